/*
** gpt2_ref.c: GPT-2 and Llama forward, backward, AdamW and LR schedule in double precision -- the
** oracle. It computes what Hugging Face's GPT2LMHeadModel, LlamaForCausalLM and (with experts)
** MixtralForCausalLM compute (no dropout), works directly in the checkpoint layout (GPT-2's
** Conv1D weights are (in, out), Llama's nn.Linear weights (out, in)), and favours plain loops
** over speed. It does no I/O (see ref_io.c) and has no notion of ranks. Contracts of the types:
** gpt2_ref.h.
*/
#include "gpt2_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_PI 3.14159265358979323846

/* -- Support ---------------------------------------------------------------------------------- */

/*
** malloc that never returns NULL: the reference is a one-shot tool and dies with
** "gpt2_ref: out of memory" (exit 1) when memory runs out.
*/
void *ref_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "gpt2_ref: out of memory\n");
        exit(1);
    }
    return p;
}

/*
** calloc that never returns NULL (see ref_xmalloc).
*/
void *ref_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "gpt2_ref: out of memory\n");
        exit(1);
    }
    return p;
}

static double *dalloc(size_t n)
{
    return ref_xcalloc(n, sizeof(double));
}

/* -- Parameter table -------------------------------------------------------------------------- */

static void add_tensor(ref_model *m, size_t *offset, const char *name, int ndim, long d0,
                       long d1, int decay, ref_init_kind init)
{
    ref_tensor *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 1;
    t->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    t->offset = *offset;
    t->decay = decay;
    t->init = init;
    *offset += t->numel;
}

/* Pointer to the tensor called 'name' inside the flat array 'base' (it must exist). */
static double *view_named(const ref_model *m, double *base, const char *name)
{
    const ref_tensor *t = ref_model_find(m, name);
    if (t == NULL) {
        fprintf(stderr, "gpt2_ref: internal error: no tensor '%s'\n", name);
        abort();
    }
    return base + t->offset;
}

/* Pointer to the tensor named printf(fmt, layer) inside the flat array 'base'. */
static double *view(const ref_model *m, double *base, const char *fmt, int layer)
{
    char name[REF_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    return view_named(m, base, name);
}

/* As view, or NULL if the model has no such tensor (biases without add_bias_linear). */
static double *view_opt(const ref_model *m, double *base, const char *fmt, int layer)
{
    char name[REF_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    return ref_model_find(m, name) ? view_named(m, base, name) : NULL;
}

/* Expert e of layer l, tensor 'suffix' ("c_fc.weight", "w1.weight", ...), or NULL if the model
** has none. */
static double *expert_view(const ref_model *m, double *base, int l, int e, const char *suffix)
{
    char name[REF_NAME_MAX];
    if (m->cfg.arch == REF_ARCH_LLAMA)
        snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s", l, e,
                 suffix);
    else
        snprintf(name, sizeof name, "h.%d.mlp.experts.%d.%s", l, e, suffix);
    return ref_model_find(m, name) ? view_named(m, base, name) : NULL;
}

/* bind_weights for a Llama model (below). */
static void bind_llama_weights(ref_weights *w, const ref_model *m, double *base)
{
    w->wte = view(m, base, "model.embed_tokens.weight", 0);
    for (int l = 0; l < m->cfg.layers; l++) {
        ref_layer *h = &w->h[l];
        h->input_ln_w = view(m, base, "model.layers.%d.input_layernorm.weight", l);
        h->q_w = view(m, base, "model.layers.%d.self_attn.q_proj.weight", l);
        h->k_w = view(m, base, "model.layers.%d.self_attn.k_proj.weight", l);
        h->v_w = view(m, base, "model.layers.%d.self_attn.v_proj.weight", l);
        h->o_w = view(m, base, "model.layers.%d.self_attn.o_proj.weight", l);
        h->post_ln_w = view(m, base, "model.layers.%d.post_attention_layernorm.weight", l);
        int E = m->cfg.moe.experts;
        if (E == 0) {
            h->gate_w = view(m, base, "model.layers.%d.mlp.gate_proj.weight", l);
            h->up_w = view(m, base, "model.layers.%d.mlp.up_proj.weight", l);
            h->down_w = view(m, base, "model.layers.%d.mlp.down_proj.weight", l);
            continue;
        }
        h->moe.router_w = view(m, base, "model.layers.%d.block_sparse_moe.gate.weight", l);
        h->moe.expert_bias = view_opt(
            m, base, "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias", l);
        h->moe.experts = ref_xcalloc((size_t)E, sizeof(ref_expert));
        for (int e = 0; e < E; e++) {
            ref_expert *x = &h->moe.experts[e];
            x->w1 = expert_view(m, base, l, e, "w1.weight");
            x->w2 = expert_view(m, base, l, e, "w2.weight");
            x->w3 = expert_view(m, base, l, e, "w3.weight");
        }
        if (m->cfg.moe.shared_ffn > 0) {    /* the shared expert in the dense MLP's views */
            h->gate_w = view(m, base, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
            h->up_w = view(m, base, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
            h->down_w = view(m, base, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
        }
    }
    w->ln_f_w = view(m, base, "model.norm.weight", 0);
    w->lm_head = m->cfg.tie_embeddings ? w->wte : view(m, base, "lm_head.weight", 0);
}

/* Point the views of 'w' into 'base'; the expert arrays of w->h[l].moe are allocated here. */
static void bind_weights(ref_weights *w, const ref_model *m, double *base)
{
    if (m->cfg.arch == REF_ARCH_LLAMA) {
        bind_llama_weights(w, m, base);
        return;
    }
    w->wte = view(m, base, "wte.weight", 0);
    w->lm_head = w->wte;
    w->wpe = view(m, base, "wpe.weight", 0);
    for (int l = 0; l < m->cfg.layers; l++) {
        ref_layer *h = &w->h[l];
        h->ln_1_w = view(m, base, "h.%d.ln_1.weight", l);
        h->ln_1_b = view(m, base, "h.%d.ln_1.bias", l);
        h->c_attn_w = view(m, base, "h.%d.attn.c_attn.weight", l);
        h->c_attn_b = view_opt(m, base, "h.%d.attn.c_attn.bias", l);
        h->attn_proj_w = view(m, base, "h.%d.attn.c_proj.weight", l);
        h->attn_proj_b = view_opt(m, base, "h.%d.attn.c_proj.bias", l);
        h->ln_2_w = view(m, base, "h.%d.ln_2.weight", l);
        h->ln_2_b = view(m, base, "h.%d.ln_2.bias", l);
        int E = m->cfg.moe.experts;
        if (E == 0) {
            h->mlp.c_fc_w = view(m, base, "h.%d.mlp.c_fc.weight", l);
            h->mlp.c_fc_b = view_opt(m, base, "h.%d.mlp.c_fc.bias", l);
            h->mlp.c_proj_w = view(m, base, "h.%d.mlp.c_proj.weight", l);
            h->mlp.c_proj_b = view_opt(m, base, "h.%d.mlp.c_proj.bias", l);
            continue;
        }
        h->moe.router_w = view(m, base, "h.%d.mlp.router.weight", l);
        h->moe.router_b = view_opt(m, base, "h.%d.mlp.router.bias", l);
        h->moe.expert_bias = view_opt(m, base, "h.%d.mlp.router.expert_bias", l);
        h->moe.experts = ref_xcalloc((size_t)E, sizeof(ref_expert));
        for (int e = 0; e < E; e++) {
            ref_expert *x = &h->moe.experts[e];
            x->c_fc_w = expert_view(m, base, l, e, "c_fc.weight");
            x->c_fc_b = expert_view(m, base, l, e, "c_fc.bias");
            x->c_proj_w = expert_view(m, base, l, e, "c_proj.weight");
            x->c_proj_b = expert_view(m, base, l, e, "c_proj.bias");
        }
        if (m->cfg.moe.shared_ffn > 0) {    /* the shared expert in the dense MLP's views */
            h->mlp.c_fc_w = view(m, base, "h.%d.mlp.shared_experts.c_fc.weight", l);
            h->mlp.c_fc_b = view_opt(m, base, "h.%d.mlp.shared_experts.c_fc.bias", l);
            h->mlp.c_proj_w = view(m, base, "h.%d.mlp.shared_experts.c_proj.weight", l);
            h->mlp.c_proj_b = view_opt(m, base, "h.%d.mlp.shared_experts.c_proj.bias", l);
        }
    }
    w->ln_f_w = view(m, base, "ln_f.weight", 0);
    w->ln_f_b = view(m, base, "ln_f.bias", 0);
}

/* The width of a layer's dense MLP: ffn, or with experts the shared expert's (0: none). */
static int mlp_width(const ref_config *cfg)
{
    return cfg->moe.experts > 0 ? cfg->moe.shared_ffn : cfg->ffn;
}

/* Number of key/value heads of a Llama config (0 means as many as query heads). */
static int kv_heads(const ref_config *cfg)
{
    return cfg->kv_heads > 0 ? cfg->kv_heads : cfg->heads;
}

/* Rotary base of a Llama config (0 means Llama's 10000). */
static double rope_theta(const ref_config *cfg)
{
    return cfg->rope_theta > 0.0 ? cfg->rope_theta : 10000.0;
}

/* ref_model_new's tensor table for a Llama model (README.md, "Llama"): embed_tokens, per layer
** input_layernorm, q, k, v, o, post_attention_layernorm, then gate, up, down (dense) or the
** router and per expert w1, w2, w3; then model.norm and (untied) lm_head. */
static void add_llama_tensors(ref_model *m, size_t *off)
{
    const ref_config *cfg = &m->cfg;
    long C = cfg->hidden, V = cfg->vocab, F = cfg->ffn, D = cfg->hidden / cfg->heads;
    long HD = cfg->heads * D, KD = kv_heads(cfg) * D;
    long E = cfg->moe.experts, Fe = cfg->moe.ffn, Fs = cfg->moe.shared_ffn;
    char name[REF_NAME_MAX];

    add_tensor(m, off, "model.embed_tokens.weight", 2, V, C, 1, REF_INIT_NORMAL);
    for (int l = 0; l < cfg->layers; l++) {
#define LAYER_TENSOR(suffix, ndim, d0, d1, decay, init)                         \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);           \
        add_tensor(m, off, name, ndim, d0, d1, decay, init);
        LAYER_TENSOR("input_layernorm.weight", 1, C, 0, 0, REF_INIT_ONE)
        LAYER_TENSOR("self_attn.q_proj.weight", 2, HD, C, 1, REF_INIT_NORMAL)
        LAYER_TENSOR("self_attn.k_proj.weight", 2, KD, C, 1, REF_INIT_NORMAL)
        LAYER_TENSOR("self_attn.v_proj.weight", 2, KD, C, 1, REF_INIT_NORMAL)
        LAYER_TENSOR("self_attn.o_proj.weight", 2, C, HD, 1, REF_INIT_OUT_PROJ)
        LAYER_TENSOR("post_attention_layernorm.weight", 1, C, 0, 0, REF_INIT_ONE)
        if (E == 0) {
            LAYER_TENSOR("mlp.gate_proj.weight", 2, F, C, 1, REF_INIT_NORMAL)
            LAYER_TENSOR("mlp.up_proj.weight", 2, F, C, 1, REF_INIT_NORMAL)
            LAYER_TENSOR("mlp.down_proj.weight", 2, C, F, 1, REF_INIT_OUT_PROJ)
            continue;
        }
        LAYER_TENSOR("block_sparse_moe.gate.weight", 2, E, C, 1, REF_INIT_NORMAL)
        for (int e = 0; e < E; e++) {
#define EXPERT_TENSOR(suffix, d0, d1, init)                                     \
            snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s", \
                     l, e, suffix);                                             \
            add_tensor(m, off, name, 2, d0, d1, 1, init);
            EXPERT_TENSOR("w1.weight", Fe, C, REF_INIT_NORMAL)
            EXPERT_TENSOR("w2.weight", C, Fe, REF_INIT_OUT_PROJ)
            EXPERT_TENSOR("w3.weight", Fe, C, REF_INIT_NORMAL)
#undef EXPERT_TENSOR
        }
        if (Fs > 0) {           /* Qwen2-MoE's names */
            LAYER_TENSOR("mlp.shared_expert.gate_proj.weight", 2, Fs, C, 1, REF_INIT_NORMAL)
            LAYER_TENSOR("mlp.shared_expert.up_proj.weight", 2, Fs, C, 1, REF_INIT_NORMAL)
            LAYER_TENSOR("mlp.shared_expert.down_proj.weight", 2, C, Fs, 1, REF_INIT_OUT_PROJ)
        }
#undef LAYER_TENSOR
    }
    add_tensor(m, off, "model.norm.weight", 1, C, 0, 0, REF_INIT_ONE);
    if (!cfg->tie_embeddings)
        add_tensor(m, off, "lm_head.weight", 2, V, C, 1, REF_INIT_NORMAL);
    for (int l = 0; cfg->moe.experts > 0 && cfg->moe.bias_rate > 0.0 && l < cfg->layers; l++) {
        /* last: state, not trained (Hugging Face DeepSeek-V3's name) */
        snprintf(name, sizeof name,
                 "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias", l);
        add_tensor(m, off, name, 1, cfg->moe.experts, 0, 0, REF_INIT_ZERO);
    }
}

/* ref_model_new's tensor table for a GPT-2 model: wte, wpe, then per layer ln_1, attn.c_attn,
** attn.c_proj, ln_2, the feed-forward block, then ln_f (weight before bias). The feed-forward
** block is mlp.c_fc, mlp.c_proj (dense), or mlp.router.weight followed by
** mlp.experts.{e}.c_fc, mlp.experts.{e}.c_proj for e = 0..E-1 (biases only with moe.bias),
** then with moe.shared_ffn mlp.shared_experts.c_fc, .c_proj (biases as the dense MLP's). */
static void add_gpt2_tensors(ref_model *m, size_t *off)
{
    const ref_config *cfg = &m->cfg;
    long C = cfg->hidden, V = cfg->vocab, T = cfg->seq, F = cfg->ffn;
    const ref_moe_config *moe = &cfg->moe;
    long E = moe->experts, Fe = moe->ffn, Fs = moe->shared_ffn;
    int lb = !cfg->no_linear_bias;
    char name[REF_NAME_MAX];

    add_tensor(m, off, "wte.weight", 2, V, C, 1, REF_INIT_NORMAL);
    add_tensor(m, off, "wpe.weight", 2, T, C, 1, REF_INIT_NORMAL);
    for (int l = 0; l < cfg->layers; l++) {
#define LAYER_TENSOR(suffix, ndim, d0, d1, decay, init)                         \
        snprintf(name, sizeof name, "h.%d.%s", l, suffix);                      \
        add_tensor(m, off, name, ndim, d0, d1, decay, init);
        LAYER_TENSOR("ln_1.weight", 1, C, 0, 0, REF_INIT_ONE)
        LAYER_TENSOR("ln_1.bias", 1, C, 0, 0, REF_INIT_ZERO)
        LAYER_TENSOR("attn.c_attn.weight", 2, C, 3 * C, 1, REF_INIT_NORMAL)
        if (lb) {
            LAYER_TENSOR("attn.c_attn.bias", 1, 3 * C, 0, 0, REF_INIT_ZERO)
        }
        LAYER_TENSOR("attn.c_proj.weight", 2, C, C, 1, REF_INIT_OUT_PROJ)
        if (lb) {
            LAYER_TENSOR("attn.c_proj.bias", 1, C, 0, 0, REF_INIT_ZERO)
        }
        LAYER_TENSOR("ln_2.weight", 1, C, 0, 0, REF_INIT_ONE)
        LAYER_TENSOR("ln_2.bias", 1, C, 0, 0, REF_INIT_ZERO)
        if (E == 0) {
            LAYER_TENSOR("mlp.c_fc.weight", 2, C, F, 1, REF_INIT_NORMAL)
            if (lb) {
                LAYER_TENSOR("mlp.c_fc.bias", 1, F, 0, 0, REF_INIT_ZERO)
            }
            LAYER_TENSOR("mlp.c_proj.weight", 2, F, C, 1, REF_INIT_OUT_PROJ)
            if (lb) {
                LAYER_TENSOR("mlp.c_proj.bias", 1, C, 0, 0, REF_INIT_ZERO)
            }
            continue;
        }
        LAYER_TENSOR("mlp.router.weight", 2, E, C, 1, REF_INIT_NORMAL)
        if (moe->router_bias) {        /* Megatron initialises it like the weight */
            LAYER_TENSOR("mlp.router.bias", 1, E, 0, 0, REF_INIT_NORMAL)
        }
        for (int e = 0; e < E; e++) {
#define EXPERT_TENSOR(suffix, ndim, d0, d1, decay, init)                        \
            snprintf(name, sizeof name, "h.%d.mlp.experts.%d.%s", l, e, suffix); \
            add_tensor(m, off, name, ndim, d0, d1, decay, init);
            EXPERT_TENSOR("c_fc.weight", 2, C, Fe, 1, REF_INIT_NORMAL)
            if (moe->bias) {
                EXPERT_TENSOR("c_fc.bias", 1, Fe, 0, 0, REF_INIT_ZERO)
            }
            EXPERT_TENSOR("c_proj.weight", 2, Fe, C, 1, REF_INIT_OUT_PROJ)
            if (moe->bias) {
                EXPERT_TENSOR("c_proj.bias", 1, C, 0, 0, REF_INIT_ZERO)
            }
#undef EXPERT_TENSOR
        }
        if (Fs > 0) {           /* the shared expert: the model's MLP, biases as lb */
            LAYER_TENSOR("mlp.shared_experts.c_fc.weight", 2, C, Fs, 1, REF_INIT_NORMAL)
            if (lb) {
                LAYER_TENSOR("mlp.shared_experts.c_fc.bias", 1, Fs, 0, 0, REF_INIT_ZERO)
            }
            LAYER_TENSOR("mlp.shared_experts.c_proj.weight", 2, Fs, C, 1, REF_INIT_OUT_PROJ)
            if (lb) {
                LAYER_TENSOR("mlp.shared_experts.c_proj.bias", 1, C, 0, 0, REF_INIT_ZERO)
            }
        }
#undef LAYER_TENSOR
    }
    add_tensor(m, off, "ln_f.weight", 1, C, 0, 0, REF_INIT_ONE);
    add_tensor(m, off, "ln_f.bias", 1, C, 0, 0, REF_INIT_ZERO);
    for (int l = 0; E > 0 && moe->bias_rate > 0.0 && l < cfg->layers; l++) {
        snprintf(name, sizeof name, "h.%d.mlp.router.expert_bias", l);   /* last: state */
        add_tensor(m, off, name, 1, E, 0, 0, REF_INIT_ZERO);
    }
}

/*
** Create a model for 'cfg' (which the caller has validated: every size >= 1, heads divides
** hidden; for a mixture of experts 1 <= top_k <= experts and ffn >= 1; for Llama, kv_heads
** (0 = heads) divides heads, hidden/heads is even, no expert biases). Builds the tensor table
** in the canonical Hugging Face order (add_gpt2_tensors, add_llama_tensors) and allocates
** params, grads and AdamW moments, all zero. Weight decay applies to the 2-D tensors only
** (embeddings, weight matrices, the router), never to biases or norm weights. Free with
** ref_model_free.
*/
ref_model *ref_model_new(const ref_config *cfg)
{
    ref_model *m = ref_xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    long E = cfg->moe.experts;
    long per_layer = 8 + (E == 0 ? 4 : 3 + 4 * E + 4);  /* at most, either architecture;
                                                        ** + 4: a shared expert */
    m->tensors = ref_xcalloc((size_t)(4 + per_layer * cfg->layers), sizeof *m->tensors);
    size_t off = 0;
    if (cfg->arch == REF_ARCH_LLAMA)
        add_llama_tensors(m, &off);
    else
        add_gpt2_tensors(m, &off);

    m->nparams = off;
    m->params = dalloc(off);
    m->grads = dalloc(off);
    m->m = dalloc(off);
    m->v = dalloc(off);
    m->w.h = ref_xcalloc((size_t)cfg->layers, sizeof(ref_layer));
    m->g.h = ref_xcalloc((size_t)cfg->layers, sizeof(ref_layer));
    bind_weights(&m->w, m, m->params);
    bind_weights(&m->g, m, m->grads);
    m->routed = ref_xcalloc((size_t)(cfg->layers * (E > 0 ? E : 1)), sizeof(int));
    return m;
}

/*
** Free a model from ref_model_new (NULL is allowed).
*/
void ref_model_free(ref_model *m)
{
    if (m == NULL)
        return;
    free(m->tensors);
    free(m->routed);
    free(m->params);
    free(m->grads);
    free(m->m);
    free(m->v);
    for (int l = 0; l < m->cfg.layers; l++) {
        free(m->w.h[l].moe.experts);
        free(m->g.h[l].moe.experts);
    }
    free(m->w.h);
    free(m->g.h);
    free(m);
}

/*
** The tensor called 'name' (Hugging Face name, e.g. "h.0.mlp.c_fc.bias"), or NULL.
*/
const ref_tensor *ref_model_find(const ref_model *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

/* -- Random initialisation -------------------------------------------------------------------- */
/*
** The reference's own generator (it need not match the runtime's Philox; only itself):
**   mix(z)  = the splitmix64 output function: z += 0x9e3779b97f4a7c15;
**             z = (z ^ z>>30) * 0xbf58476d1ce4e5b9; z = (z ^ z>>27) * 0x94d049bb133111eb;
**             return z ^ z>>31                                  (all arithmetic mod 2^64)
**   key     = mix(seed ^ mix(fnv1a64(tensor name)))
**   u(j)    = ((mix(key + j) >> 11) + 0.5) * 2^-53                in (0, 1)
**   normal  = sqrt(-2 ln u(2i)) * cos(2 pi u(2i+1))              for element i (Box-Muller)
** so every element is a function of (seed, tensor name, element index) only. The value
** std * normal is then rounded to float32, so that a model saved with --save-init (F32) and
** loaded back with --init is exactly the model that --random-init trains.
*/
static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static double uniform01(uint64_t key, uint64_t j)
{
    return ((double)(mix64(key + j) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/*
** The standard normal number of element 'index' of the tensor 'name' under 'seed' (above).
*/
double ref_rng_normal(uint64_t seed, const char *name, uint64_t index)
{
    uint64_t key = mix64(seed ^ mix64(fnv1a64(name)));
    double u1 = uniform01(key, 2 * index);
    double u2 = uniform01(key, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * REF_PI * u2);
}

/*
** Initialise every parameter as issues 4 and 7 say: weights N(0, 0.02) (the router too),
** attn.c_proj, mlp.c_proj and expert c_proj weights N(0, 0.02/sqrt(2L)), biases 0, LayerNorm
** weight 1 and bias 0 (values rounded to float32, see above). Llama: o_proj, down_proj and
** expert w2 N(0, 0.02/sqrt(2L)), every other 2-D weight N(0, 0.02), RMSNorm weights 1 (the
** init kinds of the tensor table). Resets the optimizer state and the step counter.
*/
void ref_model_init_random(ref_model *m, uint64_t seed)
{
    double std_proj = 0.02 / sqrt(2.0 * m->cfg.layers);
    for (int i = 0; i < m->ntensors; i++) {
        const ref_tensor *t = &m->tensors[i];
        double *p = m->params + t->offset;
        for (size_t e = 0; e < t->numel; e++) {
            switch (t->init) {
            case REF_INIT_NORMAL:
                p[e] = (float)(0.02 * ref_rng_normal(seed, t->name, e));
                break;
            case REF_INIT_OUT_PROJ:
                p[e] = (float)(std_proj * ref_rng_normal(seed, t->name, e));
                break;
            case REF_INIT_ZERO:
                p[e] = 0.0;
                break;
            case REF_INIT_ONE:
                p[e] = 1.0;
                break;
            }
        }
    }
    memset(m->m, 0, m->nparams * sizeof(double));
    memset(m->v, 0, m->nparams * sizeof(double));
    m->t = 0;
}

/* -- Single ops ------------------------------------------------------------------------------- */
/* N = B*T rows; row n = b*T + t. Forward ops overwrite their outputs; backward ops add (+=). */

/*
** out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. tokens (B,T) must be in [0, V). wpe may be NULL
** (Llama: no position embedding), then out[b,t,:] = wte[tokens[b,t],:].
*/
void ref_embed_fwd(double *out, const int *tokens, const double *wte, const double *wpe,
                   int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double *o = out + ((size_t)b * T + t) * C;
            const double *e = wte + (size_t)tokens[b * T + t] * C;
            const double *p = wpe ? wpe + (size_t)t * C : NULL;
            for (int c = 0; c < C; c++)
                o[c] = p ? e[c] + p[c] : e[c];
        }
}

/*
** dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:] (dwpe may be NULL).
*/
void ref_embed_bwd(double *dwte, double *dwpe, const double *dout, const int *tokens,
                   int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const double *d = dout + ((size_t)b * T + t) * C;
            double *de = dwte + (size_t)tokens[b * T + t] * C;
            double *dp = dwpe ? dwpe + (size_t)t * C : NULL;
            for (int c = 0; c < C; c++) {
                de[c] += d[c];
                if (dp)
                    dp[c] += d[c];
            }
        }
}

/*
** LayerNorm over the last dimension of in (N,C): out = (in - mean) * rstd * w + b with the
** biased variance, rstd = 1/sqrt(var + eps). Saves mean (N) and rstd (N) for the backward.
*/
void ref_layernorm_fwd(double *out, double *mean, double *rstd, const double *in,
                       const double *w, const double *b, int N, int C, double eps)
{
    for (int n = 0; n < N; n++) {
        const double *x = in + (size_t)n * C;
        double *y = out + (size_t)n * C;
        double mu = 0.0, var = 0.0;
        for (int c = 0; c < C; c++)
            mu += x[c];
        mu /= C;
        for (int c = 0; c < C; c++)
            var += (x[c] - mu) * (x[c] - mu);
        var /= C;
        double rs = 1.0 / sqrt(var + eps);
        for (int c = 0; c < C; c++)
            y[c] = (x[c] - mu) * rs * w[c] + b[c];
        mean[n] = mu;
        rstd[n] = rs;
    }
}

/*
** Backward of ref_layernorm_fwd. With xhat = (x - mean) * rstd and g = dout * w:
** din += rstd * (g - mean(g) - xhat * mean(g * xhat)), dw += dout * xhat, db += dout.
*/
void ref_layernorm_bwd(double *din, double *dw, double *db, const double *dout,
                       const double *in, const double *w, const double *mean,
                       const double *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *x = in + (size_t)n * C;
        const double *dy = dout + (size_t)n * C;
        double *dx = din + (size_t)n * C;
        double g_mean = 0.0, gx_mean = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            double g = dy[c] * w[c];
            g_mean += g;
            gx_mean += g * xhat;
        }
        g_mean /= C;
        gx_mean /= C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            double g = dy[c] * w[c];
            dx[c] += rstd[n] * (g - g_mean - xhat * gx_mean);
            dw[c] += dy[c] * xhat;
            db[c] += dy[c];
        }
    }
}

/*
** Hugging Face Conv1D: out (N,OUT) = in (N,IN) . w (IN,OUT) + b (OUT); b may be NULL.
** Loop order n-i-o keeps the inner loop on contiguous rows of w and out.
*/
void ref_linear_fwd(double *out, const double *in, const double *w, const double *b,
                    int N, int IN, int OUT)
{
    for (int n = 0; n < N; n++) {
        double *o = out + (size_t)n * OUT;
        const double *x = in + (size_t)n * IN;
        for (int j = 0; j < OUT; j++)
            o[j] = b ? b[j] : 0.0;
        for (int i = 0; i < IN; i++) {
            double xi = x[i];
            const double *wi = w + (size_t)i * OUT;
            for (int j = 0; j < OUT; j++)
                o[j] += xi * wi[j];
        }
    }
}

/*
** Backward of ref_linear_fwd: din += dout . w^T, dw += in^T . dout, db += sum over rows of
** dout (db may be NULL).
*/
void ref_linear_bwd(double *din, double *dw, double *db, const double *dout,
                    const double *in, const double *w, int N, int IN, int OUT)
{
    for (int n = 0; n < N; n++) {
        const double *dy = dout + (size_t)n * OUT;
        const double *x = in + (size_t)n * IN;
        double *dx = din + (size_t)n * IN;
        for (int i = 0; i < IN; i++) {          /* dw += x^T dy: independent elements */
            double *dwi = dw + (size_t)i * OUT, xi = x[i];
            for (int j = 0; j < OUT; j++)
                dwi[j] += xi * dy[j];
        }
        /* dx[i] += sum over j of dy[j] w[i][j], each sum in j order: four rows at a time, so
        ** that four chains of additions run side by side (the same sums, the same bits) */
        int i = 0;
        for (; i + 4 <= IN; i += 4) {
            const double *w0 = w + (size_t)i * OUT, *w1 = w0 + OUT, *w2 = w1 + OUT;
            const double *w3 = w2 + OUT;
            double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            for (int j = 0; j < OUT; j++) {
                a0 += dy[j] * w0[j];
                a1 += dy[j] * w1[j];
                a2 += dy[j] * w2[j];
                a3 += dy[j] * w3[j];
            }
            dx[i] += a0;
            dx[i + 1] += a1;
            dx[i + 2] += a2;
            dx[i + 3] += a3;
        }
        for (; i < IN; i++) {
            const double *wi = w + (size_t)i * OUT;
            double acc = 0.0;
            for (int j = 0; j < OUT; j++)
                acc += dy[j] * wi[j];
            dx[i] += acc;
        }
        if (db)
            for (int j = 0; j < OUT; j++)
                db[j] += dy[j];
    }
}

/*
** The shape of one causal attention call, for the strided core below: H query heads and K
** key/value heads (K divides H) of D channels each. Row (b, t) starts at (b*T + t) * q_ld in q
** and dq, at (b*T + t) * kv_ld in k, v, dk and dv, and at (b*T + t) * H*D in out and dout.
*/
typedef struct {
    int B, T, H, K, D;
    size_t q_ld, kv_ld;   /* row strides, in doubles: 3C for packed q | k | v, else H*D, K*D */
} attn_dims;

/*
** Causal softmax attention over strided rows; ref_attention_fwd and ref_attention_gqa_fwd are
** views of it. Query head h uses channels [h*D, (h+1)*D) of q; key/value head h / (H/K) the
** same span of k and v. For query t and key s <= t:
**   att[b,h,t,s] = softmax_s(q_t . k_s / sqrt(D)),  out[b,t,h*D:(h+1)*D] = sum_s att * v_s.
** att (B,H,T,T) is saved for the backward, with zeros for s > t.
*/
static void attention_fwd(double *out, double *att, const double *q, const double *k,
                          const double *v, const attn_dims *a)
{
    int T = a->T, H = a->H, D = a->D, group = a->H / a->K;
    size_t HD = (size_t)H * D;
    double scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < H; h++) {
            size_t qh = (size_t)h * D, kvh = (size_t)(h / group) * D;
            for (int t = 0; t < T; t++) {
                const double *qt = q + ((size_t)b * T + t) * a->q_ld + qh;
                double *p = att + (((size_t)b * H + h) * T + t) * T;
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double *ks = k + ((size_t)b * T + s) * a->kv_ld + kvh;
                    double dot = 0.0;
                    for (int d = 0; d < D; d++)
                        dot += qt[d] * ks[d];
                    p[s] = dot * scale;
                    if (p[s] > mx)
                        mx = p[s];
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    p[s] = exp(p[s] - mx);
                    sum += p[s];
                }
                for (int s = 0; s <= t; s++)
                    p[s] /= sum;
                for (int s = t + 1; s < T; s++)
                    p[s] = 0.0;
                double *y = out + ((size_t)b * T + t) * HD + qh;
                for (int d = 0; d < D; d++)
                    y[d] = 0.0;
                for (int s = 0; s <= t; s++) {
                    const double *vs = v + ((size_t)b * T + s) * a->kv_ld + kvh;
                    for (int d = 0; d < D; d++)
                        y[d] += p[s] * vs[d];
                }
            }
        }
}

/*
** Backward of attention_fwd: adds into dq, dk and dv (strided as q, k and v) given dout. Per
** query t:
**   dv_s += p_s dy,  dp_s = dy . v_s,  dscore_s = p_s (dp_s - sum_r p_r dp_r),
**   dq_t += scale sum_s dscore_s k_s,  dk_s += scale dscore_s q_t.
** A key/value head's gradient is thus the sum over the H/K query heads that read it.
*/
static void attention_bwd(double *dq, double *dk, double *dv, const double *dout,
                          const double *q, const double *k, const double *v, const double *att,
                          const attn_dims *a)
{
    int T = a->T, H = a->H, D = a->D, group = a->H / a->K;
    size_t HD = (size_t)H * D;
    double scale = 1.0 / sqrt((double)D);
    double *dp = dalloc((size_t)T);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < H; h++) {
            size_t qh = (size_t)h * D, kvh = (size_t)(h / group) * D;
            for (int t = 0; t < T; t++) {
                size_t row_t = ((size_t)b * T + t) * a->q_ld + qh;
                const double *qt = q + row_t;
                double *dqt = dq + row_t;
                const double *dy = dout + ((size_t)b * T + t) * HD + qh;
                const double *p = att + (((size_t)b * H + h) * T + t) * T;
                double pdp = 0.0;
                for (int s = 0; s <= t; s++) {
                    size_t row_s = ((size_t)b * T + s) * a->kv_ld + kvh;
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) {
                        dot += dy[d] * v[row_s + d];
                        dv[row_s + d] += p[s] * dy[d];
                    }
                    dp[s] = dot;
                    pdp += p[s] * dot;
                }
                for (int s = 0; s <= t; s++) {
                    size_t row_s = ((size_t)b * T + s) * a->kv_ld + kvh;
                    double ds = p[s] * (dp[s] - pdp) * scale;
                    for (int d = 0; d < D; d++) {
                        dqt[d] += ds * k[row_s + d];
                        dk[row_s + d] += ds * qt[d];
                    }
                }
            }
        }
    free(dp);
}

/*
** Causal multi-head self-attention (GPT-2). qkv (B,T,3C) holds q | k | v; head h uses channels
** [h*D, (h+1)*D) of each, D = C/H; out is (B,T,C) and att (B,H,T,T) as in attention_fwd.
*/
void ref_attention_fwd(double *out, double *att, const double *qkv, int B, int T, int C,
                       int H)
{
    attn_dims a = {.B = B, .T = T, .H = H, .K = H, .D = C / H,
                   .q_ld = 3 * (size_t)C, .kv_ld = 3 * (size_t)C};
    attention_fwd(out, att, qkv, qkv + C, qkv + 2 * (size_t)C, &a);
}

/*
** Backward of ref_attention_fwd: adds into dqkv (B,T,3C) given dout (B,T,C); see attention_bwd.
*/
void ref_attention_bwd(double *dqkv, const double *dout, const double *qkv, const double *att,
                       int B, int T, int C, int H)
{
    attn_dims a = {.B = B, .T = T, .H = H, .K = H, .D = C / H,
                   .q_ld = 3 * (size_t)C, .kv_ld = 3 * (size_t)C};
    attention_bwd(dqkv, dqkv + C, dqkv + 2 * (size_t)C, dout, qkv, qkv + C,
                  qkv + 2 * (size_t)C, att, &a);
}

/*
** Causal grouped-query attention (Llama) over separate q (B,T,H*D), k and v (B,T,K*D), K
** dividing H: query head h reads key/value head h / (H/K). out is (B,T,H*D), att (B,H,T,T).
** With K = H and q | k | v packed this is exactly ref_attention_fwd.
*/
void ref_attention_gqa_fwd(double *out, double *att, const double *q, const double *k,
                           const double *v, int B, int T, int H, int K, int D)
{
    attn_dims a = {.B = B, .T = T, .H = H, .K = K, .D = D,
                   .q_ld = (size_t)H * D, .kv_ld = (size_t)K * D};
    attention_fwd(out, att, q, k, v, &a);
}

/*
** Backward of ref_attention_gqa_fwd: adds into dq (B,T,H*D), dk and dv (B,T,K*D) given dout
** (B,T,H*D); a key/value head's gradient is the sum over the H/K query heads that read it.
*/
void ref_attention_gqa_bwd(double *dq, double *dk, double *dv, const double *dout,
                           const double *q, const double *k, const double *v, const double *att,
                           int B, int T, int H, int K, int D)
{
    attn_dims a = {.B = B, .T = T, .H = H, .K = K, .D = D,
                   .q_ld = (size_t)H * D, .kv_ld = (size_t)K * D};
    attention_bwd(dq, dk, dv, dout, q, k, v, att, &a);
}

/* GELU, tanh approximation (Hugging Face "gelu_new"):
** gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#define GELU_A 0.044715

/*
** out[i] = gelu(in[i]) for i < n.
*/
void ref_gelu_fwd(double *out, const double *in, size_t n)
{
    double s = sqrt(2.0 / REF_PI);
    for (size_t i = 0; i < n; i++) {
        double x = in[i];
        out[i] = 0.5 * x * (1.0 + tanh(s * (x + GELU_A * x * x * x)));
    }
}

/*
** din[i] += dout[i] * gelu'(in[i]), with u = s (x + a x^3), gelu' =
** 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) s (1 + 3 a x^2).
*/
void ref_gelu_bwd(double *din, const double *dout, const double *in, size_t n)
{
    double s = sqrt(2.0 / REF_PI);
    for (size_t i = 0; i < n; i++) {
        double x = in[i];
        double th = tanh(s * (x + GELU_A * x * x * x));
        double du = s * (1.0 + 3.0 * GELU_A * x * x);   /* d u / d x */
        double grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
        din[i] += dout[i] * grad;
    }
}

/*
** Tied LM head: logits (N,V) = x (N,C) . wte^T, wte (V,C).
*/
void ref_head_fwd(double *logits, const double *x, const double *wte, int N, int V, int C)
{
    for (int n = 0; n < N; n++) {
        const double *xn = x + (size_t)n * C;
        for (int v = 0; v < V; v++) {
            const double *e = wte + (size_t)v * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++)
                dot += xn[c] * e[c];
            logits[(size_t)n * V + v] = dot;
        }
    }
}

/*
** Backward of ref_head_fwd: dx += dlogits . wte, dwte += dlogits^T . x.
*/
void ref_head_bwd(double *dx, double *dwte, const double *dlogits, const double *x,
                  const double *wte, int N, int V, int C)
{
    for (int n = 0; n < N; n++) {
        const double *xn = x + (size_t)n * C;
        double *dxn = dx + (size_t)n * C;
        for (int v = 0; v < V; v++) {
            double g = dlogits[(size_t)n * V + v];
            const double *e = wte + (size_t)v * C;
            double *de = dwte + (size_t)v * C;
            for (int c = 0; c < C; c++) {
                dxn[c] += g * e[c];
                de[c] += g * xn[c];
            }
        }
    }
}

/*
** Softmax cross-entropy per row: losses[n] = logsumexp(logits[n,:]) - logits[n,targets[n]],
** probs[n,:] = softmax(logits[n,:]). probs may be the same array as logits (in place).
*/
void ref_xent_fwd(double *probs, double *losses, const double *logits, const int *targets,
                  int N, int V)
{
    for (int n = 0; n < N; n++) {
        const double *z = logits + (size_t)n * V;
        double *p = probs + (size_t)n * V;
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++)
            if (z[v] > mx)
                mx = z[v];
        for (int v = 0; v < V; v++)
            sum += exp(z[v] - mx);
        double lse = mx + log(sum);
        losses[n] = lse - z[targets[n]];
        for (int v = 0; v < V; v++)
            p[v] = exp(z[v] - lse);
    }
}

/*
** Backward of 'scale * sum of losses': dlogits[n,v] += scale * (probs[n,v] - [v == target]).
*/
void ref_xent_bwd(double *dlogits, const double *probs, const int *targets, int N, int V,
                  double scale)
{
    for (int n = 0; n < N; n++)
        for (int v = 0; v < V; v++) {
            double onehot = v == targets[n] ? 1.0 : 0.0;
            dlogits[(size_t)n * V + v] += scale * (probs[(size_t)n * V + v] - onehot);
        }
}

/* -- Llama ops -------------------------------------------------------------------------------- */
/* RMSNorm, rotary position embedding and SwiGLU: what Hugging Face's LlamaRMSNorm,
** apply_rotary_pos_emb (rotate_half) and LlamaMLP's act_fn(gate) * up compute, in double. */

/*
** RMSNorm over the rows of in (N,C): rstd[n] = 1/sqrt(mean(in[n,:]^2) + eps),
** out = in * rstd * w. Saves rstd (N) for the backward. out may not alias in.
*/
void ref_rmsnorm_fwd(double *out, double *rstd, const double *in, const double *w, int N, int C,
                     double eps)
{
    for (int n = 0; n < N; n++) {
        const double *x = in + (size_t)n * C;
        double *y = out + (size_t)n * C;
        double ms = 0.0;
        for (int c = 0; c < C; c++)
            ms += x[c] * x[c];
        ms /= C;
        double rs = 1.0 / sqrt(ms + eps);
        for (int c = 0; c < C; c++)
            y[c] = x[c] * rs * w[c];
        rstd[n] = rs;
    }
}

/*
** Backward of ref_rmsnorm_fwd. With xhat = in * rstd and g = dout * w:
** din += rstd * (g - xhat * mean(g * xhat)), dw += dout * xhat.
*/
void ref_rmsnorm_bwd(double *din, double *dw, const double *dout, const double *in,
                     const double *w, const double *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *x = in + (size_t)n * C;
        const double *dy = dout + (size_t)n * C;
        double *dx = din + (size_t)n * C;
        double gx_mean = 0.0;
        for (int c = 0; c < C; c++)
            gx_mean += dy[c] * w[c] * x[c] * rstd[n];
        gx_mean /= C;
        for (int c = 0; c < C; c++) {
            double xhat = x[c] * rstd[n];
            dx[c] += rstd[n] * (dy[c] * w[c] - xhat * gx_mean);
            dw[c] += dy[c] * xhat;
        }
    }
}

/*
** Rotate every head of N rows by angle pos[i] * inv_j, or by its negative when sign = -1.
** Row i starts at x + i*ld; head h occupies columns [h*D, (h+1)*D), pairs (j, j + D/2).
*/
static void rope_rotate(double *x, int ld, int N, const int *pos, int H, int D, double theta,
                        double sign)
{
    int half = D / 2;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < half; j++) {
            double inv = 1.0 / pow(theta, (double)(2 * j) / D);
            double a = (double)pos[i] * inv;
            double c = cos(a), s = sign * sin(a);
            for (int h = 0; h < H; h++) {
                double *r = x + (size_t)i * ld + (size_t)h * D;
                double x0 = r[j], x1 = r[j + half];
                r[j] = x0 * c - x1 * s;
                r[j + half] = x1 * c + x0 * s;
            }
        }
}

/*
** Rotary position embedding in place (HF rotate_half convention) on N rows of ld elements:
** H heads of D channels at columns h*D (D even); row i is at position pos[i] >= 0. For
** j < D/2, inv_j = 1 / theta^(2j/D), a = pos * inv_j (double):
**   x'[j] = x[j] cos a - x[j+D/2] sin a,  x'[j+D/2] = x[j+D/2] cos a + x[j] sin a.
*/
void ref_rope_fwd(double *x, int ld, int N, const int *pos, int H, int D, double theta)
{
    rope_rotate(x, ld, N, pos, H, D, theta, 1.0);
}

/*
** Backward of ref_rope_fwd, in place on the gradient dx (same layout): the transpose of the
** rotation, i.e. the rotation by -a. Unlike the other backward ops it overwrites.
*/
void ref_rope_bwd(double *dx, int ld, int N, const int *pos, int H, int D, double theta)
{
    rope_rotate(dx, ld, N, pos, H, D, theta, -1.0);
}

/*
** SwiGLU: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)), for i < n.
*/
void ref_swiglu_fwd(double *out, const double *gate, const double *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
}

/*
** Backward of ref_swiglu_fwd; WRITES (does not add) dgate and dup:
** dup = dout * silu(g), dgate = dout * up * sig(g) (1 + g (1 - sig(g))), sig = 1/(1+exp(-g)).
*/
void ref_swiglu_bwd(double *dgate, double *dup, const double *dout, const double *gate,
                    const double *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];
        double sig = 1.0 / (1.0 + exp(-g));
        double d = dout[i];
        dup[i] = d * g * sig;
        dgate[i] = d * up[i] * sig * (1.0 + g * (1.0 - sig));
    }
}

/* nn.Linear without bias (Llama's every weight): out (N,OUT) = in (N,IN) . w^T, w (OUT,IN).
** That is the LM head's layout, so ref_head_fwd computes it. */
static void linear_nt_fwd(double *out, const double *in, const double *w, int N, int IN, int OUT)
{
    ref_head_fwd(out, in, w, N, OUT, IN);
}

/* Backward of linear_nt_fwd: din += dout . w, dw += dout^T . in. */
static void linear_nt_bwd(double *din, double *dw, const double *dout, const double *in,
                          const double *w, int N, int IN, int OUT)
{
    ref_head_bwd(din, dw, dout, in, w, N, OUT, IN);
}

/* -- Mixture of experts --------------------------------------------------------------------- */
/*
** Megatron's TopKRouter and experts, written out (README.md, "Mixture of experts"), over
** N = B*T tokens, row n = b*T + t:
**   logits[n,e] = x_n . router_w[e]                              (no bias)
**   sel[n,0..k-1] = the k largest logits, descending; equal logits: the lower expert first
**   prob[n,j] = softmax over the k selected logits (default), or
**               softmax over all E logits, taken at sel[n,j] (pre_softmax; not renormalised);
**               times topk_scale when it is > 0
**   capacity (factor f > 0): per router call (the S = moe.shards blocks of T/S positions,
**               all B sequences: a tensor-parallel rank's tokens under SP; with cp_shards P
**               blocks of each cp rank's local positions) of n tokens,
**               cap = ceil((n*k/E) * f) (none if cap > n); each expert keeps up to cap of the
**               call's choices -- those of the highest probability, ties to the earlier row
**               (t, b) (drop_probs), or the earliest rows: position t first, then sequence
**               b -- and drops the rest; a dropped choice adds nothing, the token keeps its
**               other choices with their probabilities unchanged
**   out_n = sum over kept j of prob[n,j] * (c_proj_e(gelu(c_fc_e(x_n)))),  e = sel[n,j]
**               (Megatron scales the activation before fc2 and the fc2 bias by prob, which
**               is the same as scaling the whole expert output, bias included); in a Llama
**               model the expert is Mixtral's w2_e(silu(w1_e x_n) * w3_e x_n)
**   aux = coeff * E / (k N^2) * sum_e (sum_n scores[n,e]) * count_e, with scores = softmax
**               over all E, count_e = tokens whose top-k holds e, before any dropping;
**               plus the z-loss z_coeff / N * sum_n logsumexp(logits[n,:])^2
*/

/* log(sum_e exp(z[e])) of n values, shifted by their maximum. */
static double logsumexp(const double *z, int n)
{
    double mx = z[0], sum = 0.0;
    for (int i = 1; i < n; i++)
        mx = fmax(mx, z[i]);
    for (int i = 0; i < n; i++)
        sum += exp(z[i] - mx);
    return mx + log(sum);
}

/*
** Expert capacity of a forward over 'ntokens' tokens: ceil((ntokens*k / E) * factor), the
** division and the product in double exactly in this order (Megatron's get_capacity, with
** num_tokens = ntokens*k). 0 when moe->capacity <= 0 (no dropping).
*/
static double drop_margin = 1.0;
static long drop_ties;

double ref_moe_drop_margin(long *ties)
{
    if (ties) *ties = drop_ties;
    return drop_margin;
}

int ref_moe_capacity(int ntokens, const ref_moe_config *moe)
{
    if (!(moe->capacity > 0.0))
        return 0;
    double per_expert = (double)((long long)ntokens * moe->top_k) / moe->experts;
    return (int)ceil(per_expert * moe->capacity);
}

/*
** Allocate the MoE activations of a forward over N tokens into *ma (zeroed; u too, which only
** Llama's experts use).
** Release with ref_moe_acts_release.
*/
void ref_moe_acts_init(ref_moe_acts *ma, const ref_moe_config *moe, int N, int C)
{
    size_t n = (size_t)N, E = (size_t)moe->experts, k = (size_t)moe->top_k;
    memset(ma, 0, sizeof *ma);
    ma->logits = dalloc(n * E);
    ma->scores = dalloc(n * E);
    ma->sel = ref_xcalloc(n * k, sizeof(int));
    ma->prob = dalloc(n * k);
    ma->keep = ref_xcalloc(n * k, sizeof(int));
    ma->h = dalloc(n * k * (size_t)moe->ffn);
    ma->u = dalloc(n * k * (size_t)moe->ffn);
    ma->a = dalloc(n * k * (size_t)moe->ffn);
    ma->y = dalloc(n * k * (size_t)C);
    ma->count = ref_xcalloc((size_t)E * N, sizeof(int));
    ma->routed = ref_xcalloc((size_t)E, sizeof(int));
}

/*
** Free the arrays of *ma (from ref_moe_acts_init; a zeroed struct is allowed).
*/
void ref_moe_acts_release(ref_moe_acts *ma)
{
    free(ma->logits);
    free(ma->scores);
    free(ma->sel);
    free(ma->prob);
    free(ma->keep);
    free(ma->h);
    free(ma->u);
    free(ma->a);
    free(ma->y);
    free(ma->count);
    free(ma->routed);
    memset(ma, 0, sizeof *ma);
}

/* out[i] = softmax(z)[i] for i < n (out may be z). */
static void softmax(double *out, const double *z, int n)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        if (z[i] > mx)
            mx = z[i];
    for (int i = 0; i < n; i++) {
        out[i] = exp(z[i] - mx);
        sum += out[i];
    }
    for (int i = 0; i < n; i++)
        out[i] /= sum;
}

/* sel[0..k-1] = indices of the k largest z[0..E-1], largest first; among equal values the
** lower index comes first (the scan is ascending and only a strictly larger value wins). */
/* sel = the k largest of z (E), descending, ties to the lower index; with ok non-NULL only
** among the experts e whose group e / W has ok[e / W] set. */
static void topk_select(int *sel, const double *z, int E, int k, const unsigned char *ok,
                        int W)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = ok != NULL && !ok[e / W];
            for (int i = 0; i < j; i++)
                taken |= sel[i] == e;
            if (!taken && (best < 0 || z[e] > z[best]))
                best = e;
        }
        sel[j] = best;
    }
}

/* One expert on one token 'in' (C): y (C) = the expert's output, keeping h, u and a (Fe).
** GPT-2: c_proj(gelu(c_fc(in))) (u untouched); Llama (x->w1 set): w2(silu(w1 in) * w3 in). */
static void expert_fwd(double *y, double *h, double *u, double *a, const ref_expert *x,
                       const double *in, int C, int Fe)
{
    if (x->w1 != NULL) {
        linear_nt_fwd(h, in, x->w1, 1, C, Fe);
        linear_nt_fwd(u, in, x->w3, 1, C, Fe);
        ref_swiglu_fwd(a, h, u, (size_t)Fe);
        linear_nt_fwd(y, a, x->w2, 1, Fe, C);
        return;
    }
    ref_linear_fwd(h, in, x->c_fc_w, x->c_fc_b, 1, C, Fe);
    ref_gelu_fwd(a, h, (size_t)Fe);
    ref_linear_fwd(y, a, x->c_proj_w, x->c_proj_b, 1, Fe, C);
}

/* Backward of expert_fwd for the gradient gy (C) of y: adds into dx (C) and the expert's
** gradients xg; d_a, d_h, d_u are scratch (Fe). */
static void expert_bwd(double *dx, ref_expert *xg, const double *gy, const ref_expert *xw,
                       const double *in, const double *h, const double *u, const double *a,
                       double *d_a, double *d_h, double *d_u, int C, int Fe)
{
    memset(d_a, 0, (size_t)Fe * sizeof(double));
    if (xw->w1 != NULL) {
        linear_nt_bwd(d_a, xg->w2, gy, a, xw->w2, 1, Fe, C);
        ref_swiglu_bwd(d_h, d_u, d_a, h, u, (size_t)Fe);
        linear_nt_bwd(dx, xg->w1, d_h, in, xw->w1, 1, C, Fe);
        linear_nt_bwd(dx, xg->w3, d_u, in, xw->w3, 1, C, Fe);
        return;
    }
    ref_linear_bwd(d_a, xg->c_proj_w, xg->c_proj_b, gy, a, xw->c_proj_w, 1, Fe, C);
    memset(d_h, 0, (size_t)Fe * sizeof(double));
    ref_gelu_bwd(d_h, d_a, h, (size_t)Fe);
    ref_linear_bwd(dx, xg->c_fc_w, xg->c_fc_b, d_h, in, xw->c_fc_w, 1, C, Fe);
}

/*
** Mixture-of-experts forward over B sequences of T tokens: in and out are (N,C), N = B*T,
** row n = b*T + t (the capacity's drop order needs B and T). Overwrites out and every field
** of *ma (routing, expert activations, counts, capacity, and ma->aux, the load-balancing loss
** of these N tokens with the coefficient applied; 0 when moe->aux_coeff is 0).
*/
void ref_moe_fwd(double *out, ref_moe_acts *ma, const ref_moe_weights *w,
                 const ref_moe_config *moe, const double *in, int B, int T, int C)
{
    int N = B * T, E = moe->experts, k = moe->top_k, Fe = moe->ffn;
    double *gv = dalloc((size_t)E), *gsum = dalloc((size_t)E);     /* group-limited scratch */
    double *key = dalloc((size_t)E);     /* the top-k's ranking: z, or sigmoid(z) + bias */
    const double *eb = moe->bias_rate > 0.0 ? w->expert_bias : NULL;
    unsigned char *gok = ref_xcalloc((size_t)E, 1);
    int *plain = ref_xcalloc((size_t)k, sizeof(int));

    /* routing: logits, scores over all experts, top-k choices and their probabilities; the
    ** aux loss's counts per expert (with seq_aux per sequence b = n / T) */
    int S = moe->seq_aux ? B : 1;
    memset(ma->count, 0, (size_t)S * E * sizeof(int));
    for (int n = 0; n < N; n++) {
        const double *x = in + (size_t)n * C;
        double *z = ma->logits + (size_t)n * E;
        double *s = ma->scores + (size_t)n * E;
        int *sel = ma->sel + (size_t)n * k;
        double *prob = ma->prob + (size_t)n * k;
        for (int e = 0; e < E; e++) {
            const double *r = w->router_w + (size_t)e * C;
            double dot = w->router_b ? w->router_b[e] : 0.0;
            for (int c = 0; c < C; c++)
                dot += x[c] * r[c];
            z[e] = dot;
        }
        softmax(s, z, E);
        const unsigned char *okp = NULL;
        int W = E;
        if (moe->groups > 1) {  /* group-limited: the group_topk best groups */
            W = E / moe->groups;
            for (int e = 0; e < E; e++)     /* the selection values */
                gv[e] = moe->sigmoid ? 1.0 / (1.0 + exp(-z[e])) + (eb ? eb[e] : 0.0)
                                     : moe->pre_softmax ? s[e] : z[e];
            int m = k / moe->group_topk;
            for (int g = 0; g < moe->groups; g++) {
                gsum[g] = 0.0;
                for (int e = g * W; e < (g + 1) * W; e++) {
                    int rank = 0;
                    for (int f = g * W; f < (g + 1) * W; f++)
                        rank += gv[f] > gv[e] || (gv[f] == gv[e] && f < e);
                    if (rank < m)
                        gsum[g] += gv[e];
                }
            }
            for (int g = 0; g < moe->groups; g++) {
                int rank = 0;
                for (int h = 0; h < moe->groups; h++)
                    rank += gsum[h] > gsum[g] || (gsum[h] == gsum[g] && h < g);
                gok[g] = rank < moe->group_topk;
            }
            okp = gok;
        }
        for (int e = 0; e < E; e++)    /* expert bias: for the choice only */
            key[e] = eb ? 1.0 / (1.0 + exp(-z[e])) + eb[e] : z[e];
        topk_select(sel, key, E, k, okp, W);
        if (moe->sigmoid) {     /* scores: the sigmoids over their sum; sigmoid is increasing */
            double D = 1e-20, ps = 1e-20;
            for (int e = 0; e < E; e++)
                D += s[e] = 1.0 / (1.0 + exp(-z[e]));
            for (int j = 0; j < k; j++)
                ps += s[sel[j]];
            for (int j = 0; j < k; j++)
                prob[j] = k > 1 ? s[sel[j]] / ps : s[sel[j]];
            for (int e = 0; e < E; e++)
                s[e] /= D;
        }
        /* the aux loss's counts: the plain top-k of the logits, without the group limit and
        ** without the expert bias (Megatron's compute_routing_scores_for_aux_loss); only
        ** without either is that the routing itself */
        int *csel = sel;
        if (moe->groups > 1 || eb) {
            topk_select(plain, z, E, k, NULL, E);
            csel = plain;
        }
        for (int j = 0; j < k; j++) {
            if (!moe->sigmoid)
                prob[j] = moe->pre_softmax ? s[sel[j]] : z[sel[j]];
            ma->keep[(size_t)n * k + j] = 1;
            ma->count[(moe->seq_aux ? n / T : 0) * E + csel[j]]++;
        }
        if (!moe->pre_softmax && !moe->sigmoid)
            softmax(prob, prob, k);
        for (int j = 0; j < k && moe->topk_scale > 0.0; j++)
            prob[j] *= moe->topk_scale;
    }
    free(gv);
    free(gsum);
    free(key);
    free(gok);
    free(plain);

    /* capacity: per router call (S blocks of positions), each expert keeps 'cap' choices,
    ** visited in row order (t, b) or by falling probability */
    /* (with cp_shards P > 1 a call is one of a cp rank's R blocks of its local positions: its
    ** chunks c and 2P-1-c of T/(2P), in that order) */
    int R = moe->shards > 1 ? moe->shards : 1, P = moe->cp_shards > 1 ? moe->cp_shards : 1;
    int Tl = T / P, Ts = Tl / R, ch = T / (2 * P);
    ma->capacity = ref_moe_capacity(Ts * B, moe);
    if (ma->capacity > 0 && ma->capacity <= Ts * B) {
        int *order = ref_xcalloc((size_t)Ts * B * k, sizeof(int));
        for (int s = 0; s < P * R; s++)
            for (int e = 0; e < E; e++) {
                int m = 0;       /* expert e's choices of this call, in local row order */
                int c = s / R;
                for (int tl = s % R * Ts; tl < (s % R + 1) * Ts; tl++)
                    for (int b = 0; b < B; b++)
                        for (int j = 0; j < k; j++) {
                            int t = P == 1 ? tl : tl < ch ? c * ch + tl
                                                          : (2 * P - 1 - c) * ch + tl - ch;
                            int nj = (b * T + t) * k + j;
                            if (ma->sel[nj] == e)
                                order[m++] = nj;
                        }
                for (int i = 1; moe->drop_probs && i < m; i++) {   /* stable: ties keep rows */
                    int v = order[i], q = i;
                    for (; q > 0 && ma->prob[order[q - 1]] < ma->prob[v]; q--)
                        order[q] = order[q - 1];
                    order[q] = v;
                }
                if (moe->drop_probs && m > ma->capacity) {
                    double kept = ma->prob[order[ma->capacity - 1]];
                    double gap = (kept - ma->prob[order[ma->capacity]]) / kept;
                    if (gap > 0 && gap < drop_margin) drop_margin = gap;
                    drop_ties += gap == 0;
                }
                for (int i = ma->capacity; i < m; i++)
                    ma->keep[order[i]] = 0;
            }
        free(order);
    }
    /* the expert bias's counts: the kept choices; with padding every expert's rows, min(cap,
    ** tokens) per router call (Megatron counts its padded routing map) */
    memset(ma->routed, 0, (size_t)E * sizeof(int));
    int cap = ref_moe_capacity(Ts * B, moe);
    for (int e = 0; e < E && moe->pad && cap > 0; e++)
        ma->routed[e] = P * R * (cap < Ts * B ? cap : Ts * B);
    for (int nj = 0; nj < N * k && !(moe->pad && cap > 0); nj++)
        ma->routed[ma->sel[nj]] += ma->keep[nj];

    /* experts: out_n = sum over kept choices of prob * expert_e(x_n) */
    memset(out, 0, (size_t)N * C * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            size_t nj = (size_t)n * k + j;
            double *h = ma->h + nj * Fe, *u = ma->u + nj * Fe, *a = ma->a + nj * Fe;
            double *y = ma->y + nj * C;
            if (!ma->keep[nj]) {
                memset(h, 0, (size_t)Fe * sizeof(double));
                memset(u, 0, (size_t)Fe * sizeof(double));
                memset(a, 0, (size_t)Fe * sizeof(double));
                memset(y, 0, (size_t)C * sizeof(double));
                continue;
            }
            expert_fwd(y, h, u, a, &w->experts[ma->sel[nj]], in + (size_t)n * C, C, Fe);
            double p = ma->prob[nj];
            double *o = out + (size_t)n * C;
            for (int c = 0; c < C; c++)
                o[c] += p * y[c];
        }

    /* load-balancing loss, Megatron's switch_load_balancing_loss_func */
    ma->aux = 0.0;
    if (moe->aux_coeff != 0.0) {      /* seq_aux: the mean over b of sequence b's aux loss */
        double sum = 0.0;
        int Ns = N / S;                 /* tokens per set */
        for (int b = 0; b < S; b++)
            for (int e = 0; e < E; e++) {
                double pe = 0.0;
                for (int n = b * Ns; n < (b + 1) * Ns; n++)
                    pe += ma->scores[(size_t)n * E + e];
                sum += pe * ma->count[b * E + e];
            }
        ma->aux = sum * (E * moe->aux_coeff / ((double)Ns * Ns * k)) / S;
    }
    /* z-loss, Megatron's z_loss_func (the mean over the micro-batch's tokens) */
    if (moe->z_coeff != 0.0) {
        double sum = 0.0;
        for (int n = 0; n < N; n++) {
            double lse = logsumexp(ma->logits + (size_t)n * E, E);
            sum += lse * lse;
        }
        ma->aux += moe->z_coeff * sum / N;
    }
}

/*
** Backward of ref_moe_fwd (same in, w, moe, B, T and its *ma) for the objective
** 'dout . out + aux_scale * aux': ADDS into din (N,C) and into every tensor of g (router and
** experts; the bias views may be NULL). The router gets the gradient through the routing
** probabilities and, when aux_coeff != 0, through the aux loss's softmax over all experts;
** token counts and choices are constants (piecewise).
*/
void ref_moe_bwd(double *din, ref_moe_weights *g, const double *dout, double aux_scale,
                 const ref_moe_acts *ma, const ref_moe_weights *w, const ref_moe_config *moe,
                 const double *in, int B, int T, int C)
{
    int N = B * T, E = moe->experts, k = moe->top_k, Fe = moe->ffn;
    double *gy = dalloc((size_t)C), *d_a = dalloc((size_t)Fe), *d_h = dalloc((size_t)Fe);
    double *d_u = dalloc((size_t)Fe);
    double *dp = dalloc((size_t)k), *ds = dalloc((size_t)E), *dz = dalloc((size_t)E);
    /* d (aux_scale * aux) / d scores[n,e] = aux_g * count_e (of n's sequence with seq_aux) */
    int S = moe->seq_aux ? B : 1, Ns = N / S;
    double aux_g = aux_scale * (E * moe->aux_coeff / ((double)Ns * Ns * k)) / S;

    for (int n = 0; n < N; n++) {
        const double *x = in + (size_t)n * C, *dy = dout + (size_t)n * C;
        double *dx = din + (size_t)n * C;

        /* experts of the kept choices; dp[j] = d objective / d prob[n,j] */
        for (int j = 0; j < k; j++) {
            size_t nj = (size_t)n * k + j;
            dp[j] = 0.0;
            if (!ma->keep[nj])
                continue;
            int e = ma->sel[nj];
            const double *y = ma->y + nj * C;
            double p = ma->prob[nj];
            for (int c = 0; c < C; c++) {
                dp[j] += dy[c] * y[c];
                gy[c] = p * dy[c];
            }
            expert_bwd(dx, &g->experts[e], gy, &w->experts[e], x, ma->h + nj * Fe,
                       ma->u + nj * Fe, ma->a + nj * Fe, d_a, d_h, d_u, C, Fe);
        }

        /* dz = d objective / d logits[n,:]: through the probabilities, then the aux loss */
        const double *s = ma->scores + (size_t)n * E;
        const int *sel = ma->sel + (size_t)n * k;
        const double *prob = ma->prob + (size_t)n * k;
        memset(dz, 0, (size_t)E * sizeof(double));
        memset(ds, 0, (size_t)E * sizeof(double));
        double sc = moe->topk_scale > 0.0 ? moe->topk_scale : 1.0;   /* prob = sc * q */
        if (moe->sigmoid) {
            /* sig_e = s_e * D; q_j = sig_j / (sum of the chosen + 1e-20) (k = 1: sig_j);
            ** d sig from q and from the aux scores s = sig / D, then d z = d sig sig (1 - sig) */
            const double *z = ma->logits + (size_t)n * E;
            double D = 1e-20, ssel = 1e-20, qd = 0.0, gs = 0.0;
            for (int e = 0; e < E; e++)
                D += 1.0 / (1.0 + exp(-z[e]));
            for (int j = 0; j < k; j++)
                ssel += 1.0 / (1.0 + exp(-z[sel[j]]));
            for (int j = 0; j < k; j++)
                qd += prob[j] / sc * sc * dp[j];
            if (moe->aux_coeff != 0.0)
                for (int e = 0; e < E; e++)
                    gs += aux_g * ma->count[n / Ns * E + e] * s[e];
            for (int e = 0; e < E; e++) {
                double sig = 1.0 / (1.0 + exp(-z[e]));
                double dsig = moe->aux_coeff != 0.0 ?
                              (aux_g * ma->count[n / Ns * E + e] - gs) / D : 0.0;
                for (int j = 0; j < k; j++)
                    if (sel[j] == e)
                        dsig += k > 1 ? (sc * dp[j] - qd) / ssel : sc * dp[j];
                dz[e] = dsig * sig * (1.0 - sig);
            }
        } else if (moe->pre_softmax) {
            for (int j = 0; j < k; j++)
                ds[sel[j]] += sc * dp[j];
        } else {
            double pdp = 0.0;           /* sum over j of q_j * d q_j, d q_j = sc * dp[j] */
            for (int j = 0; j < k; j++)
                pdp += prob[j] * dp[j];
            for (int j = 0; j < k; j++)
                dz[sel[j]] += prob[j] / sc * (sc * dp[j] - pdp);
        }
        if (moe->aux_coeff != 0.0 && !moe->sigmoid)
            for (int e = 0; e < E; e++)
                ds[e] += aux_g * ma->count[n / Ns * E + e];
        if (moe->z_coeff != 0.0) {  /* d lse^2 / d logits = 2 lse * softmax(logits) */
            const double *z = ma->logits + (size_t)n * E;
            double lse = logsumexp(z, E);
            double zg = aux_scale * moe->z_coeff / N * 2.0 * lse;
            for (int e = 0; e < E; e++)
                dz[e] += zg * exp(z[e] - lse);
        }
        double sds = 0.0;
        for (int e = 0; e < E && !moe->sigmoid; e++)
            sds += s[e] * ds[e];
        for (int e = 0; e < E && !moe->sigmoid; e++)
            dz[e] += s[e] * (ds[e] - sds);

        /* logits = x . router_w^T (+ router_b) */
        for (int e = 0; e < E; e++) {
            if (g->router_b)
                g->router_b[e] += dz[e];
            if (dz[e] == 0.0)
                continue;
            const double *r = w->router_w + (size_t)e * C;
            double *dr = g->router_w + (size_t)e * C;
            for (int c = 0; c < C; c++) {
                dr[c] += dz[e] * x[c];
                dx[c] += dz[e] * r[c];
            }
        }
    }
    free(gy);
    free(d_a);
    free(d_h);
    free(d_u);
    free(dp);
    free(ds);
    free(dz);
}

/* -- Activations ------------------------------------------------------------------------------ */

/*
** Allocate the activations and backward scratch for forward passes over B sequences.
** Free with ref_acts_free and the same cfg.
*/
ref_acts *ref_acts_new(const ref_config *cfg, int B)
{
    size_t N = (size_t)B * cfg->seq, C = cfg->hidden, F = (size_t)mlp_width(cfg), V = cfg->vocab;
    size_t H = cfg->heads, T = cfg->seq, D = C / H, K = (size_t)kv_heads(cfg);
    int llama = cfg->arch == REF_ARCH_LLAMA;
    ref_acts *a = ref_xcalloc(1, sizeof *a);
    a->B = B;
    a->layer = ref_xcalloc((size_t)cfg->layers, sizeof *a->layer);
    for (int l = 0; l < cfg->layers; l++) {
        ref_layer_acts *la = &a->layer[l];
        la->x_in = dalloc(N * C);
        la->ln1 = dalloc(N * C);
        la->ln1_rstd = dalloc(N);
        la->att = dalloc((size_t)B * H * T * T);
        la->y = dalloc(N * C);
        la->x_mid = dalloc(N * C);
        la->ln2 = dalloc(N * C);
        la->ln2_rstd = dalloc(N);
        if (llama) {
            la->q = dalloc(N * H * D);
            la->k = dalloc(N * K * D);
            la->v = dalloc(N * K * D);
        } else {
            la->ln1_mean = dalloc(N);
            la->ln2_mean = dalloc(N);
            la->qkv = dalloc(N * 3 * C);
        }
        if (cfg->moe.experts > 0)
            ref_moe_acts_init(&la->moe, &cfg->moe, (int)N, (int)C);
        if (F > 0) {
            la->mlp.h = dalloc(N * F);
            la->mlp.a = dalloc(N * F);
            if (llama)
                la->mlp.u = dalloc(N * F);
        }
    }
    a->pos = ref_xcalloc(N, sizeof(int));
    for (size_t n = 0; n < N; n++)
        a->pos[n] = (int)(n % T);
    a->x_out = dalloc(N * C);
    a->lnf = dalloc(N * C);
    if (!llama)
        a->lnf_mean = dalloc(N);
    a->lnf_rstd = dalloc(N);
    a->probs = dalloc(N * V);
    a->losses = dalloc(N);
    a->d_res = dalloc(N * C);
    a->d_ln = dalloc(N * C);
    a->d_y = dalloc(N * C);
    a->d_qkv = dalloc(N * 3 * C);         /* Llama: (H + 2K) D <= 3C */
    if (F > 0) {
        a->d_h = dalloc(N * F);
        a->d_a = dalloc(N * F);
        if (llama)
            a->d_u = dalloc(N * F);
    }
    a->d_logits = dalloc(N * V);
    return a;
}

/*
** Free activations from ref_acts_new (NULL is allowed).
*/
void ref_acts_free(ref_acts *a, const ref_config *cfg)
{
    if (a == NULL)
        return;
    for (int l = 0; l < cfg->layers; l++) {
        ref_layer_acts *la = &a->layer[l];
        free(la->x_in);
        free(la->ln1);
        free(la->ln1_mean);
        free(la->ln1_rstd);
        free(la->qkv);
        free(la->q);
        free(la->k);
        free(la->v);
        free(la->att);
        free(la->y);
        free(la->x_mid);
        free(la->ln2);
        free(la->ln2_mean);
        free(la->ln2_rstd);
        free(la->mlp.h);
        free(la->mlp.u);
        free(la->mlp.a);
        ref_moe_acts_release(&la->moe);
    }
    free(a->layer);
    free(a->pos);
    free(a->x_out);
    free(a->lnf);
    free(a->lnf_mean);
    free(a->lnf_rstd);
    free(a->probs);
    free(a->losses);
    free(a->d_res);
    free(a->d_ln);
    free(a->d_y);
    free(a->d_qkv);
    free(a->d_h);
    free(a->d_a);
    free(a->d_u);
    free(a->d_logits);
    free(a);
}

static void zero(double *p, size_t n)
{
    memset(p, 0, n * sizeof(double));
}

/* -- Feed-forward block (what a mixture of experts replaces) ---------------------- */

/* out (N,C) = c_proj(gelu(c_fc(in))); keeps the c_fc output and the GELU output. */
static void mlp_fwd(double *out, ref_mlp_acts *ma, const ref_layer *w, const double *in,
                    int N, int C, int F)
{
    ref_linear_fwd(ma->h, in, w->mlp.c_fc_w, w->mlp.c_fc_b, N, C, F);
    ref_gelu_fwd(ma->a, ma->h, (size_t)N * F);
    ref_linear_fwd(out, ma->a, w->mlp.c_proj_w, w->mlp.c_proj_b, N, F, C);
}

/* Backward of mlp_fwd: din += ..., parameter gradients into g; d_h, d_a are scratch (N,F). */
static void mlp_bwd(double *din, ref_layer *g, const double *dout, const ref_mlp_acts *ma,
                    const ref_layer *w, const double *in, double *d_h, double *d_a,
                    int N, int C, int F)
{
    zero(d_a, (size_t)N * F);
    ref_linear_bwd(d_a, g->mlp.c_proj_w, g->mlp.c_proj_b, dout, ma->a, w->mlp.c_proj_w,
                   N, F, C);
    zero(d_h, (size_t)N * F);
    ref_gelu_bwd(d_h, d_a, ma->h, (size_t)N * F);
    ref_linear_bwd(din, g->mlp.c_fc_w, g->mlp.c_fc_b, d_h, in, w->mlp.c_fc_w, N, C, F);
}

/* out (N,C) = down(silu(gate(in)) * up(in)), Llama's MLP; keeps gate, up and the product. */
static void swiglu_mlp_fwd(double *out, ref_mlp_acts *ma, const ref_layer *w, const double *in,
                           int N, int C, int F)
{
    linear_nt_fwd(ma->h, in, w->gate_w, N, C, F);
    linear_nt_fwd(ma->u, in, w->up_w, N, C, F);
    ref_swiglu_fwd(ma->a, ma->h, ma->u, (size_t)N * F);
    linear_nt_fwd(out, ma->a, w->down_w, N, F, C);
}

/* Backward of swiglu_mlp_fwd: din += ..., parameter gradients into g; d_h, d_u, d_a are
** scratch (N,F). */
static void swiglu_mlp_bwd(double *din, ref_layer *g, const double *dout, const ref_mlp_acts *ma,
                           const ref_layer *w, const double *in, double *d_h, double *d_u,
                           double *d_a, int N, int C, int F)
{
    zero(d_a, (size_t)N * F);
    linear_nt_bwd(d_a, g->down_w, dout, ma->a, w->down_w, N, F, C);
    ref_swiglu_bwd(d_h, d_u, d_a, ma->h, ma->u, (size_t)N * F);
    linear_nt_bwd(din, g->gate_w, d_h, in, w->gate_w, N, C, F);
    linear_nt_bwd(din, g->up_w, d_u, in, w->up_w, N, C, F);
}

/* -- Forward and backward ---------------------------------------------------------------------- */

/* The residual stream leaving layer l: the next layer's input, or x_out after the last. */
static double *layer_out(ref_acts *a, int l, int L)
{
    return l + 1 < L ? a->layer[l + 1].x_in : a->x_out;
}

/*
** The Llama forward (README.md, "Llama"), ref_forward's contract. Per layer:
**   h = rmsnorm(x_in); q, k, v = h . Wq^T, h . Wk^T, h . Wv^T; rope(q), rope(k) at position t;
**   x_mid = x_in + gqa_attention(q, k, v) . Wo^T; h = rmsnorm(x_mid);
**   out = x_mid + down(silu(gate(h)) * up(h))   (or the mixture of Mixtral experts, plus
**         the shared expert's down(silu(gate(h)) * up(h)) with moe.shared_ffn)
** then logits = rmsnorm(x_out) . lm_head^T.
*/
static double llama_forward(const ref_model *m, ref_acts *a, const int *inputs,
                            const int *targets)
{
    const ref_config *cfg = &m->cfg;
    int B = a->B, T = cfg->seq, C = cfg->hidden, F = mlp_width(cfg), L = cfg->layers;
    int H = cfg->heads, K = kv_heads(cfg), D = C / H, N = B * T;

    ref_embed_fwd(L > 0 ? a->layer[0].x_in : a->x_out, inputs, m->w.wte, NULL, B, T, C);
    a->aux = 0.0;
    for (int l = 0; l < L; l++) {
        const ref_layer *w = &m->w.h[l];
        ref_layer_acts *la = &a->layer[l];
        double *out = layer_out(a, l, L);

        ref_rmsnorm_fwd(la->ln1, la->ln1_rstd, la->x_in, w->input_ln_w, N, C, cfg->ln_eps);
        linear_nt_fwd(la->q, la->ln1, w->q_w, N, C, H * D);
        linear_nt_fwd(la->k, la->ln1, w->k_w, N, C, K * D);
        linear_nt_fwd(la->v, la->ln1, w->v_w, N, C, K * D);
        ref_rope_fwd(la->q, H * D, N, a->pos, H, D, rope_theta(cfg));
        ref_rope_fwd(la->k, K * D, N, a->pos, K, D, rope_theta(cfg));
        ref_attention_gqa_fwd(la->y, la->att, la->q, la->k, la->v, B, T, H, K, D);
        linear_nt_fwd(la->x_mid, la->y, w->o_w, N, H * D, C);
        for (size_t i = 0; i < (size_t)N * C; i++)
            la->x_mid[i] += la->x_in[i];

        ref_rmsnorm_fwd(la->ln2, la->ln2_rstd, la->x_mid, w->post_ln_w, N, C, cfg->ln_eps);
        if (cfg->moe.experts > 0) {
            ref_moe_fwd(out, &la->moe, &w->moe, &cfg->moe, la->ln2, B, T, C);
            a->aux += la->moe.aux;
            if (F > 0) {        /* + the shared expert (d_y is free in the forward) */
                swiglu_mlp_fwd(a->d_y, &la->mlp, w, la->ln2, N, C, F);
                for (size_t i = 0; i < (size_t)N * C; i++)
                    out[i] += a->d_y[i];
            }
        } else {
            swiglu_mlp_fwd(out, &la->mlp, w, la->ln2, N, C, F);
        }
        for (size_t i = 0; i < (size_t)N * C; i++)
            out[i] += la->x_mid[i];
    }
    ref_rmsnorm_fwd(a->lnf, a->lnf_rstd, a->x_out, m->w.ln_f_w, N, C, cfg->ln_eps);
    ref_head_fwd(a->probs, a->lnf, m->w.lm_head, N, cfg->vocab, C);
    ref_xent_fwd(a->probs, a->losses, a->probs, targets, N, cfg->vocab);

    double sum = 0.0;
    for (int n = 0; n < N; n++)
        sum += a->losses[n];
    return sum;
}

/* The Llama backward, ref_backward's contract (the tied head's gradient lands in wte's). */
static void llama_backward(ref_model *m, ref_acts *a, const int *inputs, const int *targets,
                           double scale, double aux_scale)
{
    const ref_config *cfg = &m->cfg;
    int B = a->B, T = cfg->seq, C = cfg->hidden, F = mlp_width(cfg), L = cfg->layers;
    int H = cfg->heads, K = kv_heads(cfg), D = C / H, V = cfg->vocab, N = B * T;
    size_t NC = (size_t)N * C;
    double *d_q = a->d_qkv, *d_k = d_q + (size_t)N * H * D, *d_v = d_k + (size_t)N * K * D;

    zero(a->d_logits, (size_t)N * V);
    ref_xent_bwd(a->d_logits, a->probs, targets, N, V, scale);
    zero(a->d_ln, NC);
    ref_head_bwd(a->d_ln, m->g.lm_head, a->d_logits, a->lnf, m->w.lm_head, N, V, C);
    zero(a->d_res, NC);
    ref_rmsnorm_bwd(a->d_res, m->g.ln_f_w, a->d_ln, a->x_out, m->w.ln_f_w, a->lnf_rstd, N, C);

    for (int l = L - 1; l >= 0; l--) {
        const ref_layer *w = &m->w.h[l];
        ref_layer *g = &m->g.h[l];
        ref_layer_acts *la = &a->layer[l];

        zero(a->d_ln, NC);
        if (cfg->moe.experts > 0)
            ref_moe_bwd(a->d_ln, &g->moe, a->d_res, aux_scale, &la->moe, &w->moe, &cfg->moe,
                        la->ln2, B, T, C);
        if (F > 0)              /* the dense MLP or the shared expert */
            swiglu_mlp_bwd(a->d_ln, g, a->d_res, &la->mlp, w, la->ln2, a->d_h, a->d_u, a->d_a,
                           N, C, F);
        ref_rmsnorm_bwd(a->d_res, g->post_ln_w, a->d_ln, la->x_mid, w->post_ln_w, la->ln2_rstd,
                        N, C);

        zero(a->d_y, NC);
        linear_nt_bwd(a->d_y, g->o_w, a->d_res, la->y, w->o_w, N, H * D, C);
        zero(a->d_qkv, (size_t)N * (H + 2 * K) * D);
        ref_attention_gqa_bwd(d_q, d_k, d_v, a->d_y, la->q, la->k, la->v, la->att, B, T, H, K,
                              D);
        ref_rope_bwd(d_q, H * D, N, a->pos, H, D, rope_theta(cfg));
        ref_rope_bwd(d_k, K * D, N, a->pos, K, D, rope_theta(cfg));
        zero(a->d_ln, NC);
        linear_nt_bwd(a->d_ln, g->q_w, d_q, la->ln1, w->q_w, N, C, H * D);
        linear_nt_bwd(a->d_ln, g->k_w, d_k, la->ln1, w->k_w, N, C, K * D);
        linear_nt_bwd(a->d_ln, g->v_w, d_v, la->ln1, w->v_w, N, C, K * D);
        ref_rmsnorm_bwd(a->d_res, g->input_ln_w, a->d_ln, la->x_in, w->input_ln_w, la->ln1_rstd,
                        N, C);
    }
    ref_embed_bwd(m->g.wte, NULL, a->d_res, inputs, B, T, C);
}

/*
** Forward pass over a->B sequences: inputs and targets are (B,T) token ids in [0, V).
** Stores every activation in 'a' and returns the SUM over the B*T positions of the
** cross-entropy -log p(target) (divide by the token count for the mean). For a mixture of
** experts, a->aux is set to the sum over layers of these B*T tokens' load-balancing losses
** (0 for a dense model or aux_coeff 0). Either architecture (a Llama model: llama_forward).
*/
double ref_forward(const ref_model *m, ref_acts *a, const int *inputs, const int *targets)
{
    if (m->cfg.arch == REF_ARCH_LLAMA)
        return llama_forward(m, a, inputs, targets);
    const ref_config *cfg = &m->cfg;
    int B = a->B, T = cfg->seq, C = cfg->hidden, F = mlp_width(cfg), L = cfg->layers;
    int N = B * T;

    ref_embed_fwd(L > 0 ? a->layer[0].x_in : a->x_out, inputs, m->w.wte, m->w.wpe, B, T, C);
    a->aux = 0.0;
    for (int l = 0; l < L; l++) {
        const ref_layer *w = &m->w.h[l];
        ref_layer_acts *la = &a->layer[l];
        double *out = layer_out(a, l, L);

        /* x_mid = x_in + attn.c_proj(attention(attn.c_attn(ln_1(x_in)))) */
        ref_layernorm_fwd(la->ln1, la->ln1_mean, la->ln1_rstd, la->x_in, w->ln_1_w, w->ln_1_b,
                          N, C, cfg->ln_eps);
        ref_linear_fwd(la->qkv, la->ln1, w->c_attn_w, w->c_attn_b, N, C, 3 * C);
        ref_attention_fwd(la->y, la->att, la->qkv, B, T, C, cfg->heads);
        ref_linear_fwd(la->x_mid, la->y, w->attn_proj_w, w->attn_proj_b, N, C, C);
        for (size_t i = 0; i < (size_t)N * C; i++)
            la->x_mid[i] += la->x_in[i];

        /* out = x_mid + mlp(ln_2(x_mid)), the MLP being dense or a mixture of experts */
        ref_layernorm_fwd(la->ln2, la->ln2_mean, la->ln2_rstd, la->x_mid, w->ln_2_w, w->ln_2_b,
                          N, C, cfg->ln_eps);
        if (cfg->moe.experts > 0) {
            ref_moe_fwd(out, &la->moe, &w->moe, &cfg->moe, la->ln2, B, T, C);
            a->aux += la->moe.aux;
            if (F > 0) {        /* + the shared expert (d_y is free in the forward) */
                mlp_fwd(a->d_y, &la->mlp, w, la->ln2, N, C, F);
                for (size_t i = 0; i < (size_t)N * C; i++)
                    out[i] += a->d_y[i];
            }
        } else {
            mlp_fwd(out, &la->mlp, w, la->ln2, N, C, F);
        }
        for (size_t i = 0; i < (size_t)N * C; i++)
            out[i] += la->x_mid[i];
    }
    ref_layernorm_fwd(a->lnf, a->lnf_mean, a->lnf_rstd, a->x_out, m->w.ln_f_w, m->w.ln_f_b,
                      N, C, cfg->ln_eps);
    ref_head_fwd(a->probs, a->lnf, m->w.wte, N, cfg->vocab, C);
    ref_xent_fwd(a->probs, a->losses, a->probs, targets, N, cfg->vocab);

    double sum = 0.0;
    for (int n = 0; n < N; n++)
        sum += a->losses[n];
    return sum;
}

/*
** Backward pass of the last ref_forward on 'a' (same inputs and targets) for the objective
** 'scale * (sum of the B*T losses) + aux_scale * a->aux': ADDS every parameter gradient into
** m->grads. aux_scale is ignored by dense models. Either architecture.
*/
void ref_backward(ref_model *m, ref_acts *a, const int *inputs, const int *targets,
                  double scale, double aux_scale)
{
    if (m->cfg.arch == REF_ARCH_LLAMA) {
        llama_backward(m, a, inputs, targets, scale, aux_scale);
        return;
    }
    const ref_config *cfg = &m->cfg;
    int B = a->B, T = cfg->seq, C = cfg->hidden, F = mlp_width(cfg), L = cfg->layers;
    int V = cfg->vocab, N = B * T;
    size_t NC = (size_t)N * C;

    zero(a->d_logits, (size_t)N * V);
    ref_xent_bwd(a->d_logits, a->probs, targets, N, V, scale);
    zero(a->d_ln, NC);
    ref_head_bwd(a->d_ln, m->g.wte, a->d_logits, a->lnf, m->w.wte, N, V, C);
    zero(a->d_res, NC);
    ref_layernorm_bwd(a->d_res, m->g.ln_f_w, m->g.ln_f_b, a->d_ln, a->x_out, m->w.ln_f_w,
                      a->lnf_mean, a->lnf_rstd, N, C);

    /* d_res holds d loss / d (residual stream); the residual adds pass it through unchanged,
    ** and each branch adds its LayerNorm input gradient into it. */
    for (int l = L - 1; l >= 0; l--) {
        const ref_layer *w = &m->w.h[l];
        ref_layer *g = &m->g.h[l];
        ref_layer_acts *la = &a->layer[l];

        zero(a->d_ln, NC);
        if (cfg->moe.experts > 0)
            ref_moe_bwd(a->d_ln, &g->moe, a->d_res, aux_scale, &la->moe, &w->moe, &cfg->moe,
                        la->ln2, B, T, C);
        if (F > 0)              /* the dense MLP or the shared expert */
            mlp_bwd(a->d_ln, g, a->d_res, &la->mlp, w, la->ln2, a->d_h, a->d_a, N, C, F);
        ref_layernorm_bwd(a->d_res, g->ln_2_w, g->ln_2_b, a->d_ln, la->x_mid, w->ln_2_w,
                          la->ln2_mean, la->ln2_rstd, N, C);

        zero(a->d_y, NC);
        ref_linear_bwd(a->d_y, g->attn_proj_w, g->attn_proj_b, a->d_res, la->y, w->attn_proj_w,
                       N, C, C);
        zero(a->d_qkv, 3 * NC);
        ref_attention_bwd(a->d_qkv, a->d_y, la->qkv, la->att, B, T, C, cfg->heads);
        zero(a->d_ln, NC);
        ref_linear_bwd(a->d_ln, g->c_attn_w, g->c_attn_b, a->d_qkv, la->ln1, w->c_attn_w,
                       N, C, 3 * C);
        ref_layernorm_bwd(a->d_res, g->ln_1_w, g->ln_1_b, a->d_ln, la->x_in, w->ln_1_w,
                          la->ln1_mean, la->ln1_rstd, N, C);
    }
    ref_embed_bwd(m->g.wte, m->g.wpe, a->d_res, inputs, B, T, C);
}

/*
** Loss and gradients of one step over 'nsamples' sequences (inputs, targets: (nsamples,T)),
** processed as micro-batches of a->B sequences (nsamples must be a multiple of a->B).
** The objective is
**     J = (mean cross-entropy over all nsamples*T target tokens)
**       + (1/nmb) * sum over the nmb = nsamples/B micro-batches of the micro-batch's aux loss
** (the second term only for a mixture of experts, each micro-batch's aux loss being the sum
** over layers; Megatron's 1/(M*D) scaling of MoEAuxLossAutoScaler). m->grads is set (not
** added) to the gradient of J. Returns the mean cross-entropy; *aux_loss (may be NULL) gets
** the second term.
*/
double ref_compute_grads(ref_model *m, ref_acts *a, const int *inputs, const int *targets,
                         int nsamples, double *aux_loss)
{
    int T = m->cfg.seq;
    double ntok = (double)nsamples * T, nmb = (double)(nsamples / a->B);
    double loss_sum = 0.0, aux_sum = 0.0;
    int E = m->cfg.moe.experts;
    zero(m->grads, m->nparams);
    memset(m->routed, 0, (size_t)m->cfg.layers * (E > 0 ? E : 1) * sizeof(int));
    for (int s = 0; s < nsamples; s += a->B) {
        loss_sum += ref_forward(m, a, inputs + (size_t)s * T, targets + (size_t)s * T);
        aux_sum += a->aux;
        for (int l = 0; l < m->cfg.layers && E > 0; l++)    /* the expert bias's counts */
            for (int e = 0; e < E; e++)
                m->routed[l * E + e] += a->layer[l].moe.routed[e];
        ref_backward(m, a, inputs + (size_t)s * T, targets + (size_t)s * T, 1.0 / ntok,
                     1.0 / nmb);
    }
    if (aux_loss != NULL)
        *aux_loss = aux_sum / nmb;
    return loss_sum / ntok;
}

/* -- Optimizer -------------------------------------------------------------------------------- */

/*
** Learning rate of optimizer step t (t = 1 for the first step; step t uses the data of step
** s = t - 1), Megatron's schedule as tests/ref/README.md writes it: the scheduler has seen
** n = (t - 1) * G samples (G = o->gbs), and with W = warmup * G, S = decay_steps * G:
**   W > 0 and n <= W:       lr_init + (lr - lr_init) * n / W
**   constant:               lr
**   n > S:                  min_lr
**   inverse-square-root:    max(min_lr, lr * sqrt(max(W, 1)) / sqrt(max(n, 1)))
**   otherwise:              min_lr + c * (lr - min_lr), r = (n - W) / (S - W),
**     linear c = 1 - r, cosine c = (cos(pi r) + 1) / 2, WSD (D = wsd_steps * G): c = 1 while
**     n <= S - D, then with q = (n - S + D) / D: exponential 2 * 0.5^q - 1, linear 1 - q,
**     cosine (cos(pi q) + 1) / 2, minus_sqrt 1 - sqrt(q).
** Written for this reference from the README, not shared with lib/lr.c.
*/
double ref_lr(const ref_optim *o, int t)
{
    double g = o->gbs > 0 ? o->gbs : 1;
    double n = (t - 1) * g, w = o->warmup * g, s = o->decay_steps * g;
    double c;
    if (w > 0 && n <= w)
        return o->lr_init + (o->lr - o->lr_init) * n / w;
    if (o->style == REF_LR_CONSTANT)
        return o->lr;
    if (n > s)
        return o->min_lr;
    if (o->style == REF_LR_INVERSE_SQRT) {
        double x = o->lr * pow(fmax(w, 1.0), 0.5) / pow(fmax(n, 1.0), 0.5);
        return x > o->min_lr ? x : o->min_lr;
    }
    double r = (n - w) / (s - w);
    switch (o->style) {
    case REF_LR_LINEAR:
        c = 1.0 - r;
        break;
    case REF_LR_WSD: {
        double d = o->wsd_steps * g, q = n <= s - d ? 0.0 : (n - (s - d)) / d;
        if (n <= s - d)
            c = 1.0;
        else if (o->wsd_style == REF_WSD_LINEAR)
            c = 1.0 - q;
        else if (o->wsd_style == REF_WSD_COSINE)
            c = 0.5 * (cos(REF_PI * q) + 1.0);
        else if (o->wsd_style == REF_WSD_MINUS_SQRT)
            c = 1.0 - sqrt(q);
        else
            c = 2.0 * pow(0.5, q) - 1.0;
        break;
    }
    default:
        c = 0.5 * (cos(REF_PI * r) + 1.0);
        break;
    }
    return o->min_lr + c * (o->lr - o->min_lr);
}

/*
** Global L2 norm of all gradients, sqrt(sum g^2) (torch.nn.utils.clip_grad_norm_).
*/
double ref_grad_norm(const ref_model *m)
{
    double sum = 0.0;
    for (size_t i = 0; i < m->nparams; i++)
        sum += m->grads[i] * m->grads[i];
    return sqrt(sum);
}

/*
** clip_grad_norm_: coef = max_norm / (norm + 1e-6); grads *= coef only if coef < 1.
** max_norm <= 0 disables clipping. Returns 1 if the gradients were scaled.
*/
int ref_clip_grads(ref_model *m, double max_norm, double norm)
{
    if (max_norm <= 0.0)
        return 0;
    double coef = max_norm / (norm + 1e-6);
    if (!(coef < 1.0))
        return 0;
    for (size_t i = 0; i < m->nparams; i++)
        m->grads[i] *= coef;
    return 1;
}

/*
** One torch.optim.AdamW update of n elements at step t (t >= 1), in torch's order:
**   p *= 1 - lr*wd                              (decoupled decay, on the old p, first)
**   m  = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
**   p -= lr * m_hat / (sqrt(v_hat) + eps),  m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t)
** Pass wd = 0 for tensors without weight decay.
*/
void ref_adamw_update(double *p, const double *g, double *m, double *v, size_t n,
                      double lr, double beta1, double beta2, double eps, double wd, int t)
{
    double bc1 = 1.0 - pow(beta1, t);
    double bc2 = 1.0 - pow(beta2, t);
    for (size_t i = 0; i < n; i++) {
        p[i] *= 1.0 - lr * wd;
        m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
        double m_hat = m[i] / bc1;
        double v_hat = v[i] / bc2;
        p[i] -= lr * m_hat / (sqrt(v_hat) + eps);
    }
}

/*
** Advance m->t and apply AdamW with learning rate 'lr' to every tensor, with weight decay
** o->wd on the tensors marked decay and none on the others.
*/
void ref_optimizer_step(ref_model *m, const ref_optim *o, double lr)
{
    m->t++;
    for (int i = 0; i < m->ntensors; i++) {
        const ref_tensor *t = &m->tensors[i];
        size_t off = t->offset;
        ref_adamw_update(m->params + off, m->grads + off, m->m + off, m->v + off, t->numel,
                         lr, o->beta1, o->beta2, o->eps, t->decay ? o->wd : 0.0, m->t);
    }
}

/*
** Aux-loss-free load balancing after a step (moe.bias_rate > 0; Megatron's
** get_updated_expert_bias): per layer, bias[e] += bias_rate * sign(mean_f count[f] - count[e]),
** count = m->routed (the step's kept choices, every micro-batch). No-op otherwise.
*/
void ref_expert_bias_update(ref_model *m)
{
    int E = m->cfg.moe.experts;
    if (E == 0 || !(m->cfg.moe.bias_rate > 0.0))
        return;
    for (int l = 0; l < m->cfg.layers; l++) {
        const int *c = m->routed + (size_t)l * E;
        double mean = 0.0;
        for (int e = 0; e < E; e++)
            mean += c[e];
        mean /= E;
        for (int e = 0; e < E; e++) {
            double off = mean - c[e];
            m->w.h[l].moe.expert_bias[e] += m->cfg.moe.bias_rate * ((off > 0) - (off < 0));
        }
    }
}

/*
** One training step on 'nsamples' sequences (the whole global batch, in micro-batches of
** a->B): gradients of the objective (ref_compute_grads), global norm, clipping, learning rate
** for t = m->t + 1, AdamW. Returns what the log prints for this step.
*/
ref_step_info ref_train_step(ref_model *m, ref_acts *a, const ref_optim *o,
                             const int *inputs, const int *targets, int nsamples)
{
    ref_step_info info;
    info.loss = ref_compute_grads(m, a, inputs, targets, nsamples, &info.aux_loss);
    info.grad_norm = ref_grad_norm(m);
    ref_clip_grads(m, o->clip, info.grad_norm);
    info.step = m->t + 1;
    info.lr = ref_lr(o, info.step);
    ref_optimizer_step(m, o, info.lr);
    ref_expert_bias_update(m);
    return info;
}
