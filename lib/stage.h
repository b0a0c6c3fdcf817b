/*
** stage.h: what the stage's files (stage.c, model.c, moe.c, groups.c) share with each other and
** with the library's upper modules (world, faults, weights, ckpt, train), and generated code
** never sees: the library's state behind the generated code's accessors (model.c), the
** stage's buffers and expanded tables (stage.c), a MoE layer's routing state (moe.c), group
** creation (groups.c). Everything here is set up once, by gpt_main, before the first step.
*/
#ifndef GPT_STAGE_H
#define GPT_STAGE_H

#include "gpt.h"       // defines: gpt_state, gpt_program, gpt_stage, gpt_param, gpt_piece, ...
#include "tensors.h"   // defines: lib_tensor, lib_tensor_index

/* -- The library's state ----------------------------------------------------------------- */

/* A layer's tensors and their f32 gradients by field (gpt.h GPT_FIELDS), local expert e's at
** LIB_FIELD(field, e); the expert bias's host state (expert_bias only; NULL otherwise). */
#define LIB_FIELD(field, e) ((1 + (e)) * GPT_NFIELDS + (field))
typedef struct {
    void **p;                   /* [GPT_NFIELDS * (1 + EXPERTS_LOCAL)], the model's dtype */
    float **g;                  /* the same, f32 */
    float *ebias;               /* (EXPERTS) h.{i}.mlp.router.expert_bias: state, not a
                                ** parameter (no gradient, no optimizer), the same on every rank */
    int *ecount;                /* (EXPERTS) this step's rows per expert so far */
} lib_layer;

/* A MoE layer's routing state in one activation slot (gpt.h gpt_moe; moe.c): host copies of
** the routing and the rows each exchange moves, from which the all-to-alls' counts follow. */
struct gpt_moe {
    void *const *a;             /* the layer's buffers in this slot (its ML_ entries) */
    lib_layer *layer;           /* its tensors' state (the expert bias and counts) */
    int *local;                 /* (AUX_SEQS, E) the aux loss's counts of this rank's rows */
    int *sel_h, *pos_h;         /* (N_SP, TOPK): choices; their send row, -1 if dropped */
    int nsend, nrows;           /* rows sent; rows at this rank's experts */
    int *sendmat, *recvmat;     /* [EP * NL] rows per (peer, local expert) sent, received */
    int *gmat;                  /* [ETP * EP * NL] every expert-tp member's recvmat */
    int *sendrows, *recvrows;   /* [EP] rows per ep peer */
    int *memrows;               /* [ETP] rows each expert-tp member received */
    int *erows;                 /* [EXPERTS_LOCAL] rows per local expert */
    size_t *counts;             /* [GPT_NA2AS][4][max(EP, ETP)]: each exchange's counts and
                                ** displacements, in elements */
    gpt_a2a a2a[GPT_NA2AS];     /* pointers into counts */
};

typedef struct {
    void *m[GPT_NMEMS];         /* its L_, ML_ buffers in this slot (NULL: none) */
    gpt_moe moe;
} lib_layer_acts;

typedef struct {
    void *x, *dy;               /* (N_SP, C) the chunk's input and its gradient */
    int *tokens;                /* (N) token ids (embedding chunk only) */
    lib_layer_acts *layer;      /* [layers] */
} lib_chunk_acts;

typedef struct {
    lib_layer *layers;          /* [layers] */
    lib_chunk_acts *acts;       /* [slots] */
} lib_chunk;

typedef struct {
    const gpt_program *prog;
    const gpt_stage *stage;
    gpt_dims d;
    int tp_rank, cp_rank, dp_rank, pp_rank, ep_rank, etp_rank, edp_rank;
    int vocab_start, vocab_valid;          /* this tp rank's real vocabulary rows            */
    int pp_prev, pp_next;                  /* pipeline neighbours (global ranks, wrapping)   */
    int cp_prev, cp_next;                  /* context-parallel ring neighbours (global)      */
    rt_group *grp[GPT_NGROUPS];            /* NULL: not created                              */
    lib_chunk *chunk;                      /* [stage->nchunks]                               */
    const gpt_step_in *in;                 /* the step being run                             */
    double moe_aux;                        /* this rank's share of the step's aux loss       */
    int evaluating;                        /* inside gpt_eval_begin .. gpt_eval_end          */
} gpt_state;

extern gpt_state gpt;

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
    void **grad;                /* [gpt_stage.grad_buffers]: the gradient buffers */
    void **pool;                /* [pool slots * (pool_pos + 1) * GPT_NMEMS]: the shared
                                   activation slots (gpt_stage.pool_slots; slot_mem) */
    int pool_pos;               /* layer positions in a slot: the largest chunk's layers */
    int nparams;
    lib_param *params;          /* buffer order (buffer, then offset) */
    int npieces;
    lib_piece *pieces;
    int ntensors;
    lib_tensor *tensors;        /* the model's tensors (tensors.h: lib_tensors_build) */
    int ebias_tensor;           /* the first expert-bias tensor; -1: none */
    void *mem[GPT_NMEMS];       /* the stage's buffers (S_, MS_, H_, X_; NULL: none) */
    void *other_p[GPT_NFIELDS]; /* the embedding's and head's tensors by field */
    float *other_g[GPT_NFIELDS];    /* their f32 gradients */
    float *loss_dev;            /* (NMB) loss sums per micro-batch (X_LOSS) */
    float *stat_dev;            /* (nparams + 3) norm pieces, then dense | experts | total */
    float *sp_pack;             /* packed sequence-parallel gradients (X_SP_PACK) */
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
void *lib_grad_buffer(int i);                /* gradient buffer i (gpt_sched_step.dy) */
/* Waits for the communication a step leaves in flight (with overlap, the all-gathers of the
** next step's parameters: gpt_stage.sync), so that the parameters can be read between steps.
** Every rank calls it alike (before a checkpoint, --save, a stop, the end). */
void lib_sync(void);
size_t lib_state_bytes(void);                /* resume checkpoint: parameters and optimizer */
void lib_state_io(unsigned char *host, int save);

/* Where the values of lib_state_io's bytes belong in the model, layout-free: a block holds
** element (r, c), r < rows, c < cols, of the rectangle of tensor 'tensor' (lib.tensors) at
** (grow, gcol), at byte at + (r * ld + c) * size of the state. Every piece of every
** parameter (the tied copy too), per kind; the moments and the main parameters of a
** distributed optimizer's shards only where this rank holds them (a piece cut by a shard's
** edge gives up to three blocks); the expert biases. A resume checkpoint stores the list
** (ckpt.c), so that a program of another layout can find any value in it. */
enum {
    LIB_STATE_PARAM,            /* the parameters in the model's dtype ('size' 4 or 2) */
    LIB_STATE_MAIN,             /* bf16 training's f32 main parameters */
    LIB_STATE_EXP_AVG,          /* AdamW's first moment */
    LIB_STATE_EXP_AVG_SQ,       /* its second moment */
    LIB_STATE_EBIAS,            /* the expert biases (f32 state, not parameters) */
    LIB_STATE_KINDS
};
typedef struct {
    uint64_t tensor, kind, size, grow, gcol, rows, cols, ld, at;
    int buf;                    /* LIB_STATE_PARAM: its buffer, and 'pos' the buffer element */
    size_t pos;                 /* of its (0, 0) (not stored: this rank's own layout) */
} lib_state_block;
enum { LIB_STATE_BLOCK_WORDS = 9 };   /* the stored words: tensor .. at */
int lib_state_blocks(lib_state_block **out);     /* malloc'd; returns the count */
/* The whole f32 parameters of buffer b, where --init and the initialisation write and --save
** reads: the parameters themselves in f32 training; in bf16, the gradient buffer (unused
** between steps) as staging, made current by lib_master_allgather and made effective by
** lib_master_commit (the main parameters and their bf16 copy). */
float *lib_master(int b);
void lib_master_commit(void);
void lib_master_allgather(void);      /* all-gathered over dp with the distributed optimizer */
/* This rank's first gradient element that is not finite, among those it counts in the norm:
** 1 with the tensor's name, the element's index in this rank's part and its value; 0 if none. */
int lib_first_bad_grad(const char **name, long long *index, float *value);

/* groups.c: coordinates and communicators of this rank (collective over the world). */
void lib_groups_create(const gpt_program *prog);
void lib_groups_print(const gpt_program *prog);   /* --show-groups */

/* stage.c: every local layer's expert bias in turn: 'fn' gets its global layer and its (E) values. */
void lib_expert_bias_each(void (*fn)(int layer, float *bias, void *ctx), void *ctx);

/* moe.c: a layer's routing state in one slot, set up once (host arrays). */
void lib_moe_init(gpt_moe *m, void *const *a, lib_layer *layer);

#endif
