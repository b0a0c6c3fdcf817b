/*
** gpt2_ref.h: the independent reference (oracle) for GPT-2 training -- model, loss, every
** parameter gradient, AdamW, LR schedule and gradient clipping, all in double precision,
** single process, written to be read. It is not fast and knows nothing about parallelism.
** Two architectures: GPT-2 (GPT2LMHeadModel) and Llama (LlamaForCausalLM; with experts,
** MixtralForCausalLM), chosen by ref_config.arch.
** Callers: tests/ref/main.c (build/ref/gpt2_ref), tests/ref/ref_test.c, and kernel tests that
** link build/ref/libref.a to compare single ops (ref_layernorm_fwd, ref_attention_bwd, ...).
** Semantics: issues 4 and 7 (the mixture of experts) and tests/ref/README.md. File formats are
** in ref_io.h.
*/
#ifndef GPT2_REF_H
#define GPT2_REF_H

#include <stddef.h>
#include <stdint.h>

/* -- Configuration ---------------------------------------------------------------------------- */

/* The mixture of experts that replaces every layer's MLP (docs/megatron.md §8); experts = 0: dense MLP.
** Semantics (routing, ties, capacity, aux loss): tests/ref/README.md, "Mixture of experts". */
typedef struct ref_moe_config {
    int experts;        /* E: experts per layer; 0 = no MoE (the dense MLP of width ffn) */
    int top_k;          /* k: experts per token, 1 <= k <= E */
    int ffn;            /* Fe: inner width of every expert's MLP */
    int bias;           /* 1: expert c_fc and c_proj have biases */
    int router_bias;    /* 1: the router has a bias: logits = x . router_w^T + router_b
                        ** (Megatron's router with add_bias_linear) */
    int pre_softmax;    /* 0: top-k of the logits, softmax over those k (Megatron default);
                        ** 1: softmax over all E, then top-k of it (not renormalised) */
    double aux_coeff;   /* load-balancing (Switch) loss coefficient; 0 = off */
    double z_coeff;     /* router z-loss coefficient (Megatron's moe_z_loss_coeff); 0 = off */
    int sigmoid;        /* 1: Megatron's score function sigmoid: the aux loss's scores are the
                        ** sigmoids over their sum (+1e-20), prob the chosen sigmoids over
                        ** theirs (+1e-20; k = 1: the sigmoid itself); pre_softmax unused */
    int groups;         /* group-limited routing (Megatron's moe_router_num_groups): the E
                        ** experts in this many equal groups, scored by the sum of their
                        ** k/group_topk largest selection values (the logits; the scores with
                        ** pre_softmax or sigmoid); the top-k only from the group_topk best
                        ** groups (ties: the lower group). 0 or 1: none */
    int group_topk;
    double topk_scale;  /* factor of the chosen probabilities (Megatron's
                        ** moe_router_topk_scaling_factor); 0 = 1 */
    int seq_aux;        /* 1: the aux loss per sequence, averaged over the B sequences
                        ** (Megatron's load balancing type seq_aux_loss) */
    double capacity;    /* capacity factor; 0 = no token dropping */
    int drop_probs;     /* beyond the capacity keep 1: the highest probabilities (Megatron's
                        ** default drop policy "probs", the CLI's); 0: the earliest rows */
    int shards;         /* router calls per micro-batch (TP under SP): its positions in this
                        ** many equal blocks, each with its own capacity; 0 or 1: one call */
    double bias_rate;   /* > 0: aux-loss-free load balancing (Megatron's expert bias, sigmoid
                        ** only): the top-k (and group) choice ranks sigmoid(z) + bias[e];
                        ** after each step bias[e] += bias_rate * sign(mean - count[e]), count
                        ** the step's kept choices of e (padded with pad); 0 = none */
    int pad;            /* with capacity and bias_rate: the counts are the padded rows, as
                        ** Megatron's pad_to_capacity routing map (min(cap, call tokens)) */
    int cp_shards;      /* context parallelism P > 1: first the positions of each of P cp
                        ** ranks (chunks c and 2P-1-c of T/(2P), in that order), then the
                        ** 'shards' blocks of those; 0 or 1: none */
    int shared_ffn;     /* > 0: a shared expert (Megatron's moe_shared_expert_intermediate_size,
                        ** no gate): a dense MLP of this width (the model's MLP: GELU with the
                        ** linear biases, or SwiGLU) on every token, added to the routed output;
                        ** its weights are the layer's dense MLP views; 0 = none */
} ref_moe_config;

/* The architecture (tests/ref/README.md, "Llama"). */
typedef enum {
    REF_ARCH_GPT2,      /* GPT2LMHeadModel: LayerNorm, GELU MLP, learned positions, tied head */
    REF_ARCH_LLAMA      /* LlamaForCausalLM / MixtralForCausalLM: RMSNorm, rope, GQA, SwiGLU */
} ref_arch;

typedef struct ref_config {
    int layers;         /* L: transformer blocks */
    int hidden;         /* C: channels */
    int heads;          /* H: attention heads; divides C, head_dim = C / H */
    int seq;            /* T: sequence length, also the number of rows of wpe */
    int vocab;          /* V: vocabulary (never padded in the reference) */
    int ffn;            /* F: MLP inner width (GPT-2: 4C unless the model says otherwise;
                        ** Llama: the SwiGLU width of gate/up/down) */
    double ln_eps;      /* LayerNorm / RMSNorm eps (1e-5 for GPT-2 and by default for Llama) */
    ref_moe_config moe; /* all zero: a dense model */
    int no_linear_bias; /* GPT-2: 1 drops the biases of c_attn, attn.c_proj, mlp.c_fc and
                        ** mlp.c_proj (Megatron's add_bias_linear = false); norms keep theirs */
    /* Llama only (arch == REF_ARCH_LLAMA); GPT-2 ignores them */
    ref_arch arch;      /* REF_ARCH_GPT2 (0) unless set */
    int kv_heads;       /* K: key/value heads, divides H (grouped-query attention); 0 = H */
    double rope_theta;  /* rotary base; 0 = 10000 (Llama 2's) */
    int tie_embeddings; /* 1: lm_head is embed_tokens (no lm_head.weight tensor) */
} ref_config;

/* How a tensor is initialised by ref_model_init_random (tests/ref/README.md). */
typedef enum {
    REF_INIT_NORMAL,    /* N(0, 0.02)                                   */
    REF_INIT_OUT_PROJ,  /* N(0, 0.02 / sqrt(2 * layers)): attn, mlp and expert c_proj weights */
    REF_INIT_ZERO,      /* biases, LayerNorm bias                       */
    REF_INIT_ONE        /* LayerNorm weight                             */
} ref_init_kind;

#define REF_NAME_MAX 96

/* One parameter tensor: its Hugging Face name, shape, and place in the flat arrays. */
typedef struct ref_tensor {
    char name[REF_NAME_MAX];    /* e.g. "h.3.attn.c_attn.weight" */
    int ndim;                   /* 1 or 2 */
    long shape[2];              /* Hugging Face shape; Conv1D weights are (in, out) */
    size_t offset;              /* first element in params / grads / m / v */
    size_t numel;
    int decay;                  /* 1: AdamW weight decay applies (2-D weights and embeddings) */
    ref_init_kind init;
} ref_tensor;

/* One expert of a mixture-of-experts layer (views, checkpoint shapes): in a GPT-2 model a GELU
** MLP C -> Fe -> C in Conv1D layout (the w* views NULL); in a Llama model Mixtral's SwiGLU
** expert w2(silu(w1 x) * w3 x) in nn.Linear layout (the c_* views NULL). */
typedef struct ref_expert {
    double *c_fc_w;             /* (C, Fe) */
    double *c_fc_b;             /* (Fe), NULL without expert biases */
    double *c_proj_w;           /* (Fe, C) */
    double *c_proj_b;           /* (C), NULL without expert biases */
    double *w1;                 /* (Fe, C) block_sparse_moe.experts.{e}.w1.weight: gate */
    double *w2;                 /* (C, Fe) w2.weight: down */
    double *w3;                 /* (Fe, C) w3.weight: up */
} ref_expert;

/* The mixture of experts of one layer (views into params or grads). */
typedef struct ref_moe_weights {
    double *router_w;           /* (E, C) mlp.router.weight (Llama: block_sparse_moe.gate.weight):
                                ** logits = x . router_w^T (+ router_b) */
    double *router_b;           /* (E) mlp.router.bias, NULL without moe.router_bias */
    double *expert_bias;        /* (E) mlp.router.expert_bias (Llama: block_sparse_moe.gate.
                                ** e_score_correction_bias), NULL without bias_rate: state,
                                ** not trained (no gradient reaches it; no decay) */
    ref_expert *experts;        /* [E] mlp.experts.{e}.*; owned by the ref_model */
} ref_moe_weights;

/* Views of one layer's tensors (into params or into grads). Shapes as in the checkpoint.
** A GPT-2 model uses the GPT-2 views, a Llama model the Llama views; the others are NULL. */
typedef struct ref_layer {
    /* GPT-2 (Conv1D weights, in x out) */
    double *ln_1_w, *ln_1_b;    /* (C), (C) */
    double *c_attn_w;           /* (C, 3C) in x out, output columns q | k | v */
    double *c_attn_b;           /* (3C) */
    double *attn_proj_w;        /* (C, C) attn.c_proj.weight, in x out */
    double *attn_proj_b;        /* (C) */
    double *ln_2_w, *ln_2_b;    /* (C), (C) */
    /* The feed-forward block: the dense MLP (cfg.moe.experts == 0; moe views are NULL) or the
    ** mixture of experts (mlp views are NULL). See mlp_fwd / ref_moe_fwd in gpt2_ref.c. */
    struct {
        double *c_fc_w;         /* (C, F) */
        double *c_fc_b;         /* (F) */
        double *c_proj_w;       /* (F, C) */
        double *c_proj_b;       /* (C) */
    } mlp;
    ref_moe_weights moe;        /* both architectures (experts differ, see ref_expert) */
    /* Llama (nn.Linear weights, out x in: y = x . W^T; no biases). D = C/H, K = kv heads. */
    double *input_ln_w;         /* (C) input_layernorm.weight (RMSNorm) */
    double *q_w;                /* (H*D, C) self_attn.q_proj.weight */
    double *k_w, *v_w;          /* (K*D, C) self_attn.{k,v}_proj.weight */
    double *o_w;                /* (C, H*D) self_attn.o_proj.weight */
    double *post_ln_w;          /* (C) post_attention_layernorm.weight (RMSNorm) */
    double *gate_w, *up_w;      /* (F, C) mlp.{gate,up}_proj.weight (dense only) */
    double *down_w;             /* (C, F) mlp.down_proj.weight (dense only) */
} ref_layer;

typedef struct ref_weights {
    double *wte;                /* (V, C) token embedding (Llama: model.embed_tokens.weight) */
    double *wpe;                /* (T, C) position embedding; NULL for Llama */
    ref_layer *h;               /* [L] */
    double *ln_f_w, *ln_f_b;    /* (C), (C) final norm (Llama: model.norm.weight, ln_f_b NULL) */
    double *lm_head;            /* (V, C) logits = x . lm_head^T: wte itself (GPT-2, tied Llama)
                                ** or lm_head.weight (untied Llama) */
} ref_weights;

/* The model with its optimizer state. Created by ref_model_new, freed by ref_model_free. */
typedef struct ref_model {
    ref_config cfg;
    int ntensors;
    ref_tensor *tensors;        /* [ntensors], canonical order: wte, wpe, h.0.*, ..., ln_f.*
                                ** (Llama: embed_tokens, layers, norm, lm_head; README.md) */
    size_t nparams;
    double *params;             /* (nparams) */
    double *grads;              /* (nparams) d loss / d params of the current step */
    double *m, *v;              /* (nparams) AdamW first and second moments */
    ref_weights w;              /* views into params */
    ref_weights g;              /* views into grads */
    int t;                      /* optimizer steps taken so far */
    int *routed;                /* (L, E) the step's kept choices per expert (bias_rate > 0) */
} ref_model;

/* Activations of one forward pass over B sequences (N = B*T rows), kept for the backward. */
typedef struct ref_mlp_acts {
    double *h;                  /* (N, F) c_fc output, before GELU (Llama: gate_proj output) */
    double *u;                  /* (N, F) Llama: up_proj output; NULL for GPT-2 */
    double *a;                  /* (N, F) GELU output (Llama: silu(gate) * up) */
} ref_mlp_acts;

/* Activations of one mixture-of-experts forward over N = B*T tokens (row n = b*T + t), kept for
** the backward. "Choice" (n, j) is token n's j-th expert, j < k, best first. */
typedef struct ref_moe_acts {
    double *logits;             /* (N, E) router logits */
    double *scores;             /* (N, E) softmax of the logits over all E experts */
    int *sel;                   /* (N, k) chosen experts, by logit descending, ties: lower index */
    double *prob;               /* (N, k) routing probability of each choice */
    int *keep;                  /* (N, k) 1 unless the choice was dropped by the capacity */
    double *h;                  /* (N, k, Fe) expert c_fc output of each choice, before GELU
                                ** (Llama: its w1 (gate) output) */
    double *u;                  /* (N, k, Fe) Llama: its w3 (up) output; unused by GPT-2 */
    double *a;                  /* (N, k, Fe) its GELU output (Llama: silu(gate) * up) */
    double *y;                  /* (N, k, C) expert output c_proj(a) + bias, before the prob */
    int *count;                 /* (E) tokens whose top-k holds expert e (the aux loss's count);
                                ** with seq_aux (B, E): per sequence (room for N rows) */
    int *routed;                /* (E) choices kept per expert (padded with moe.pad) */
    int capacity;               /* per-expert token limit of this forward; 0 = unlimited */
    double aux;                 /* this forward's load-balancing loss plus its z-loss
                                ** (coefficients included) */
} ref_moe_acts;

/* Llama uses the same fields, with RMSNorms (ln1 = input_layernorm, ln2 =
** post_attention_layernorm; no means) and q, k, v in place of qkv. */
typedef struct ref_layer_acts {
    double *x_in;               /* (N, C) residual stream entering the layer */
    double *ln1, *ln1_mean, *ln1_rstd;      /* (N, C), (N), (N); ln1_mean NULL for Llama */
    double *qkv;                /* (N, 3C) GPT-2; NULL for Llama */
    double *q, *k, *v;          /* Llama: (N, H*D), (N, K*D), (N, K*D); q and k after rope */
    double *att;                /* (B, H, T, T) softmax probabilities, 0 above the diagonal */
    double *y;                  /* (N, C) attention output, heads concatenated, before c_proj */
    double *x_mid;              /* (N, C) residual stream after the attention block */
    double *ln2, *ln2_mean, *ln2_rstd;      /* (N, C), (N), (N); ln2_mean NULL for Llama */
    ref_mlp_acts mlp;           /* dense models */
    ref_moe_acts moe;           /* mixture-of-experts models */
} ref_layer_acts;

typedef struct ref_acts {
    int B;                      /* sequences per forward (the micro-batch) */
    ref_layer_acts *layer;      /* [L] */
    int *pos;                   /* (N) position of row n = b*T + t: t (rope) */
    double *x_out;              /* (N, C) residual stream after the last layer */
    double *lnf, *lnf_mean, *lnf_rstd;      /* (N, C), (N), (N); lnf_mean NULL for Llama */
    double *probs;              /* (N, V) softmax of the logits */
    double *losses;             /* (N) -log probs[target] */
    double aux;                 /* sum over layers of the load-balancing losses (MoE only) */
    /* scratch for the backward pass */
    double *d_res;              /* (N, C) gradient of the residual stream */
    double *d_ln;               /* (N, C) gradient of a LayerNorm output */
    double *d_y;                /* (N, C) gradient of the attention output */
    double *d_qkv;              /* (N, 3C); Llama: d q | d k | d v, (N, (H + 2K) D) */
    double *d_h, *d_a;          /* (N, F) MLP inner gradients */
    double *d_u;                /* (N, F) Llama: gradient of the up_proj output */
    double *d_logits;           /* (N, V) */
} ref_acts;

/* Learning-rate decay styles, Megatron's --lr-decay-style (cosine, the default, is 0), and the
** final decay of WSD, Megatron's --lr-wsd-decay-style (exponential, the default, is 0).
** ORDER lr_styles, wsd_styles (main.c) */
typedef enum {
    REF_LR_COSINE, REF_LR_CONSTANT, REF_LR_LINEAR, REF_LR_INVERSE_SQRT, REF_LR_WSD
} ref_lr_style;
typedef enum {
    REF_WSD_EXPONENTIAL, REF_WSD_LINEAR, REF_WSD_COSINE, REF_WSD_MINUS_SQRT
} ref_wsd_style;

/* Optimizer and schedule settings (torch.optim.AdamW + clip_grad_norm_ + Megatron's learning-rate
** schedule, tests/ref/README.md). */
typedef struct ref_optim {
    double lr;                  /* peak learning rate (Megatron's max_lr) */
    double min_lr;              /* the rate after the decay */
    double lr_init;             /* the rate of the first warm-up step (--lr-warmup-init) */
    int warmup;                 /* linear warm-up steps (0: none) */
    int decay_steps;            /* steps after which the rate is min_lr */
    ref_lr_style style;         /* decay after the warm-up */
    ref_wsd_style wsd_style;    /* WSD only: the shape of its final decay */
    int wsd_steps;              /* WSD only: the last wsd_steps of decay_steps decay */
    int gbs;                    /* sequences per step: Megatron counts samples (0 is taken as 1) */
    double beta1, beta2, eps;
    double wd;                  /* decoupled weight decay, on tensors with decay = 1 */
    double clip;                /* max global grad norm; <= 0 disables clipping */
} ref_optim;

/* What one training step reports (one line of the log). */
typedef struct ref_step_info {
    int step;                   /* t: 1 for the first optimizer step */
    double loss;                /* mean cross-entropy over every target token of the step */
    double aux_loss;            /* MoE: mean over micro-batches of the summed layer aux losses */
    double lr;                  /* learning rate used by this step */
    double grad_norm;           /* global L2 norm of the gradients before clipping */
} ref_step_info;

/* -- Model ------------------------------------------------------------------------------------ */

ref_model *ref_model_new(const ref_config *cfg);
void ref_model_free(ref_model *m);
const ref_tensor *ref_model_find(const ref_model *m, const char *name);
void ref_model_init_random(ref_model *m, uint64_t seed);
double ref_rng_normal(uint64_t seed, const char *name, uint64_t index);

ref_acts *ref_acts_new(const ref_config *cfg, int B);
void ref_acts_free(ref_acts *a, const ref_config *cfg);

double ref_forward(const ref_model *m, ref_acts *a, const int *inputs, const int *targets);
void ref_backward(ref_model *m, ref_acts *a, const int *inputs, const int *targets,
                  double scale, double aux_scale);
double ref_compute_grads(ref_model *m, ref_acts *a, const int *inputs, const int *targets,
                         int nsamples, double *aux_loss);

/* -- Optimizer -------------------------------------------------------------------------------- */

double ref_lr(const ref_optim *o, int t);
double ref_grad_norm(const ref_model *m);
int ref_clip_grads(ref_model *m, double max_norm, double norm);
void ref_adamw_update(double *p, const double *g, double *m, double *v, size_t n,
                      double lr, double beta1, double beta2, double eps, double wd, int t);
void ref_optimizer_step(ref_model *m, const ref_optim *o, double lr);
/* Aux-loss-free balancing after a step: each layer's expert bias from m->routed (moe.bias_rate
** > 0; ref_train_step calls it after the optimizer; no-op otherwise). */
void ref_expert_bias_update(ref_model *m);
ref_step_info ref_train_step(ref_model *m, ref_acts *a, const ref_optim *o,
                             const int *inputs, const int *targets, int nsamples);

/* -- Single ops (also used by the kernel tests) ----------------------------------------------- */
/* Forward ops overwrite their outputs. Backward ops ADD into every gradient they produce. */

void ref_embed_fwd(double *out, const int *tokens, const double *wte, const double *wpe,
                   int B, int T, int C);
void ref_embed_bwd(double *dwte, double *dwpe, const double *dout, const int *tokens,
                   int B, int T, int C);
void ref_layernorm_fwd(double *out, double *mean, double *rstd, const double *in,
                       const double *w, const double *b, int N, int C, double eps);
void ref_layernorm_bwd(double *din, double *dw, double *db, const double *dout,
                       const double *in, const double *w, const double *mean,
                       const double *rstd, int N, int C);
void ref_linear_fwd(double *out, const double *in, const double *w, const double *b,
                    int N, int IN, int OUT);
void ref_linear_bwd(double *din, double *dw, double *db, const double *dout,
                    const double *in, const double *w, int N, int IN, int OUT);
void ref_attention_fwd(double *out, double *att, const double *qkv, int B, int T, int C,
                       int H);
void ref_attention_bwd(double *dqkv, const double *dout, const double *qkv, const double *att,
                       int B, int T, int C, int H);
void ref_attention_gqa_fwd(double *out, double *att, const double *q, const double *k,
                           const double *v, int B, int T, int H, int K, int D);
void ref_attention_gqa_bwd(double *dq, double *dk, double *dv, const double *dout,
                           const double *q, const double *k, const double *v, const double *att,
                           int B, int T, int H, int K, int D);
void ref_gelu_fwd(double *out, const double *in, size_t n);
void ref_gelu_bwd(double *din, const double *dout, const double *in, size_t n);
void ref_head_fwd(double *logits, const double *x, const double *wte, int N, int V, int C);
void ref_head_bwd(double *dx, double *dwte, const double *dlogits, const double *x,
                  const double *wte, int N, int V, int C);
void ref_xent_fwd(double *probs, double *losses, const double *logits, const int *targets,
                  int N, int V);
void ref_xent_bwd(double *dlogits, const double *probs, const int *targets, int N, int V,
                  double scale);

/* Llama ops. ref_rmsnorm_bwd adds; ref_rope_* work in place; ref_swiglu_bwd writes. */
/* RMSNorm over rows of C: rstd[n] = 1/sqrt(mean(in^2) + eps); out = in * rstd * w. */
void ref_rmsnorm_fwd(double *out, double *rstd, const double *in, const double *w, int N, int C,
                     double eps);
/* backward: din += rstd*(g - xhat*mean(g*xhat)) with g = dout*w, xhat = in*rstd; dw += dout*xhat
** (both accumulate) */
void ref_rmsnorm_bwd(double *din, double *dw, const double *dout, const double *in,
                     const double *w, const double *rstd, int N, int C);
/* Rotary embedding, HF rotate_half convention, in place on N rows of ld elements, H heads of D
** channels at columns h*D; row i is at position pos[i]. For i < D/2: inv = theta^(-2i/D) (in
** double), a = pos*inv, x'[i] = x[i] cos a - x[i+D/2] sin a,
** x'[i+D/2] = x[i+D/2] cos a + x[i] sin a. */
void ref_rope_fwd(double *x, int ld, int N, const int *pos, int H, int D, double theta);
/* its backward (the transpose: rotation by -a), in place on the gradient */
void ref_rope_bwd(double *dx, int ld, int N, const int *pos, int H, int D, double theta);
/* out = silu(gate) * up, silu(g) = g/(1+exp(-g)) */
void ref_swiglu_fwd(double *out, const double *gate, const double *up, size_t n);
/* dgate, dup written (not accumulated) */
void ref_swiglu_bwd(double *dgate, double *dup, const double *dout, const double *gate,
                    const double *up, size_t n);

/* -- Mixture of experts --------------------------------------------------------------------- */

int ref_moe_capacity(int ntokens, const ref_moe_config *moe);
/* Over every router call so far, under the "probs" drop policy: the smallest relative gap
** between the probability of the last choice an expert keeps and of the first it drops,
** (kept - dropped) / kept > 0 (1 when nothing was dropped), and in *ties (if not NULL) how
** many times those two were exactly equal (two sequences with the same prefix: kept in row
** order here). A tie, or a gap near f32's rounding, lets an f32 program drop another choice
** than this reference (tests/moe trains its capacity cases on data without either). */
double ref_moe_drop_margin(long *ties);
void ref_moe_acts_init(ref_moe_acts *ma, const ref_moe_config *moe, int N, int C);
void ref_moe_acts_release(ref_moe_acts *ma);
void ref_moe_fwd(double *out, ref_moe_acts *ma, const ref_moe_weights *w,
                 const ref_moe_config *moe, const double *in, int B, int T, int C);
void ref_moe_bwd(double *din, ref_moe_weights *g, const double *dout, double aux_scale,
                 const ref_moe_acts *ma, const ref_moe_weights *w, const ref_moe_config *moe,
                 const double *in, int B, int T, int C);

/* -- Support ---------------------------------------------------------------------------------- */

void *ref_xmalloc(size_t bytes);
void *ref_xcalloc(size_t count, size_t size);

#endif
