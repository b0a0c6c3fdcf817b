/*
** tests/kernels/emu/cudnn_emu.cc: cuDNN's backend API (cudnn.h here) emulated for the CPU: the
** descriptors, their attributes and finalisation, operation graphs, the engine heuristic,
** execution plans, variant packs and execution. Written from cuDNN's documentation of each
** descriptor and operation, without reference to lib/attn_cudnn.cu's graphs: an operation graph
** is interpreted op by op, so whatever graph a caller builds is computed as cuDNN defines it.
**
** Tensors are 4-d (dims and strides; a scalar by value may have fewer, the missing leading dims
** 1); virtual ones live in f32 buffers here, each element
** rounded to the tensor's data type when written (bf16: to nearest even), addressed by their
** strides. Operations: pointwise ADD, MUL, SUB, DIV, EXP, LOG, IDENTITY, CMP_GE, GEN_INDEX (the
** index along AXIS), BINARY_SELECT (y = t ? x : b), the inputs broadcast where a dim is 1;
** MATMUL (c = a b over the last two dims, in f32, the batch dims of a and b equal to c's or
** dividing them: index i of c reads i / (c's / theirs), a kv head serving its group of query
** heads); REDUCTION ADD and MAX onto dims that are 1 or divide the input's (groups of adjacent
** indices); RESHAPE (y: the memory of x under y's dims and strides; its offsets within x's).
**
** Refused with CUDNN_STATUS_BAD_PARAM (and a message for cudnnGetLastErrorString): an attribute
** of the wrong type or count or on the wrong descriptor, a change after finalisation, a missing
** required attribute, shapes that do not match, a descriptor not finalised where one is needed,
** a graph where a virtual tensor is produced twice, never or not consumed, or with a cycle; a
** variant pack without a pointer for a non-virtual tensor, or a pointer aligned less than the
** tensor's BYTE_ALIGNMENT; no workspace where the plan needs one. The heuristic proposes two
** engines: engine 0 carries the NONDETERMINISTIC note (its matmuls start each sum at a k that
** changes from one execution to the next, as atomics would reorder them), engine 1 does not.
*/
#include "cudnn.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <vector>

static char last_error[256];

static cudnnStatus_t refuse(cudnnStatus_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}
#define BAD(...) refuse(CUDNN_STATUS_BAD_PARAM, __VA_ARGS__)

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char *cudnnGetErrorString(cudnnStatus_t st)
{
    switch (st) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    default: return "CUDNN_STATUS (emulated: other)";
    }
}

void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (!max_size) return;
    snprintf(message, max_size, "%s", last_error);
    last_error[0] = 0;
}

struct cudnnContext { int live; };
cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    *h = new cudnnContext{ 1 };
    return CUDNN_STATUS_SUCCESS;
}

/* -- Descriptors ------------------------------------------------------------------------------- */

struct value { cudnnBackendAttributeType_t type; std::vector<unsigned char> bytes; int64_t n; };

struct emu_desc {
    cudnnBackendDescriptorType_t kind;
    bool final;
    std::map<int, value> attrs;
    /* tensors, once finalised */
    cudnnDataType_t dt;
    int64_t dim[4], str[4], uid, align;
    bool virt, byval;
    /* operation graphs: ops in an order that computes each input before its use */
    std::vector<emu_desc *> order;
    /* engine configurations and engines: which engine, on which graph */
    int engine;
    emu_desc *graph;
};

/* The attributes each descriptor takes: type, and whether finalisation requires it */
struct rule { cudnnBackendDescriptorType_t kind; int attr; cudnnBackendAttributeType_t type;
              int64_t nmin, nmax; bool required; };
#define R(kind, attr, type, nmin, nmax, required)                                           \
    { CUDNN_BACKEND_##kind##_DESCRIPTOR, CUDNN_ATTR_##attr, CUDNN_TYPE_##type, nmin, nmax,  \
      required }
static const rule RULES[] = {
    R(TENSOR, TENSOR_DATA_TYPE, DATA_TYPE, 1, 1, 1),
    R(TENSOR, TENSOR_DIMENSIONS, INT64, 1, 4, 1),
    R(TENSOR, TENSOR_STRIDES, INT64, 1, 4, 1),
    R(TENSOR, TENSOR_UNIQUE_ID, INT64, 1, 1, 1),
    R(TENSOR, TENSOR_BYTE_ALIGNMENT, INT64, 1, 1, 1),
    R(TENSOR, TENSOR_IS_VIRTUAL, BOOLEAN, 1, 1, 0),
    R(TENSOR, TENSOR_IS_BY_VALUE, BOOLEAN, 1, 1, 0),
    R(POINTWISE, POINTWISE_MODE, POINTWISE_MODE, 1, 1, 1),
    R(POINTWISE, POINTWISE_MATH_PREC, DATA_TYPE, 1, 1, 1),
    R(POINTWISE, POINTWISE_AXIS, INT64, 1, 1, 0),
    R(OPERATION_POINTWISE, OPERATION_POINTWISE_PW_DESCRIPTOR, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_POINTWISE, OPERATION_POINTWISE_XDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_POINTWISE, OPERATION_POINTWISE_YDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_POINTWISE, OPERATION_POINTWISE_BDESC, BACKEND_DESCRIPTOR, 1, 1, 0),
    R(OPERATION_POINTWISE, OPERATION_POINTWISE_TDESC, BACKEND_DESCRIPTOR, 1, 1, 0),
    R(OPERATION_POINTWISE, OPERATION_POINTWISE_ALPHA1, FLOAT, 1, 1, 0),
    R(OPERATION_POINTWISE, OPERATION_POINTWISE_ALPHA2, FLOAT, 1, 1, 0),
    R(MATMUL, MATMUL_COMP_TYPE, DATA_TYPE, 1, 1, 1),
    R(OPERATION_MATMUL, OPERATION_MATMUL_ADESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_MATMUL, OPERATION_MATMUL_BDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_MATMUL, OPERATION_MATMUL_CDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_MATMUL, OPERATION_MATMUL_DESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(REDUCTION, REDUCTION_OPERATOR, REDUCTION_OPERATOR_TYPE, 1, 1, 1),
    R(REDUCTION, REDUCTION_COMP_TYPE, DATA_TYPE, 1, 1, 1),
    R(OPERATION_REDUCTION, OPERATION_REDUCTION_XDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_REDUCTION, OPERATION_REDUCTION_YDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_REDUCTION, OPERATION_REDUCTION_DESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_RESHAPE, OPERATION_RESHAPE_XDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATION_RESHAPE, OPERATION_RESHAPE_YDESC, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(OPERATIONGRAPH, OPERATIONGRAPH_HANDLE, HANDLE, 1, 1, 1),
    R(OPERATIONGRAPH, OPERATIONGRAPH_OPS, BACKEND_DESCRIPTOR, 1, 1 << 20, 1),
    R(ENGINEHEUR, ENGINEHEUR_OPERATION_GRAPH, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(ENGINEHEUR, ENGINEHEUR_MODE, HEUR_MODE, 1, 1, 1),
    R(EXECUTION_PLAN, EXECUTION_PLAN_HANDLE, HANDLE, 1, 1, 1),
    R(EXECUTION_PLAN, EXECUTION_PLAN_ENGINE_CONFIG, BACKEND_DESCRIPTOR, 1, 1, 1),
    R(VARIANT_PACK, VARIANT_PACK_UNIQUE_IDS, INT64, 0, 1 << 20, 1),
    R(VARIANT_PACK, VARIANT_PACK_DATA_POINTERS, VOID_PTR, 0, 1 << 20, 1),
    R(VARIANT_PACK, VARIANT_PACK_WORKSPACE, VOID_PTR, 1, 1, 1),
};
#undef R

static size_t type_size(cudnnBackendAttributeType_t t)
{
    switch (t) {
    case CUDNN_TYPE_HANDLE: case CUDNN_TYPE_VOID_PTR: case CUDNN_TYPE_BACKEND_DESCRIPTOR:
        return sizeof(void *);
    case CUDNN_TYPE_INT64: return 8;
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_FLOAT: return 4;
    default: return 4;                  /* the enums */
    }
}

static const rule *rule_for(cudnnBackendDescriptorType_t k, int attr)
{
    for (const rule &r : RULES)
        if (r.kind == k && r.attr == attr) return &r;
    return NULL;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t *d)
{
    emu_desc *e = new emu_desc();
    e->kind = type;
    *d = e;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d)
{
    delete (emu_desc *)d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t n,
                                       const void *v)
{
    emu_desc *e = (emu_desc *)d;
    if (!e) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "no descriptor");
    if (e->final) return BAD("attribute %d set on a finalised descriptor", (int)name);
    const rule *r = rule_for(e->kind, name);
    if (!r) return BAD("descriptor kind %d has no attribute %d", (int)e->kind, (int)name);
    if (r->type != type) return BAD("attribute %d: type %d, not %d", (int)name, (int)type,
                                    (int)r->type);
    if (n < r->nmin || n > r->nmax) return BAD("attribute %d: %lld elements", (int)name,
                                               (long long)n);
    if (n && !v) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "attribute %d: NULL",
                               (int)name);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < n; i++) {
            emu_desc *x = ((emu_desc *const *)v)[i];
            if (!x || !x->final)
                return refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                              "attribute %d: descriptor %lld not finalised", (int)name,
                              (long long)i);
        }
    value &val = e->attrs[name];
    val.type = type;
    val.n = n;
    val.bytes.assign((const unsigned char *)v, (const unsigned char *)v + n * type_size(type));
    return CUDNN_STATUS_SUCCESS;
}

static const value *get(const emu_desc *e, int attr)
{
    auto it = e->attrs.find(attr);
    return it == e->attrs.end() ? NULL : &it->second;
}

static int64_t i64(const emu_desc *e, int attr, int64_t i = 0)
{
    int64_t x;
    memcpy(&x, get(e, attr)->bytes.data() + 8 * i, 8);
    return x;
}

static int enum32(const emu_desc *e, int attr)
{
    int x;
    memcpy(&x, get(e, attr)->bytes.data(), 4);
    return x;
}

static bool flag(const emu_desc *e, int attr)
{
    const value *v = get(e, attr);
    return v && v->bytes[0];
}

static emu_desc *sub(const emu_desc *e, int attr, int64_t i = 0)
{
    const value *v = get(e, attr);
    if (!v) return NULL;
    emu_desc *x;
    memcpy(&x, v->bytes.data() + sizeof x * i, sizeof x);
    return x;
}

/* -- Finalisation: what each kind requires ----------------------------------------------------- */

static bool is_tensor(const emu_desc *t)
{
    return t && t->kind == CUDNN_BACKEND_TENSOR_DESCRIPTOR;
}

static cudnnStatus_t final_tensor(emu_desc *t)
{
    t->dt = (cudnnDataType_t)enum32(t, CUDNN_ATTR_TENSOR_DATA_TYPE);
    if (t->dt != CUDNN_DATA_FLOAT && t->dt != CUDNN_DATA_BFLOAT16 && t->dt != CUDNN_DATA_INT32 &&
        t->dt != CUDNN_DATA_BOOLEAN)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "tensor data type %d", (int)t->dt);
    /* fewer than 4 dims: the missing leading ones are 1 (a scalar's one dim broadcasts) */
    int64_t nd = get(t, CUDNN_ATTR_TENSOR_DIMENSIONS)->n;
    if (get(t, CUDNN_ATTR_TENSOR_STRIDES)->n != nd)
        return BAD("tensor: %lld dims, %lld strides", (long long)nd,
                   (long long)get(t, CUDNN_ATTR_TENSOR_STRIDES)->n);
    for (int i = 0; i < 4; i++) {
        int64_t k = i - (4 - nd);
        t->dim[i] = k < 0 ? 1 : i64(t, CUDNN_ATTR_TENSOR_DIMENSIONS, k);
        t->str[i] = k < 0 ? 1 : i64(t, CUDNN_ATTR_TENSOR_STRIDES, k);
        if (t->dim[i] < 1 || t->str[i] < 1) return BAD("tensor dim %d: %lld stride %lld", i,
                                                       (long long)t->dim[i],
                                                       (long long)t->str[i]);
    }

    t->uid = i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID);
    t->align = i64(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
    t->virt = flag(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
    t->byval = flag(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
    if (t->align < 1) return BAD("tensor %lld: byte alignment %lld", (long long)t->uid,
                                 (long long)t->align);
    if (t->virt && t->byval) return BAD("tensor %lld: virtual and by value", (long long)t->uid);
    if (nd < 4 && !t->byval)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "tensor %lld: %lld dims (the emulation: 4, or "
                      "a scalar by value)", (long long)t->uid, (long long)nd);
    if (t->byval && t->dim[0] * t->dim[1] * t->dim[2] * t->dim[3] != 1)
        return BAD("tensor %lld: by value but not a scalar", (long long)t->uid);
    return CUDNN_STATUS_SUCCESS;
}

static int64_t span(const emu_desc *t)          /* elements from the first to the last, + 1 */
{
    int64_t s = 1;
    for (int i = 0; i < 4; i++) s += (t->dim[i] - 1) * t->str[i];
    return s;
}

static bool binary_mode(int m)
{
    return m == CUDNN_POINTWISE_ADD || m == CUDNN_POINTWISE_MUL || m == CUDNN_POINTWISE_SUB ||
           m == CUDNN_POINTWISE_DIV || m == CUDNN_POINTWISE_CMP_GE ||
           m == CUDNN_POINTWISE_BINARY_SELECT;
}

static bool unary_mode(int m)
{
    return m == CUDNN_POINTWISE_EXP || m == CUDNN_POINTWISE_LOG ||
           m == CUDNN_POINTWISE_IDENTITY || m == CUDNN_POINTWISE_GEN_INDEX;
}

static cudnnStatus_t final_pointwise_op(emu_desc *op)
{
    emu_desc *pd = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
    emu_desc *x = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
    emu_desc *y = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    emu_desc *b = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
    emu_desc *t = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
    if (pd->kind != CUDNN_BACKEND_POINTWISE_DESCRIPTOR || !is_tensor(x) || !is_tensor(y) ||
        (b && !is_tensor(b)) || (t && !is_tensor(t)))
        return BAD("pointwise operation: a descriptor of the wrong kind");
    int m = enum32(pd, CUDNN_ATTR_POINTWISE_MODE);
    if (!binary_mode(m) && !unary_mode(m))
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "pointwise mode %d", m);
    if (binary_mode(m) != (b != NULL)) return BAD("pointwise mode %d: b %s", m,
                                                  b ? "given" : "missing");
    if ((m == CUDNN_POINTWISE_BINARY_SELECT) != (t != NULL))
        return BAD("pointwise mode %d: t %s", m, t ? "given" : "missing");
    if (m == CUDNN_POINTWISE_GEN_INDEX) {
        if (!get(pd, CUDNN_ATTR_POINTWISE_AXIS)) return BAD("GEN_INDEX without an axis");
        int64_t axis = i64(pd, CUDNN_ATTR_POINTWISE_AXIS);
        if (axis < 0 || axis > 3) return BAD("GEN_INDEX axis %lld", (long long)axis);
    }
    if (y->byval) return BAD("pointwise output %lld by value", (long long)y->uid);
    const emu_desc *in[3] = { x, b, t };
    for (const emu_desc *i : in)
        for (int d = 0; i && d < 4; d++)
            if (i->dim[d] != y->dim[d] && i->dim[d] != 1)
                return BAD("pointwise mode %d: input %lld dim %d is %lld, output's %lld", m,
                           (long long)i->uid, d, (long long)i->dim[d], (long long)y->dim[d]);
    return CUDNN_STATUS_SUCCESS;
}

static bool batch_ok(int64_t in, int64_t out) { return in == out || (in < out && out % in == 0); }

static cudnnStatus_t final_matmul_op(emu_desc *op)
{
    emu_desc *a = sub(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
    emu_desc *b = sub(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
    emu_desc *c = sub(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
    emu_desc *m = sub(op, CUDNN_ATTR_OPERATION_MATMUL_DESC);
    if (!is_tensor(a) || !is_tensor(b) || !is_tensor(c) ||
        m->kind != CUDNN_BACKEND_MATMUL_DESCRIPTOR)
        return BAD("matmul operation: a descriptor of the wrong kind");
    if (a->dim[2] != c->dim[2] || b->dim[3] != c->dim[3] || a->dim[3] != b->dim[2])
        return BAD("matmul %lld x %lld -> %lld: (%lld x %lld) (%lld x %lld) -> (%lld x %lld)",
                   (long long)a->uid, (long long)b->uid, (long long)c->uid,
                   (long long)a->dim[2], (long long)a->dim[3], (long long)b->dim[2],
                   (long long)b->dim[3], (long long)c->dim[2], (long long)c->dim[3]);
    for (int d = 0; d < 2; d++)
        if (!batch_ok(a->dim[d], c->dim[d]) || !batch_ok(b->dim[d], c->dim[d]))
            return BAD("matmul batch dim %d: %lld, %lld -> %lld", d, (long long)a->dim[d],
                       (long long)b->dim[d], (long long)c->dim[d]);
    if (c->virt && c->dt == CUDNN_DATA_BOOLEAN) return BAD("matmul into booleans");
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t final_reduction_op(emu_desc *op)
{
    emu_desc *x = sub(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
    emu_desc *y = sub(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
    emu_desc *r = sub(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
    if (!is_tensor(x) || !is_tensor(y) || r->kind != CUDNN_BACKEND_REDUCTION_DESCRIPTOR)
        return BAD("reduction operation: a descriptor of the wrong kind");
    int o = enum32(r, CUDNN_ATTR_REDUCTION_OPERATOR);
    if (o != CUDNN_REDUCE_TENSOR_ADD && o != CUDNN_REDUCE_TENSOR_MAX)
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "reduction operator %d", o);
    for (int d = 0; d < 4; d++)
        if (!batch_ok(y->dim[d], x->dim[d]))
            return BAD("reduction dim %d: %lld onto %lld", d, (long long)x->dim[d],
                       (long long)y->dim[d]);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t final_reshape_op(emu_desc *op)
{
    emu_desc *x = sub(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
    emu_desc *y = sub(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
    if (!is_tensor(x) || !is_tensor(y)) return BAD("reshape: not tensors");
    if (x->dim[0] * x->dim[1] * x->dim[2] * x->dim[3] !=
        y->dim[0] * y->dim[1] * y->dim[2] * y->dim[3])
        return BAD("reshape %lld -> %lld: element counts differ", (long long)x->uid,
                   (long long)y->uid);
    if (span(y) > span(x)) return BAD("reshape %lld -> %lld: y reaches past x's memory",
                                      (long long)x->uid, (long long)y->uid);
    return CUDNN_STATUS_SUCCESS;
}

/* The inputs and outputs of an operation */
static void op_tensors(const emu_desc *op, std::vector<emu_desc *> &in,
                       std::vector<emu_desc *> &out)
{
    in.clear();
    out.clear();
    switch (op->kind) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        in.push_back(sub(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC));
        if (sub(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC))
            in.push_back(sub(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC));
        if (sub(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC))
            in.push_back(sub(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC));
        out.push_back(sub(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC));
        break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        in.push_back(sub(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC));
        in.push_back(sub(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC));
        out.push_back(sub(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC));
        break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        in.push_back(sub(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC));
        out.push_back(sub(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC));
        break;
    default:
        in.push_back(sub(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC));
        out.push_back(sub(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
        break;
    }
}

static bool is_op(const emu_desc *d)
{
    return d->kind == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ||
           d->kind == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
           d->kind == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ||
           d->kind == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

/* Every tensor id names one tensor; every virtual tensor is produced once and consumed; no
** tensor is produced twice; an order exists (no cycle). */
static cudnnStatus_t final_graph(emu_desc *g)
{
    const value *v = get(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    std::vector<emu_desc *> ops, in, out;
    for (int64_t i = 0; i < v->n; i++) {
        ops.push_back(sub(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, i));
        if (!is_op(ops.back())) return BAD("graph: element %lld is not an operation",
                                           (long long)i);
    }
    std::map<int64_t, emu_desc *> by_uid;
    std::map<emu_desc *, int> produced, consumed;
    for (emu_desc *op : ops) {
        op_tensors(op, in, out);
        std::vector<emu_desc *> all(in);
        all.insert(all.end(), out.begin(), out.end());
        for (emu_desc *t : all) {
            auto it = by_uid.find(t->uid);
            if (it != by_uid.end() && it->second != t)
                return BAD("graph: two tensors with id %lld", (long long)t->uid);
            by_uid[t->uid] = t;
        }
        for (emu_desc *t : in) consumed[t]++;
        for (emu_desc *t : out)
            if (produced[t]++) return BAD("graph: tensor %lld produced twice", (long long)t->uid);
    }
    for (auto &kv : by_uid) {
        emu_desc *t = kv.second;
        if (t->virt && !produced[t])
            return BAD("graph: virtual tensor %lld is never produced", (long long)t->uid);
        if (t->virt && !consumed[t])
            return BAD("graph: virtual tensor %lld is never used", (long long)t->uid);
        if (t->byval && produced[t])
            return BAD("graph: by-value tensor %lld is an output", (long long)t->uid);
    }
    /* the order: an op runs once every tensor it reads that some op produces is done */
    std::map<emu_desc *, bool> done;
    std::vector<bool> ran(ops.size());
    g->order.clear();
    for (size_t pass = 0; pass < ops.size(); pass++)
        for (size_t i = 0; i < ops.size(); i++) {
            if (ran[i]) continue;
            op_tensors(ops[i], in, out);
            bool ready = true;
            for (emu_desc *t : in)
                if (produced[t] && !done[t]) ready = false;
            if (!ready) continue;
            ran[i] = true;
            g->order.push_back(ops[i]);
            for (emu_desc *t : out) done[t] = true;
        }
    if (g->order.size() != ops.size()) return BAD("graph: a cycle");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d)
{
    emu_desc *e = (emu_desc *)d;
    if (e->final) return BAD("finalised twice");
    for (const rule &r : RULES)
        if (r.kind == e->kind && r.required && !get(e, r.attr))
            return BAD("descriptor kind %d: attribute %d missing", (int)e->kind, r.attr);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (e->kind) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: st = final_tensor(e); break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: st = final_pointwise_op(e); break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: st = final_matmul_op(e); break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: st = final_reduction_op(e); break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: st = final_reshape_op(e); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: st = final_graph(e); break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
        int m = enum32(e, CUDNN_ATTR_POINTWISE_MODE);
        if (m == CUDNN_POINTWISE_GEN_INDEX && !get(e, CUDNN_ATTR_POINTWISE_AXIS))
            st = BAD("GEN_INDEX without an axis");
        break;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        if (sub(e, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)->kind !=
            CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
            st = BAD("heuristic: not an operation graph");
        break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        emu_desc *cfg = sub(e, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        if (cfg->kind != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) st = BAD("plan: not an engine config");
        else {
            e->engine = cfg->engine;
            e->graph = cfg->graph;
        }
        break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        if (get(e, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->n !=
            get(e, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->n)
            st = BAD("variant pack: %lld ids, %lld pointers",
                     (long long)get(e, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->n,
                     (long long)get(e, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->n);
        break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        break;
    default:
        st = refuse(CUDNN_STATUS_NOT_SUPPORTED, "descriptor kind %d is finalised by cuDNN",
                    (int)e->kind);
    }
    if (st == CUDNN_STATUS_SUCCESS) e->final = true;
    return st;
}

/* -- Heuristic, engines, plans ----------------------------------------------------------------- */

enum { ENGINES = 2, ENGINE_NONDET = 0 };

/* A plan's workspace: a float per row of the graph's largest tensor (the emulation writes it),
** or CUDNN_EMU_WORKSPACE bytes (the environment: a test's plans too big for their caller) */
static int64_t plan_workspace(const emu_desc *g)
{
    const char *e = getenv("CUDNN_EMU_WORKSPACE");
    if (e && *e) return atoll(e);
    int64_t w = 0;
    std::vector<emu_desc *> in, out;
    for (const emu_desc *op : g->order) {
        op_tensors(op, in, out);
        for (const emu_desc *t : out) w = std::max(w, t->dim[0] * t->dim[1] * t->dim[2] * 4);
    }
    return w;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t *count, void *elements)
{
    emu_desc *e = (emu_desc *)d;
    if (!e->final && e->kind != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR &&
        e->kind != CUDNN_BACKEND_ENGINE_DESCRIPTOR)
        return refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "get %d: not finalised", (int)name);
    if (e->kind == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return BAD("heuristic results: type");
        int64_t n = std::min<int64_t>(requested, ENGINES);
        for (int64_t i = 0; i < n; i++) {
            emu_desc *c = ((emu_desc **)elements)[i];
            if (!c || c->kind != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
                return BAD("heuristic results: element %lld is no engine config", (long long)i);
            c->engine = (int)i;
            c->graph = sub(e, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
            c->final = true;
        }
        *count = requested ? n : (int64_t)ENGINES;
        return CUDNN_STATUS_SUCCESS;
    }
    if (e->kind == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && name == CUDNN_ATTR_ENGINECFG_ENGINE) {
        emu_desc *eng = *(emu_desc **)elements;
        if (!e->final || type != CUDNN_TYPE_BACKEND_DESCRIPTOR || requested != 1 || !eng ||
            eng->kind != CUDNN_BACKEND_ENGINE_DESCRIPTOR)
            return BAD("engine config's engine: wrong request");
        eng->engine = e->engine;
        eng->graph = e->graph;
        eng->final = true;
        *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (e->kind == CUDNN_BACKEND_ENGINE_DESCRIPTOR && name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
        if (!e->final || type != CUDNN_TYPE_NUMERICAL_NOTE) return BAD("engine notes: type");
        cudnnBackendNumericalNote_t notes[2] = { CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
                                                 CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC };
        int64_t n = std::min<int64_t>(requested, e->engine == ENGINE_NONDET ? 2 : 1);
        memcpy(elements, notes, n * sizeof notes[0]);
        *count = n;
        return CUDNN_STATUS_SUCCESS;
    }
    if (e->kind == CUDNN_BACKEND_ENGINE_DESCRIPTOR && name == CUDNN_ATTR_ENGINE_GLOBAL_INDEX) {
        if (!e->final || type != CUDNN_TYPE_INT64 || requested < 1)
            return BAD("engine index: type");
        *(int64_t *)elements = e->engine;
        *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (e->kind == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
        name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        if (type != CUDNN_TYPE_INT64 || requested < 1) return BAD("workspace size: type");
        *(int64_t *)elements = plan_workspace(e->graph);
        *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "get attribute %d of kind %d: not emulated",
                  (int)name, (int)e->kind);
}

/* -- Execution --------------------------------------------------------------------------------- */

/* A tensor's elements: a virtual one's f32 buffer, or the caller's memory */
struct store {
    const emu_desc *t;
    float *buf;            /* virtual */
    void *mem;             /* otherwise */
};

static float to_dtype(float v, cudnnDataType_t dt)
{
    switch (dt) {
    case CUDNN_DATA_BFLOAT16: return __bfloat162float(__float2bfloat16_rn(v));
    case CUDNN_DATA_INT32: return (float)(int32_t)v;
    case CUDNN_DATA_BOOLEAN: return v != 0.0f;
    default: return v;
    }
}

static float load(const store &s, int64_t off)
{
    if (s.buf) return s.buf[off];
    switch (s.t->dt) {
    case CUDNN_DATA_BFLOAT16: {
        __nv_bfloat16 b;
        b.bits = ((const uint16_t *)s.mem)[off];
        return __bfloat162float(b);
    }
    case CUDNN_DATA_INT32: return (float)((const int32_t *)s.mem)[off];
    case CUDNN_DATA_BOOLEAN: return ((const bool *)s.mem)[off];
    default: return ((const float *)s.mem)[off];
    }
}

static void put(store &s, int64_t off, float v)
{
    if (s.buf) {
        s.buf[off] = to_dtype(v, s.t->dt);
        return;
    }
    switch (s.t->dt) {
    case CUDNN_DATA_BFLOAT16: ((uint16_t *)s.mem)[off] = __float2bfloat16_rn(v).bits; break;
    case CUDNN_DATA_INT32: ((int32_t *)s.mem)[off] = (int32_t)v; break;
    case CUDNN_DATA_BOOLEAN: ((bool *)s.mem)[off] = v != 0.0f; break;
    default: ((float *)s.mem)[off] = v;
    }
}

static int64_t offset(const emu_desc *t, const int64_t i[4])
{
    int64_t o = 0;
    for (int d = 0; d < 4; d++) o += i[d] * t->str[d];
    return o;
}

/* The offset in t of output index i: broadcast dims (1) read index 0; a dim that divides the
** output's reads i / (out / its) */
static int64_t offset_from(const emu_desc *t, const emu_desc *y, const int64_t i[4])
{
    int64_t j[4];
    for (int d = 0; d < 4; d++)
        j[d] = t->dim[d] == y->dim[d] ? i[d] : i[d] / (y->dim[d] / t->dim[d]);
    return offset(t, j);
}

#define FOR4(t, i)                                                                            \
    for (i[0] = 0; i[0] < (t)->dim[0]; i[0]++)                                                \
        for (i[1] = 0; i[1] < (t)->dim[1]; i[1]++)                                            \
            for (i[2] = 0; i[2] < (t)->dim[2]; i[2]++)                                        \
                for (i[3] = 0; i[3] < (t)->dim[3]; i[3]++)

static unsigned executions;                  /* engine 0's changing order */

/* A broadcast input's strides against output y: 0 along the dims where it has 1 */
static void bstrides(const emu_desc *t, const emu_desc *y, int64_t s[4])
{
    for (int d = 0; d < 4; d++) s[d] = t && t->dim[d] == y->dim[d] ? t->str[d] : 0;
}

static void run_pointwise(const emu_desc *op, std::map<const emu_desc *, store> &st)
{
    emu_desc *pd = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
    const emu_desc *x = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
    const emu_desc *b = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
    const emu_desc *t = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
    const emu_desc *y = sub(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    int m = enum32(pd, CUDNN_ATTR_POINTWISE_MODE);
    int64_t axis = m == CUDNN_POINTWISE_GEN_INDEX ? i64(pd, CUDNN_ATTR_POINTWISE_AXIS) : 0;
    store &sy = st[y];
    const store sx = st[x], sb = b ? st[b] : sx, stt = t ? st[t] : sx;
    int64_t xs[4], bs[4], ts[4], i[4];
    bstrides(x, y, xs);
    bstrides(b, y, bs);
    bstrides(t, y, ts);
    for (i[0] = 0; i[0] < y->dim[0]; i[0]++)
        for (i[1] = 0; i[1] < y->dim[1]; i[1]++)
            for (i[2] = 0; i[2] < y->dim[2]; i[2]++) {
                int64_t ox = i[0] * xs[0] + i[1] * xs[1] + i[2] * xs[2];
                int64_t ob = i[0] * bs[0] + i[1] * bs[1] + i[2] * bs[2];
                int64_t ot = i[0] * ts[0] + i[1] * ts[1] + i[2] * ts[2];
                int64_t oy = i[0] * y->str[0] + i[1] * y->str[1] + i[2] * y->str[2];
                for (i[3] = 0; i[3] < y->dim[3]; i[3]++) {
                    float xv = load(sx, ox + i[3] * xs[3]);
                    float bv = b ? load(sb, ob + i[3] * bs[3]) : 0;
                    float r;
                    switch (m) {
                    case CUDNN_POINTWISE_ADD: r = xv + bv; break;
                    case CUDNN_POINTWISE_MUL: r = xv * bv; break;
                    case CUDNN_POINTWISE_SUB: r = xv - bv; break;
                    case CUDNN_POINTWISE_DIV: r = xv / bv; break;
                    case CUDNN_POINTWISE_EXP: r = expf(xv); break;
                    case CUDNN_POINTWISE_LOG: r = logf(xv); break;
                    case CUDNN_POINTWISE_CMP_GE: r = xv >= bv; break;
                    case CUDNN_POINTWISE_GEN_INDEX: r = (float)i[axis]; break;
                    case CUDNN_POINTWISE_BINARY_SELECT:
                        r = load(stt, ot + i[3] * ts[3]) != 0.0f ? xv : bv;
                        break;
                    default: r = xv; break;                       /* IDENTITY */
                    }
                    put(sy, oy + i[3] * y->str[3], r);
                }
            }
}

static void run_matmul(const emu_desc *op, std::map<const emu_desc *, store> &st, int engine)
{
    const emu_desc *a = sub(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
    const emu_desc *b = sub(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
    const emu_desc *c = sub(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
    const store &sa = st[a], &sb = st[b];
    store &sc = st[c];
    int64_t M = c->dim[2], N = c->dim[3], K = a->dim[3];
    int64_t k0 = engine == ENGINE_NONDET ? executions % K : 0;
    std::vector<float> am(M * K), bm(K * N), row(N);   /* one batch's operands, as values */
    int64_t i[4] = { 0, 0, 0, 0 };
    for (i[0] = 0; i[0] < c->dim[0]; i[0]++)
        for (i[1] = 0; i[1] < c->dim[1]; i[1]++) {
            int64_t oa = offset_from(a, c, i), ob = offset_from(b, c, i);
            for (int64_t m = 0; m < M; m++)
                for (int64_t k = 0; k < K; k++)
                    am[m * K + k] = load(sa, oa + m * a->str[2] + k * a->str[3]);
            for (int64_t k = 0; k < K; k++)
                for (int64_t n = 0; n < N; n++)
                    bm[k * N + n] = load(sb, ob + k * b->str[2] + n * b->str[3]);
            for (int64_t m = 0; m < M; m++) {
                /* each c[m][n] summed in k order (engine 0: from k0 on, wrapping) */
                std::fill(row.begin(), row.end(), 0.0f);
                for (int64_t kk = 0; kk < K; kk++) {
                    int64_t k = kk + k0 < K ? kk + k0 : kk + k0 - K;
                    float av = am[m * K + k];
                    const float *bk = &bm[k * N];
                    for (int64_t n = 0; n < N; n++) row[n] += av * bk[n];
                }
                for (int64_t n = 0; n < N; n++) {
                    int64_t ic[4] = { i[0], i[1], m, n };
                    put(sc, offset(c, ic), row[n]);
                }
            }
        }
}

static void run_reduction(const emu_desc *op, std::map<const emu_desc *, store> &st)
{
    const emu_desc *x = sub(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
    const emu_desc *y = sub(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
    bool max = enum32(sub(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC),
                      CUDNN_ATTR_REDUCTION_OPERATOR) == CUDNN_REDUCE_TENSOR_MAX;
    std::vector<float> acc(span(y), max ? -INFINITY : 0.0f);
    const store &sx = st[x];
    int64_t i[4];
    FOR4(x, i) {
        int64_t j[4];
        for (int d = 0; d < 4; d++) j[d] = i[d] / (x->dim[d] / y->dim[d]);
        float v = load(sx, offset(x, i));
        float &a = acc[offset(y, j)];
        a = max ? fmaxf(a, v) : a + v;
    }
    store &sy = st[y];
    FOR4(y, i) put(sy, offset(y, i), acc[offset(y, i)]);
}

static void run_reshape(const emu_desc *op, std::map<const emu_desc *, store> &st)
{
    const emu_desc *x = sub(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
    const emu_desc *y = sub(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
    const store &sx = st[x];
    store &sy = st[y];
    int64_t i[4];
    FOR4(y, i) {
        int64_t o = offset(y, i);
        put(sy, o, load(sx, o));
    }
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan_,
                                  cudnnBackendDescriptor_t pack_)
{
    emu_desc *plan = (emu_desc *)plan_, *pack = (emu_desc *)pack_;
    if (!h || !h->live) return BAD("execute: no handle");
    if (!plan || plan->kind != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->final)
        return BAD("execute: not a finalised plan");
    if (!pack || pack->kind != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pack->final)
        return BAD("execute: not a finalised variant pack");
    const emu_desc *g = plan->graph;
    std::map<int64_t, void *> ptr;
    const value *ids = get(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    for (int64_t k = 0; k < ids->n; k++) {
        void *p;
        memcpy(&p, get(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->bytes.data() + k * sizeof p,
               sizeof p);
        ptr[i64(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, k)] = p;
    }
    void *wsp;
    memcpy(&wsp, get(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE)->bytes.data(), sizeof wsp);
    int64_t wsb = plan_workspace(g);
    if (wsb && !wsp) return BAD("execute: the plan needs %lld workspace bytes, none given",
                                (long long)wsb);
    std::map<const emu_desc *, store> st;
    std::vector<std::vector<float> > bufs;
    std::vector<emu_desc *> in, out;
    for (const emu_desc *op : g->order) {
        op_tensors(op, in, out);
        in.insert(in.end(), out.begin(), out.end());
        for (const emu_desc *t : in) {
            if (st.count(t)) continue;
            store s = { t, NULL, NULL };
            if (t->virt) {
                bufs.emplace_back(span(t), NAN);
                s.buf = bufs.back().data();
            } else {
                auto it = ptr.find(t->uid);
                if (it == ptr.end() || !it->second)
                    return BAD("execute: no pointer for tensor %lld", (long long)t->uid);
                if ((uintptr_t)it->second % t->align)
                    return BAD("execute: tensor %lld at %p, not aligned to %lld bytes",
                               (long long)t->uid, it->second, (long long)t->align);
                s.mem = it->second;
            }
            st[t] = s;
        }
    }
    if (wsb) memset(wsp, 0xff, wsb);         /* the engine's scratch: NaN until it writes */
    for (const emu_desc *op : g->order)
        switch (op->kind) {
        case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: run_pointwise(op, st); break;
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: run_matmul(op, st, plan->engine); break;
        case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: run_reduction(op, st); break;
        default: run_reshape(op, st); break;
        }
    executions++;
    return CUDNN_STATUS_SUCCESS;
}
