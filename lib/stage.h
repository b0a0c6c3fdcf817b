/*
** stage.h: what the stage's files (stage.c, model.c, moe.c, groups.c) share with each other and
** with the library's upper modules (world, faults, weights, ckpt, train), and generated code
** never sees: the stage's buffers and expanded tables (stage.c), the model's scratch and
** embedding/head tensors (model.c), the mixture-of-experts scratch (moe.c), group creation
** (groups.c). Everything here is set up once, by gpt_main, before the first step.
*/
#ifndef GPT_STAGE_H
#define GPT_STAGE_H

#include "gpt.h"       // defines: gpt_state, gpt_program, gpt_stage, gpt_param, gpt_piece, ...
#include "tensors.h"   // defines: lib_tensor, lib_tensor_index

/* -- The model's scratch, embedding and head (model.c) ------------------------------------- */

/* 'void *': the model's dtype (gpt.d.act); 'float *': f32. */
typedef struct {
    void *full;           /* (N, C)            partial sums / the output gradient gathered   */
    void *full_sp;        /* (N_SP, C)         reduce-scatter output (= full without SP)      */
    void *gather;         /* (N, C)            a column-parallel input gathered (SP only)     */
    void *dqkv;           /* (N, QKV_LOCAL)                                                  */
    void *datty;          /* (N, C_LOCAL)                                                    */
    float *dsum;          /* (B, HEADS_LOCAL, T) attention backward: rowsum(dout * out)      */
    void *dfc;            /* (N, FF_LOCAL)     dense MLP only                                */
    void *logits;         /* (N, V_LOCAL)      head stage only                               */
    float *ce;            /* (4 * N)           row max | sum exp | target logit | loss       */
    int *targets;         /* (N)               head stage only                               */
    void *ring_kv;        /* (2, N, 2 C_LOCAL) K|V blocks on the context-parallel ring        */
    float *ring_dkv;      /* (2, N, 2 C_LOCAL) their dK|dV, travelling with them (backward)   */
    float *ring_acc;      /* (N, C_LOCAL)      the merged output / dq, f32                    */
    void *a2a_send;       /* (N, QKV_LOCAL)    CP_COMM=a2a: blocks to send                    */
    void *a2a_recv;       /* (N, QKV_LOCAL)    blocks received                                */
    void *a2a_dout;       /* (N, C_LOCAL)      the output gradient in sequence order          */
    void *qkvp;           /* (N, QKVP_LOCAL)   llama: q|k|v projections, then their gradient  */
    void *dact;           /* (N, FF_LOCAL)     llama: d(SwiGLU output)                        */
    void *dshared;        /* (N_SP, C)         shared expert: the routed experts' d(ln_2 out)   */
} lib_scratch;

/* Parameters (model dtype) or, in the gradient copies, f32 gradients. */
typedef struct { void *wte, *wpe; } lib_embed;             /* (V_LOCAL, C), (T_MODEL, C) */
typedef struct { void *ln_f_w, *ln_f_b, *wte; } lib_head;  /* (C), (C), (V_LOCAL, C) */
typedef struct { void *lnf; float *lnf_mean, *lnf_rstd; } lib_head_acts;

/* The mixture of experts' scratch, shared by every layer and micro-batch (moe.c): rows of
** tokens in the model's dtype, probabilities f32. */
typedef struct {
    float *logits;        /* (N_SP, E) router logits (f32) */
    void *xs;             /* (SEND_MAX, C): rows this rank sends, in dispatch order */
    float *ps;            /* (SEND_MAX) */
    void *xr;             /* (RECV_MAX, C): rows received from the EP group */
    float *pr;            /* (RECV_MAX) */
    void *xg;             /* (ROWS_MAX, C): rows gathered over the expert-TP group */
    float *pg;            /* (ROWS_MAX) */
    void *act;            /* (ROWS_MAX, EFF_LOCAL) prob * gelu(fc) (llama: prob * swiglu) */
    void *dfc;            /* (ROWS_MAX, 2 EFF_LOCAL) llama: d(w1 | w3 outputs) */
    void *ye, *yg;        /* (ROWS_MAX, C) expert outputs: expert-major, then member-major */
    void *yr, *ys;        /* (RECV_MAX, C), (SEND_MAX, C) on the way back */
    float *dpe, *dpg;     /* (ROWS_MAX) d(prob): expert-major, member-major */
    float *dpr, *dps;     /* (RECV_MAX), (SEND_MAX) */
    float *dprob;         /* (N_SP, K) */
    void *dlogits;        /* (N_SP, E) the router's logit gradient, rounded for its GEMMs */
    float *colsum;        /* (E) sums of the scores over this rank's tokens */
    int *counts;          /* (MOE_COUNTS) device staging of the count exchanges */
} lib_moe_scratch;

/* -- The stage (stage.c) ---------------------------------------------------------------------- */

/* A parameter of this rank, expanded from the stage's tables: where it lives, its struct
** pointers, and its tensor. */
typedef struct {
    gpt_param p;                /* offset absolute in its buffer */
    int chunk, layer;           /* layer: local index in the chunk, -1 for embedding/head */
    int global_layer;           /* -1 for embedding/head */
    int tensor;                 /* index into lib.tensors */
    int order;                  /* position in the stage's tables (layer rows, then others) */
} lib_param;

/* A piece of this rank: its rectangle with the global start resolved for this rank. */
typedef struct {
    int param;                  /* index into lib.params */
    int lrow, lcol, grow, gcol, rows, cols;
    int flags;
} lib_piece;

/* The expert bias of layer l (expert_bias; its host state in the layer's gpt_moe_params) is
** tensor lib.ebias_tensor + l, after every parameter; no piece holds it. */

typedef struct {
    void **pbuf;                /* [nbuffers]: the model's parameters (model dtype) */
    float **gbuf;               /* [nbuffers]: f32 (main) gradients */
    float **main;               /* [nbuffers]: bf16 training's f32 main parameters (state
                                   elements: the whole buffer or this rank's shards); f32
                                   training: NULL (the parameters are their own main copy) */
    float **mbuf, **vbuf;       /* [nbuffers]: AdamW moments (state elements) */
    void **work;                /* [positions * GPT_NMEMS]: the recompute workspace */
    int nwork;                  /* positions allocated so far */
    int nparams;
    lib_param *params;          /* buffer order (buffer, then offset) */
    int npieces;
    lib_piece *pieces;
    int ntensors;
    lib_tensor *tensors;        /* the model's tensors (tensors.h: lib_tensors_build) */
    int ebias_tensor;           /* the first expert-bias tensor; -1: none */
    lib_scratch s;
    lib_moe_scratch ms;
    lib_embed embed_p, embed_g;
    lib_head head_p, head_g;
    lib_head_acts head_a;
    float *loss_dev;            /* (NMB) loss sums per micro-batch */
    float *stat_dev;            /* (nparams + 3) norm pieces, then dense | experts | total */
    float *sp_pack;             /* packed sequence-parallel gradients */
    size_t sp_total;
    double norm_sum[3];         /* dense, experts, total (host, after the reductions) */
    size_t mem_bytes;           /* device bytes setup allocated: checked against the plan */
    size_t es;                  /* bytes of one element of the model's dtype */
    int head;                   /* the stage's last chunk holds the head and the loss */
    int fault;                  /* LIB_FAULT_*: a fault gpt_main injects into this step */
} lib_state;

/* Faults injected for tests (GPT_FAULT, faults.c): a NaN in this rank's first counted gradient
** before the norm; an infinite loss share. */
enum { LIB_FAULT_NAN_GRAD = 1, LIB_FAULT_INF_LOSS = 2 };

extern lib_state lib;

/* 'p' advanced by n elements of the model's dtype. */
static inline void *lib_at(const void *p, size_t n)
{
    return (char *)p + n * lib.es;
}

/* stage.c */
void lib_stage_setup(void);                  /* buffers, views, activations: the plan */
void lib_layer_acts_alloc(gpt_layer_acts *a, const gpt_layer_store *st);  /* one layer's */
size_t lib_state_bytes(void);                /* resume checkpoint: parameters and optimizer */
void lib_state_io(unsigned char *host, int save);
/* The whole f32 parameters of buffer b, where --init and the initialisation write and --save
** reads: the parameters themselves in f32 training; in bf16, the gradient buffer (unused
** between steps) as staging, made current by lib_master_fetch and made effective by
** lib_master_commit (the main parameters and their bf16 copy). */
float *lib_master(int b);
void lib_master_commit(void);
void lib_master_fetch(void);                 /* collective with the distributed optimizer */
/* This rank's first gradient element that is not finite, among those it counts in the norm:
** 1 with the tensor's name, the element's index in this rank's part and its value; 0 if none. */
int lib_first_bad_grad(const char **name, long long *index, float *value);

/* groups.c: coordinates and communicators of this rank (collective over the world). */
void lib_groups_create(const gpt_program *prog);
void lib_groups_print(const gpt_program *prog);   /* --show-groups */

/* Context parallelism (model.c): the global position of this rank's local position t. */
int lib_cp_position(int t);

/* stage.c: every local layer's expert bias in turn: 'fn' gets its global layer and its (E) values. */
void lib_expert_bias_each(void (*fn)(int layer, float *bias, void *ctx), void *ctx);

/* moe.c */
void lib_moe_fwd(const gpt_moe_params *p, gpt_moe_acts *a, const void *x, void *out,
                 double *aux);
void lib_moe_bwd(const gpt_moe_params *p, gpt_moe_params *g, const gpt_moe_acts *a,
                 const void *x, const void *dout, void *dx);

#endif
