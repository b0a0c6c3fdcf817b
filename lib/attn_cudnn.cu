/*
** attn_cudnn.cu: causal attention of whole sequences on cuDNN's fused attention, for
** attention_fwd and attention_bwd in bf16 (kernels_cuda.cu calls it first; where it answers 0,
** the own kernels run). Built on cuDNN 9's backend API: each pass is an operation graph of
** tensors, matmuls, pointwise operations and reductions in the scaled-dot-product pattern that
** cuDNN's fused-attention engines recognise (the graph below, docs/GPU.md "cuDNN attention"),
** finalised once per shape into an execution plan and then executed per call. libcudnn.so.9 is
** opened at the first call (dlopen): a machine without it runs the own kernels.
**
** ATTN (environment) chooses: unset, cuDNN where it loads and accepts the graph, else the own
** kernels with one line on stderr saying why; ATTN=cudnn, cuDNN or a failed job (for a
** measurement that must not silently fall back); ATTN=own, never cuDNN. Only the engines
** without cuDNN's NONDETERMINISTIC note are used: a step's results do not depend on the run.
**
** Layouts (kernels.h): qkv rows t*B + b of (Hl + 2 KVl) hd, out and dout rows of Hl hd, lse and
** dsum (B, Hl, T) f32: every operand is a strided view, nothing is copied. The statistics
** cuDNN keeps (the log-sum-exp of the scaled, masked scores) are the own kernels' lse, so either
** backward follows either forward. The probabilities enter their products with v and dout in
** bf16, and the score gradients theirs with q and k (the bound kernels.h states for
** attention_bf16_products). The kernel tests run this file on an emulation of the backend API
** (tests/kernels/emu/cudnn_emu.cc) that interprets the graph.
*/
#include <cuda_runtime.h>
#include <cudnn.h>
#ifndef GPT_CUDA_EMU
#include <dlfcn.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attn_cudnn.h"
#include "rt.h"        // defines: RT_CHECK, rt_log, RT_CUDA

/* -- The library, opened at the first call ----------------------------------------------------- */

#define DNN_CALLS(X)                                                                           \
    X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnGetLastErrorString) X(cudnnCreate)        \
    X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor) X(cudnnBackendFinalize)   \
    X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) X(cudnnBackendExecute)
static struct {
#define DNN_FIELD(f) decltype(&::f) f;
    DNN_CALLS(DNN_FIELD)
#undef DNN_FIELD
} dnn;

/* The deprecated attribute names that still carry the handle (cuDNN 9 marks them deprecated;
** named by value so that the build has no warning) */
#define ATTR_OPERATIONGRAPH_HANDLE ((cudnnBackendAttributeName_t)800)
#define ATTR_EXECUTION_PLAN_HANDLE ((cudnnBackendAttributeName_t)400)

enum { MODE_AUTO, MODE_CUDNN, MODE_OWN };
static int mode = -1;
static int loaded = -1;                  /* -1: not tried; 0: unavailable (why: load_why) */
static char load_why[256];
static cudnnHandle_t handle;
/* The workspace: the runtime's (rt_workspace: in the memory plan, shared with cuBLAS, whose
** calls run on the same stream); under a runtime without one (the kernel tests' CPU runtime
** beside the CUDA kernels) one of the same size of its own. A plan needing more is not used. */
static void *ws;
static size_t ws_bytes;

static int attn_mode(void)
{
    if (mode >= 0) return mode;
    const char *e = getenv("ATTN");
    if (!e || !*e) mode = MODE_AUTO;
    else if (!strcmp(e, "cudnn")) mode = MODE_CUDNN;
    else if (!strcmp(e, "own")) mode = MODE_OWN;
    else RT_CHECK(0, "ATTN=%s: expected cudnn (cuDNN's fused attention) or own (the library's "
                     "kernels)", e);
    return mode;
}

static int dnn_load(void)
{
    if (loaded >= 0) return loaded;
    loaded = 0;
#ifdef GPT_CUDA_EMU
#define DNN_BIND(f) dnn.f = &::f;
    DNN_CALLS(DNN_BIND)
#undef DNN_BIND
#else
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_why, sizeof load_why, "libcudnn.so.9 does not load (%s)", dlerror());
        return 0;
    }
#define DNN_BIND(f)                                                                            \
    if (!(dnn.f = (decltype(&::f))dlsym(lib, #f))) {                                           \
        snprintf(load_why, sizeof load_why, "libcudnn.so.9 has no %s", #f);                   \
        return 0;                                                                              \
    }
    DNN_CALLS(DNN_BIND)
#undef DNN_BIND
#endif
    size_t v = dnn.cudnnGetVersion();
    if (v < 90000) {
        snprintf(load_why, sizeof load_why, "cuDNN %zu is older than 9.0", v);
        return 0;
    }
    ws = rt_workspace(&ws_bytes);
    if (!ws) {
        ws_bytes = RT_CUDA_WORKSPACE_BYTES;
        RT_CUDA(cudaMalloc(&ws, ws_bytes));
    }
    cudnnStatus_t st = dnn.cudnnCreate(&handle);      /* on the legacy default stream */
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(load_why, sizeof load_why, "cudnnCreate: %s", dnn.cudnnGetErrorString(st));
        return 0;
    }
    return loaded = 1;
}

/* -- Building a graph -------------------------------------------------------------------------- */

#define G_DESCS 256
#define G_OPS 48
struct dnn_graph {
    cudnnBackendDescriptor_t all[G_DESCS];   /* every descriptor made, for a refused graph */
    int nall;
    cudnnBackendDescriptor_t ops[G_OPS];
    int nops;
    int64_t next_uid;                         /* the virtual tensors' ids */
    cudnnStatus_t st;                         /* the first failure, and where */
    char why[320];
};

static void g_fail(dnn_graph *g, cudnnStatus_t st, const char *what)
{
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    char msg[192] = "";
    dnn.cudnnGetLastErrorString(msg, sizeof msg);
    g->st = st;
    snprintf(g->why, sizeof g->why, "%s: %s%s%s", what, dnn.cudnnGetErrorString(st),
             *msg ? ": " : "", msg);
}

static cudnnBackendDescriptor_t g_new(dnn_graph *g, cudnnBackendDescriptorType_t type)
{
    cudnnBackendDescriptor_t d = NULL;
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->nall == G_DESCS) {
        g_fail(g, CUDNN_STATUS_INTERNAL_ERROR, "attn_cudnn: G_DESCS too small");
        return NULL;
    }
    cudnnStatus_t st = dnn.cudnnBackendCreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) g_fail(g, st, "cudnnBackendCreateDescriptor");
    else g->all[g->nall++] = d;
    return d;
}

static void g_set(dnn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                  cudnnBackendAttributeType_t t, int64_t n, const void *v)
{
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t st = dnn.cudnnBackendSetAttribute(d, a, t, n, v);
    char what[64];
    snprintf(what, sizeof what, "cudnnBackendSetAttribute (attribute %d)", (int)a);
    if (st != CUDNN_STATUS_SUCCESS) g_fail(g, st, what);
}

static void g_desc(dnn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                   cudnnBackendDescriptor_t v)
{
    g_set(g, d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static void g_fin(dnn_graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t st = dnn.cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) g_fail(g, st, what);
}

static void g_free(dnn_graph *g)
{
    for (int i = g->nall; i-- > 0;) dnn.cudnnBackendDestroyDescriptor(g->all[i]);
    g->nall = 0;
}

/* A tensor: dims and strides of 4 (b, h, rows, cols); uid 0 gives a virtual one a fresh id */
struct shape4 { int64_t d[4], s[4]; };

static shape4 sh(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                 int64_t s2, int64_t s3)
{
    shape4 x = { { d0, d1, d2, d3 }, { s0, s1, s2, s3 } };
    return x;
}

static shape4 dense(int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    return sh(d0, d1, d2, d3, d1 * d2 * d3, d2 * d3, d3, 1);
}

static shape4 transpose(shape4 x)     /* the same memory, rows and columns swapped */
{
    return sh(x.d[0], x.d[1], x.d[3], x.d[2], x.s[0], x.s[1], x.s[3], x.s[2]);
}

/* (a scalar by value has one dim, 1, as cudnn-frontend declares its scalars) */
static cudnnBackendDescriptor_t tensor(dnn_graph *g, int64_t uid, cudnnDataType_t dt,
                                       shape4 x, bool is_virtual, bool by_value)
{
    cudnnBackendDescriptor_t d = g_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16, id = uid ? uid : g->next_uid++, nd = by_value ? 1 : 4;
    g_set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    g_set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, x.d + 4 - nd);
    g_set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, x.s + 4 - nd);
    g_set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    g_set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    g_set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) g_set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    g_fin(g, d, "a tensor");
    return d;
}

static cudnnBackendDescriptor_t io(dnn_graph *g, int64_t uid, cudnnDataType_t dt, shape4 x)
{
    return tensor(g, uid, dt, x, false, false);
}

static cudnnBackendDescriptor_t virt(dnn_graph *g, cudnnDataType_t dt, shape4 x)
{
    return tensor(g, 0, dt, x, true, false);
}

static cudnnBackendDescriptor_t scalar(dnn_graph *g, int64_t uid)   /* a float by value */
{
    return tensor(g, uid, CUDNN_DATA_FLOAT, sh(1, 1, 1, 1, 1, 1, 1, 1), false, true);
}

static void add_op(dnn_graph *g, cudnnBackendDescriptor_t op, const char *what)
{
    g_fin(g, op, what);
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (g->nops == G_OPS) g_fail(g, CUDNN_STATUS_INTERNAL_ERROR, "attn_cudnn: G_OPS too small");
    else g->ops[g->nops++] = op;
}

/* y = mode(x, b, t) computed in prec; b, t NULL where the mode has fewer inputs; axis for
** GEN_INDEX (-1: none) */
static void pw(dnn_graph *g, cudnnPointwiseMode_t m, cudnnDataType_t prec,
               cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis)
{
    cudnnBackendDescriptor_t p = g_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    g_set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m);
    g_set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) g_set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    g_fin(g, p, "a pointwise descriptor");
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    float one = 1.0f;
    g_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p);
    g_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    g_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (b) g_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) g_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    add_op(g, op, "a pointwise operation");
}

static void pw1(dnn_graph *g, cudnnPointwiseMode_t m, cudnnBackendDescriptor_t x,
                cudnnBackendDescriptor_t y)
{
    pw(g, m, CUDNN_DATA_FLOAT, x, NULL, NULL, y, -1);
}

static void pw2(dnn_graph *g, cudnnPointwiseMode_t m, cudnnBackendDescriptor_t x,
                cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y)
{
    pw(g, m, CUDNN_DATA_FLOAT, x, b, NULL, y, -1);
}

/* c = a b (batched over dims 0 and 1; a kv head serves its group of query heads) */
static void matmul(dnn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c)
{
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = g_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    g_set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    g_fin(g, m, "a matmul descriptor");
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    g_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    g_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    g_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    g_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
    add_op(g, op, "a matmul operation");
}

/* y = the reduction of x over the dims where y has 1 (or a group of heads: dims that divide) */
static void reduce(dnn_graph *g, cudnnReduceTensorOp_t r, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t y)
{
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t d = g_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    g_set(g, d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r);
    g_set(g, d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    g_fin(g, d, "a reduction descriptor");
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    g_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    g_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    g_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, d);
    add_op(g, op, "a reduction operation");
}

/* y: the same memory as x under other dims and strides (a transposed view) */
static void reshape(dnn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    g_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    g_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add_op(g, op, "a reshape operation");
}

/* -- The graphs -------------------------------------------------------------------------------- */

/* The tensors the variant pack binds (non-virtual), by unique id */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_DO, UID_DQ, UID_DK,
    UID_DV, UID_DSUM, UID_ONE, UID_VIRTUAL = 100
};

struct att_shape { int64_t B, T, H, KV, hd; };

/* The views of the qkv rows (kernels.h): query head h of batch element b at time t is at
** (t B + b) w + h hd; K is given transposed (hd, T), as the backend's first product takes it,
** and in the backward V too. */
static shape4 q_view(att_shape a)
{
    int64_t w = (a.H + 2 * a.KV) * a.hd;
    return sh(a.B, a.H, a.T, a.hd, w, a.hd, a.B * w, 1);
}

static shape4 kv_view(att_shape a)
{
    int64_t w = (a.H + 2 * a.KV) * a.hd;
    return sh(a.B, a.KV, a.T, a.hd, w, a.hd, a.B * w, 1);
}

static shape4 out_view(att_shape a)   /* out and dout: rows of H hd */
{
    int64_t C = a.H * a.hd;
    return sh(a.B, a.H, a.T, a.hd, C, a.hd, a.B * C, 1);
}

static shape4 row_stat(att_shape a)   /* lse and dsum (B, H, T) */
{
    return sh(a.B, a.H, a.T, 1, a.H * a.T, a.T, 1, 1);
}

/* The causal mask on scores x (B, H, T, T) f32: y = x where row >= column, -inf elsewhere */
static cudnnBackendDescriptor_t causal(dnn_graph *g, att_shape a, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t neg_inf)
{
    shape4 s = dense(a.B, a.H, a.T, a.T);
    cudnnBackendDescriptor_t row = virt(g, CUDNN_DATA_INT32, s), col = virt(g, CUDNN_DATA_INT32, s);
    cudnnBackendDescriptor_t keep = virt(g, CUDNN_DATA_BOOLEAN, s);
    cudnnBackendDescriptor_t y = virt(g, CUDNN_DATA_FLOAT, s);
    pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, row, 2);
    pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, col, 3);
    pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, keep, y, -1);
    return y;
}

/* The tensors both passes bind: q, k^T, v (the backward: v^T), out, the statistics (lse), and
** the scale and -inf by value */
struct att_operands {
    cudnnBackendDescriptor_t q, kt, v, o, stats, scale, neg_inf;
};

static att_operands operands(dnn_graph *g, att_shape a, bool bwd)
{
    att_operands x;
    x.q = io(g, UID_Q, CUDNN_DATA_BFLOAT16, q_view(a));
    x.kt = io(g, UID_K, CUDNN_DATA_BFLOAT16, transpose(kv_view(a)));
    x.v = io(g, UID_V, CUDNN_DATA_BFLOAT16, bwd ? transpose(kv_view(a)) : kv_view(a));
    x.o = io(g, UID_O, CUDNN_DATA_BFLOAT16, out_view(a));
    x.stats = io(g, UID_STATS, CUDNN_DATA_FLOAT, row_stat(a));
    x.scale = scalar(g, UID_SCALE);
    x.neg_inf = scalar(g, UID_NEG_INF);
    return x;
}

/*
** Forward: s = q k^T (f32), s *= scale, the causal mask, m = rowmax(s), e = exp(s - m),
** l = rowsum(e), stats = m + log(l) (lse), p = e / l stored in bf16, out = p v.
*/
static void graph_fwd(dnn_graph *g, att_shape a)
{
    shape4 s4 = dense(a.B, a.H, a.T, a.T), r4 = dense(a.B, a.H, a.T, 1);
    att_operands x = operands(g, a, false);
    cudnnBackendDescriptor_t s = virt(g, CUDNN_DATA_FLOAT, s4), ss = virt(g, CUDNN_DATA_FLOAT, s4);
    matmul(g, x.q, x.kt, s);
    pw2(g, CUDNN_POINTWISE_MUL, s, x.scale, ss);
    cudnnBackendDescriptor_t sm = causal(g, a, ss, x.neg_inf);
    cudnnBackendDescriptor_t m = virt(g, CUDNN_DATA_FLOAT, r4), d = virt(g, CUDNN_DATA_FLOAT, s4);
    cudnnBackendDescriptor_t e = virt(g, CUDNN_DATA_FLOAT, s4), l = virt(g, CUDNN_DATA_FLOAT, r4);
    cudnnBackendDescriptor_t logl = virt(g, CUDNN_DATA_FLOAT, r4);
    cudnnBackendDescriptor_t p = virt(g, CUDNN_DATA_BFLOAT16, s4);
    reduce(g, CUDNN_REDUCE_TENSOR_MAX, sm, m);
    pw2(g, CUDNN_POINTWISE_SUB, sm, m, d);
    pw1(g, CUDNN_POINTWISE_EXP, d, e);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, l);
    pw1(g, CUDNN_POINTWISE_LOG, l, logl);
    pw2(g, CUDNN_POINTWISE_ADD, m, logl, x.stats);
    pw2(g, CUDNN_POINTWISE_DIV, e, l, p);
    matmul(g, p, x.v, x.o);
}

/* x^T (B, H, T, T) as a view of the (B, H, T, T) dense x, stored in bf16 for its product */
static cudnnBackendDescriptor_t transposed(dnn_graph *g, att_shape a, cudnnBackendDescriptor_t x)
{
    cudnnBackendDescriptor_t y = virt(g, CUDNN_DATA_BFLOAT16,
                                      transpose(dense(a.B, a.H, a.T, a.T)));
    reshape(g, x, y);
    return y;
}

/* c (kv heads) = a b summed over each kv head's group of query heads: the product per query
** head, then a reduction of the group (as cuDNN's own graphs do); one product with a.H == KV */
static void matmul_kv(dnn_graph *g, att_shape a, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t c)
{
    if (a.H == a.KV) {
        matmul(g, x, y, c);
        return;
    }
    cudnnBackendDescriptor_t full = virt(g, CUDNN_DATA_BFLOAT16, dense(a.B, a.H, a.T, a.hd));
    matmul(g, x, y, full);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, c);
}

/*
** Backward, from q, k, v, out, dout and the forward's stats: dsum = rowsum(dout * out) (kept in
** the caller's dsum), p = exp(scale q k^T - stats) under the mask, dv = p^T dout,
** ds = scale p (dout v^T - dsum), dk = ds^T q, dq = ds k. dq is a product of its own, written
** once (no accumulation across blocks: the deterministic form).
*/
static void graph_bwd(dnn_graph *g, att_shape a)
{
    shape4 s4 = dense(a.B, a.H, a.T, a.T), r4 = dense(a.B, a.H, a.T, 1);
    att_operands x = operands(g, a, true);
    cudnnBackendDescriptor_t q = x.q, kt = x.kt, vt = x.v, o = x.o, stats = x.stats;
    cudnnBackendDescriptor_t scale = x.scale, neg_inf = x.neg_inf;
    cudnnBackendDescriptor_t dout = io(g, UID_DO, CUDNN_DATA_BFLOAT16, out_view(a));
    cudnnBackendDescriptor_t dsum = io(g, UID_DSUM, CUDNN_DATA_FLOAT, row_stat(a));
    cudnnBackendDescriptor_t dq = io(g, UID_DQ, CUDNN_DATA_BFLOAT16, q_view(a));
    cudnnBackendDescriptor_t dk = io(g, UID_DK, CUDNN_DATA_BFLOAT16, kv_view(a));
    cudnnBackendDescriptor_t dv = io(g, UID_DV, CUDNN_DATA_BFLOAT16, kv_view(a));
    cudnnBackendDescriptor_t one = scalar(g, UID_ONE);

    /* dsum = rowsum(dout * out) * 1 */
    cudnnBackendDescriptor_t od = virt(g, CUDNN_DATA_FLOAT, dense(a.B, a.H, a.T, a.hd));
    cudnnBackendDescriptor_t rs = virt(g, CUDNN_DATA_FLOAT, r4);
    pw2(g, CUDNN_POINTWISE_MUL, dout, o, od);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, od, rs);
    pw2(g, CUDNN_POINTWISE_MUL, rs, one, dsum);

    /* p = exp(scale q k^T - stats), masked */
    cudnnBackendDescriptor_t s = virt(g, CUDNN_DATA_FLOAT, s4), ss = virt(g, CUDNN_DATA_FLOAT, s4);
    cudnnBackendDescriptor_t sl = virt(g, CUDNN_DATA_FLOAT, s4), p = virt(g, CUDNN_DATA_FLOAT, s4);
    matmul(g, q, kt, s);
    pw2(g, CUDNN_POINTWISE_MUL, s, scale, ss);
    pw2(g, CUDNN_POINTWISE_SUB, ss, stats, sl);
    pw1(g, CUDNN_POINTWISE_EXP, causal(g, a, sl, neg_inf), p);

    /* dv = p^T dout */
    matmul_kv(g, a, transposed(g, a, p), dout, dv);

    /* ds = scale p (dout v^T - dsum) */
    cudnnBackendDescriptor_t dp = virt(g, CUDNN_DATA_FLOAT, s4), dd = virt(g, CUDNN_DATA_FLOAT, s4);
    cudnnBackendDescriptor_t dpp = virt(g, CUDNN_DATA_FLOAT, s4);
    cudnnBackendDescriptor_t ds = virt(g, CUDNN_DATA_FLOAT, s4);
    matmul(g, dout, vt, dp);
    pw2(g, CUDNN_POINTWISE_SUB, dp, dsum, dd);
    pw2(g, CUDNN_POINTWISE_MUL, dd, p, dpp);
    pw2(g, CUDNN_POINTWISE_MUL, dpp, scale, ds);

    /* dk = ds^T q; dq = ds k (k: the transposed view of kt) */
    matmul_kv(g, a, transposed(g, a, ds), q, dk);
    cudnnBackendDescriptor_t k = virt(g, CUDNN_DATA_BFLOAT16, kv_view(a));
    reshape(g, kt, k);
    matmul(g, ds, k, dq);
}

/* -- Plans ------------------------------------------------------------------------------------- */

static const char *ordinal(int i)
{
    static const char *const name[] = { "first", "second", "third", "fourth", "fifth" };
    return i < 5 ? name[i] : "sixth or later";
}

/* The graph's first engine configuration, by cuDNN's heuristic (mode A), that is deterministic,
** finalises into a plan and fits the workspace; NULL where none does. g->why says which (the
** engine) or why not. */
static cudnnBackendDescriptor_t g_plan(dnn_graph *g)
{
    cudnnBackendDescriptor_t og = g_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g_set(g, og, ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    g_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    g_fin(g, og, "the operation graph");
    cudnnBackendDescriptor_t heur = g_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    g_desc(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og);
    g_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    g_fin(g, heur, "the engine heuristic");
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;

    enum { MAX_CFGS = 16 };
    cudnnBackendDescriptor_t cfg[MAX_CFGS];
    int64_t n = 0;
    for (int i = 0; i < MAX_CFGS; i++) cfg[i] = g_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    cudnnStatus_t st = dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CFGS,
                                                    &n, cfg);
    if (st != CUDNN_STATUS_SUCCESS) {
        g_fail(g, st, "the heuristic's results");
        return NULL;
    }
    int nondet = 0, toobig = 0, refused = 0;
    int64_t need = 0;                   /* the least workspace of the plans too big for it */
    char last[320] = "";
    for (int i = 0; i < n && i < MAX_CFGS; i++) {
        cudnnBackendDescriptor_t eng = g_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        cudnnBackendNumericalNote_t note[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t one = 0, nn = 0, workspace = 0;
        if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
        if (dnn.cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one, &eng) ||
            dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                         CUDNN_TYPE_NUMERICAL_NOTE,
                                         CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, note))
            continue;
        bool det = true;
        for (int j = 0; j < nn && j < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; j++)
            if (note[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) det = false;
        if (!det) {
            nondet++;
            continue;
        }
        cudnnBackendDescriptor_t plan = g_new(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        g_set(g, plan, ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        g_desc(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg[i]);
        g_fin(g, plan, "an execution plan");
        if (g->st == CUDNN_STATUS_SUCCESS) {
            cudnnStatus_t wst = dnn.cudnnBackendGetAttribute(
                plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &one,
                &workspace);
            if (wst != CUDNN_STATUS_SUCCESS) g_fail(g, wst, "the plan's workspace size");
            else if ((size_t)workspace <= ws_bytes) {
                int64_t id = -1;
                dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                             CUDNN_TYPE_INT64, 1, &one, &id);
                snprintf(g->why, sizeof g->why, "engine %lld (the %s of %d proposed), %lld "
                         "bytes of workspace", (long long)id, ordinal(i), (int)n,
                         (long long)workspace);
                return plan;
            }
            else {
                if (!need || workspace < need) need = workspace;
                toobig++;
                continue;
            }
        }
        refused++;
        memcpy(last, g->why, sizeof last);
        g->st = CUDNN_STATUS_SUCCESS;                      /* the next configuration */
    }
    char big[96] = "";
    if (need) snprintf(big, sizeof big, " (%lld bytes at least)", (long long)need);
    snprintf(g->why, sizeof g->why, "of the %d engine configurations cuDNN proposed, %d %s "
             "nondeterministic, %d need%s more workspace than the memory plan's %zu bytes%s, "
             "%d did not finalise%s%s", (int)n, nondet, nondet == 1 ? "is" : "are", toobig,
             toobig == 1 ? "s" : "", ws_bytes, big, refused, *last ? "; the last: " : "", last);
    g->st = CUDNN_STATUS_NOT_SUPPORTED;
    return NULL;
}

/* Plans by shape and pass, built at the first call of each (a refused one is remembered) */
#define PLANS 16
struct dnn_plan {
    int bwd;
    att_shape a;
    cudnnBackendDescriptor_t plan;           /* NULL: refused */
};
static dnn_plan plans[PLANS];
static int nplans;

static bool same(att_shape x, att_shape y)
{
    return x.B == y.B && x.T == y.T && x.H == y.H && x.KV == y.KV && x.hd == y.hd;
}

static const dnn_plan *plan_for(int bwd, att_shape a)
{
    for (int i = 0; i < nplans; i++)
        if (plans[i].bwd == bwd && same(plans[i].a, a)) return &plans[i];
    if (nplans == PLANS) {                  /* more shapes than kept: the own kernels */
        static int told;
        RT_CHECK(attn_mode() != MODE_CUDNN, "ATTN=cudnn: more than %d attention shapes", PLANS);
        if (!told++) rt_log("cuDNN's attention keeps the plans of %d shapes: the library's "
                            "kernels run the others", PLANS);
        return NULL;
    }
    dnn_plan *p = &plans[nplans++];
    dnn_graph *g = (dnn_graph *)calloc(1, sizeof *g);
    RT_CHECK(g, "attn_cudnn: out of host memory");
    g->next_uid = UID_VIRTUAL;
    p->bwd = bwd;
    p->a = a;
    if (bwd) graph_bwd(g, a);
    else graph_fwd(g, a);
    p->plan = g->st == CUDNN_STATUS_SUCCESS ? g_plan(g) : NULL;
    char what[128];
    snprintf(what, sizeof what, "attention %s of B %lld, T %lld, %lld heads (%lld kv), head "
             "size %lld", bwd ? "backward" : "forward", (long long)a.B, (long long)a.T,
             (long long)a.H, (long long)a.KV, (long long)a.hd);
    if (p->plan && attn_mode() == MODE_CUDNN)   /* a measurement: which engine ran */
        rt_log("cuDNN %s: %s", what, g->why);
    if (!p->plan) {
        RT_CHECK(attn_mode() != MODE_CUDNN, "ATTN=cudnn: cuDNN refuses the %s: %s", what, g->why);
        rt_log("cuDNN refuses the %s (%s): the library's kernels run it", what, g->why);
        g_free(g);
    }
    /* a plan keeps its graph's descriptors: they live as long as the program */
    free(g);
    return p;
}

/* -- The calls --------------------------------------------------------------------------------- */

/* May cuDNN run this call? Loads the library at the first call of a shape it could run. */
static bool usable(const void *const *ptrs, int n)
{
    if (attn_mode() == MODE_OWN) return false;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] % 16) {               /* the tensors' stated byte alignment */
            static int told;
            RT_CHECK(attn_mode() != MODE_CUDNN, "ATTN=cudnn: an attention operand at %p is not "
                     "16-byte aligned", ptrs[i]);
            if (!told++) rt_log("an attention operand at %p is not 16-byte aligned: the "
                                "library's kernels run such calls", ptrs[i]);
            return false;
        }
    if (!dnn_load()) {
        RT_CHECK(attn_mode() != MODE_CUDNN, "ATTN=cudnn: %s", load_why);
        static int told;
        if (!told++) rt_log("cuDNN's attention is not available (%s): the library's kernels "
                            "run attention", load_why);
        return false;
    }
    return true;
}

static void execute(const dnn_plan *p, const int64_t *uids, void **ptrs, int n)
{
    dnn_graph g = {};
    cudnnBackendDescriptor_t vp = g_new(&g, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    g_set(&g, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    g_set(&g, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    g_set(&g, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    g_fin(&g, vp, "the variant pack");
    if (g.st == CUDNN_STATUS_SUCCESS) {
        cudnnStatus_t st = dnn.cudnnBackendExecute(handle, p->plan, vp);
        if (st != CUDNN_STATUS_SUCCESS) g_fail(&g, st, "cudnnBackendExecute");
    }
    RT_CHECK(g.st == CUDNN_STATUS_SUCCESS, "cuDNN attention %s: %s",
             p->bwd ? "backward" : "forward", g.why);
    g_free(&g);
}

/* the by-value scalars, aligned as their tensors state (16 bytes) */
alignas(16) static const float NEG_INF = -INFINITY;
alignas(16) static const float ONE = 1.0f;

static att_shape shape_of(int B, int T, int Hl, int KVl, int hd)
{
    att_shape a = { B, T, Hl, KVl, hd };
    return a;
}

int cudnn_attention_fwd(void *out, float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                        int hd, float scale)
{
    const char *base = (const char *)qkv;
    const void *k = base + (size_t)Hl * hd * 2, *v = base + (size_t)(Hl + KVl) * hd * 2;
    const void *ptrs[] = { qkv, k, v, out, lse };
    if (!usable(ptrs, 5)) return 0;
    const dnn_plan *p = plan_for(0, shape_of(B, T, Hl, KVl, hd));
    if (!p || !p->plan) return 0;
    alignas(16) float sc = scale;
    int64_t uids[] = { UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF };
    void *bind[] = { (void *)qkv, (void *)k, (void *)v, out, lse, &sc, (void *)&NEG_INF };
    execute(p, uids, bind, 7);
    return 1;
}

int cudnn_attention_bwd(void *dqkv, float *dsum, const void *dout, const void *out,
                        const float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                        int hd, float scale)
{
    size_t ko = (size_t)Hl * hd * 2, vo = (size_t)(Hl + KVl) * hd * 2;
    const char *base = (const char *)qkv;
    char *dbase = (char *)dqkv;
    const void *ptrs[] = { qkv, base + ko, base + vo, out, dout, lse, dsum, dqkv, dbase + ko,
                           dbase + vo };
    if (!usable(ptrs, 10)) return 0;
    const dnn_plan *p = plan_for(1, shape_of(B, T, Hl, KVl, hd));
    if (!p || !p->plan) return 0;
    alignas(16) float sc = scale;
    int64_t uids[] = { UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DSUM, UID_DQ,
                       UID_DK, UID_DV, UID_SCALE, UID_NEG_INF, UID_ONE };
    void *bind[] = { (void *)qkv, (void *)(base + ko), (void *)(base + vo), (void *)out,
                     (void *)dout, (void *)lse, dsum, dqkv, dbase + ko, dbase + vo, &sc,
                     (void *)&NEG_INF, (void *)&ONE };
    execute(p, uids, bind, 13);
    return 1;
}
