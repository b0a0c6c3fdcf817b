/*
** weights.c: the whole model's parameters as Hugging Face safetensors, layout-free: --init
** reads a file or the shards of an index (F32, BF16 or F16) after checking it against the
** model's tensor list, --save writes one file or a Hugging Face directory's files (hfdir.h)
** in F32 or BF16; without --init the seeded initialisation.
** Every rank reads and writes its own pieces (stage.h: lib.pieces) in the f32 parameters
** (lib_master). Called by gpt_main.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weights.h"
#include "fail.h"         // defines: lib_fail_file, lib_report_error
#include "hfdir.h"        // defines: lib_hf_is_dir, lib_hf_shards, lib_hf_begin, lib_hf_finish
#include "faults.h"       // defines: lib_fault_point
#include "safetensors.h"  // defines: st_file, st_index, st_open, st_read_f32, st_header, ...
#include "stage.h"        // defines: lib (tensors, pieces), lib_master, lib_expert_bias_each
#include "tensors.h"      // defines: lib_tensor, lib_tensor_find, lib_tensor_names
#include "world.h"        // defines: lib_world_barrier, lib_world_allreduce_max

/* -- Checking --init's checkpoint -------------------------------------------------------- */

/* Problems with the tensors of a checkpoint: each reported (rank 0, at most 20), counted. */
static int st_problems;

static void st_problem(const char *path, const char *fmt, ...) RT_PRINTF(2, 3);
static void st_problem(const char *path, const char *fmt, ...)
{
    if (st_problems++ < 20) {
        va_list ap;
        va_start(ap, fmt);
        lib_report_error(path, fmt, ap);
        va_end(ap);
    }
}

static const char *shape_text(char *buf, size_t cap, const long long *shape, int n)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* Non-parameter buffers that Hugging Face checkpoints may hold, by name suffix; --init skips
** them: GPT-2's causal masks, Llama's rotary frequencies. */
static const char *const st_buffers[] = {
    ".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"
};

static int st_buffer(const char *name)
{
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof st_buffers / sizeof *st_buffers; k++) {
        size_t m = strlen(st_buffers[k]);
        if (n > m && !strcmp(name + n - m, st_buffers[k])) return 1;
    }
    return 0;
}

/* Hugging Face families: told apart by a tensor name only they use (anchor) and, for a
** mixture-of-experts variant, a part of a name (marker); the first row that fits is the
** family (the variants come first). For the message about another architecture's checkpoint
** and the closing line of the problems. */
static const struct { const char *family, *anchor, *marker; } st_families[] = {
    { "Mixtral", "model.embed_tokens.weight", ".block_sparse_moe." },
    { "Llama", "model.embed_tokens.weight", NULL },
    { "GPT-2", "wte.weight", NULL }, { "GPT-2", "transformer.wte.weight", NULL },
};

static const char *family_of(const char *const *names, int n)
{
    for (size_t k = 0; k < sizeof st_families / sizeof *st_families; k++) {
        int anchor = 0, marker = !st_families[k].marker;
        for (int i = 0; i < n; i++) {
            anchor |= !strcmp(names[i], st_families[k].anchor);
            marker |= st_families[k].marker && strstr(names[i], st_families[k].marker);
        }
        if (anchor && marker) return st_families[k].family;
    }
    return NULL;
}

/* The model --init's checkpoint is checked against: its tensors and, for messages, its name
** (set by lib_weights_load and lib_weights_read before st_check). */
static struct {
    const lib_tensor *tensors;
    int n;
    const char *model;
} chk;

/* The model's tensor names (a malloc'd array of chk.n pointers). */
static const char **model_names(void)
{
    return lib_tensor_names(chk.tensors, chk.n);
}

/* GPT2LMHeadModel.save_pretrained writes GPT-2's names under this prefix (GPT2Model, and
** Hugging Face's gpt2 checkpoints, without). */
static const char gpt2_prefix[] = "transformer.";

/* The model's tensor named 'name' (GPT-2's with or without gpt2_prefix), or -1. */
static int tensor_named(const char *name)
{
    int t = lib_tensor_find(chk.tensors, chk.n, name);
    size_t n = strlen(gpt2_prefix);
    if (t < 0 && !strncmp(name, gpt2_prefix, n))
        t = lib_tensor_find(chk.tensors, chk.n, name + n);
    return t;
}

/* A model whose LM head is its embedding (GPT-2; Llama with tie_embeddings) has no
** "lm_head.weight"; a checkpoint may still hold the head as a copy of the embedding (a
** state_dict of GPT2LMHeadModel). For that name: the embedding's tensor; else -1. */
static const char head_name[] = "lm_head.weight";
static const char *const embedding_names[] = { "wte.weight", "model.embed_tokens.weight" };

static int tied_head_of(const char *name)
{
    if (strcmp(name, head_name) || tensor_named(name) >= 0) return -1;
    for (size_t k = 0; k < sizeof embedding_names / sizeof *embedding_names; k++) {
        int t = tensor_named(embedding_names[k]);
        if (t >= 0) return t;
    }
    return -1;
}

/* "'a', 'b', ..." from the first two of names[n] ("no tensors" when n = 0). */
static const char *names_text(char *buf, size_t cap, const char *const *names, int n)
{
    if (n == 0) snprintf(buf, cap, "no tensors");
    else snprintf(buf, cap, "'%s'%s%s%s%s", names[0], n > 1 ? ", '" : "", n > 1 ? names[1] : "",
                  n > 1 ? "'" : "", n > 2 ? ", ..." : "");
    return buf;
}

/* Where --init's tensors come from: one safetensors file, or the shards an index names. */
typedef struct {
    char path[ST_PATH_MAX];      /* the file, or the index (--init, or --init/NAME) */
    int is_index;
    st_index ix;                 /* is_index */
    int nfiles;                  /* 1, or the index's shards */
    st_file *files;              /* [nfiles]; fd < 0: could not be opened (err says why) */
    char (*fpath)[ST_PATH_MAX];  /* [nfiles] */
    char (*err)[256];            /* [nfiles] */
    const st_tensor **found;     /* [ntensors]: each model tensor's entry, NULL if none */
    int *found_file;             /* [ntensors]: the file of that entry */
    const st_tensor *head;       /* a tied model's lm_head.weight in the checkpoint, or NULL */
    int head_file, head_of;      /* its file; the embedding tensor it must equal */
} init_src;

/*
** Resolve --init's path and open what it names. A path that is not there, a directory without
** a checkpoint, a malformed index and (for a single file) a malformed header fail at once; the
** shards of an index are opened quietly, their failures kept for init_check_index.
*/
static void init_open(init_src *s, const char *arg)
{
    char err[256];
    memset(s, 0, sizeof *s);
    if (st_resolve(arg, s->path, sizeof s->path, &s->is_index, err, sizeof err))
        lib_fail_file(arg, "%s", err);
    if (s->is_index && st_index_read(&s->ix, s->path, err, sizeof err))
        lib_fail_file(s->path, "%s", err);
    s->nfiles = s->is_index ? s->ix.nshards : 1;
    int n = s->nfiles ? s->nfiles : 1;
    s->files = calloc((size_t)n, sizeof *s->files);
    s->fpath = calloc((size_t)n, sizeof *s->fpath);
    s->err = calloc((size_t)n, sizeof *s->err);
    s->found = calloc((size_t)chk.n, sizeof *s->found);
    s->found_file = calloc((size_t)chk.n, sizeof *s->found_file);
    RT_CHECK(s->files && s->fpath && s->err && s->found && s->found_file, "out of memory");
    if (!s->is_index) {
        snprintf(s->fpath[0], sizeof s->fpath[0], "%s", s->path);
        if (st_open(&s->files[0], s->path, err, sizeof err)) lib_fail_file(s->path, "%s", err);
        return;
    }
    for (int k = 0; k < s->nfiles; k++) {
        st_index_shard_path(&s->ix, k, s->path, s->fpath[k], sizeof s->fpath[k]);
        st_open(&s->files[k], s->fpath[k], s->err[k], sizeof s->err[k]);
    }
}

static void init_close(init_src *s)
{
    for (int k = 0; k < s->nfiles; k++)
        if (s->files[k].fd >= 0) st_close(&s->files[k]);
    st_index_free(&s->ix);
    free(s->files);
    free(s->fpath);
    free(s->err);
    free(s->found);
    free(s->found_file);
}

/* The first opened shard other than 'skip' that holds 'name', or -1. */
static int shard_holding(const init_src *s, const char *name, int skip)
{
    for (int k = 0; k < s->nfiles; k++)
        if (k != skip && s->files[k].fd >= 0 && st_find(&s->files[k], name)) return k;
    return -1;
}

/*
** A checkpoint of another architecture: when it is of another family (st_families) than the
** model, or fewer than a tenth of the model's tensors are named in it (the index's weight_map
** and its shards, or the file's header), fail with one line naming the first tensors of both
** (their families where known), not a line per tensor.
*/
static void init_foreign(const init_src *s)
{
    int cap = s->is_index ? s->ix.n : 0, n = 0, matched = 0;
    for (int k = 0; k < s->nfiles; k++) cap += s->files[k].fd >= 0 ? s->files[k].n : 0;
    const char **names = malloc(sizeof *names * (size_t)(cap ? cap : 1));
    char *seen = calloc((size_t)chk.n, 1);
    RT_CHECK(names && seen, "out of memory");
    for (int i = 0; s->is_index && i < s->ix.n; i++)
        if (!st_buffer(s->ix.map[i].name)) names[n++] = s->ix.map[i].name;
    for (int k = 0; k < s->nfiles; k++)
        for (int i = 0; s->files[k].fd >= 0 && i < s->files[k].n; i++) {
            const char *name = s->files[k].t[i].name;
            if (!st_buffer(name) && (!s->is_index || !st_index_find(&s->ix, name)))
                names[n++] = name;
        }
    for (int i = 0; i < n; i++) {
        int t = tensor_named(names[i]);
        if (t >= 0 && !seen[t]) {
            seen[t] = 1;
            matched++;
        }
    }
    free(seen);
    const char **want = model_names();
    const char *ff = family_of(names, n), *mf = family_of(want, chk.n);
    int other = ff && mf && strcmp(ff, mf);
    if (10 * matched >= chk.n && !other) {
        free(names);
        free(want);
        return;
    }
    char have_text[2 * ST_NAME_MAX + 32], want_text[2 * ST_NAME_MAX + 32], needs[64];
    names_text(have_text, sizeof have_text, names, n);
    names_text(want_text, sizeof want_text, want, chk.n);
    const char *what = s->is_index ? "this checkpoint" : "this file";
    free(names);
    free(want);
    if (mf) snprintf(needs, sizeof needs, "Hugging Face %s names", mf);
    else snprintf(needs, sizeof needs, "the names");
    if (other)
        lib_fail_file(s->path, "%s holds %s tensor names (%s) but the model (%s) needs %s (%s): "
                      "convert the checkpoint or pick the matching model", what, ff, have_text,
                      chk.model, needs, want_text);
    char count[32] = "none";
    if (matched) snprintf(count, sizeof count, "only %d", matched);
    lib_fail_file(s->path, "%s of the model's %d tensors are in %s, which holds %s, but the "
                  "model (%s) needs %s (%s): convert the checkpoint or pick the matching model",
                  count, chk.n, what, have_text, chk.model, needs, want_text);
}

/* Entry e of file k for model tensor t (head: the tied head, which has t's shape): shape,
** dtype and data offsets, reported against the file. The first entry of a tensor is the one
** read; a second is a problem. */
static void check_entry_of(init_src *s, int k, const st_tensor *e, int t, int head)
{
    const st_tensor **found = head ? &s->head : &s->found[t];
    int *found_file = head ? &s->head_file : &s->found_file[t];
    char s1[64], s2[64];
    const char *path = s->fpath[k];
    const lib_tensor *ti = &chk.tensors[t];
    long long want[2] = { ti->rows, ti->cols };
    long long rows = e->ndim == 2 ? e->shape[0] : 1, cols = e->ndim == 2 ? e->shape[1]
                                                                     : e->shape[0];
    int ok_dtype = e->dtype == ST_F32 || e->dtype == ST_BF16 || e->dtype == ST_F16;
    if (*found)
        st_problem(path, "tensor '%s' appears twice", e->name);
    else if (e->ndim != ti->ndim || rows != ti->rows || cols != ti->cols)
        st_problem(path, "tensor '%s' has shape %s, expected %s", e->name,
                   shape_text(s1, sizeof s1, e->shape,
                              e->ndim <= ST_MAX_DIMS ? e->ndim : ST_MAX_DIMS),
                   shape_text(s2, sizeof s2, want + 2 - ti->ndim, ti->ndim));
    else if (!ok_dtype)
        st_problem(path, "tensor '%s' has dtype '%s'; expected F32, BF16 or F16", e->name,
                   e->dtype_name);
    else if (!st_extent_ok(&s->files[k], e))
        st_problem(path, "tensor '%s' has data_offsets [%lld, %lld]: they must span its "
                   "%lld bytes inside the file", e->name, e->begin, e->end,
                   rows * cols * st_dtype_size(e->dtype));
    if (!*found) {
        *found = e;
        *found_file = k;
        if (head) s->head_of = t;
    }
}

static void check_entry(init_src *s, int k, const st_tensor *e, int t)
{
    check_entry_of(s, k, e, t, 0);
}

/* One file: every tensor of its header is the model's (or a buffer), every model tensor is
** in it. */
static void init_check_file(init_src *s)
{
    const st_file *f = &s->files[0];
    for (int i = 0; i < f->n; i++) {
        const st_tensor *e = &f->t[i];
        int t = tensor_named(e->name), h = tied_head_of(e->name);
        if (t >= 0) check_entry(s, 0, e, t);
        else if (h >= 0) check_entry_of(s, 0, e, h, 1);
        else if (!st_buffer(e->name))
            st_problem(s->path, "unexpected tensor '%s' (not a parameter of this model)",
                       e->name);
    }
    for (int t = 0; t < chk.n; t++)
        if (!s->found[t]) {
            char s1[64];
            const lib_tensor *ti = &chk.tensors[t];
            long long want[2] = { ti->rows, ti->cols };
            st_problem(s->path, "missing tensor '%s' %s", ti->name,
                       shape_text(s1, sizeof s1, want + 2 - ti->ndim, ti->ndim));
        }
}

/*
** An index and its shards: each shard opened; each model tensor in the weight_map, mapped to
** a shard that holds it; each name of the weight_map and of the shards the model's (or a
** buffer); each tensor in the shard the index names, once, and checked there.
*/
static void init_check_index(init_src *s)
{
    const st_index *ix = &s->ix;
    char s1[64];
    for (int k = 0; k < s->nfiles; k++) {
        if (s->files[k].fd >= 0) continue;
        int mapped = 0;
        for (int i = 0; i < ix->n; i++) mapped += ix->map[i].shard == k;
        st_problem(s->fpath[k], "%s; the index maps %d tensor%s to this shard", s->err[k],
                   mapped, mapped == 1 ? "" : "s");
    }
    for (int t = 0; t < chk.n; t++) {
        const lib_tensor *ti = &chk.tensors[t];
        const st_entry *e = st_index_find(ix, ti->name);
        if (!e) {
            long long want[2] = { ti->rows, ti->cols };
            int k = shard_holding(s, ti->name, -1);
            if (k >= 0)
                st_problem(s->path, "tensor '%s' is in '%s' but not in the weight_map",
                           ti->name, ix->shard[k]);
            else
                st_problem(s->path, "missing tensor '%s' %s", ti->name,
                           shape_text(s1, sizeof s1, want + 2 - ti->ndim, ti->ndim));
        } else if (s->files[e->shard].fd >= 0 && !st_find(&s->files[e->shard], ti->name)) {
            int k = shard_holding(s, ti->name, e->shard);
            char also[ST_NAME_MAX + 32] = "";
            if (k >= 0) snprintf(also, sizeof also, " (it is in '%s')", ix->shard[k]);
            st_problem(s->path, "tensor '%s' is mapped to '%s', which does not hold it%s",
                       ti->name, ix->shard[e->shard], also);
        }
    }
    for (int i = 0; i < ix->n; i++) {
        const st_entry *e = &ix->map[i];
        int head = tied_head_of(e->name) >= 0;
        if (tensor_named(e->name) < 0 && !st_buffer(e->name) && !head)
            st_problem(s->path, "unexpected tensor '%s' (not a parameter of this model)",
                       e->name);
        if (head && s->files[e->shard].fd >= 0 && !st_find(&s->files[e->shard], e->name))
            st_problem(s->path, "tensor '%s' is mapped to '%s', which does not hold it",
                       e->name, ix->shard[e->shard]);
    }
    for (int k = 0; k < s->nfiles; k++)
        for (int i = 0; s->files[k].fd >= 0 && i < s->files[k].n; i++) {
            const st_tensor *te = &s->files[k].t[i];
            const st_entry *e = st_index_find(ix, te->name);
            int t = tensor_named(te->name), h = tied_head_of(te->name);
            if (h >= 0 && e && e->shard == k) check_entry_of(s, k, te, h, 1);
            if (!e) {       /* a model tensor not in the index is reported above */
                if (t < 0 && h < 0 && !st_buffer(te->name))
                    st_problem(s->fpath[k], "unexpected tensor '%s' (not in the index, not a "
                               "parameter of this model)", te->name);
            } else if (t >= 0 && e->shard == k) {
                check_entry(s, k, te, t);
            } else if (t >= 0 && s->files[e->shard].fd >= 0 &&
                       st_find(&s->files[e->shard], te->name)) {
                st_problem(s->fpath[k], "tensor '%s' is also in this shard; the index maps it "
                           "to '%s'", te->name, ix->shard[e->shard]);
            }
        }
}

/*
** Open --init's checkpoint (a safetensors file, an index, or a directory holding one; see
** init_open) and check it: every tensor of the model present once with its shape, in F32,
** BF16 or F16, inside its file; nothing else but Hugging Face's buffers (st_buffers) and a
** tied model's head (tied_head_of, checked equal to the embedding when loaded). GPT-2's names
** may carry GPT2LMHeadModel's "transformer." prefix. A
** checkpoint of another architecture fails in one line (init_foreign); other problems (up to
** 20 shown) are all reported, then the load fails. Fills s->found and s->found_file.
*/
static void st_check(init_src *s, const char *arg)
{
    init_open(s, arg);
    init_foreign(s);
    st_problems = 0;
    if (s->is_index) init_check_index(s);
    else init_check_file(s);
    if (st_problems) {
        const char **want = model_names();
        const char *mf = family_of(want, chk.n);
        free(want);
        char names[64];
        snprintf(names, sizeof names, "%s%s", mf ? "Hugging Face " : "their Hugging Face",
                 mf ? mf : "");
        lib_fail_file(s->path, "not loaded (%d problem%s): --init needs the %d tensors of this "
                      "model, with %s names and shapes, in F32, BF16 or F16", st_problems,
                      st_problems > 1 ? "s" : "", chk.n, names);
    }
}

/* -- Initialising, loading and saving ----------------------------------------------------- */

/* Copy a host (rows, cols) block into / out of a local tensor at (lrow, lcol), stride ld, in
** the f32 parameters (lib_master). */
static void piece_copy(const lib_piece *pc, float *host, int to_device)
{
    const lib_param *lp = &lib.params[pc->param];
    float *base = lib_master(lp->p.buf) + lp->p.offset + (size_t)pc->lrow * lp->p.ld + pc->lcol;
    if (pc->cols == lp->p.ld) {
        size_t bytes = (size_t)pc->rows * pc->cols * sizeof(float);
        if (to_device) rt_memcpy(base, host, bytes, RT_H2D);
        else rt_memcpy(host, base, bytes, RT_D2H);
        return;
    }
    for (int r = 0; r < pc->rows; r++) {
        float *row = base + (size_t)r * lp->p.ld, *h = host + (size_t)r * pc->cols;
        if (to_device) rt_memcpy(row, h, (size_t)pc->cols * sizeof(float), RT_H2D);
        else rt_memcpy(h, row, (size_t)pc->cols * sizeof(float), RT_D2H);
    }
}

enum { ELEM_BITS = 40 };         /* a non-finite weight's key: tensor << 40 | element */

/* The first non-finite of the n values v, elements first.. of tensor t: its key into *bad
** when smaller (-1: none yet), so that every rank can agree on the first of the world's. */
static void find_nonfinite(const float *v, size_t n, int t, long long first, long long *bad)
{
    for (size_t k = 0; k < n; k++)
        if (!isfinite(v[k])) {
            long long key = (long long)t << ELEM_BITS | (first + (long long)k);
            if (*bad < 0 || key < *bad) *bad = key;
            return;
        }
}

typedef struct { init_src *s; long long bad; } ebias_ctx;

/* The expert bias of a layer from the --init files (every rank reads its layers' whole). */
static void ebias_load(int layer, float *bias, void *ctx)
{
    ebias_ctx *c = ctx;
    init_src *s = c->s;
    int t = lib.ebias_tensor + layer, k = s->found_file[t];
    RT_CHECK(st_read_f32(&s->files[k], s->found[t], 0, lib.tensors[t].cols, bias) == 0,
             "%s: read failed: %s", s->fpath[k], strerror(errno));
    find_nonfinite(bias, (size_t)lib.tensors[t].cols, t, 0, &c->bad);
}

/* Every rank alike: when a rank read a weight that is not finite (its first: 'bad', -1 if
** none), fail naming the world's first, its tensor, element and value. */
static void check_finite(init_src *s, long long bad)
{
    long long key = bad < 0 ? 0 : LLONG_MAX - bad;
    lib_world_allreduce_max(&key);
    if (!key) return;
    bad = LLONG_MAX - key;
    int t = (int)(bad >> ELEM_BITS), k = s->found_file[t];
    long long e = bad & ((1ll << ELEM_BITS) - 1);
    const lib_tensor *ti = &lib.tensors[t];
    float x = 0;
    RT_CHECK(st_read_f32(&s->files[k], s->found[t], e, 1, &x) == 0, "%s: read failed: %s",
             s->fpath[k], strerror(errno));
    char at[64] = "";
    if (ti->ndim == 2)
        snprintf(at, sizeof at, " (row %lld, column %lld)", e / ti->cols, e % ti->cols);
    char value[32] = "nan";
    if (!isnan(x)) snprintf(value, sizeof value, "%g", (double)x);
    lib_fail_file(s->fpath[k], "tensor '%s' element %lld%s is %s: every weight --init loads "
                  "must be a finite number", ti->name, e, at, value);
}

/*
** A tied head in the checkpoint must be the embedding's copy: each rank compares the rows of
** the embedding it read (v: n values from element 'first') with the head's; the first that
** differs (bit for bit, as f32) into *bad, as find_nonfinite.
*/
static void compare_head(init_src *s, const float *v, size_t n, long long first, long long *bad)
{
    float *h = malloc(n * sizeof *h + 1);
    RT_CHECK(h, "out of memory");
    RT_CHECK(st_read_f32(&s->files[s->head_file], s->head, first, (long long)n, h) == 0,
             "%s: read failed: %s", s->fpath[s->head_file], strerror(errno));
    for (size_t k = 0; k < n; k++)
        if (memcmp(&h[k], &v[k], sizeof *h)) {
            long long key = first + (long long)k;
            if (*bad < 0 || key < *bad) *bad = key;
            break;
        }
    free(h);
}

/* Every rank alike: when some rank's embedding rows differ from the tied head's (its first
** such element 'bad', -1 if none), fail naming the world's first. Hugging Face ties the head
** after loading and ignores the copy; a head that differs means an untied model, which this
** one is not, so it is refused rather than dropped. */
static void check_head(init_src *s, long long bad)
{
    long long key = bad < 0 ? 0 : LLONG_MAX - bad;
    lib_world_allreduce_max(&key);
    if (!key) return;
    bad = LLONG_MAX - key;
    const lib_tensor *ti = &chk.tensors[s->head_of];
    float x = 0, y = 0;
    RT_CHECK(st_read_f32(&s->files[s->head_file], s->head, bad, 1, &x) == 0 &&
             st_read_f32(&s->files[s->found_file[s->head_of]], s->found[s->head_of], bad, 1,
                         &y) == 0, "%s: read failed: %s", s->path, strerror(errno));
    lib_fail_file(s->fpath[s->head_file], "tensor '%s' differs from '%s' at element %lld (row "
                  "%lld, column %lld: %.9g, not %.9g): the model (%s) ties its LM head to the "
                  "embedding, so a checkpoint may hold the head only as the embedding's copy",
                  head_name, s->found[s->head_of]->name, bad, bad / ti->cols, bad % ti->cols,
                  (double)x, (double)y, chk.model);
}

/*
** --init PATH: every rank reads its own pieces straight from the files that hold them (no
** communication; each rank opens the checkpoint's files and checks their headers alike, and a
** bad checkpoint fails every rank alike, lib_fail_file), and every weight must be finite (the
** first that is not is named, check_finite). Then the parameters are effective
** (lib_master_commit).
*/
void lib_weights_load(const char *arg)
{
    init_src s;
    chk.tensors = lib.tensors;
    chk.n = lib.ntensors;
    chk.model = gpt.prog->model;
    st_check(&s, arg);
    long long bad = -1;         /* the first non-finite weight this rank read (find_nonfinite) */
    long long head_bad = -1;    /* the first element of a tied head that differs (compare_head) */
    for (int i = 0; i < lib.npieces; i++) {
        const lib_piece *pc = &lib.pieces[i];
        int t = lib.params[pc->param].tensor, k = s.found_file[t];
        const lib_tensor *ti = &lib.tensors[t];
        float *host = malloc((size_t)pc->rows * pc->cols * sizeof(float));
        RT_CHECK(host, "out of memory");
        for (int r = 0; r < pc->rows; r++) {
            long long first = (long long)(pc->grow + r) * ti->cols + pc->gcol;
            RT_CHECK(st_read_f32(&s.files[k], s.found[t], first, pc->cols,
                                 host + (size_t)r * pc->cols) == 0,
                     "%s: read failed: %s", s.fpath[k], strerror(errno));
            find_nonfinite(host + (size_t)r * pc->cols, (size_t)pc->cols, t, first, &bad);
            if (s.head && t == s.head_of)
                compare_head(&s, host + (size_t)r * pc->cols, (size_t)pc->cols, first,
                             &head_bad);
        }
        piece_copy(pc, host, 1);
        free(host);
    }
    ebias_ctx ec = { &s, bad };
    if (lib.ebias_tensor >= 0) lib_expert_bias_each(ebias_load, &ec);
    check_finite(&s, ec.bad);
    check_head(&s, head_bad);
    init_close(&s);
    lib_master_commit();
}

/*
** --init PATH for a one-process program (generate): every tensor of ts[0..n) read whole, as
** f32, and handed to take(t, data, ctx) in order (data: rows*cols floats, valid during the
** call: one tensor in host memory at a time), after the same checks as lib_weights_load
** (st_check: missing, extra, misshapen tensors, another architecture); a weight that is not
** finite fails naming it. 'model' names the model in messages. Needs no stage and issues no
** communication.
*/
void lib_weights_read(const char *arg, const lib_tensor *ts, int n, const char *model,
                      void (*take)(int t, const float *data, void *ctx), void *ctx)
{
    init_src s;
    chk.tensors = ts;
    chk.n = n;
    chk.model = model;
    st_check(&s, arg);
    for (int t = 0; t < n; t++) {
        size_t count = (size_t)ts[t].rows * ts[t].cols;
        int k = s.found_file[t];
        float *data = malloc(count * sizeof(float));
        RT_CHECK(data, "out of memory");
        RT_CHECK(st_read_f32(&s.files[k], s.found[t], 0, (long long)count, data) == 0,
                 "%s: read failed: %s", s.fpath[k], strerror(errno));
        long long bad = -1;
        find_nonfinite(data, count, t, 0, &bad);
        if (bad >= 0) {
            long long e = bad & ((1ll << ELEM_BITS) - 1);
            char at[64] = "";
            if (ts[t].ndim == 2)
                snprintf(at, sizeof at, " (row %lld, column %lld)", e / ts[t].cols,
                         e % ts[t].cols);
            lib_fail_file(s.fpath[k], "tensor '%s' element %lld%s is %g: every weight --init "
                          "loads must be a finite number", ts[t].name, e, at, (double)data[e]);
        }
        take(t, data, ctx);
        free(data);
    }
    init_close(&s);
}

static void ebias_zero(int layer, float *bias, void *ctx)
{
    (void)ctx;
    memset(bias, 0, (size_t)lib.tensors[lib.ebias_tensor + layer].cols * sizeof(float));
}

/*
** The initialisation without --init: element (r, c) of tensor t depends on (seed, t's name,
** r*cols + c) only, so every layout initialises the same model; expert biases are zero.
*/
void lib_weights_init(unsigned long long seed)
{
    for (int i = 0; i < lib.npieces; i++) {
        const lib_piece *pc = &lib.pieces[i];
        const lib_param *lp = &lib.params[pc->param];
        const lib_tensor *ti = &lib.tensors[lp->tensor];
        float *base = lib_master(lp->p.buf) + lp->p.offset + (size_t)pc->lrow * lp->p.ld +
                      pc->lcol;
        if (ti->init == GPT_INIT_NORMAL) {
            rt_rng_normal(base, pc->rows, pc->cols, lp->p.ld, seed, ti->stream,
                          (uint64_t)pc->grow * ti->cols + pc->gcol, (uint64_t)ti->cols, 0.0f,
                          ti->std);
        } else {
            size_t n = (size_t)pc->rows * pc->cols;
            float *host = malloc(n * sizeof(float));
            RT_CHECK(host, "out of memory");
            for (size_t k = 0; k < n; k++) host[k] = ti->init == GPT_INIT_ONE ? 1.0f : 0.0f;
            piece_copy(pc, host, 1);
            free(host);
        }
    }
    if (lib.ebias_tensor >= 0) lib_expert_bias_each(ebias_zero, NULL);   /* Megatron: zeros */
    lib_master_commit();
}

/*
** Where --save writes: one file (PATH.tmp, renamed to PATH) or a Hugging Face directory's
** safetensors files (DIR.tmp/NAME, hfdir.h), every tensor in one of them at its offset. All
** ranks make the same plan from the model's tensor list.
*/
typedef struct {
    int dir;                     /* --save DIR */
    st_dtype dtype;              /* F32, or BF16 (--save-dtype bf16) */
    int nfiles;
    char tmpdir[ST_PATH_MAX];    /* dir: DIR.tmp */
    char (*path)[ST_PATH_MAX];   /* [nfiles] where each file is written */
    int *file_of;                /* [ntensors] */
    st_tensor *ts;               /* [ntensors] names, shapes, offsets in their file's data */
    long long *data0;            /* [nfiles] header bytes: where the data starts */
    unsigned char **hdr;         /* [nfiles] */
    long long bytes;             /* every file's bytes */
} save_plan;

static void plan_make(save_plan *p, const lib_flags *f)
{
    int n = lib.ntensors;
    memset(p, 0, sizeof *p);
    p->dir = lib_hf_is_dir(f->save);
    p->dtype = f->save_bf16 ? ST_BF16 : ST_F32;
    p->ts = calloc((size_t)n, sizeof *p->ts);
    p->file_of = calloc((size_t)n, sizeof *p->file_of);
    long long *bytes = calloc((size_t)n, sizeof *bytes);
    st_tensor *one = calloc((size_t)n, sizeof *one);
    RT_CHECK(p->ts && p->file_of && bytes && one, "out of memory");
    for (int t = 0; t < n; t++) {
        const lib_tensor *ti = &lib.tensors[t];
        snprintf(p->ts[t].name, sizeof p->ts[t].name, "%s", ti->name);
        p->ts[t].dtype = p->dtype;
        p->ts[t].ndim = ti->ndim;
        p->ts[t].shape[0] = ti->ndim == 2 ? ti->rows : ti->cols;
        p->ts[t].shape[1] = ti->cols;
        bytes[t] = (long long)ti->rows * ti->cols * st_dtype_size(p->dtype);
    }
    p->nfiles = p->dir ? lib_hf_shards(bytes, n, f->save_shard_bytes, p->file_of) : 1;
    p->path = calloc((size_t)p->nfiles, sizeof *p->path);
    p->data0 = calloc((size_t)p->nfiles, sizeof *p->data0);
    p->hdr = calloc((size_t)p->nfiles, sizeof *p->hdr);
    RT_CHECK(p->path && p->data0 && p->hdr, "out of memory");
    if (p->dir) snprintf(p->tmpdir, sizeof p->tmpdir, "%s%s", f->save, HF_TMP_SUFFIX);
    for (int k = 0; k < p->nfiles; k++) {
        int m = 0;                  /* file k's tensors, in checkpoint order */
        for (int t = 0; t < n; t++)
            if (p->file_of[t] == k) one[m++] = p->ts[t];
        size_t len;
        p->hdr[k] = st_header(one, m, &len);
        RT_CHECK(p->hdr[k], "out of memory");
        p->data0[k] = (long long)len;
        p->bytes += (long long)len + (m ? one[m - 1].end : 0);
        for (int t = 0, j = 0; t < n; t++)
            if (p->file_of[t] == k) p->ts[t] = one[j++];
        char name[64];
        lib_hf_file_name(k, p->nfiles, name, sizeof name);
        if (p->dir) snprintf(p->path[k], sizeof p->path[k], "%.4000s/%s", p->tmpdir, name);
        else snprintf(p->path[k], sizeof p->path[k], "%.4000s.tmp", f->save);
    }
    free(bytes);
    free(one);
}

static void plan_free(save_plan *p)
{
    for (int k = 0; k < p->nfiles; k++) free(p->hdr[k]);
    free(p->hdr);
    free(p->data0);
    free(p->path);
    free(p->file_of);
    free(p->ts);
}

/* F32 bits to BF16 bits, rounded to nearest even as torch's .to(torch.bfloat16); a NaN stays
** a quiet NaN. */
static uint16_t to_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}

/* Write n values of tensor t, elements first.., at their place in the plan (fds: each file's
** descriptor, opened on first use). */
static void plan_write(const save_plan *p, int *fds, int t, long long first, const float *v,
                       size_t n)
{
    int k = p->file_of[t], size = st_dtype_size(p->dtype);
    if (fds[k] < 0) {
        fds[k] = open(p->path[k], O_WRONLY);
        RT_CHECK(fds[k] >= 0, "%s: cannot open: %s", p->path[k], strerror(errno));
    }
    const void *bytes = v;
    uint16_t *half = NULL;
    if (p->dtype == ST_BF16) {
        half = malloc(n * sizeof *half + 1);
        RT_CHECK(half, "out of memory");
        for (size_t i = 0; i < n; i++) half[i] = to_bf16(v[i]);  /* little-endian hosts */
        bytes = half;
    }
    off_t at = (off_t)(p->data0[k] + p->ts[t].begin + first * size);
    RT_CHECK(pwrite(fds[k], bytes, n * (size_t)size, at) == (ssize_t)(n * (size_t)size),
             "%s: write failed: %s", p->path[k], strerror(errno));
    free(half);
}

static void plan_close(const save_plan *p, int *fds)
{
    for (int k = 0; k < p->nfiles; k++)
        if (fds[k] >= 0) {
            RT_CHECK(fsync(fds[k]) == 0, "%s: fsync failed: %s", p->path[k], strerror(errno));
            close(fds[k]);
            fds[k] = -1;
        }
}

typedef struct { const save_plan *p; int *fds; } save_dst;

static void ebias_save(int layer, float *bias, void *ctx)
{
    const save_dst *d = ctx;
    int t = lib.ebias_tensor + layer;
    plan_write(d->p, d->fds, t, 0, bias, (size_t)lib.tensors[t].cols);
}

/* The bytes --save writes (for the start-up check of its room, faults.h). */
long long lib_weights_save_bytes(const lib_flags *f)
{
    save_plan p;
    plan_make(&p, f);
    long long total = p.bytes;
    plan_free(&p);
    return total;
}

/*
** --save PATH: rank 0 makes the files (DIR.tmp first for a directory), each with its header
** and sized to its final length; every owner of a piece (data-parallel rank 0; tp rank 0 for
** replicated tensors; never the tied copy) writes its rows at their offsets, converted to the
** --save-dtype; after a barrier rank 0 syncs, then renames PATH.tmp to PATH, or finishes the
** directory (hfdir.h: index, config, tokenizer, rename). Written whole or not at all. The
** values are the f32 (main) parameters. Collective over the world (every rank calls it); an
** I/O error stops the job (RT_CHECK) before the rename.
*/
void lib_weights_save(const lib_flags *f)
{
    lib_sync();
    lib_master_allgather();
    save_plan p;
    plan_make(&p, f);
    int *fds = malloc(sizeof *fds * (size_t)p.nfiles);
    RT_CHECK(fds, "out of memory");
    for (int k = 0; k < p.nfiles; k++) fds[k] = -1;
    if (rt_rank() == 0) {
        lib_fault_point();
        if (p.dir) lib_hf_begin(f->save, p.tmpdir, sizeof p.tmpdir);
        for (int k = 0; k < p.nfiles; k++) {
            int fd = open(p.path[k], O_WRONLY | O_CREAT | O_TRUNC, 0644);
            long long end = p.data0[k];
            for (int t = 0; t < lib.ntensors; t++)
                if (p.file_of[t] == k && p.data0[k] + p.ts[t].end > end)
                    end = p.data0[k] + p.ts[t].end;
            RT_CHECK(fd >= 0, "%s: cannot create: %s", p.path[k], strerror(errno));
            RT_CHECK(pwrite(fd, p.hdr[k], (size_t)p.data0[k], 0) == (ssize_t)p.data0[k] &&
                     ftruncate(fd, end) == 0, "%s: write failed: %s", p.path[k],
                     strerror(errno));
            close(fd);
        }
    }
    lib_world_barrier();
    for (int i = 0; i < lib.npieces; i++) {
        const lib_piece *pc = &lib.pieces[i];
        /* every piece is written by exactly one rank: a data-parallel replica's first rank,
        ** tp rank 0 for tp-replicated tensors, never the tied copy */
        int rep = pc->flags & GPT_REPLICATED;
        int mine = (pc->flags & GPT_EXPERT_PIECE)
            ? gpt.edp_rank == 0 && (!rep || gpt.etp_rank == 0)
            : gpt.dp_rank == 0 && gpt.cp_rank == 0 && (!rep || gpt.tp_rank == 0);
        if ((pc->flags & GPT_TIED_COPY) || !mine) continue;
        int t = lib.params[pc->param].tensor;
        const lib_tensor *ti = &lib.tensors[t];
        float *host = malloc((size_t)pc->rows * pc->cols * sizeof(float));
        RT_CHECK(host, "out of memory");
        piece_copy(pc, host, 0);
        lib_fault_point();
        for (int r = 0; r < pc->rows; r++)
            plan_write(&p, fds, t, (long long)(pc->grow + r) * ti->cols + pc->gcol,
                       host + (size_t)r * pc->cols, (size_t)pc->cols);
        free(host);
    }
    /* the expert biases of a stage's layers: its first dense rank (tp, cp, dp 0) */
    if (lib.ebias_tensor >= 0 && gpt.tp_rank == 0 && gpt.cp_rank == 0 && gpt.dp_rank == 0) {
        save_dst dst = { &p, fds };
        lib_expert_bias_each(ebias_save, &dst);
    }
    plan_close(&p, fds);
    lib_world_barrier();
    if (rt_rank() == 0) {
        lib_fault_point();
        for (int k = 0; k < p.nfiles; k++) {
            int fd = open(p.path[k], O_RDONLY);
            RT_CHECK(fd >= 0 && fsync(fd) == 0, "%s: fsync failed: %s", p.path[k],
                     strerror(errno));
            close(fd);
        }
        if (p.dir)
            lib_hf_finish(f->save, p.tmpdir, p.ts, p.file_of, lib.ntensors, p.nfiles, p.dtype,
                          f->tokenizer);
        else
            RT_CHECK(rename(p.path[0], f->save) == 0, "cannot rename %s to %s: %s", p.path[0],
                     f->save, strerror(errno));
    }
    lib_world_barrier();
    free(fds);
    plan_free(&p);
}
