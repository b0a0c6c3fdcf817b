/*
** internal.h: what the library's own files share and generated code never sees: the stage's
** buffers and expanded tables (stage.c), the model's scratch and embedding/head tensors
** (model.c), the mixture-of-experts scratch (moe.c), the model's tensor list (train.c), group
** creation (groups.c). Everything here is set up once, by gpt_main, before the first step.
*/
#ifndef GPT_INTERNAL_H
#define GPT_INTERNAL_H

#include "gpt.h"   // defines: gpt_state, gpt_program, gpt_stage, gpt_param, gpt_piece, ...

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

/* The model's tensors in checkpoint order, expanded from the roles. */
typedef struct {
    char name[96];
    int rows, cols, ndim;
    gpt_init init;
    float std;
    uint64_t stream;            /* FNV-1a 64 of the name: its random values' stream */
} lib_tensor;

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
    lib_tensor *tensors;
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
    int fault;                  /* LIB_FAULT_*: a fault train.c injects into this step */
} lib_state;

/* Faults injected for tests (GPT_FAULT, train.c): a NaN in this rank's first counted gradient
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

/* train.c: the tensor list, built from the roles; index of a role's tensor. */
void lib_tensors_build(const gpt_program *prog);
int lib_tensor_index(const gpt_program *prog, int role, int layer, int expert);

/* stage.c: every local layer's expert bias in turn: 'fn' gets its global layer and its (E) values. */
void lib_expert_bias_each(void (*fn)(int layer, float *bias, void *ctx), void *ctx);

/* moe.c: a layer's routing state in one slot, set up once (host arrays). */
void lib_moe_init(gpt_moe *m, void *const *a, lib_layer *layer);

/* data.c: Megatron indexed datasets (PREFIX.bin + PREFIX.idx) sampled as its GPTDataset and
** BlendedDataset ("train" split, whole corpus); every rank builds the same indices. */
typedef struct lib_data lib_data;
int lib_data_is_indexed(const char *path, char **prefix);   /* *prefix: new string */
lib_data *lib_data_open(int n, char *const *prefixes, const double *weights, int seq,
                        long long request, unsigned long long seed, int verbose);
long long lib_data_size(const lib_data *d);
void lib_data_sample(const lib_data *d, long long i, int *out);   /* (seq + 1) ids */
void lib_data_check_vocab(const lib_data *d, int vocab, void (*world_max)(long long *));
void lib_data_free(lib_data *d);

/* A token file (--data FILE): nanoGPT's uint16 .bin or an llm.c shard; or, when mm is set, a
** Megatron dataset or blend (train.c). lib_tokens_open checks the header and that every id is
** < vocab (the ranks share the scan; world_max agrees on the first bad position), through
** lib_fail_file. */
typedef struct {
    const char *path;
    int fd;
    long long first;          /* byte offset of token 0 */
    long long ntok, nsamples;
    lib_data *mm;             /* a Megatron indexed dataset or blend; NULL: a token file */
} lib_tokens;
void lib_tokens_open(lib_tokens *t, const char *path, int seq, int vocab,
                     void (*world_max)(long long *));

/* Errors that every rank detects alike: rank 0 reports "WHERE: error: ...", all exit. */
void lib_fail_all(int code, const char *fmt, ...) RT_PRINTF(2, 3) RT_NORETURN;
void lib_fail_file(const char *path, const char *fmt, ...) RT_PRINTF(2, 3) RT_NORETURN;

#endif
