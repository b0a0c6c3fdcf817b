/*
** stage.c: the stage machinery every generated stage shares, driven by its tables (gpt_stage):
** setup (the parameter buffers, the parameter and gradient views, the activation slots and
** scratch, each sized by the generator's memory plan, whose total is checked), and the pieces
** of a training step that follow the schedule: gradient reductions (docs/megatron.md §5.6),
** the gradient norm (§6), clipping, AdamW on the whole buffer or on this rank's shard of the
** distributed optimizer (§5.4), the parameter all-gather, the loss. The generated step calls
** them in its order, each naming its one collective. Also the resume checkpoint's state.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stage.h"

lib_state lib;

/* -- Memory: the generator's plan ------------------------------------------------------------ */

static const char *const mem_names[GPT_NMEMS] = {
#define GPT_MEM_NAME(id) #id,
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

/*
** A per-layer entry of a layer kept as 'st': in the recompute workspace at the layer's
** position when the plan marks the entry 'work' and the layer has a position (its output
** excepted when it keeps it), allocated there once and shared by every layer at that
** position; else a new instance of its own.
*/
static void *layer_mem(gpt_mem_id id, const gpt_layer_store *st)
{
    const gpt_mem *m = &gpt.stage->mem[id];
    if (!st || st->work < 0 || !m->work || m->how != GPT_MEM_ALLOC ||
        (id == GPT_M_L_RES2 && st->keep_out))
        return mem(id, NULL);
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

static int *host_ints(int n)
{
    int *p = calloc(n > 0 ? (size_t)n : 1, sizeof(int));
    RT_CHECK(p, "out of memory");
    return p;
}

/* One layer's activations, as the plan and the layer's store say (NULL: all its own). */
void lib_layer_acts_alloc(gpt_layer_acts *a, const gpt_layer_store *st)
{
    const gpt_dims *d = &gpt.d;
    a->ln1 = layer_mem(GPT_M_L_LN1, st);
    a->ln1_mean = layer_mem(GPT_M_L_LN1_MEAN, st);
    a->ln1_rstd = layer_mem(GPT_M_L_LN1_RSTD, st);
    a->qkv = layer_mem(GPT_M_L_QKV, st);
    a->lse = layer_mem(GPT_M_L_LSE, st);
    a->atty = layer_mem(GPT_M_L_ATTY, st);
    a->res1 = layer_mem(GPT_M_L_RES1, st);
    a->ln2 = layer_mem(GPT_M_L_LN2, st);
    a->ln2_mean = layer_mem(GPT_M_L_LN2_MEAN, st);
    a->ln2_rstd = layer_mem(GPT_M_L_LN2_RSTD, st);
    a->fc = layer_mem(GPT_M_L_FC, st);
    a->gelu = layer_mem(GPT_M_L_GELU, st);
    a->res2 = layer_mem(GPT_M_L_RES2, st);
    a->qkv_seq = layer_mem(GPT_M_L_QKV_SEQ, st);
    a->atty_seq = layer_mem(GPT_M_L_ATTY_SEQ, st);
    gpt_moe_acts *m = &a->moe;
    m->scores = layer_mem(GPT_M_ML_SCORES, st);
    m->prob = layer_mem(GPT_M_ML_PROB, st);
    m->sel = layer_mem(GPT_M_ML_SEL, st);
    m->pos = layer_mem(GPT_M_ML_POS, st);
    m->send_tok = layer_mem(GPT_M_ML_SEND_TOK, st);
    m->order = layer_mem(GPT_M_ML_ORDER, st);
    m->unorder = layer_mem(GPT_M_ML_UNORDER, st);
    m->xe = layer_mem(GPT_M_ML_XE, st);
    m->pe = layer_mem(GPT_M_ML_PE, st);
    m->fc = layer_mem(GPT_M_ML_FC, st);
    m->h = layer_mem(GPT_M_ML_H, st);
    m->auxg = layer_mem(GPT_M_ML_AUXG, st);
    m->zg = layer_mem(GPT_M_ML_ZG, st);
    m->ssum = layer_mem(GPT_M_ML_SSUM, st);
    if (d->moe) {                            /* host side of the routing */
        m->sel_h = host_ints(d->n_sp * d->topk);
        m->pos_h = host_ints(d->n_sp * d->topk);
        m->sendrows = host_ints(d->ep);
        m->recvrows = host_ints(d->ep);
        m->memrows = host_ints(d->etp);
        m->erows = host_ints(d->experts_local);
    }
}

static void scratch_alloc(void)
{
    lib_scratch *s = &lib.s;
    s->full = mem(GPT_M_S_FULL, NULL);
    s->full_sp = mem(GPT_M_S_FULL_SP, s->full);
    s->gather = mem(GPT_M_S_GATHER, NULL);
    s->dqkv = mem(GPT_M_S_DQKV, NULL);
    s->datty = mem(GPT_M_S_DATTY, NULL);
    s->dsum = mem(GPT_M_S_DSUM, NULL);
    s->dfc = mem(GPT_M_S_DFC, NULL);
    s->qkvp = mem(GPT_M_S_QKVP, NULL);
    s->dact = mem(GPT_M_S_DACT, NULL);
    s->dshared = mem(GPT_M_S_DSHARED, NULL);
    s->logits = mem(GPT_M_S_LOGITS, NULL);
    s->ce = mem(GPT_M_S_CE, NULL);
    s->targets = mem(GPT_M_S_TARGETS, NULL);
    s->ring_kv = mem(GPT_M_S_RING_KV, NULL);
    s->ring_dkv = mem(GPT_M_S_RING_DKV, NULL);
    s->ring_acc = mem(GPT_M_S_RING_ACC, NULL);
    s->a2a_send = mem(GPT_M_S_A2A_SEND, NULL);
    s->a2a_recv = mem(GPT_M_S_A2A_RECV, NULL);
    s->a2a_dout = mem(GPT_M_S_A2A_DOUT, NULL);
    lib_moe_scratch *ms = &lib.ms;
    ms->logits = mem(GPT_M_MS_LOGITS, NULL);
    ms->xs = mem(GPT_M_MS_XS, NULL);
    ms->ps = mem(GPT_M_MS_PS, NULL);
    ms->xr = mem(GPT_M_MS_XR, NULL);
    ms->pr = mem(GPT_M_MS_PR, NULL);
    ms->xg = mem(GPT_M_MS_XG, NULL);
    ms->pg = mem(GPT_M_MS_PG, NULL);
    ms->act = mem(GPT_M_MS_ACT, NULL);
    ms->dfc = mem(GPT_M_MS_DFC, NULL);
    ms->ye = mem(GPT_M_MS_YE, NULL);
    ms->yg = mem(GPT_M_MS_YG, NULL);
    ms->yr = mem(GPT_M_MS_YR, NULL);
    ms->ys = mem(GPT_M_MS_YS, NULL);
    ms->dpe = mem(GPT_M_MS_DPE, NULL);
    ms->dpg = mem(GPT_M_MS_DPG, NULL);
    ms->dpr = mem(GPT_M_MS_DPR, NULL);
    ms->dps = mem(GPT_M_MS_DPS, NULL);
    ms->dprob = mem(GPT_M_MS_DPROB, NULL);
    ms->dlogits = mem(GPT_M_MS_DLOGITS, NULL);
    ms->colsum = mem(GPT_M_MS_COLSUM, NULL);
    ms->counts = mem(GPT_M_MS_COUNTS, NULL);
    lib.head_a.lnf = mem(GPT_M_H_LNF, NULL);
    lib.head_a.lnf_mean = mem(GPT_M_H_LNF_MEAN, NULL);
    lib.head_a.lnf_rstd = mem(GPT_M_H_LNF_RSTD, NULL);
    lib.loss_dev = mem(GPT_M_X_LOSS, NULL);
    lib.stat_dev = mem(GPT_M_X_STAT, NULL);
    lib.sp_pack = mem(GPT_M_X_SP_PACK, NULL);
}

/* -- Parameters: the stage's tables, expanded for this rank ---------------------------------- */

/* The struct member a parameter (or its gradient) lives behind. */
static void **field_ptr(const lib_param *lp, int grad)
{
    int f = lp->p.field, e = lp->p.expert;
    if (lp->layer < 0) {
        lib_embed *em = grad ? &lib.embed_g : &lib.embed_p;
        lib_head *hd = grad ? &lib.head_g : &lib.head_p;
        switch (f) {
        case GPT_P_WTE: return &em->wte;
        case GPT_P_WPE: return &em->wpe;
        case GPT_P_LN_F_W: return &hd->ln_f_w;
        case GPT_P_LN_F_B: return &hd->ln_f_b;
        case GPT_P_HEAD_WTE: return &hd->wte;
        case GPT_P_LM_HEAD: return &hd->wte;      /* untied: the head's own weight */
        default: break;
        }
    } else {
        gpt_chunk *c = &gpt.chunk[lp->chunk];
        gpt_layer_params *l = grad ? &c->grads[lp->layer] : &c->params[lp->layer];
        switch (f) {
        case GPT_P_LN1_W: return &l->ln_1_w;
        case GPT_P_LN1_B: return &l->ln_1_b;
        case GPT_P_QKV_W: return &l->c_attn_w;
        case GPT_P_QKV_B: return &l->c_attn_b;
        case GPT_P_ATTN_PROJ_W: return &l->attn_proj_w;
        case GPT_P_ATTN_PROJ_B: return &l->attn_proj_b;
        case GPT_P_LN2_W: return &l->ln_2_w;
        case GPT_P_LN2_B: return &l->ln_2_b;
        case GPT_P_FC_W: return &l->c_fc_w;
        case GPT_P_FC_B: return &l->c_fc_b;
        case GPT_P_MLP_PROJ_W: return &l->mlp_proj_w;
        case GPT_P_MLP_PROJ_B: return &l->mlp_proj_b;
        case GPT_P_ROUTER_W: return &l->moe.router_w;
        case GPT_P_ROUTER_B: return &l->moe.router_b;
        case GPT_P_EXPERT_FC_W: return &l->moe.fc_w[e];
        case GPT_P_EXPERT_FC_B: return &l->moe.fc_b[e];
        case GPT_P_EXPERT_PROJ_W: return &l->moe.proj_w[e];
        case GPT_P_EXPERT_PROJ_B: return &l->moe.proj_b[e];
        case GPT_P_K_W: return &l->k_w;
        case GPT_P_V_W: return &l->v_w;
        case GPT_P_UP_W: return &l->up_w;
        case GPT_P_EXPERT_UP_W: return &l->moe.up_w[e];
        default: break;
        }
    }
    RT_CHECK(0, "parameter field %d does not belong %s (a generator bug)", f,
             lp->layer < 0 ? "outside a layer" : "in a layer");
    return NULL;
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

    lib.head = st->chunks[st->nchunks - 1].head;
    gpt.chunk = calloc((size_t)st->nchunks, sizeof *gpt.chunk);
    RT_CHECK(gpt.chunk, "out of memory");
    for (int c = 0; c < st->nchunks; c++) {
        const gpt_chunk_info *ci = &st->chunks[c];
        gpt_chunk *ch = &gpt.chunk[c];
        /* + 1: a chunk may hold no layer (a layout's embedding- or loss-only chunk) */
        ch->params = calloc((size_t)ci->layers + 1, sizeof *ch->params);
        ch->grads = calloc((size_t)ci->layers + 1, sizeof *ch->grads);
        ch->acts = calloc((size_t)ci->slots, sizeof *ch->acts);
        RT_CHECK(ch->params && ch->grads && ch->acts, "out of memory");
        if (d->moe)
            for (int j = 0; j < ci->layers; j++)
                for (int g = 0; g < 2; g++) {
                    gpt_moe_params *m = g ? &ch->grads[j].moe : &ch->params[j].moe;
                    size_t n = (size_t)d->experts_local;
                    m->fc_w = calloc(n, sizeof(void *));
                    m->fc_b = calloc(n, sizeof(void *));
                    m->proj_w = calloc(n, sizeof(void *));
                    m->proj_b = calloc(n, sizeof(void *));
                    m->up_w = calloc(n, sizeof(void *));
                    RT_CHECK(m->fc_w && m->fc_b && m->proj_w && m->proj_b && m->up_w,
                             "out of memory");
                    if (d->expert_bias && !g) {     /* host state, outside the plan */
                        m->ebias = calloc((size_t)d->experts, sizeof(float));
                        m->ecount = calloc((size_t)d->experts, sizeof(int));
                        RT_CHECK(m->ebias && m->ecount, "out of memory");
                    }
                }
        for (int s = 0; s < ci->slots; s++) {
            gpt_chunk_acts *a = &ch->acts[s];
            a->x = mem(GPT_M_C_X, NULL);
            a->dy = mem(GPT_M_C_DY, NULL);
            a->tokens = ci->embedding ? mem(GPT_M_C_TOKENS, NULL) : NULL;
            a->layer = calloc((size_t)ci->layers + 1, sizeof *a->layer);
            RT_CHECK(a->layer, "out of memory");
            for (int j = 0; j < ci->layers; j++)
                lib_layer_acts_alloc(&a->layer[j], ci->store ? &ci->store[j] : NULL);
        }
    }
    scratch_alloc();

    params_expand();
    for (int i = 0; i < lib.nparams; i++) {
        const lib_param *lp = &lib.params[i];
        *field_ptr(lp, 0) = lib_at(lib.pbuf[lp->p.buf], lp->p.offset);
        *field_ptr(lp, 1) = lib.gbuf[lp->p.buf] + lp->p.offset;
        if (lp->p.flags & GPT_SP_REDUCE) lib.sp_total += lp->p.n;
    }
    if (st->head_uses_wte) {     /* one stage holds both: the head uses wte itself (tied) */
        lib.head_p.wte = lib.embed_p.wte;
        lib.head_g.wte = lib.embed_g.wte;
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

/* bf16 training: the staging buffer gets the f32 main parameters, each rank's shards
** all-gathered over the buffer's data-parallel group with the distributed optimizer. */
void lib_master_fetch(void)
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

/* Sequence-parallel parameters: each tp rank saw N_SP of the tokens, so their gradients are
** summed over tp (docs/megatron.md §4.6); packed into one all-reduce. */
void gpt_sp_allreduce(rt_group *tp)
{
    size_t at = 0;
    for (int i = 0; i < lib.nparams; i++) {
        const gpt_param *p = &lib.params[i].p;
        if (!(p->flags & GPT_SP_REDUCE)) continue;
        rt_memcpy(lib.sp_pack + at, lib.gbuf[p->buf] + p->offset, p->n * sizeof(float), RT_D2D);
        at += p->n;
    }
    rt_allreduce(lib.sp_pack, lib.sp_total, RT_F32, RT_SUM, tp);
    at = 0;
    for (int i = 0; i < lib.nparams; i++) {
        const gpt_param *p = &lib.params[i].p;
        if (!(p->flags & GPT_SP_REDUCE)) continue;
        rt_memcpy(lib.gbuf[p->buf] + p->offset, lib.sp_pack + at, p->n * sizeof(float), RT_D2D);
        at += p->n;
    }
}

void gpt_grad_allreduce_range(int buf, size_t offset, size_t n, rt_group *g)
{
    rt_allreduce(lib.gbuf[buf] + offset, n, RT_F32, RT_SUM, g);
}

void gpt_grad_scale(int buf, float s)
{
    scale_inplace(lib.gbuf[buf], gpt.stage->buffers[buf].size, s);
}

void gpt_grad_allreduce(int buf, rt_group *g)
{
    rt_allreduce(lib.gbuf[buf], gpt.stage->buffers[buf].size, RT_F32, RT_SUM, g);
}

void gpt_grad_reduce_scatter(int buf, int bucket, rt_group *g)
{
    const gpt_buffer *b = &gpt.stage->buffers[buf];
    const gpt_bucket *k = &b->buckets[bucket];
    rt_reduce_scatter(lib.gbuf[buf] + k->start, lib.gbuf[buf] + shard_start(b, k), k->shard,
                      RT_F32, g);
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

typedef struct { int np; char *expert; } norm_parts;

static void norm_part(const lib_param *lp, size_t at, size_t n, void *ctx)
{
    const gpt_param *p = &lp->p;
    norm_parts *t = ctx;
    t->expert[t->np] = (char)gpt.stage->buffers[p->buf].expert;
    sumsq(lib.stat_dev + t->np++, lib.gbuf[p->buf] + at, n);
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
    RT_CHECK(expert, "out of memory");
    norm_parts parts_of = { 0, expert };
    counted_ranges(norm_part, &parts_of);
    np = parts_of.np;
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

void gpt_norm_allreduce(int which, rt_group *g)
{
    rt_allreduce(lib.stat_dev + lib.nparams + which, 1, RT_F32, RT_SUM, g);
}

double gpt_norm(int total)
{
    float red[3];
    rt_memcpy(red, lib.stat_dev + lib.nparams, sizeof red, RT_D2H);
    return total ? sqrt((double)red[2]) : sqrt((double)red[0] + (double)red[1]);
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
                adamw_step(main, lib.gbuf[bi] + lo, lib.mbuf[bi] + at, lib.vbuf[bi] + at,
                           hi - lo, in->lr, in->beta1, in->beta2, in->eps, wd, bc1, bc2, c,
                           lib.main ? lib_at(lib.pbuf[bi], lo) : NULL, gpt.d.act);
            }
        } else {
            size_t o = p->offset;
            float *main = lib.main ? lib.main[bi] + o : (float *)lib.pbuf[bi] + o;
            adamw_step(main, lib.gbuf[bi] + o, lib.mbuf[bi] + o, lib.vbuf[bi] + o, p->n,
                       in->lr, in->beta1, in->beta2, in->eps, wd, bc1, bc2, c,
                       lib.main ? lib_at(lib.pbuf[bi], o) : NULL, gpt.d.act);
        }
    }
}

void gpt_param_allgather(int buf, int bucket, rt_group *g)
{
    const gpt_buffer *b = &gpt.stage->buffers[buf];
    const gpt_bucket *k = &b->buckets[bucket];
    rt_allgather(lib_at(lib.pbuf[buf], shard_start(b, k)), lib_at(lib.pbuf[buf], k->start),
                 k->shard, gpt.d.act, g);
}

/* Every rank's share of the aux loss: the objective's term over the replicas and micro-batches. */
void gpt_aux_allreduce(rt_group *world, gpt_step_out *out)
{
    float a = (float)(gpt.moe_aux / ((double)gpt.d.nmb * gpt.prog->dp));
    float *dev = lib.stat_dev + lib.nparams + 2;
    rt_memcpy(dev, &a, sizeof a, RT_H2D);
    rt_allreduce(dev, 1, RT_F32, RT_SUM, world);
    rt_memcpy(&a, dev, sizeof a, RT_D2H);
    out->aux_loss = a;
}

/* The step's mean loss over the global batch: the head stage's tp-rank-0 ranks hold it. */
void gpt_loss_allreduce(const gpt_step_in *in, rt_group *world, gpt_step_out *out)
{
    float part = 0.0f;
    int nmb = gpt.d.nmb;
    if (lib.head && gpt.tp_rank == 0) {     /* cp ranks hold different tokens: all count */
        float *sums = malloc((size_t)nmb * sizeof(float));
        RT_CHECK(sums, "out of memory");
        double total = 0.0;
        rt_memcpy(sums, lib.loss_dev, (size_t)nmb * sizeof(float), RT_D2H);
        for (int k = 0; k < nmb; k++) total += sums[k];
        part = (float)(total / (double)gpt.prog->tokens_per_step);
        free(sums);
    }
    if (lib.fault & LIB_FAULT_INF_LOSS) part = INFINITY;
    /* with it, the ranks that want to stop (a signal, --exit-duration-in-mins): all agree;
    ** the norm's slots are free again (read by gpt_norm before this) */
    float both[2] = { part, in->stop ? 1.0f : 0.0f };
    float *dev = lib.stat_dev + lib.nparams;
    rt_memcpy(dev, both, sizeof both, RT_H2D);
    rt_allreduce(dev, 2, RT_F32, RT_SUM, world);
    rt_memcpy(both, dev, sizeof both, RT_D2H);
    out->loss = both[0];
    out->stop = both[1] > 0.0f;
}

/* -- The expert bias (aux-loss-free load balancing) ------------------------------------------ */

void lib_expert_bias_each(void (*fn)(int layer, float *bias, void *ctx), void *ctx)
{
    for (int c = 0; c < gpt.stage->nchunks; c++)
        for (int j = 0; j < gpt.stage->chunks[c].layers; j++)
            fn(gpt.stage->chunks[c].first + j, gpt.chunk[c].params[j].moe.ebias, ctx);
}

/*
** The step's tail (gpt_expert_bias_update, gpt.h), after the optimizer: Megatron's
** get_updated_expert_bias, layer by layer: the counts (kept rows per expert, every
** micro-batch) summed over dp-cp and tp, i.e. over every token of the step; the sign of
** mean - count is that of total - E * count, exact in integers; bias += rate * that sign
** (f32, as Megatron's buffer). A skipped step (out->skipped) leaves the biases as they were
** (the collectives run all the same: every rank skips alike).
*/
void gpt_expert_bias_update(const gpt_step_out *out)
{
    const int E = gpt.d.experts;
    for (int c = 0; c < gpt.stage->nchunks; c++)
        for (int j = 0; j < gpt.stage->chunks[c].layers; j++) {
            gpt_moe_params *m = &gpt.chunk[c].params[j].moe;
            /* >>> all-reduce of the counts over dp-cp, then tp */
            rt_memcpy(lib.ms.counts, m->ecount, (size_t)E * sizeof(int), RT_H2D);
            if (gpt.grp[GPT_GRP_DPCP]) rt_allreduce(lib.ms.counts, (size_t)E, RT_I32, RT_SUM,
                                                    gpt.grp[GPT_GRP_DPCP]);
            if (gpt.grp[GPT_GRP_TP]) rt_allreduce(lib.ms.counts, (size_t)E, RT_I32, RT_SUM,
                                                  gpt.grp[GPT_GRP_TP]);
            rt_memcpy(m->ecount, lib.ms.counts, (size_t)E * sizeof(int), RT_D2H);
            long long total = 0;
            for (int e = 0; e < E; e++) total += m->ecount[e];
            for (int e = 0; e < E; e++) {
                long long off = total - (long long)E * m->ecount[e];
                if (!out->skipped)
                    m->ebias[e] += gpt.d.bias_rate * (float)((off > 0) - (off < 0));
                m->ecount[e] = 0;
            }
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
