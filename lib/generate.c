/*
** generate.c: gpt_generate, the generate program of every generated directory (generate.h).
** The model comes whole from --init (weights.c's reader: the checks of train's --init) into
** device memory in f32; its sizes from the program's roles and dims, undoing the layout's
** tensor-parallel split, so any layout's directory serves. The forward pass is the training
** forward's, step for step, on the same kernels (GPT: LayerNorm, GELU of kernel_rows.h,
** learned positions; Llama: RMSNorm, rotary positions, grouped-query attention, SwiGLU),
** over any number of new positions after those already cached: the prompt at once (prefill),
** then one token at a time. Decoding: greedy, or sampled with temperature, top-k and top-p
** from a seeded generator. Text in and out is one section below (prompt_tokens, emit_token),
** where a tokenizer plugs in.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "generate.h"
#include "fail.h"     // defines: lib_fail_all, lib_fail_name
#include "flags.h"    // defines: lib_flag_def, lib_flags_table, lib_flags_table_usage, KIND_*
#include "tensors.h"  // defines: lib_tensor, lib_tensors_build, lib_tensor_find
#include "weights.h"  // defines: lib_weights_read

/* -- Flags -------------------------------------------------------------------------------------- */

/* _(ID, name, META, KIND, field, default, help), as LIB_FLAGS (flags.h). */
#define GEN_FLAGS(_) \
    _(INIT, "init", "PATH", STRING, init, NULL, \
      "the model's weights (required): a `.safetensors` file, an index, or a directory " \
      "holding one, as train's `--init` (train's `--save` writes one)") \
    _(TOKENIZER, "tokenizer", "PATH", STRING, tokenizer, NULL, \
      "a Hugging Face `tokenizer.json`, or a directory holding one (as train's `--save DIR` " \
      "writes): `--prompt` is encoded with it (after its begin-of-document id, if it has " \
      "one), the tokens are printed as text, and `--eos` defaults to its end-of-document id") \
    _(PROMPT, "prompt", "TEXT", STRING, prompt, NULL, \
      "the prompt as text: with `--tokenizer`, its tokens; without, one token per byte " \
      "(models with a vocabulary of 256)") \
    _(PROMPT_IDS, "prompt-ids", "LIST", STRING, prompt_ids, NULL, \
      "the prompt as token ids, comma-separated (`15496,11,995`), for any model") \
    _(MAX_NEW_TOKENS, "max-new-tokens", "N", INT, max_new, "=the model's positions left", \
      "tokens to generate at most; the prompt and them must fit the model's sequence length") \
    _(TEMPERATURE, "temperature", "X", NUM, temperature, "1", \
      "sample from softmax(logits / X); 0: greedy (the most likely token, the lowest id on " \
      "a tie)") \
    _(TOP_K, "top-k", "N", INT, top_k, "0", "sample among the N most likely tokens only; 0: all") \
    _(TOP_P, "top-p", "X", NUM, top_p, "1", \
      "sample among the most likely tokens whose probabilities first reach X in total " \
      "(nucleus sampling), 0 < X <= 1") \
    _(SEED, "seed", "N", U64, seed, "1337", "the sampling's random seed (the same seed, the " \
      "same text)") \
    _(EOS, "eos", "ID", INT, eos, NULL, "stop after generating this id (the end-of-document " \
      "token)") \
    _(NO_KV_CACHE, "no-kv-cache", "", FLAG, no_cache, NULL, \
      "recompute every position for each new token instead of caching keys and values " \
      "(slow; a check of the cache)") \
    _(LOGITS, "logits", "FILE", STRING, logits, NULL, \
      "also write the logits each new token was chosen from: little-endian f32, one row of " \
      "the vocabulary's size per new token") \
    _(HELP, "help", "", HELP, help, NULL, "print this help and exit (also `-h`)")

typedef struct {
    const char *init, *tokenizer, *prompt, *prompt_ids, *logits;
    int max_new, top_k, eos, no_cache, help;
    double temperature, top_p;
    unsigned long long seed;
} gen_flags;

#define GEN_FLAG_ID(id, name, meta, kind, field, def, help) GEN_FLAG_##id,
enum { GEN_FLAGS(GEN_FLAG_ID) GEN_NFLAGS };

#define GEN_CHECK_FIELD(id, name, meta, kind, field, def, help) \
    _Static_assert(_Generic(((gen_flags *)0)->field, kind_type_##kind: 1, default: 0), \
                   "--" name ": the field " #field " is not of kind " #kind);
#define GEN_KIND_TYPE(kind, type) typedef type kind_type_##kind;
LIB_FLAG_KINDS(GEN_KIND_TYPE)
GEN_FLAGS(GEN_CHECK_FIELD)

#define GEN_FLAG_DEF(id, name, meta, kind, field, def, help) \
    { name, meta, KIND_##kind, offsetof(gen_flags, field), def, help },
static const lib_flag_def gen_defs[] = { GEN_FLAGS(GEN_FLAG_DEF) };

/* -- The model ---------------------------------------------------------------------------------- */

/* One layer's tensors on the device (f32); a missing bias is NULL. */
typedef struct {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    float *qkv_w, *qkv_b, *proj_w, *proj_b, *fc_w, *fc_b, *fc2_w, *fc2_b;   /* GPT (in, out) */
    float *q_w, *k_w, *v_w, *o_w, *gate_w, *up_w, *down_w;                  /* Llama (out, in) */
} gen_layer;

typedef struct {
    const gpt_program *prog;
    int llama, L, C, H, KV, hd, F, V, T;     /* T: positions (seq_len) */
    float eps, scale, theta;
    float *wte, *wpe, *lnf_w, *lnf_b, *head;
    gen_layer *h;
    /* the tensors as read: their names, for finding them */
    int ntensors;
    lib_tensor *tensors;
    float **dev;
} gen_model;

/* The device copy of the tensor named by fmt (with the layer's number), or NULL when the model
** has none (an optional bias); required ones are the model's by construction (the roles). */
static float *tensor(const gen_model *m, int required, const char *fmt, int layer)
{
    char name[96];
    snprintf(name, sizeof name, fmt, layer);
    int t = lib_tensor_find(m->tensors, m->ntensors, name);
    RT_CHECK(t >= 0 || !required, "generate: the model has no tensor '%s'", name);
    return t >= 0 ? m->dev[t] : NULL;
}

/* A tensor read from --init (lib_weights_read) into device memory. */
static void tensor_take(int t, const float *data, void *ctx)
{
    gen_model *m = ctx;
    size_t bytes = (size_t)m->tensors[t].rows * m->tensors[t].cols * sizeof(float);
    m->dev[t] = rt_malloc(bytes);
    rt_memcpy(m->dev[t], data, bytes, RT_H2D);
}

/* The model's sizes from the program (dims are per tp rank: multiplied back), its tensors
** from --init into device memory. A mixture of experts is refused. */
static void model_load(gen_model *m, const gpt_program *prog, const char *init)
{
    const gpt_dims *d = &prog->dims;
    memset(m, 0, sizeof *m);
    m->prog = prog;
    if (d->moe)
        lib_fail_all(2, "%s is a mixture-of-experts model: generate runs dense GPT and Llama "
                     "models only", prog->model);
    m->llama = d->llama;
    m->L = prog->layers;
    m->C = d->C;
    m->hd = d->head_dim;
    m->H = d->heads_local * d->tp;
    m->KV = m->llama ? d->kv_local * d->tp : m->H;
    m->V = prog->vocab;
    m->T = d->t_model;
    m->eps = d->ln_eps;
    m->scale = d->att_scale;
    m->theta = d->rope_theta;
    int ebias;
    m->ntensors = lib_tensors_build(prog, &m->tensors, &ebias);
    m->dev = calloc((size_t)m->ntensors, sizeof *m->dev);
    RT_CHECK(m->dev, "out of memory");
    lib_weights_read(init, m->tensors, m->ntensors, prog->model, tensor_take, m);
    m->h = calloc((size_t)m->L, sizeof *m->h);
    RT_CHECK(m->h, "out of memory");
    if (m->llama) {
        m->wte = tensor(m, 1, "model.embed_tokens.weight", 0);
        m->lnf_w = tensor(m, 1, "model.norm.weight", 0);
        m->head = tensor(m, 0, "lm_head.weight", 0);
        if (!m->head) m->head = m->wte;            /* tie_embeddings */
        const char *p = "model.layers.%d.";
        char f[96];
#define LT(field, suffix) (snprintf(f, sizeof f, "%s%s", p, suffix), \
                           m->h[l].field = tensor(m, 1, f, l))
        for (int l = 0; l < m->L; l++) {
            LT(ln1_w, "input_layernorm.weight");
            LT(ln2_w, "post_attention_layernorm.weight");
            LT(q_w, "self_attn.q_proj.weight");
            LT(k_w, "self_attn.k_proj.weight");
            LT(v_w, "self_attn.v_proj.weight");
            LT(o_w, "self_attn.o_proj.weight");
            LT(gate_w, "mlp.gate_proj.weight");
            LT(up_w, "mlp.up_proj.weight");
            LT(down_w, "mlp.down_proj.weight");
        }
#undef LT
        m->F = m->tensors[lib_tensor_find(m->tensors, m->ntensors,
                                          "model.layers.0.mlp.gate_proj.weight")].rows;
    } else {
        m->wte = m->head = tensor(m, 1, "wte.weight", 0);
        m->wpe = tensor(m, 1, "wpe.weight", 0);
        m->lnf_w = tensor(m, 1, "ln_f.weight", 0);
        m->lnf_b = tensor(m, 1, "ln_f.bias", 0);
        for (int l = 0; l < m->L; l++) {
            gen_layer *y = &m->h[l];
            y->ln1_w = tensor(m, 1, "h.%d.ln_1.weight", l);
            y->ln1_b = tensor(m, 1, "h.%d.ln_1.bias", l);
            y->ln2_w = tensor(m, 1, "h.%d.ln_2.weight", l);
            y->ln2_b = tensor(m, 1, "h.%d.ln_2.bias", l);
            y->qkv_w = tensor(m, 1, "h.%d.attn.c_attn.weight", l);
            y->qkv_b = tensor(m, 0, "h.%d.attn.c_attn.bias", l);
            y->proj_w = tensor(m, 1, "h.%d.attn.c_proj.weight", l);
            y->proj_b = tensor(m, 0, "h.%d.attn.c_proj.bias", l);
            y->fc_w = tensor(m, 1, "h.%d.mlp.c_fc.weight", l);
            y->fc_b = tensor(m, 0, "h.%d.mlp.c_fc.bias", l);
            y->fc2_w = tensor(m, 1, "h.%d.mlp.c_proj.weight", l);
            y->fc2_b = tensor(m, 0, "h.%d.mlp.c_proj.bias", l);
        }
        m->F = m->tensors[lib_tensor_find(m->tensors, m->ntensors, "h.0.mlp.c_fc.weight")].cols;
    }
}

static void model_free(gen_model *m)
{
    for (int t = 0; t < m->ntensors; t++) rt_free(m->dev[t]);
    free(m->dev);
    free(m->tensors);
    free(m->h);
}

/* -- The forward pass with a key/value cache ---------------------------------------------------- */

/* Device buffers for up to T positions at once (the run's: the prompt and the new tokens), and
** each layer's cache of T keys and values of its KV kv heads (grouped-query attention: query
** head h reads kv head h / (H/KV) in the attention kernels; GPT: KV = H). */
typedef struct {
    int *tok;                         /* (T) token ids */
    float *x, *ln, *mean, *rstd;      /* (T, C), (T, C), (T), (T) */
    float *qkv;                       /* (T, (H + 2 KV) hd) q | k | v */
    float *att, *lse;                 /* (T, H hd) f32 attention output, (H, T) log-sum-exp */
    float *proj;                      /* (T, C) */
    float *fc, *act;                  /* (T, F) GPT: c_fc out, GELU; Llama (T, 2F) gate | up,
                                         (T, F) SwiGLU */
    float *logits;                    /* (V) */
    float **k, **v;                   /* [L] (T, KV hd) */
} gen_bufs;

static float *dev_floats(size_t n)
{
    return rt_malloc(n * sizeof(float));
}

static void bufs_alloc(gen_bufs *b, const gen_model *m, int positions)
{
    size_t T = (size_t)positions, A = (size_t)m->H * m->hd, K = (size_t)m->KV * m->hd;
    b->tok = rt_malloc(T * sizeof(int));
    b->x = dev_floats(T * m->C);
    b->ln = dev_floats(T * m->C);
    b->mean = dev_floats(T);
    b->rstd = dev_floats(T);
    b->qkv = dev_floats(T * (A + 2 * K));
    b->att = dev_floats(T * A);
    b->lse = dev_floats(T * m->H);
    b->proj = dev_floats(T * m->C);
    b->fc = dev_floats(T * m->F * (m->llama ? 2 : 1));
    b->act = dev_floats(T * m->F);
    b->logits = dev_floats((size_t)m->V);
    b->k = calloc((size_t)m->L, sizeof *b->k);
    b->v = calloc((size_t)m->L, sizeof *b->v);
    RT_CHECK(b->k && b->v, "out of memory");
    for (int l = 0; l < m->L; l++) {
        b->k[l] = dev_floats(T * K);
        b->v[l] = dev_floats(T * K);
    }
}

static void bufs_free(gen_bufs *b, const gen_model *m)
{
    void *all[] = { b->tok, b->x, b->ln, b->mean, b->rstd, b->qkv, b->att, b->lse,
                    b->proj, b->fc, b->act, b->logits };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) rt_free(all[i]);
    for (int l = 0; l < m->L; l++) {
        rt_free(b->k[l]);
        rt_free(b->v[l]);
    }
    free(b->k);
    free(b->v);
}

/*
** Attention of n new positions (q rows of ldq in b->qkv) over the cache's pos0 + n keys into
** b->att: the keys before pos0 all visible, the n new ones causally; the two blocks merged by
** their log-sum-exps (the context-parallel blocks' kernel, kernels.h).
*/
static void attend(gen_bufs *b, const gen_model *m, int l, int pos0, int n)
{
    int A = m->H * m->hd, K = m->KV * m->hd, ldq = A + 2 * K;
    fill_f32(b->att, (size_t)n * A, 0.0f);
    fill_f32(b->lse, (size_t)n * m->H, -INFINITY);
    if (pos0 > 0)
        attention_fwd_block(b->att, b->lse, n, b->qkv, ldq, b->k[l], b->v[l], K, 1, n, pos0,
                            m->H, m->KV, m->hd, 0, m->scale, RT_F32);
    attention_fwd_block(b->att, b->lse, n, b->qkv, ldq, b->k[l] + (size_t)pos0 * K,
                        b->v[l] + (size_t)pos0 * K, K, 1, n, n, m->H, m->KV, m->hd, 1, m->scale,
                        RT_F32);
}

/* The new rows' keys and values (columns A.. and A + K.. of b->qkv) into the cache at pos0. */
static void cache_store(gen_bufs *b, const gen_model *m, int l, int pos0, int n)
{
    size_t A = (size_t)m->H * m->hd, K = (size_t)m->KV * m->hd, W = A + 2 * K;
    copy_cols(b->k[l] + pos0 * K, RT_F32, K, b->qkv + A, RT_F32, W, n, (int)K);
    copy_cols(b->v[l] + pos0 * K, RT_F32, K, b->qkv + A + K, RT_F32, W, n, (int)K);
}

static void gpt_layer_fwd(gen_bufs *b, const gen_model *m, int l, int pos0, int n)
{
    const gen_layer *y = &m->h[l];
    int C = m->C, F = m->F;
    layernorm_fwd(b->ln, b->mean, b->rstd, b->x, y->ln1_w, y->ln1_b, n, C, m->eps, RT_F32);
    matmul_fwd(b->qkv, b->ln, y->qkv_w, y->qkv_b, n, C, 3 * C, RT_F32);
    cache_store(b, m, l, pos0, n);
    attend(b, m, l, pos0, n);
    matmul_fwd(b->proj, b->att, y->proj_w, y->proj_b, n, C, C, RT_F32);
    add_inplace(b->x, b->proj, (size_t)n * C, RT_F32);
    layernorm_fwd(b->ln, b->mean, b->rstd, b->x, y->ln2_w, y->ln2_b, n, C, m->eps, RT_F32);
    matmul_gelu_fwd(b->fc, b->act, b->ln, y->fc_w, y->fc_b, n, C, F, RT_F32);
    matmul_fwd(b->proj, b->act, y->fc2_w, y->fc2_b, n, F, C, RT_F32);
    add_inplace(b->x, b->proj, (size_t)n * C, RT_F32);
}

static void llama_layer_fwd(gen_bufs *b, const gen_model *m, int l, int pos0, int n)
{
    const gen_layer *y = &m->h[l];
    int C = m->C, F = m->F, hd = m->hd, Q = m->H * hd, K = m->KV * hd, W = Q + 2 * K;
    rmsnorm_fwd(b->ln, b->rstd, b->x, y->ln1_w, n, C, m->eps, RT_F32);
    linear_fwd(b->qkv, W, b->ln, y->q_w, n, C, Q, RT_F32);
    linear_fwd(b->qkv + Q, W, b->ln, y->k_w, n, C, K, RT_F32);
    linear_fwd(b->qkv + Q + K, W, b->ln, y->v_w, n, C, K, RT_F32);
    rope_fwd(b->qkv, (size_t)W, n, 1, m->H, hd, pos0, m->theta, 0, RT_F32);
    rope_fwd(b->qkv + Q, (size_t)W, n, 1, m->KV, hd, pos0, m->theta, 0, RT_F32);
    cache_store(b, m, l, pos0, n);
    attend(b, m, l, pos0, n);
    linear_fwd(b->proj, C, b->att, y->o_w, n, Q, C, RT_F32);
    add_inplace(b->x, b->proj, (size_t)n * C, RT_F32);
    rmsnorm_fwd(b->ln, b->rstd, b->x, y->ln2_w, n, C, m->eps, RT_F32);
    linear_fwd(b->fc, 2 * F, b->ln, y->gate_w, n, C, F, RT_F32);
    linear_fwd(b->fc + F, 2 * F, b->ln, y->up_w, n, C, F, RT_F32);
    swiglu_fwd(b->act, b->fc, n, F, RT_F32);
    linear_fwd(b->proj, C, b->act, y->down_w, n, F, C, RT_F32);
    add_inplace(b->x, b->proj, (size_t)n * C, RT_F32);
}

/*
** The n tokens tok[0..n) at positions pos0.. (those before already in the cache): their keys
** and values into the cache, and the logits of the last one into logits (host, V).
*/
static void forward(gen_bufs *b, const gen_model *m, const int *tok, int pos0, int n,
                    float *logits)
{
    int C = m->C;
    rt_memcpy(b->tok, tok, (size_t)n * sizeof(int), RT_H2D);
    embed_fwd(b->x, b->tok, m->wte, n, C, 0, m->V, RT_F32);
    if (!m->llama) pos_fwd(b->x, m->wpe, n, 1, C, pos0, RT_F32);
    for (int l = 0; l < m->L; l++)
        (m->llama ? llama_layer_fwd : gpt_layer_fwd)(b, m, l, pos0, n);
    float *last = b->x + (size_t)(n - 1) * C;
    if (m->llama) rmsnorm_fwd(b->ln, b->rstd, last, m->lnf_w, 1, C, m->eps, RT_F32);
    else layernorm_fwd(b->ln, b->mean, b->rstd, last, m->lnf_w, m->lnf_b, 1, C, m->eps, RT_F32);
    linear_fwd(b->logits, m->V, b->ln, m->head, 1, C, m->V, RT_F32);
    rt_memcpy(logits, b->logits, (size_t)m->V * sizeof(float), RT_D2H);
}

/* -- Decoding ----------------------------------------------------------------------------------- */

/* splitmix64: the sampler's generator, one state from --seed. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;      /* [0, 1) */
}

static const float *sort_keys;      /* the logits order_desc sorts by */

/* Descending logits, the lower id first on a tie. */
static int order_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float x = sort_keys[i], y = sort_keys[j];
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

/*
** The next token from the logits (V): greedy at temperature 0 (the first maximum); else the
** tokens sorted by logit, cut to the top-k, softmax(logits / temperature) over them, cut to the
** smallest prefix whose probabilities reach top-p, and one drawn from what is left (as Hugging
** Face's TopK and TopP warpers: the most likely token is always kept). idx, p: V of scratch.
*/
static int pick(const float *logits, int V, const gen_flags *f, uint64_t *rng, int *idx,
                double *p)
{
    if (f->temperature == 0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < V; i++) idx[i] = i;
    sort_keys = logits;
    qsort(idx, (size_t)V, sizeof *idx, order_desc);
    int keep = f->top_k > 0 && f->top_k < V ? f->top_k : V;
    double total = 0, mx = logits[idx[0]];
    for (int r = 0; r < keep; r++) {
        p[r] = exp(((double)logits[idx[r]] - mx) / f->temperature);
        total += p[r];
    }
    double cum = 0;
    int n = 0;
    while (n < keep && (n == 0 || cum < f->top_p * total)) cum += p[n++];
    double u = rng_uniform(rng) * cum;
    for (int r = 0; r < n; r++) {
        u -= p[r];
        if (u < 0) return idx[r];
    }
    return idx[n - 1];
}

/* -- Text in and out ---------------------------------------------------------------------------- */
/*
** The one place that knows how text becomes tokens and tokens become text. With --tokenizer
** (the entry point's gen_tokenizer_api): --prompt encoded by it, after its begin-of-document
** id when it has one (as Hugging Face's tokenizers add it), and every token printed as its
** bytes. Without: a model of 256 tokens reads --prompt as bytes (one token per byte) and prints
** its tokens as bytes; any model reads --prompt-ids and, past 256 tokens, prints ids.
*/
enum { BYTE_VOCAB = 256 };

typedef struct {
    const gen_tokenizer_api *api;
    struct tok_model *t;        /* the loaded tokenizer, or NULL */
} gen_text;

/* The tokenizer --tokenizer names into tx (nothing without the flag); it must fit the model. */
static void text_open(gen_text *tx, const gen_flags *f, const gen_tokenizer_api *api, int V)
{
    tx->api = api;
    tx->t = NULL;
    if (!f->tokenizer) return;
    if (!api) lib_fail_all(2, "--tokenizer: this program has no tokenizer library");
    char err[512];
    tx->t = api->load(f->tokenizer, err, sizeof err);
    if (!tx->t) lib_fail_all(2, "--tokenizer: %s", err);
    int n = api->vocab_size(tx->t);
    if (n > V)
        lib_fail_all(2, "--tokenizer %s has %d ids, the model %d: it is another model's "
                     "tokenizer", f->tokenizer, n, V);
}

/* The prompt's tokens (malloc'd) into *out; returns their number. */
static int prompt_tokens(const gen_flags *f, const gen_text *tx, int V, int **out)
{
    if (!f->prompt == !f->prompt_ids)
        lib_fail_all(2, f->prompt ? "--prompt and --prompt-ids exclude each other"
                                  : "a prompt is needed: --prompt TEXT or --prompt-ids LIST");
    if (f->prompt && tx->t) {
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        int bod = tx->api->bod_id(tx->t);
        if (bod >= 0) {
            ids = malloc(sizeof *ids);
            RT_CHECK(ids, "out of memory");
            ids[n++] = bod;
            cap = 1;
        }
        RT_CHECK(tx->api->encode(tx->t, f->prompt, strlen(f->prompt), &ids, &n, &cap) == 0,
                 "out of memory");
        if (n == 0) lib_fail_all(2, "--prompt is empty: the model needs at least one token");
        int *out_ids = malloc(n * sizeof *out_ids);
        RT_CHECK(out_ids, "out of memory");
        for (size_t i = 0; i < n; i++) out_ids[i] = ids[i];
        free(ids);
        *out = out_ids;
        return (int)n;
    }
    if (f->prompt) {
        if (V != BYTE_VOCAB)
            lib_fail_all(2, "--prompt reads one token per byte, for models of %d tokens; this "
                         "model has %d: give its tokenizer (--tokenizer) or the prompt's token "
                         "ids (--prompt-ids)", BYTE_VOCAB, V);
        size_t n = strlen(f->prompt);
        if (n == 0) lib_fail_all(2, "--prompt is empty: the model needs at least one token");
        int *ids = malloc(n * sizeof *ids);
        RT_CHECK(ids, "out of memory");
        for (size_t i = 0; i < n; i++) ids[i] = (unsigned char)f->prompt[i];
        *out = ids;
        return (int)n;
    }
    size_t cap = strlen(f->prompt_ids) / 2 + 1;
    int *ids = malloc(cap * sizeof *ids), n = 0;
    RT_CHECK(ids, "out of memory");
    for (const char *s = f->prompt_ids; ; ) {
        char *end;
        errno = 0;
        long id = strtol(s, &end, 10);
        if (end == s || errno || (*end && *end != ','))
            lib_fail_all(2, "--prompt-ids expects token ids separated by commas, got '%s'",
                         f->prompt_ids);
        if (id < 0 || id >= V)
            lib_fail_all(2, "--prompt-ids: id %ld (token %d of the prompt) is outside the "
                         "model's vocabulary [0, %d)", id, n + 1, V);
        ids[n++] = (int)id;
        if (!*end) break;
        s = end + 1;
    }
    *out = ids;
    return n;
}

/* A token on stdout as it comes: its bytes (a tokenizer's), its byte (byte models) or its id
** and a space. */
static void emit_token(int id, const gen_text *tx, int V)
{
    size_t n;
    const char *b = tx->t ? tx->api->bytes(tx->t, id, &n) : NULL;
    if (b) fwrite(b, 1, n, stdout);
    else if (V == BYTE_VOCAB) putchar(id);
    else printf("%d ", id);
    fflush(stdout);
}

/* -- The program -------------------------------------------------------------------------------- */

static void check_flags(const gen_flags *f)
{
    if (!f->init)
        lib_fail_all(2, "--init PATH is needed: the weights to generate with (train's --save "
                     "writes them; a Hugging Face checkpoint of the model works too)");
    if (!(f->temperature >= 0 && f->temperature <= 1e6))
        lib_fail_all(2, "--temperature must be >= 0 (0: greedy), got %g", f->temperature);
    if (!(f->top_p > 0 && f->top_p <= 1))
        lib_fail_all(2, "--top-p must be in (0, 1], got %g", f->top_p);
}

/* The logits of every new token into 'path', written whole (a temporary file, renamed). */
static void write_logits(const char *path, const float *rows, size_t n)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "wb");
    if (!out) lib_fail_file(path, "cannot create %s: %s", tmp, strerror(errno));
    if (fwrite(rows, sizeof *rows, n, out) != n || fflush(out) || fsync(fileno(out)) ||
        fclose(out))
        lib_fail_file(path, "write failed: %s", strerror(errno));
    if (rename(tmp, path)) lib_fail_file(path, "cannot rename %s: %s", tmp, strerror(errno));
}

int gpt_generate(int argc, char **argv, const gpt_program *prog, const gen_tokenizer_api *tok)
{
    lib_fail_name("generate");
    rt_init(&argc, &argv, 1, "one rank");
    gen_flags f;
    unsigned char given[GEN_NFLAGS] = { 0 };
    memset(&f, 0, sizeof f);
    if (lib_flags_table(argc, argv, gen_defs, GEN_NFLAGS, &f, given)) {
        char usage[256];
        snprintf(usage, sizeof usage, "usage: generate --init PATH (--prompt TEXT | --prompt-ids "
                 "LIST) [flags]   (%s, on one process whatever the layout)", prog->model);
        lib_flags_table_usage(stdout, usage, gen_defs, GEN_NFLAGS);
        rt_finalize();
        return 0;
    }
    check_flags(&f);
    int V = prog->vocab, *prompt;
    gen_text tx;
    text_open(&tx, &f, tok, V);
    int P = prompt_tokens(&f, &tx, V, &prompt);
    if (!given[GEN_FLAG_EOS] && tx.t && tx.api->eod_id(tx.t) >= 0) {
        f.eos = tx.api->eod_id(tx.t);
        given[GEN_FLAG_EOS] = 1;
    }
    int T = prog->dims.t_model;
    if (given[GEN_FLAG_EOS] && f.eos >= V)
        lib_fail_all(2, "--eos %d is outside the model's vocabulary [0, %d)", f.eos, V);
    if (P >= T)
        lib_fail_all(2, "the prompt has %d tokens; the model (%s) has %d positions (seq_len), "
                     "so at most %d leave room to generate: shorten the prompt", P,
                     prog->model, T, T - 1);
    if (!given[GEN_FLAG_MAX_NEW_TOKENS]) f.max_new = T - P;
    if (P + f.max_new > T)
        lib_fail_all(2, "the prompt (%d tokens) and --max-new-tokens %d need %d positions; the "
                     "model (%s) has %d (seq_len): at most --max-new-tokens %d", P, f.max_new,
                     P + f.max_new, prog->model, T, T - P);
    gen_model m;
    model_load(&m, prog, f.init);
    gen_bufs b;
    bufs_alloc(&b, &m, P + f.max_new);

    int *seq = malloc((size_t)T * sizeof *seq), *idx = malloc((size_t)V * sizeof *idx);
    double *p = malloc((size_t)V * sizeof *p);
    /* every new token's row with --logits, else one row */
    size_t rows = f.logits ? (size_t)f.max_new + 1 : 1;
    float *logits = malloc(rows * V * sizeof *logits);
    RT_CHECK(seq && idx && p && logits, "out of memory");
    memcpy(seq, prompt, (size_t)P * sizeof *seq);
    int bod = tx.t ? tx.api->bod_id(tx.t) : -1;
    for (int i = 0; i < P; i++)
        if (i > 0 || prompt[0] != bod) emit_token(prompt[i], &tx, V);   /* not <|begin...|> */
    uint64_t rng = f.seed;
    double t0 = rt_now(), t1 = t0;
    int len = P, made = 0;
    while (made < f.max_new) {
        float *row = logits + (f.logits ? (size_t)made * V : 0);
        if (f.no_cache) forward(&b, &m, seq, 0, len, row);
        else if (made == 0) forward(&b, &m, seq, 0, P, row);
        else forward(&b, &m, seq + len - 1, len - 1, 1, row);
        rt_sync();
        if (made == 0) t1 = rt_now();
        int id = pick(row, V, &f, &rng, idx, p);
        seq[len++] = id;
        made++;
        emit_token(id, &tx, V);
        if (given[GEN_FLAG_EOS] && id == f.eos) break;
    }
    double t2 = rt_now();
    if (V != BYTE_VOCAB || tx.t || made) putchar('\n');
    fflush(stdout);
    /* the first new token comes from the prefill; the others from one decoding step each */
    double pre = t1 - t0, dec = t2 - t1;
    fprintf(stderr, "generate: prompt %d tokens, %d new tokens; prefill %.1f ms (%.1f tok/s), "
            "decode %.1f ms (%.1f tok/s)%s\n", P, made, pre * 1e3, made ? P / pre : 0.0,
            dec * 1e3, made > 1 ? (made - 1) / dec : 0.0,
            f.no_cache ? " (--no-kv-cache)" : "");
    if (f.logits) write_logits(f.logits, logits, (size_t)made * V);
    free(seq);
    free(idx);
    free(p);
    free(logits);
    free(prompt);
    bufs_free(&b, &m);
    model_free(&m);
    rt_finalize();
    return 0;
}
