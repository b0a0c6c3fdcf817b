/*
** stage.c: the stage machinery every generated stage shares, driven by its tables (gpt_stage):
** setup (the parameter buffers, the parameter and gradient views, the activation slots and
** scratch, each sized by the generator's memory plan, whose total is checked), and the pieces
** of a training step between the collectives the generated step issues (docs/megatron.md
** §5.6): zeroing and packing gradients, the gradient norm (§6), clipping, AdamW on the whole
** buffer or on this rank's shard of the distributed optimizer (§5.4), the loss, the expert
** bias; an evaluation's begin and end (§14). Also the resume checkpoint's state.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stage.h"

gpt_state gpt;
lib_state lib;

/* -- Memory: the generator's plan ------------------------------------------------------------ */

static const char *const mem_names[GPT_NMEMS] = {
#define GPT_MEM_NAME(id, dtype, what, llama) #id,
    GPT_MEMS(GPT_MEM_NAME)
#undef GPT_MEM_NAME
};

static void *counted(size_t bytes)
{
    lib.mem_bytes += bytes;
    return rt_malloc(bytes);
}

/*
** One instance of plan entry 'id': a new zero-filled allocation of its bytes, NULL when the
** plan says none, or 'alias' (the entry it shares) when it says so.
*/
static void *mem(gpt_mem_id id, void *alias)
{
    const gpt_mem *m = &gpt.stage->mem[id];
    switch (m->how) {
    case GPT_MEM_ALLOC: return counted(m->bytes);
    case GPT_MEM_ALIAS:
        RT_CHECK(alias, "memory plan: %s aliases a buffer this stage lacks (a generator bug)",
                 mem_names[id]);
        return alias;
    case GPT_MEM_NONE: return NULL;
    default: RT_CHECK(0, "memory plan: %s has no valid kind (a generator bug)", mem_names[id]);
    }
    return NULL;
}

void *lib_grad_buffer(int i)
{
    RT_CHECK(i >= 0 && i < gpt.stage->grad_buffers, "schedule: gradient buffer %d of %d (a "
             "generator bug)", i, gpt.stage->grad_buffers);
    return lib.grad[i];
}

/*
** Entry 'id' of activation slot 's' at layer position 'j' of a chunk (-1: the chunk's own
** C_ entries): a new instance, or where the chunks share one pool of slots
** (gpt_stage.pool_slots) the instance of pool slot s at position j, made by the first chunk
** that asks and shared by the others: one micro-batch at a time holds a slot of the pool.
*/
static void *slot_mem(gpt_mem_id id, int s, int j)
{
    if (!gpt.stage->pool_slots)
        return mem(id, NULL);
    size_t at = ((size_t)s * (size_t)(lib.pool_pos + 1) + (size_t)(j + 1)) * GPT_NMEMS + id;
    if (!lib.pool[at])
        lib.pool[at] = mem(id, NULL);
    return lib.pool[at];
}

/*
** A per-layer entry of the layer at position j of a chunk, kept as 'st', in slot s: in the
** recompute workspace at the layer's position when the plan marks the entry 'work' and the
** layer has a position (its output excepted when it keeps it), allocated there once and
** shared by every layer at that position; else the slot's (slot_mem).
*/
static void *layer_mem(gpt_mem_id id, const gpt_layer_store *st, int s, int j)
{
    const gpt_mem *m = &gpt.stage->mem[id];
    if (!st || st->work < 0 || !m->work || m->how != GPT_MEM_ALLOC ||
        (id == GPT_M_L_RES2 && st->keep_out))
        return slot_mem(id, s, j);
    if (st->work >= lib.nwork) {
        int n = st->work + 1;
        void **w = realloc(lib.work, (size_t)n * GPT_NMEMS * sizeof *w);
        RT_CHECK(w, "out of memory");
        memset(w + (size_t)lib.nwork * GPT_NMEMS, 0,
               (size_t)(n - lib.nwork) * GPT_NMEMS * sizeof *w);
        lib.work = w;
        lib.nwork = n;
    }
    void **slot = &lib.work[(size_t)st->work * GPT_NMEMS + id];
    if (!*slot) *slot = mem(id, NULL);
    return *slot;
}

/* The activations of the layer at position j of a chunk in slot s: its L_, ML_ entries, as
** the plan and the layer's store say (NULL: all in the slot); the routing state of a MoE
** layer. */
static void layer_acts_alloc(lib_layer_acts *a, const gpt_layer_store *st, lib_layer *layer,
                             int s, int j)
{
    for (int id = 0; id < GPT_NMEMS; id++) {
        const char *n = mem_names[id];
        if (!strncmp(n, "L_", 2) || !strncmp(n, "ML_", 3)) a->m[id] = layer_mem(id, st, s, j);
    }
    if (gpt.d.moe) lib_moe_init(&a->moe, a->m, layer);
}

/* The stage's own buffers: every S_, MS_, H_, X_ entry of the plan (aliases after their
** targets). */
static void stage_mem_alloc(void)
{
    for (int pass = 0; pass < 2; pass++)
        for (int id = 0; id < GPT_NMEMS; id++) {
            const char *n = mem_names[id];
            if (!strncmp(n, "L_", 2) || !strncmp(n, "ML_", 3) || !strncmp(n, "C_", 2)) continue;
            int alias = gpt.stage->mem[id].how == GPT_MEM_ALIAS;
            if (alias != pass) continue;
            lib.mem[id] = mem(id, alias ? lib.mem[gpt.stage->mem[id].alias] : NULL);
        }
    lib.loss_dev = lib.mem[GPT_M_X_LOSS];
    lib.stat_dev = lib.mem[GPT_M_X_STAT];
    lib.sp_pack = lib.mem[GPT_M_X_SP_PACK];
}

/* -- Parameters: the stage's tables, expanded for this rank ---------------------------------- */

/* The slot a parameter (or its gradient) is seen through: its layer's array by field (a local
** expert's at LIB_FIELD), or the embedding's and head's (the head's weight, tied or lm_head,
** at HEAD_WTE). */
static void **field_ptr(const lib_param *lp, int grad)
{
    int f = lp->p.field, e = lp->p.expert;
    RT_CHECK(f >= 0 && f < GPT_NFIELDS, "parameter field %d out of range (a generator bug)", f);
    if (lp->layer < 0) {
        if (f == GPT_P_LM_HEAD) f = GPT_P_HEAD_WTE;      /* untied: the head's own weight */
        return grad ? (void **)&lib.other_g[f] : &lib.other_p[f];
    }
    lib_layer *l = &gpt.chunk[lp->chunk].layers[lp->layer];
    int k = e >= 0 ? LIB_FIELD(f, e) : f;
    RT_CHECK(e < gpt.d.experts_local, "parameter of local expert %d of %d (a generator bug)", e,
             gpt.d.experts_local);
    return grad ? (void **)&l->g[k] : &l->p[k];
}

static int by_place(const void *a, const void *b)
{
    const lib_param *x = a, *y = b;
    if (x->p.buf != y->p.buf) return x->p.buf - y->p.buf;
    return x->p.offset < y->p.offset ? -1 : x->p.offset > y->p.offset;
}

/* Global start of a piece on this rank, and its size (vocabulary padding cut). */
static int piece_expand(const gpt_piece *pc, int param, lib_piece *out)
{
    int coord = pc->split == GPT_SPLIT_TP ? gpt.tp_rank : pc->split == GPT_SPLIT_ETP
              ? gpt.etp_rank : 0;
    *out = (lib_piece){ param, pc->lrow, pc->lcol, pc->grow + pc->step_row * coord,
                        pc->gcol + pc->step_col * coord, pc->rows, pc->cols, pc->flags };
    if (pc->flags & GPT_VOCAB_ROWS) {
        int real = gpt.prog->vocab - out->grow;
        if (real < out->rows) out->rows = real;
    }
    return out->rows > 0 && out->cols > 0;
}

/* Every parameter and piece of this rank, from the layer and other tables. */
static void params_expand(void)
{
    const gpt_stage *st = gpt.stage;
    const gpt_program *prog = gpt.prog;
    int nl = gpt.d.moe ? gpt.d.experts_local : 0;
    int n = st->nother_params, np = st->nother_pieces;
    for (int c = 0; c < st->nchunks; c++) {
        n += st->chunks[c].layers * st->chunks[c].nparams;
        np += st->chunks[c].layers * st->chunks[c].npieces;
    }
    lib_param *ps = calloc((size_t)n + 1, sizeof *ps);
    lib_piece *pcs = calloc((size_t)np + 1, sizeof *pcs);
    int *slot_of = calloc((size_t)n + 1, sizeof(int));
    RT_CHECK(ps && pcs && slot_of, "out of memory");
    int k = 0, kp = 0;
    for (int c = 0; c < st->nchunks; c++) {
        const gpt_chunk_info *ci = &st->chunks[c];
        for (int j = 0; j < ci->layers; j++) {
            int first = k;
            for (int r = 0; r < ci->nparams; r++) {
                const gpt_param *p = &ci->params[r];
                lib_param *lp = &ps[k++];
                lp->p = *p;
                lp->p.offset += ci->bases[(size_t)j * st->nbuffers + p->buf];
                if (ci->shifts) lp->p.offset += ci->shifts[(size_t)j * ci->nparams + r];
                lp->chunk = c;
                lp->layer = j;
                lp->global_layer = ci->first + j;
                lp->tensor = lib_tensor_index(prog, p->role, lp->global_layer,
                                              p->expert >= 0 ? p->expert + gpt.ep_rank * nl : -1);
            }
            for (int r = 0; r < ci->npieces; r++) {
                const gpt_piece *pc = &ci->pieces[r];
                if (piece_expand(pc, first + pc->param, &pcs[kp])) kp++;
            }
        }
    }
    int first = k;
    for (int r = 0; r < st->nother_params; r++) {
        const gpt_param *p = &st->other_params[r];
        lib_param *lp = &ps[k++];
        lp->p = *p;
        lp->chunk = st->buffers[p->buf].chunk;
        lp->layer = lp->global_layer = -1;
        lp->tensor = lib_tensor_index(prog, p->role, -1, -1);
    }
    for (int r = 0; r < st->nother_pieces; r++) {
        const gpt_piece *pc = &st->other_pieces[r];
        if (piece_expand(pc, first + pc->param, &pcs[kp])) kp++;
    }
    /* buffer order (what the norm and the optimizer walk), pieces renumbered to follow */
    for (int i = 0; i < n; i++) ps[i].order = i;
    qsort(ps, (size_t)n, sizeof *ps, by_place);
    for (int i = 0; i < n; i++) slot_of[ps[i].order] = i;
    for (int i = 0; i < kp; i++) pcs[i].param = slot_of[pcs[i].param];
    free(slot_of);
    lib.params = ps;
    lib.nparams = n;
    lib.pieces = pcs;
    lib.npieces = kp;
}

/* This rank's shard of a bucket: its index in the buffer's data-parallel group. */
static size_t shard_start(const gpt_buffer *b, const gpt_bucket *k)
{
    rt_group *g = gpt.grp[b->group];
    return k->start + (size_t)(g ? rt_group_rank(g) : 0) * k->shard;
}

/* -- Setup ------------------------------------------------------------------------------------- */

/*
** Allocate everything the stage uses (buffers, activation slots, scratch) as the generator's
** plan says, point every parameter and gradient view into the buffers, and check that the
** bytes allocated are the plan's total (the number make inspect reports). On rank 0 of each
** stage (its first rank) print "memory: planned P bytes, allocated A bytes (stage S)", A
** being what the runtime counted (rt_mem_stats): the library's buffers and the runtime's own.
*/
void lib_stage_setup(void)
{
    const gpt_stage *st = gpt.stage;
    const gpt_dims *d = &gpt.d;
    int nb = st->nbuffers;
    size_t live0, peak0;
    rt_mem_stats(&live0, &peak0);
    lib.mem_bytes = 0;
    lib.es = rt_dtype_size(d->act);
    lib.pbuf = calloc((size_t)nb + 1, sizeof *lib.pbuf);
    lib.gbuf = calloc((size_t)nb + 1, sizeof *lib.gbuf);
    lib.main = d->act == RT_F32 ? NULL : calloc((size_t)nb + 1, sizeof *lib.main);
    lib.mbuf = calloc((size_t)nb + 1, sizeof *lib.mbuf);
    lib.vbuf = calloc((size_t)nb + 1, sizeof *lib.vbuf);
    RT_CHECK(lib.pbuf && lib.gbuf && lib.mbuf && lib.vbuf && (d->act == RT_F32 || lib.main),
             "out of memory");
    for (int i = 0; i < nb; i++) {
        const gpt_buffer *b = &st->buffers[i];
        lib.pbuf[i] = counted(b->size * lib.es);
        lib.gbuf[i] = counted(b->size * sizeof(float));
        if (lib.main) lib.main[i] = counted(b->state * sizeof(float));
        lib.mbuf[i] = counted(b->state * sizeof(float));
        lib.vbuf[i] = counted(b->state * sizeof(float));
    }

    RT_CHECK(st->nchunks > 0, "stage %d has no chunk (a generator bug)", gpt.pp_rank);
    lib.pool_pos = 0;
    for (int c = 0; c < st->nchunks; c++)
        if (st->chunks[c].layers > lib.pool_pos) lib.pool_pos = st->chunks[c].layers;
    if (st->pool_slots) {
        lib.pool = calloc((size_t)st->pool_slots * (size_t)(lib.pool_pos + 1) * GPT_NMEMS,
                          sizeof *lib.pool);
        RT_CHECK(lib.pool, "out of memory");
        for (int c = 0; c < st->nchunks; c++)
            RT_CHECK(st->chunks[c].slots == st->pool_slots, "memory plan: chunk %d has %d "
                     "slots, the stage's pool %d (a generator bug)", c, st->chunks[c].slots,
                     st->pool_slots);
    }
    lib.head = st->chunks[st->nchunks - 1].head;
    gpt.chunk = calloc((size_t)st->nchunks, sizeof *gpt.chunk);
    RT_CHECK(gpt.chunk, "out of memory");
    for (int c = 0; c < st->nchunks; c++) {
        const gpt_chunk_info *ci = &st->chunks[c];
        lib_chunk *ch = &gpt.chunk[c];
        /* + 1: a chunk may hold no layer (a layout's embedding- or loss-only chunk) */
        ch->layers = calloc((size_t)ci->layers + 1, sizeof *ch->layers);
        ch->acts = calloc((size_t)ci->slots, sizeof *ch->acts);
        RT_CHECK(ch->layers && ch->acts, "out of memory");
        size_t nf = (size_t)GPT_NFIELDS * (1 + (d->moe ? d->experts_local : 0));
        for (int j = 0; j < ci->layers; j++) {
            lib_layer *l = &ch->layers[j];
            l->p = calloc(nf, sizeof *l->p);
            l->g = calloc(nf, sizeof *l->g);
            RT_CHECK(l->p && l->g, "out of memory");
            if (d->moe && d->expert_bias) {         /* host state, outside the plan */
                l->ebias = calloc((size_t)d->experts, sizeof(float));
                l->ecount = calloc((size_t)d->experts, sizeof(int));
                RT_CHECK(l->ebias && l->ecount, "out of memory");
            }
        }
        for (int s = 0; s < ci->slots; s++) {
            lib_chunk_acts *a = &ch->acts[s];
            a->x = slot_mem(GPT_M_C_X, s, -1);
            a->dy = NULL;       /* a gradient buffer while its micro-batch needs one */
            a->tokens = ci->embedding ? slot_mem(GPT_M_C_TOKENS, s, -1) : NULL;
            a->layer = calloc((size_t)ci->layers + 1, sizeof *a->layer);
            RT_CHECK(a->layer, "out of memory");
            for (int j = 0; j < ci->layers; j++)
                layer_acts_alloc(&a->layer[j], ci->store ? &ci->store[j] : NULL, &ch->layers[j],
                                 s, j);
        }
    }
    lib.grad = calloc((size_t)st->grad_buffers + 1, sizeof *lib.grad);
    RT_CHECK(lib.grad, "out of memory");
    for (int i = 0; i < st->grad_buffers; i++)
        lib.grad[i] = mem(GPT_M_C_DY, NULL);
    stage_mem_alloc();

    params_expand();
    for (int i = 0; i < lib.nparams; i++) {
        const lib_param *lp = &lib.params[i];
        *field_ptr(lp, 0) = lib_at(lib.pbuf[lp->p.buf], lp->p.offset);
        *field_ptr(lp, 1) = lib.gbuf[lp->p.buf] + lp->p.offset;
        if (lp->p.flags & GPT_SP_REDUCE) lib.sp_total += lp->p.n;
    }
    if (st->head_uses_wte) {     /* one stage holds both: the head uses wte itself (tied) */
        lib.other_p[GPT_P_HEAD_WTE] = lib.other_p[GPT_P_WTE];
        lib.other_g[GPT_P_HEAD_WTE] = lib.other_g[GPT_P_WTE];
    }
    RT_CHECK(lib.mem_bytes == st->mem_bytes, "stage setup allocated %zu bytes, the generator's "
             "plan says %zu (a generator bug)", lib.mem_bytes, st->mem_bytes);
    size_t live, peak;
    rt_mem_stats(&live, &peak);
    /* the CUDA runtime's own buffers (cuBLAS's workspace, the GEMM staging), allocated at
    ** rt_init; the CPU has none */
    size_t planned = st->mem_bytes + (strcmp(rt_backend(), "cpu") ? RT_CUDA_WORKSPACE_BYTES +
                                      RT_CUDA_STAGE_BYTES : 0);
    (void)live0;
    (void)peak0;
    if (gpt.tp_rank == 0 && gpt.cp_rank == 0 && gpt.dp_rank == 0)
        printf("memory: planned %zu bytes, allocated %zu bytes (stage %d)\n", planned, live,
               gpt.pp_rank);
    RT_CHECK(live == planned, "stage %d: %zu device bytes allocated, the plan says %zu",
             gpt.pp_rank, live, planned);
}

/* -- Parameters in f32: initialisation, loading, saving ---------------------------------------- */

float *lib_master(int b)
{
    return lib.main ? lib.gbuf[b] : (float *)lib.pbuf[b];
}

/* bf16 training: the main parameters (the whole buffer, or this rank's bucket shards) and the
** model's bf16 parameters from the f32 values in the staging buffer. */
void lib_master_commit(void)
{
    if (!lib.main) return;
    for (int i = 0; i < gpt.stage->nbuffers; i++) {
        const gpt_buffer *b = &gpt.stage->buffers[i];
        if (b->sharded) {
            for (int k = 0; k < b->nbuckets; k++) {
                const gpt_bucket *bk = &b->buckets[k];
                rt_memcpy(lib.main[i] + bk->base, lib.gbuf[i] + shard_start(b, bk),
                          bk->shard * sizeof(float), RT_D2D);
            }
        } else {
            rt_memcpy(lib.main[i], lib.gbuf[i], b->size * sizeof(float), RT_D2D);
        }
        convert(lib.pbuf[i], gpt.d.act, lib.gbuf[i], RT_F32, b->size);
    }
}

void lib_sync(void)
{
    if (gpt.stage && gpt.stage->sync) gpt.stage->sync();
}

/* bf16 training: the staging buffer gets the f32 main parameters, each rank's shards
** all-gathered over the buffer's data-parallel group with the distributed optimizer. */
void lib_master_allgather(void)
{
    if (!lib.main) return;
    for (int i = 0; i < gpt.stage->nbuffers; i++) {
        const gpt_buffer *b = &gpt.stage->buffers[i];
        if (!b->sharded) {
            rt_memcpy(lib.gbuf[i], lib.main[i], b->size * sizeof(float), RT_D2D);
            continue;
        }
        for (int k = 0; k < b->nbuckets; k++) {
            const gpt_bucket *bk = &b->buckets[k];
            rt_memcpy(lib.gbuf[i] + shard_start(b, bk), lib.main[i] + bk->base,
                      bk->shard * sizeof(float), RT_D2D);
            if (gpt.grp[b->group])
                rt_allgather(lib.gbuf[i] + shard_start(b, bk), lib.gbuf[i] + bk->start,
                             bk->shard, RT_F32, gpt.grp[b->group]);
        }
    }
}

/* -- The step after the schedule ------------------------------------------------------------- */

void gpt_step_begin(const gpt_step_in *in)
{
    gpt.in = in;
    for (int i = 0; i < gpt.stage->nbuffers; i++)
        rt_memset0(lib.gbuf[i], gpt.stage->buffers[i].size * sizeof(float));
    gpt.moe_aux = 0.0;
}

/*
** An evaluation between two steps (train.c): its forwards read the parameters (any all-gather
** still in flight is waited first) and write only what the next step overwrites or zeroes
** (activations, the gradient buffers, the loss sums), but for what the step's tail consumes:
** the aux loss and the expert counts, which gpt_eval_end puts back (the step's tail left the
** counts at zero, gpt_ebias_update).
*/
void gpt_eval_begin(const gpt_step_in *in)
{
    lib_sync();
    gpt.in = in;
    gpt.evaluating = 1;
}

void gpt_eval_end(void)
{
    gpt.evaluating = 0;
    gpt.moe_aux = 0.0;
    for (int c = 0; c < gpt.stage->nchunks; c++)
        for (int j = 0; j < gpt.stage->chunks[c].layers; j++)
            if (gpt.chunk[c].layers[j].ecount)
                memset(gpt.chunk[c].layers[j].ecount, 0, (size_t)gpt.d.experts * sizeof(int));
}

int gpt_evaluating(void)
{
    return gpt.evaluating;
}

/* Sequence-parallel parameters: each tp rank saw N_SP of the tokens, so their gradients are
** summed over tp (docs/megatron.md §4.6): packed into X_SP_PACK for one all-reduce, and back. */
static void sp_copy(int pack)
{
    size_t at = 0;
    for (int i = 0; i < lib.nparams; i++) {
        const gpt_param *p = &lib.params[i].p;
        if (!(p->flags & GPT_SP_REDUCE)) continue;
        float *g = lib.gbuf[p->buf] + p->offset;
        if (pack) rt_memcpy(lib.sp_pack + at, g, p->n * sizeof(float), RT_D2D);
        else rt_memcpy(g, lib.sp_pack + at, p->n * sizeof(float), RT_D2D);
        at += p->n;
    }
}

void gpt_sp_pack(void) { sp_copy(1); }
void gpt_sp_unpack(void) { sp_copy(0); }

float *gpt_grad_buf(int buf)
{
    return lib.gbuf[buf];
}

float *gpt_grad_shard(int buf, int bucket)
{
    const gpt_buffer *b = &gpt.stage->buffers[buf];
    return lib.gbuf[buf] + shard_start(b, &b->buckets[bucket]);
}

void *gpt_param_bucket(int buf, int bucket)
{
    return lib_at(lib.pbuf[buf], gpt.stage->buffers[buf].buckets[bucket].start);
}

void *gpt_param_shard(int buf, int bucket)
{
    const gpt_buffer *b = &gpt.stage->buffers[buf];
    return lib_at(lib.pbuf[buf], shard_start(b, &b->buckets[bucket]));
}

/* The part of parameter p inside this rank's shard of bucket k: buffer offsets [lo, hi) and
** the matching offset in the moments. Returns 0 when they do not meet. */
static int shard_part(const gpt_param *p, int k, size_t *lo, size_t *hi, size_t *at)
{
    const gpt_buffer *b = &gpt.stage->buffers[p->buf];
    const gpt_bucket *bk = &b->buckets[k];
    size_t s0 = shard_start(b, bk), s1 = s0 + bk->shard;
    *lo = p->offset > s0 ? p->offset : s0;
    *hi = p->offset + p->n < s1 ? p->offset + p->n : s1;
    *at = bk->base + (*lo - s0);
    return *lo < *hi;
}

/* Whether this rank counts p in the gradient norm (docs/megatron.md §6). */
static int counts_in_norm(const gpt_param *p)
{
    switch (p->flags & GPT_NORM_MASK) {
    case GPT_NORM_NEVER: return 0;
    case GPT_NORM_TP0: return gpt.tp_rank == 0;
    case GPT_NORM_ETP0: return gpt.etp_rank == 0;
    default: return 1;
    }
}

/* Calls fn(param, offset, n) for each range of gradients this rank counts in the norm. */
static void counted_ranges(void (*fn)(const lib_param *lp, size_t at, size_t n, void *ctx),
                           void *ctx)
{
    for (int i = 0; i < lib.nparams; i++) {
        const lib_param *lp = &lib.params[i];
        const gpt_param *p = &lp->p;
        const gpt_buffer *b = &gpt.stage->buffers[p->buf];
        if (!counts_in_norm(p)) continue;
        if (b->sharded) {
            for (int k = 0; k < b->nbuckets; k++) {
                size_t lo, hi, at;   /* a parameter lies in one bucket: one piece at most */
                if (shard_part(p, k, &lo, &hi, &at)) fn(lp, lo, hi - lo, ctx);
            }
        } else fn(lp, p->offset, p->n, ctx);
    }
}

typedef struct { int np; char *expert; const float **x; size_t *n; } norm_parts;

static void norm_part(const lib_param *lp, size_t at, size_t n, void *ctx)
{
    const gpt_param *p = &lp->p;
    norm_parts *t = ctx;
    t->expert[t->np] = (char)gpt.stage->buffers[p->buf].expert;
    t->x[t->np] = lib.gbuf[p->buf] + at;
    t->n[t->np++] = n;
}

static void poison_first(const lib_param *lp, size_t at, size_t n, void *ctx)
{
    const gpt_param *p = &lp->p;
    int *done = ctx;
    float nan = NAN;
    if (*done || n == 0) return;
    rt_memcpy(lib.gbuf[p->buf] + at, &nan, sizeof nan, RT_H2D);
    *done = 1;
}

/* Sums of squares of this rank's gradients counted once: dense, experts, their total. */
void gpt_norm_local(void)
{
    if (lib.fault & LIB_FAULT_NAN_GRAD) {
        int done = 0;
        counted_ranges(poison_first, &done);
    }
    int np = 0;
    char *expert = malloc((size_t)lib.nparams + 1);
    const float **xs = malloc(((size_t)lib.nparams + 1) * sizeof *xs);
    size_t *ns = malloc(((size_t)lib.nparams + 1) * sizeof *ns);
    RT_CHECK(expert && xs && ns, "out of memory");
    norm_parts parts_of = { 0, expert, xs, ns };
    counted_ranges(norm_part, &parts_of);
    np = parts_of.np;
    sumsq_multi(lib.stat_dev, xs, ns, np);      /* a few launches for all of them */
    free(xs);
    free(ns);
    float *parts = malloc(((size_t)np + 3) * sizeof(float));
    RT_CHECK(parts, "out of memory");
    double sum[2] = { 0.0, 0.0 };
    rt_memcpy(parts, lib.stat_dev, (size_t)np * sizeof(float), RT_D2H);
    for (int i = 0; i < np; i++) sum[(int)expert[i]] += parts[i];
    float red[3] = { (float)sum[0], (float)sum[1], (float)(sum[0] + sum[1]) };
    rt_memcpy(lib.stat_dev + lib.nparams, red, sizeof red, RT_H2D);
    free(parts);
    free(expert);
}

float *gpt_stat(int k)
{
    return lib.stat_dev + lib.nparams + k;
}

void gpt_norm_set(gpt_step_out *out, int total)
{
    float red[3];
    rt_memcpy(red, lib.stat_dev + lib.nparams, sizeof red, RT_D2H);
    out->grad_norm = total ? sqrt((double)red[2]) : sqrt((double)red[0] + (double)red[1]);
}

typedef struct { const char *name; long long index; float value; int found; } bad_grad;

static void find_bad(const lib_param *lp, size_t at, size_t n, void *ctx)
{
    const gpt_param *p = &lp->p;
    bad_grad *b = ctx;
    if (b->found) return;
    float *host = malloc(n * sizeof(float));
    RT_CHECK(host, "out of memory");
    rt_memcpy(host, lib.gbuf[p->buf] + at, n * sizeof(float), RT_D2H);
    for (size_t k = 0; k < n && !b->found; k++)
        if (!isfinite(host[k]))
            *b = (bad_grad){ lib.tensors[lp->tensor].name, (long long)(at - p->offset + k),
                             host[k], 1 };
    free(host);
}

int lib_first_bad_grad(const char **name, long long *index, float *value)
{
    bad_grad b = { 0 };
    counted_ranges(find_bad, &b);
    *name = b.name;
    *index = b.index;
    *value = b.value;
    return b.found;
}

/* AdamW (torch.optim.AdamW) with the clipping coefficient folded into the gradient, on the
** f32 main parameters; in bf16 training each updated value is also rounded into the model's
** bf16 parameters (docs/megatron.md §9.1). */
void gpt_adamw(const gpt_step_in *in, gpt_step_out *out)
{
    double norm = out->grad_norm;
    out->skipped = !isfinite(out->loss) || !isfinite(out->aux_loss) || !isfinite(norm);
    if (out->skipped) return;
    double coef = in->clip > 0 ? in->clip / (norm + 1e-6) : 1.0;   /* clip_grad_norm_ */
    float c = coef < 1.0 ? (float)coef : 1.0f;
    int t = in->step + 1;
    float bc1 = (float)(1.0 - pow((double)in->beta1, t));
    float bc2 = (float)(1.0 - pow((double)in->beta2, t));
    /* every tensor (or shard piece) in one multi-tensor call: a few launches for all */
    size_t cap = (size_t)lib.nparams + 1, count = 0;
    for (int i = 0; i < lib.nparams; i++) {
        const gpt_buffer *b = &gpt.stage->buffers[lib.params[i].p.buf];
        if (b->sharded) cap += (size_t)b->nbuckets;
    }
    adamw_tensor *ts = malloc(cap * sizeof *ts);
    RT_CHECK(ts, "out of memory");
    for (int i = 0; i < lib.nparams; i++) {
        const gpt_param *p = &lib.params[i].p;
        const gpt_buffer *b = &gpt.stage->buffers[p->buf];
        float wd = (p->flags & GPT_DECAY) ? in->wd : 0.0f;
        int bi = p->buf;
        if (b->sharded) {
            for (int k = 0; k < b->nbuckets; k++) {
                size_t lo, hi, at;
                if (!shard_part(p, k, &lo, &hi, &at)) continue;
                float *main = lib.main ? lib.main[bi] + at : (float *)lib.pbuf[bi] + lo;
                ts[count++] = (adamw_tensor){ main, lib.mbuf[bi] + at, lib.vbuf[bi] + at,
                                              lib.gbuf[bi] + lo,
                                              lib.main ? lib_at(lib.pbuf[bi], lo) : NULL,
                                              hi - lo, wd };
            }
        } else {
            size_t o = p->offset;
            float *main = lib.main ? lib.main[bi] + o : (float *)lib.pbuf[bi] + o;
            ts[count++] = (adamw_tensor){ main, lib.mbuf[bi] + o, lib.vbuf[bi] + o,
                                          lib.gbuf[bi] + o,
                                          lib.main ? lib_at(lib.pbuf[bi], o) : NULL, p->n, wd };
        }
    }
    adamw_multi(ts, (int)count, in->lr, in->beta1, in->beta2, in->eps, bc1, bc2, c, gpt.d.act);
    free(ts);
}

/* Every rank's share of the aux loss: the objective's term over the replicas and micro-batches
** (summed over the world by the generated step). */
void gpt_aux_pack(void)
{
    float a = (float)(gpt.moe_aux / ((double)gpt.d.nmb * gpt.prog->dp));
    rt_memcpy(gpt_stat(2), &a, sizeof a, RT_H2D);
}

void gpt_aux_unpack(gpt_step_out *out)
{
    float a;
    rt_memcpy(&a, gpt_stat(2), sizeof a, RT_D2H);
    out->aux_loss = a;
}

/* The step's mean loss over the global batch: the head stage's tp-rank-0 ranks hold it (cp
** ranks hold different tokens: all count); with it, the ranks that want to stop (a signal,
** --exit-duration-in-mins), so that all agree. The norm's slots are free again (read by
** gpt_norm_set before this). */
void gpt_loss_pack(const gpt_step_in *in)
{
    float part = 0.0f;
    int nmb = gpt.d.nmb;
    if (lib.head && gpt.tp_rank == 0) {
        float *sums = malloc((size_t)nmb * sizeof(float));
        RT_CHECK(sums, "out of memory");
        double total = 0.0;
        rt_memcpy(sums, lib.loss_dev, (size_t)nmb * sizeof(float), RT_D2H);
        for (int k = 0; k < nmb; k++) total += sums[k];
        part = (float)(total / (double)gpt.prog->tokens_per_step);
        free(sums);
    }
    if (lib.fault & LIB_FAULT_INF_LOSS) part = INFINITY;
    float both[2] = { part, in->stop ? 1.0f : 0.0f };
    rt_memcpy(gpt_stat(0), both, sizeof both, RT_H2D);
}

void gpt_loss_unpack(gpt_step_out *out)
{
    float both[2];
    rt_memcpy(both, gpt_stat(0), sizeof both, RT_D2H);
    out->loss = both[0];
    out->stop = both[1] > 0.0f;
}

/* -- The expert bias (aux-loss-free load balancing) ------------------------------------------ */

/* The stage's layer l, counting through its chunks in order. */
static lib_layer *stage_layer(int l, int *global)
{
    for (int c = 0; c < gpt.stage->nchunks; c++) {
        int n = gpt.stage->chunks[c].layers;
        if (l < n) {
            if (global) *global = gpt.stage->chunks[c].first + l;
            return &gpt.chunk[c].layers[l];
        }
        l -= n;
    }
    RT_CHECK(0, "expert bias: no layer %d on this stage (a generator bug)", l);
    return NULL;
}

void lib_expert_bias_each(void (*fn)(int layer, float *bias, void *ctx), void *ctx)
{
    for (int c = 0; c < gpt.stage->nchunks; c++)
        for (int j = 0; j < gpt.stage->chunks[c].layers; j++)
            fn(gpt.stage->chunks[c].first + j, gpt.chunk[c].layers[j].ebias, ctx);
}

/*
** The step's tail, after the optimizer: Megatron's get_updated_expert_bias, layer by layer: the
** counts (kept rows per expert, every micro-batch), summed by the generated step over dp-cp and
** tp, i.e. over every token of the step; the sign of mean - count is that of total - E * count,
** exact in integers; bias += rate * that sign (f32, as Megatron's buffer). A skipped step
** (out->skipped) leaves the biases as they were (the collectives run all the same: every rank
** skips alike).
*/
void gpt_ebias_counts(int l)
{
    lib_layer *m = stage_layer(l, NULL);
    rt_memcpy(lib.mem[GPT_M_MS_COUNTS], m->ecount, (size_t)gpt.d.experts * sizeof(int), RT_H2D);
}

void gpt_ebias_update(int l, const gpt_step_out *out)
{
    const int E = gpt.d.experts;
    lib_layer *m = stage_layer(l, NULL);
    rt_memcpy(m->ecount, lib.mem[GPT_M_MS_COUNTS], (size_t)E * sizeof(int), RT_D2H);
    long long total = 0;
    for (int e = 0; e < E; e++) total += m->ecount[e];
    for (int e = 0; e < E; e++) {
        long long off = total - (long long)E * m->ecount[e];
        if (!out->skipped)
            m->ebias[e] += gpt.d.bias_rate * (float)((off > 0) - (off < 0));
        m->ecount[e] = 0;
    }
}

/* -- Resume checkpoint state ---------------------------------------------------------------- */

/* Per buffer: the model's parameters, the f32 main parameters (bf16 training), the moments. */
size_t lib_state_bytes(void)
{
    size_t n = 0;
    for (int i = 0; i < gpt.stage->nbuffers; i++) {
        const gpt_buffer *b = &gpt.stage->buffers[i];
        n += b->size * lib.es + (lib.main ? 3 : 2) * b->state * sizeof(float);
    }
    if (gpt.d.expert_bias)      /* the expert biases of the stage's layers */
        for (int c = 0; c < gpt.stage->nchunks; c++)
            n += (size_t)gpt.stage->chunks[c].layers * gpt.d.experts * sizeof(float);
    return n;
}

static void ebias_out(int layer, float *bias, void *ctx)
{
    unsigned char **host = ctx;
    (void)layer;
    if (!bias) return;
    memcpy(*host, bias, (size_t)gpt.d.experts * sizeof(float));
    *host += (size_t)gpt.d.experts * sizeof(float);
}

static void ebias_in(int layer, float *bias, void *ctx)
{
    unsigned char **host = ctx;
    (void)layer;
    if (!bias) return;
    memcpy(bias, *host, (size_t)gpt.d.experts * sizeof(float));
    *host += (size_t)gpt.d.experts * sizeof(float);
}

/* -- The state's index: its blocks (stage.h lib_state_block) ---------------------------------- */

typedef struct {
    lib_state_block *b;
    int n, cap;
} block_list;

static lib_state_block *block_add(block_list *l)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->b = realloc(l->b, sizeof *l->b * (size_t)l->cap);
        RT_CHECK(l->b, "out of memory for the checkpoint's index");
    }
    memset(&l->b[l->n], 0, sizeof *l->b);
    return &l->b[l->n++];
}

/* The blocks of piece pc in a state area of 'size'-byte elements holding buffer elements
** [s0, s1) at byte 'at0' (buffer element s0 there): whole rows inside the range merge into
** one block, a row the range cuts is a block of its own. */
static void piece_blocks(block_list *l, const lib_piece *pc, uint64_t kind, uint64_t size,
                         size_t s0, size_t s1, size_t at0)
{
    const lib_param *lp = &lib.params[pc->param];
    size_t ld = (size_t)lp->p.ld, q = lp->p.offset + (size_t)pc->lrow * ld + (size_t)pc->lcol;
    size_t cols = (size_t)pc->cols;
    if (q + (size_t)(pc->rows - 1) * ld + cols <= s0 || q >= s1) return;
    lib_state_block *last = NULL;
    for (int r = 0; r < pc->rows; r++) {
        size_t lo = q + (size_t)r * ld, hi = lo + cols;
        size_t a = lo > s0 ? lo : s0, e = hi < s1 ? hi : s1;
        if (a >= e) {
            last = NULL;
            continue;
        }
        int whole = a == lo && e == hi;
        if (whole && last && last->cols == cols && last->grow + last->rows ==
            (uint64_t)(pc->grow + r)) {
            last->rows++;
            continue;
        }
        lib_state_block *k = block_add(l);
        *k = (lib_state_block){ .tensor = (uint64_t)lp->tensor, .kind = kind, .size = size,
                                .grow = (uint64_t)(pc->grow + r),
                                .gcol = (uint64_t)pc->gcol + (a - lo), .rows = 1,
                                .cols = e - a, .ld = ld, .at = at0 + (a - s0) * size,
                                .buf = lp->p.buf, .pos = a };
        last = whole ? k : NULL;
    }
}

int lib_state_blocks(lib_state_block **out)
{
    block_list l = { 0 };
    size_t at = 0;
    for (int i = 0; i < gpt.stage->nbuffers; i++) {
        const gpt_buffer *b = &gpt.stage->buffers[i];
        /* lib_state_io's order: parameters, first and second moment, main parameters */
        size_t area[4] = { at, 0, 0, 0 };
        area[1] = area[0] + b->size * lib.es;
        area[2] = area[1] + b->state * sizeof(float);
        area[3] = area[2] + b->state * sizeof(float);
        const uint64_t kinds[3] = { LIB_STATE_EXP_AVG, LIB_STATE_EXP_AVG_SQ, LIB_STATE_MAIN };
        for (int j = 0; j < lib.npieces; j++) {
            const lib_piece *pc = &lib.pieces[j];
            if (lib.params[pc->param].p.buf != i) continue;
            piece_blocks(&l, pc, LIB_STATE_PARAM, lib.es, 0, b->size, area[0]);
            for (int m = 0; m < (lib.main ? 3 : 2); m++) {
                if (!b->sharded) {
                    piece_blocks(&l, pc, kinds[m], sizeof(float), 0, b->size, area[1 + m]);
                    continue;
                }
                for (int k = 0; k < b->nbuckets; k++) {
                    const gpt_bucket *bk = &b->buckets[k];
                    size_t s0 = shard_start(b, bk);
                    piece_blocks(&l, pc, kinds[m], sizeof(float), s0, s0 + bk->shard,
                                 area[1 + m] + bk->base * sizeof(float));
                }
            }
        }
        at += b->size * lib.es + (lib.main ? 3 : 2) * b->state * sizeof(float);
    }
    if (gpt.d.expert_bias)
        for (int c = 0; c < gpt.stage->nchunks; c++)
            for (int j = 0; j < gpt.stage->chunks[c].layers; j++) {
                lib_state_block *k = block_add(&l);
                *k = (lib_state_block){ .tensor = (uint64_t)(lib.ebias_tensor +
                                                             gpt.stage->chunks[c].first + j),
                                        .kind = LIB_STATE_EBIAS, .size = sizeof(float),
                                        .rows = 1, .cols = (uint64_t)gpt.d.experts,
                                        .ld = (uint64_t)gpt.d.experts, .at = at, .buf = -1 };
                at += (size_t)gpt.d.experts * sizeof(float);
            }
    RT_CHECK(at == lib_state_bytes(), "the state's index covers %zu bytes of %zu (a library "
             "bug)", at, lib_state_bytes());
    *out = l.b;
    return l.n;
}

/* Copy every buffer's state to (save) or from 'host', buffer by buffer, then the expert
** biases. */
void lib_state_io(unsigned char *host, int save)
{
    for (int i = 0; i < gpt.stage->nbuffers; i++) {
        const gpt_buffer *b = &gpt.stage->buffers[i];
        void *dev[4] = { lib.pbuf[i], lib.mbuf[i], lib.vbuf[i], lib.main ? lib.main[i] : NULL };
        size_t len[4] = { b->size * lib.es, b->state * sizeof(float), b->state * sizeof(float),
                          lib.main ? b->state * sizeof(float) : 0 };
        for (int j = 0; j < 4; j++) {
            if (save) rt_memcpy(host, dev[j], len[j], RT_D2H);
            else rt_memcpy(dev[j], host, len[j], RT_H2D);
            host += len[j];
        }
    }
    lib_expert_bias_each(save ? ebias_out : ebias_in, &host);
}
