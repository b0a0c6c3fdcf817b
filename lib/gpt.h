/*
** gpt.h: the training library's interface to generated programs. The library (lib/, compiled
** once per backend into build/libgpt_cpu.a and build/libgpt_cuda.a) holds everything that does
** not depend on the model or the layout: the kernels and the layers' operations (lib/ops.h:
** each GEMM, norm, attention and mixture-of-experts step a generated layer calls), the stage
** machinery (buffers, parameter views, gradient reduction, norm, AdamW, checkpoint
** state, initialisation, loading and saving) and main (flags, data, checkpoints, log). A generated
** program (out/<dir>/, docs/PROGRAM.md) supplies only what varies, as constant tables: the
** sizes (gpt_dims), the model's tensors (gpt_role), the rank grid (gpt_grid, gpt_kind), and per
** pipeline stage its tables, its layers' forward and backward as kernel calls and
** collectives, its chunks and its schedule as a table of steps (gpt_stage). Every table is computed by the generator; the library decides nothing about the
** layout, it follows the tables (and checks them where a mistake would be silent).
*/
#ifndef GPT_H
#define GPT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"   // defines: the kernels (layernorm_fwd, attention_fwd, adamw_step, ...)
#include "ops.h"       // defines: matmul_fwd, linear_fwd, cp_ring_fwd_block, moe_dispatch, ...
#include "gpt_tables.h"   // defines: GPT_GROUPS, GPT_FIELDS, GPT_MEMS, GPT_A2AS
#include "rt.h"        // defines: rt_group, rt_p2p, rt_allreduce, RT_CHECK, ...

#ifdef __cplusplus
extern "C" {
#endif

/* -- Sizes ---------------------------------------------------------------------------------- */

#define GPT_MAX_CP 4096       /* context-parallel size at most (config.lua MAX_CP) */

/* Every size the model code needs, for this layout (the generator's CFG_ constants). Tokens of
** a micro-batch are rows t*B + b (sequence-major); under sequence parallelism a tp rank holds
** the n_sp rows [tp_rank*n_sp, (tp_rank+1)*n_sp) between the layers' tensor-parallel regions. */
typedef struct {
    int B, T, C;              /* micro-batch, sequence length on this rank (SEQ/CP), channels */
    int seq, cp, cp_a2a;      /* the whole sequence; context-parallel size; all-to-all (1) or
                              ** the p2p ring (0) (docs/megatron.md §12) */
    int t_chunk;              /* positions per load-balanced chunk: SEQ/(2*CP) (T if CP = 1) */
    int N, n_sp;              /* tokens per micro-batch (T*B); held per tp rank (N/TP under SP) */
    int t_model;              /* rows of wpe (the model's sequence length) */
    int heads_local, head_dim;
    int c_local, qkv_local;   /* per tp rank: attention channels C/TP, q|k|v (H + 2 KV) hd/TP */
    int ff_local;             /* MLP columns per tp rank */
    int v_local;              /* vocabulary rows per tp rank (padded) */
    int nmb;                  /* micro-batches per step */
    float ln_eps, att_scale;  /* LayerNorm eps, 1/sqrt(head_dim) */
    float dloss;              /* d(step loss)/d(token loss) = 1/(N*NMB) on this rank */
    int tp, sp;               /* tensor-parallel size; sequence parallelism (0/1) */
    rt_dtype act;             /* parameters and activations: RT_F32, or RT_BF16 (BF16=1) */
    int rc_attn, rc_ln, rc_mlp;   /* selective recompute: attention core, LayerNorms, MLP */
    /* mixture of experts (moe = 0: a dense MLP; the rest unused) */
    int moe, experts, topk, ep, etp, experts_local, eff_local;
    int pre_softmax, bias;    /* softmax over all experts before top-k; router and expert
                              ** biases (add_bias_linear, 0/1) */
    float aux_scale, aux_grad;
    float z_scale;            /* z-loss = z_scale * sum over the tokens of logsumexp(logits)^2 */
    float topk_scale;         /* the chosen probabilities' factor (topk_scaling_factor; 1) */
    int groups, group_topk;   /* group-limited routing (num_groups, group_topk); 1, 1: none */
    int expert_bias;          /* 1: aux-loss-free load balancing (moe_router_enable_expert_bias):
                              ** a per-layer expert bias on the scores for the top-k only */
    float bias_rate;          /* its step per optimizer step (moe_router_bias_update_rate) */
    int aux_seqs;             /* the aux loss's token sets: 1 (the micro-batch) or B (seq_aux_loss:
                              ** row n is sequence n % B's) */
    int capacity;             /* choices an expert keeps of this rank's N_SP*K (N_SP*K: no limit) */
    int drop_probs;           /* beyond the capacity keep 1: the highest probabilities, 0: the
                              ** earliest rows (Megatron's moe_token_drop_policy probs/position) */
    int pad_rows;             /* > 0: every expert gets exactly pad_rows rows of this rank,
                              ** zero-probability rows added (moe_pad_expert_input_to_capacity) */
    int moe_send_max, moe_recv_max, moe_rows_max, moe_counts;
    int shared_expert;        /* 1: a shared expert (moe_shared_expert_intermediate_size): the
                              ** dense MLP's params and buffers, width ff_local, on every token
                              ** beside the routed experts */
    /* the Llama layer (llama = 1; docs/llama.md): RMSNorm, rotary positions on q and k,
    ** grouped-query attention, SwiGLU, no biases, weights [out, in] (nn.Linear) */
    int llama;
    int kv_local;             /* key/value heads per tp rank */
    float rope_theta;
} gpt_dims;

/* -- The model's tensors (checkpoint order) ---------------------------------------------- */

typedef enum { GPT_INIT_NORMAL, GPT_INIT_ZERO, GPT_INIT_ONE } gpt_init;

/* Where a role's tensors sit in the checkpoint order: the tensors are the BEFORE roles, then per
** layer its LAYER roles followed, per expert, by the EXPERT roles, then the AFTER roles. */
typedef enum { GPT_BEFORE, GPT_LAYER, GPT_EXPERT, GPT_AFTER } gpt_scope;

typedef struct {
    const char *name;         /* printf pattern: "wte.weight", "h.%d.ln_1.weight",
                              ** "h.%d.mlp.experts.%d.c_fc.weight" (layer, then expert) */
    gpt_scope scope;
    int rows, cols, ndim;     /* global shape; 1-D tensors have rows = 1, ndim = 1 */
    gpt_init init;
    float std;                /* GPT_INIT_NORMAL */
} gpt_role;

/* -- Ranks and groups -------------------------------------------------------------------- */

/* ORDER GPT_AXIS: a rank's coordinates; the dense grid has ep size 1, the expert grid cp 1. */
enum { GPT_AX_TP, GPT_AX_CP, GPT_AX_EP, GPT_AX_DP, GPT_AX_PP, GPT_NAXES };

typedef struct {
    int size[GPT_NAXES];      /* dense: tp cp 1 dp pp; expert: etp 1 ep edp pp */
    int stride[GPT_NAXES];    /* rank = sum of coordinate * stride (the rank order) */
} gpt_grid;

/* The communicators a program may use (gpt_tables.h GPT_GROUPS). */
typedef enum {
#define GPT_GRP_ENUM(id, name) GPT_GRP_##id,
    GPT_GROUPS(GPT_GRP_ENUM)
#undef GPT_GRP_ENUM
    GPT_NGROUPS
} gpt_group;

enum { GPT_GRID_DENSE, GPT_GRID_EXPERT, GPT_GRID_EMBD };

/* A group kind: the axes that vary inside a group, members ordered with the fastest axis first
** as Megatron's generate_masked_orthogonal_rank_groups (the generator lists their sizes and
** strides in that order), or GPT_GRID_EMBD: the first and last rank of the pipeline group
** (first and last stage only). */
typedef struct {
    gpt_group id;
    int grid;                 /* GPT_GRID_* */
    int create;               /* 0: one member (or unused): not created, the handle is NULL */
    int naxes;                /* the axes that vary inside a group (embd: the pp axis) */
    int msize[GPT_NAXES];     /* their sizes, the fastest first (the generator's order) */
    int mstride[GPT_NAXES];   /* their rank strides */
} gpt_kind;

/* -- One pipeline stage's tables --------------------------------------------------------- */

/* The parameter tensors of the model code (gpt_tables.h GPT_FIELDS). */
typedef enum {
#define GPT_FIELD_ENUM(id, what, roles) GPT_P_##id,
    GPT_FIELDS(GPT_FIELD_ENUM)
#undef GPT_FIELD_ENUM
    GPT_NFIELDS
} gpt_field;

/* Parameter flags: weight decay, the gradient all-reduce over tp of sequence-parallel
** parameters, and how the gradient norm counts the tensor (docs/megatron.md §6). */
enum {
    GPT_DECAY = 1,
    GPT_SP_REDUCE = 2,
    GPT_NORM_ALWAYS = 0 << 2,   /* split over (expert-)tp: every rank counts its part */
    GPT_NORM_TP0 = 1 << 2,      /* replicated over tp: counted on tp rank 0 */
    GPT_NORM_ETP0 = 2 << 2,     /* an expert's replicated tensor: counted on expert-tp rank 0 */
    GPT_NORM_NEVER = 3 << 2,    /* the head's tied copy of wte: never counted */
    GPT_NORM_MASK = 3 << 2
};

/* A gradient bucket of a buffer: the distributed optimizer shards it over the buffer's
** data-parallel group; base: the shard's offset in the optimizer state (docs/megatron.md §5.4). */
typedef struct { size_t start, size, shard, base; } gpt_bucket;

/* A parameter buffer (Megatron's DDP buffer of one model chunk and kind): the parameters in
** reverse order, padded; the gradients have the same layout. */
typedef struct {
    int chunk;
    int expert;               /* expert weights: reduced over expt-dp, their own norm sum */
    size_t size;              /* elements, padding included */
    int sharded;              /* distributed optimizer: moments of this rank's bucket shards */
    size_t state;             /* AdamW moments: 'size', or this rank's shard (distributed) */
    gpt_group group;          /* the data-parallel group its gradients are reduced over */
    int nbuckets;
    const gpt_bucket *buckets;
} gpt_buffer;

/* A local parameter tensor: where it is (buffer, offset) and what it is. In a layer table the
** offset is from the layer's base in that buffer (every layer of a chunk has the same layout). */
typedef struct {
    short field;              /* gpt_field: the struct member that points at it */
    short expert;             /* local expert index, -1 */
    short buf;                /* index into the stage's buffers */
    short flags;              /* GPT_DECAY | GPT_SP_REDUCE | GPT_NORM_* */
    int role;                 /* index into the program's roles */
    int ld;                   /* row stride of the local tensor (its last dimension) */
    size_t offset, n;         /* elements */
} gpt_param;

/* Piece flags. */
enum {
    GPT_REPLICATED = 1,       /* the same values on every (expert-)tp rank: saved by rank 0 */
    GPT_TIED_COPY = 2,        /* the head's copy of wte: loaded and drawn, never saved */
    GPT_EXPERT_PIECE = 4,     /* saved by expert-data-parallel rank 0 */
    GPT_VOCAB_ROWS = 8        /* rows past the vocabulary are padding: cut */
};
enum { GPT_SPLIT_NONE, GPT_SPLIT_TP, GPT_SPLIT_ETP };

/* A rectangle of a global tensor held in a local tensor. Its global start moves with the
** rank's tp (or expert-tp) coordinate: grow + step_row * coord, gcol + step_col * coord. */
typedef struct {
    int param;                /* row of the same table (layer or other) */
    int lrow, lcol;           /* first local row and column */
    int grow, gcol;           /* first global row and column at coordinate 0 */
    int rows, cols;
    int split;                /* GPT_SPLIT_*: which coordinate moves it */
    int step_row, step_col;
    int flags;                /* GPT_REPLICATED | GPT_TIED_COPY | GPT_EXPERT_PIECE |
                                 GPT_VOCAB_ROWS */
} gpt_piece;

/* Where a layer keeps its activations (docs/megatron.md §9.2): work < 0, all in its
** activation slot; else the buffers recompute drops (the gpt_mem entries marked 'work') live
** in the stage's recompute workspace at position 'work' and are computed again in the
** backward pass; keep_out: its output (res2) stays in the slot all the same. */
typedef struct {
    short work;
    short keep_out;
} gpt_layer_store;

/* A model chunk of the stage: its layers, activation slots and duties, and the tables of its
** layers' tensors: one layer's (every layer of a chunk has the same layout) and each layer's
** base offset in every buffer of the stage. */
typedef struct {
    int first, layers;        /* global layers first .. first+layers-1 */
    int slots;                /* activation sets: micro-batches in flight at most */
    int embedding, head;
    int nparams;              /* one layer's tensors */
    const gpt_param *params;  /* offsets from the layer's base in each tensor's buffer */
    int npieces;
    const gpt_piece *pieces;  /* param: a row of 'params' */
    const size_t *bases;      /* [layers * nbuffers]: layer j's base offset in buffer b */
    const long long *shifts;  /* [layers * nparams]: what layer j's tensor r adds to its row's
                                 offset (a bucket's padding inside the layer); NULL: nothing */
    const gpt_layer_store *store;   /* [layers]; NULL: no recompute, all in the slot */
} gpt_chunk_info;

/* Every device buffer the library allocates, with the generator's size (gpt_tables.h
** GPT_MEMS). */
typedef enum {
#define GPT_MEM_ENUM(id, dtype, what, llama) GPT_M_##id,
    GPT_MEMS(GPT_MEM_ENUM)
#undef GPT_MEM_ENUM
    GPT_NMEMS
} gpt_mem_id;

/* How one of them is made: not at all (the default of an entry the stage does not list),
** allocated ('bytes' per instance), or the same memory as another (alias). 'work': a
** per-layer buffer that recompute drops: layers with a recompute workspace position keep it
** there (gpt_layer_store). */
enum { GPT_MEM_NONE = 0, GPT_MEM_ALLOC, GPT_MEM_ALIAS };
typedef struct {
    int how;
    int alias;                /* GPT_MEM_ALIAS: the gpt_mem_id it shares */
    size_t bytes;
    int work;
} gpt_mem;

typedef struct gpt_step_in gpt_step_in;
typedef struct gpt_step_out gpt_step_out;

typedef struct {
    const char *title;                     /* "stage 1 of 2: layers 4..7, head + loss" */
    int nbuffers;
    const gpt_buffer *buffers;
    int nchunks;
    const gpt_chunk_info *chunks;
    int nother_params;                     /* embedding and head tensors (absolute offsets) */
    const gpt_param *other_params;
    int nother_pieces;
    const gpt_piece *other_pieces;         /* param: a row of other_params */
    const gpt_mem *mem;                    /* [GPT_NMEMS] */
    int grad_buffers;                      /* the gradients of the chunks' outputs (one
                                              gpt_sched_step.dy each), held from their arrival
                                              to the send of the input's: a slot's dy is one
                                              of them while its micro-batch needs it */
    int pool_slots;                        /* 0: each chunk's activation slots its own; else
                                              the chunks share this many (every chunk has as
                                              many): slot k of each is the same memory, a
                                              per-layer buffer one per layer position */
    size_t mem_bytes;                      /* the generator's plan: every device byte of setup
                                              (the CUDA runtime adds RT_CUDA_WORKSPACE_BYTES) */
    int needs_inputs, needs_targets;       /* reads token ids / targets */
    int head_uses_wte;                     /* embedding and head on this stage: one wte */
    void (*step)(const gpt_step_in *in, gpt_step_out *out);
    void (*eval)(const gpt_step_in *in, gpt_step_out *out);   /* forward only: out->loss,
                                              the loss of in's micro-batches; the training
                                              state untouched (docs/PROGRAM.md §4) */
    void (*sync)(void);                    /* waits for the communication a step leaves in
                                              flight (the next step's parameters); NULL: none.
                                              gpt_sync calls it */
} gpt_stage;

/* -- The whole program --------------------------------------------------------------------- */

typedef struct {
    const char *model;                     /* "models/tiny.lua" */
    const char *layout;                    /* "tp2 pp2 dp2", for messages */
    const char *model_text;                /* the resolved model, "key=value\n" lines in a
                                              fixed order (gen/lua/program.lua model_text) */
    const char *layout_text;               /* the layout the same way (sizes, rank order,
                                              pipeline split, SP, DIST_OPT, BF16, ...) */
    const char *made_by;                   /* the command that regenerates the program */
    const char *run_hint;                  /* how to launch it, for --help */
    int world, tp, pp, dp, cp, vp;
    int gbs;                               /* global batch: MBS*NMB*DP */
    long long tokens_per_step;             /* GBS*T */
    double model_flops;                    /* of a step, as Megatron counts them */
    int vocab;                             /* real vocabulary (token ids must be below it) */
    gpt_dims dims;
    int nroles;
    const gpt_role *roles;
    int layers, experts;                   /* for the roles' per-layer / per-expert repetition */
    gpt_grid dense, expert;
    int nkinds;
    const gpt_kind *kinds;
    int nstages;
    const gpt_stage *const *stages;        /* [pp coordinate] */
} gpt_program;

/* -- What generated code calls ------------------------------------------------------------- */

/* main: parse flags, start the runtime, build the groups, set up the rank's stage, train.
** The library's main (lib/main.c) calls it with the generated program.c's description. */
int gpt_main(int argc, char **argv, const gpt_program *prog);
extern const gpt_program gpt_program_desc;

/* Message tags: pipeline activations forward, gradients backward; on the context-parallel
** ring, K|V blocks and their dK|dV. */
enum { GPT_TAG_ACT = 0, GPT_TAG_GRAD = 1, GPT_TAG_RING_KV = 2, GPT_TAG_RING_DKV = 3 };

/* The state the generated code works on, through accessors (model.c); every pointer is
** device memory of the stage's memory plan, in the model's dtype unless said otherwise. */
void *const *gpt_acts(int chunk, int slot, int layer);    /* [GPT_NMEMS]: its L_, ML_ buffers */
void *const *gpt_params(int chunk, int layer);    /* [GPT_NFIELDS]: its tensors by field;
                                                  ** layer -1: the embedding's and head's */
float *const *gpt_grads(int chunk, int layer);    /* their f32 gradients, the same way */
void *gpt_stage_buf(gpt_mem_id id);               /* a stage buffer (S_, MS_, H_, X_) */
void *gpt_x(int chunk, int slot);                 /* (N_SP, C) the chunk's input */
void *gpt_dy(int chunk, int slot);                /* (N_SP, C) d(its output), then d(input) */
int *gpt_tokens(int chunk, int slot);             /* (N) token ids (embedding chunk) */
const void *gpt_layer_in(int chunk, int slot, int layer);  /* x, or layer-1's output */
void *gpt_out(int chunk, int slot);               /* its last layer's output; x if none */
const int *gpt_inputs(int mb);                    /* host (N): micro-batch mb's token ids */
const int *gpt_targets(int mb);                   /* host (N): its targets */
rt_group *gpt_grp(gpt_group id);                  /* NULL: not created */
enum { GPT_PP_PREV, GPT_PP_NEXT, GPT_CP_PREV, GPT_CP_NEXT };
int gpt_peer(int which);                          /* a neighbour's global rank (wrapping) */
int gpt_tp_rank(void);
int gpt_cp_rank(void);
int gpt_vocab_start(void);                        /* this tp rank's first vocabulary row */
int gpt_vocab_valid(void);                        /* its rows that are real (not padding) */
int gpt_cp_position(int t);                       /* the true position of local position t */

/* The mixture of experts: a layer's routing state in one activation slot (opaque), and the
** counts of its all-to-alls as the library planned them from the routing (lib/moe.c). */
typedef struct gpt_moe gpt_moe;
gpt_moe *gpt_moe_of(int chunk, int slot, int layer);
typedef struct {
    const size_t *scounts, *sdispls, *rcounts, *rdispls;   /* elements, by group rank */
} gpt_a2a;
/* The exchanges (gpt_tables.h GPT_A2AS). */
typedef enum {
#define GPT_A2A_ENUM(id) GPT_A2A_##id,
    GPT_A2AS(GPT_A2A_ENUM)
#undef GPT_A2A_ENUM
    GPT_NA2AS
} gpt_a2a_kind;
const gpt_a2a *gpt_moe_a2a(const gpt_moe *m, gpt_a2a_kind which);

/* The schedule as data (generated stage<k>.c): each step posts its pipeline messages together
** (up to GPT_SCHED_MSGS, the first GPT_NO_MSG ends them), then runs a chunk's forward or
** backward on an activation slot (or nothing more). GPT_STEP_OVERLAP added to the kind: the
** messages (activations sent, nothing received) complete during that computation, waited
** before the next step's. */
enum { GPT_STEP_F, GPT_STEP_B, GPT_STEP_X, GPT_STEP_OVERLAP = 4 };
enum { GPT_NO_MSG, GPT_SEND_ACT, GPT_RECV_ACT, GPT_SEND_GRAD, GPT_RECV_GRAD };
#define GPT_SCHED_MSGS 4
typedef struct {
    int kind, chunk;
    int slot;                 /* activations: the chunk's slot; gradients: the gradient buffer */
} gpt_sched_msg;
typedef struct {
    int kind, mb, chunk, slot;
    int dy;                   /* F, B: the gradient buffer the slot's dy is; -1: none */
    gpt_sched_msg msg[GPT_SCHED_MSGS];
} gpt_sched_step;
/* The p2p op of a message: activations sent from the chunk's output (in its slot) to the next
** stage or received into its input from the previous one; gradients sent from one of the
** stage's gradient buffers to the previous stage or received into one from the next (N_SP*C
** elements, the model's dtype). */
rt_p2p_op gpt_sched_op(const gpt_sched_msg *g);
/* Before a row's forward or backward: the slot's dy (gpt_dy) becomes gradient buffer st->dy,
** or NULL when st->dy < 0 (a forward that makes no gradient: nothing may touch it). */
void gpt_sched_bind(const gpt_sched_step *st);

struct gpt_step_in {
    int step;                              /* 0-based optimizer step */
    float lr, beta1, beta2, eps, wd, clip;
    const int *inputs, *targets;           /* host (NMB, N): this rank's micro-batches */
    int stop;                              /* this rank wants the job to stop after the step */
};

struct gpt_step_out {
    double loss;                           /* mean loss of the global batch (every rank) */
    double aux_loss;                       /* MoE load-balancing term of the objective */
    double grad_norm;                      /* before clipping */
    int skipped;                           /* loss, aux or norm not finite: nothing updated */
    int stop;                              /* some rank's in->stop was set: all stop */
};

/* The step's pieces between its collectives (stage.c), which the generated step issues
** itself, in its order. */
void gpt_step_begin(const gpt_step_in *in);                 /* zero gradients and aux */
float *gpt_grad_buf(int buf);                               /* its f32 gradients */
float *gpt_grad_shard(int buf, int bucket);      /* this rank's shard of a bucket in it */
void *gpt_param_bucket(int buf, int bucket);     /* a bucket of the parameters */
void *gpt_param_shard(int buf, int bucket);      /* this rank's shard of it */
void gpt_sp_pack(void);                 /* SP gradients into X_SP_PACK, one after another */
void gpt_sp_unpack(void);               /* and back */
void gpt_norm_local(void);              /* sums of squares: dense, experts, their total */
float *gpt_stat(int k);                 /* (device) k = 0, 1, 2: dense, experts, total sums;
                                        ** then [loss, stop] at 0, 1 and the aux loss at 2 */
void gpt_norm_set(gpt_step_out *out, int total);   /* grad_norm: sqrt of dense + experts,
                                                   ** or of the total */
void gpt_aux_pack(void);                /* this rank's share of the aux loss into gpt_stat(2) */
void gpt_aux_unpack(gpt_step_out *out);
void gpt_loss_pack(const gpt_step_in *in);   /* [this rank's loss share, stop] into stat 0, 1 */
void gpt_loss_unpack(gpt_step_out *out);
/* an evaluation (the generated eval): begin waits for the parameters in flight and reads in's
** batch; end puts back what the forwards counted for the training step (aux loss, the expert
** counts); between the two gpt_evaluating() is 1 and a forward starts no reduction */
void gpt_eval_begin(const gpt_step_in *in);
void gpt_eval_end(void);
int gpt_evaluating(void);
/* clip and update (this rank's shard); when out's loss, aux loss or gradient norm is not
** finite, sets out->skipped and changes nothing (README.md, "When things go wrong") */
void gpt_adamw(const gpt_step_in *in, gpt_step_out *out);
/* expert_bias, for the stage's layer l (in chunk order): its step's rows per expert into
** MS_COUNTS (device, E ints) to be summed over dp-cp and tp; then bias += rate *
** sign(mean - count) unless out->skipped, and the counts restart */
void gpt_ebias_counts(int l);
void gpt_ebias_update(int l, const gpt_step_out *out);

#ifdef __cplusplus
}
#endif
#endif
