/*
** tests/kernels/emu/cuda_libs.cc: the CUDA runtime API, cuBLAS, cuBLASLt and NCCL calls of
** runtime/rt_cuda.cu, emulated for the CPU (cuda_runtime.h, cublas_v2.h, cublasLt.h, nccl.h
** here). Device memory is host memory; streams are always idle (everything runs at the call).
** The GEMMs follow cuBLAS's documentation, written here without reference to rt_cuda.cu's use
** of them: column-major operands, op(A) of m x k and op(B) of k x n, C = alpha op(A) op(B) +
** beta C with C not read when beta is 0, the product op(A) op(B) in f32 (OpenBLAS's sgemm on
** one thread: a fixed order) and alpha op(A) op(B) + beta C rounded once to C's type (bf16: to
** nearest even). cuBLASLt's matmul is the same product, then its epilogue in f32 (the bias
** added, GPT-2's GELU or its derivative times the product), rounded once. Anything else
** (another type, compute mode, a transpose kind, an epilogue) returns
** CUBLAS_STATUS_NOT_SUPPORTED; NCCL returns ncclInvalidUsage.
*/
#include "cublasLt.h"
#include "cublas_v2.h"
#include "nccl.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define DEVICE_BYTES ((size_t)80 << 30)     /* an H100's memory, for the properties */

cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : 101; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d != 0) return 101;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulation (CPU)");
    memcpy(p->uuid.bytes, "cuda-emu-device0", 16);
    p->totalGlobalMem = DEVICE_BYTES;
    p->multiProcessorCount = 132;
    p->major = 9;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, bytes);            /* NaN as f32 and bf16: reads before writes show */
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind)
{
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t)
{
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) { memset(p, v, bytes); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
/* Streams and events: records with a live mark (a handle not created, or destroyed, is
** cudaErrorInvalidResourceHandle, as CUDA reports it); the legacy stream is 0. */
struct emu_stream { unsigned live; };
struct emu_event { unsigned live; };
enum { LIVE = 0x51ee7u };

static bool stream_ok(cudaStream_t s) { return !s || s->live == LIVE; }
static bool event_ok(cudaEvent_t e) { return e && e->live == LIVE; }

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    return stream_ok(s) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    *s = new emu_stream{LIVE};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || !stream_ok(s)) return cudaErrorInvalidResourceHandle;
    s->live = 0;            /* kept (not freed) so that a use after destruction is seen */
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) { return cudaStreamQuery(s); }

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
    return stream_ok(s) && event_ok(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned)
{
    *e = new emu_event{LIVE};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!event_ok(e)) return cudaErrorInvalidResourceHandle;
    e->live = 0;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    return stream_ok(s) && event_ok(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    return event_ok(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorEmulation" : "cudaSuccess"; }
const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated CUDA error" : "no error"; }

/* -- cuBLAS ---------------------------------------------------------------------------------- */

struct emu_cublas { int unused; };

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new emu_cublas();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }

const char *cublasGetStatusName(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
         : s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                            : "CUBLAS_STATUS_NOT_SUPPORTED";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "success" : "not supported by the CUDA emulation";
}

static float load(const void *p, cudaDataType_t t, long long i)
{
    if (t == CUDA_R_32F) return static_cast<const float *>(p)[i];
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
}

static void store(void *p, cudaDataType_t t, long long i, float v)
{
    if (t == CUDA_R_32F) static_cast<float *>(p)[i] = v;
    else static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
}

static bool known(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType_t at,
                                          int lda, long long sA, const void *B, cudaDataType_t bt,
                                          int ldb, long long sB, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, long long sC, int batch,
                                          cublasComputeType_t comp, cublasGemmAlgo_t)
{
    if (!h || !known(at) || !known(bt) || !known(ct) || comp != CUBLAS_COMPUTE_32F ||
        (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* the documented argument checks: leading dimensions cover the stored rows */
    if (m < 0 || n < 0 || k < 0 || batch < 0 || ldc < (m > 1 ? m : 1) ||
        lda < ((ta == CUBLAS_OP_N ? m : k) > 1 ? (ta == CUBLAS_OP_N ? m : k) : 1) ||
        ldb < ((tb == CUBLAS_OP_N ? k : n) > 1 ? (tb == CUBLAS_OP_N ? k : n) : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    float al = *static_cast<const float *>(alpha), be = *static_cast<const float *>(beta);
    /* op(A) as f32 rows of k and op(B) as f32 columns of k, multiplied by OpenBLAS's f32 GEMM
    ** (cuBLAS's f32 compute: products and sums in f32, in an order of its own), then scaled
    ** and stored as C's type. A loop of our own here took 55 s of CPU in the runtime's GEMM
    ** test (GPT-2's shapes). The work arrays are kept from call to call (only grown). */
    static thread_local std::vector<float> ar, bc, t;
    if (ar.size() < (size_t)m * k) ar.resize((size_t)m * k);
    if (bc.size() < (size_t)n * k) bc.resize((size_t)n * k);
    if (t.size() < (size_t)n * m) t.resize((size_t)n * m);
    for (int b = 0; b < batch; b++) {
        for (int i = 0; i < m; i++)
            for (int l = 0; l < k; l++)
                ar[(size_t)i * k + l] = load(A, at, b * sA + (ta == CUBLAS_OP_N
                                        ? i + (long long)l * lda : l + (long long)i * lda));
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++)
                bc[(size_t)j * k + l] = load(B, bt, b * sB + (tb == CUBLAS_OP_N
                                        ? l + (long long)j * ldb : j + (long long)l * ldb));
        if (m > 0 && n > 0) {
            if (k > 0)      /* t[j][i] = sum_l bc[j][l] ar[i][l]: C transposed, row-major */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, bc.data(),
                            k, ar.data(), k, 0.0f, t.data(), m);
            else
                std::fill(t.begin(), t.begin() + (size_t)n * m, 0.0f);
        }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                long long ci = b * sC + i + (long long)j * ldc;
                float c = be == 0.0f ? 0.0f : be * load(C, ct, ci);
                store(C, ct, ci, al * t[(size_t)j * m + i] + c);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo)
{
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0,
                                      beta, C, ct, ldc, 0, 1, comp, algo);
}

/* -- cuBLASLt: the GEMM of cublasGemmEx, then the epilogue on its f32 results ------------------ */

struct emu_lt { int unused; };
struct lt_desc {            /* in cublasLtMatmulDescOpaque_t's space */
    int32_t ta, tb;
    uint32_t epi;
    const void *bias;
    void *aux;
    int64_t aux_ld;
    int32_t bias_type, aux_type;
};
struct lt_layout { cudaDataType_t type; uint64_t rows, cols; int64_t ld; };
static_assert(sizeof(lt_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "lt_desc");
static_assert(sizeof(lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "lt_layout");

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = new emu_lt(); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new cublasLtMatmulDescOpaque_t();
    lt_desc *x = reinterpret_cast<lt_desc *>(*d);
    *x = lt_desc{ CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, -1, -1 };
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }

template <typename V> static bool set(V *dst, const void *buf, size_t size)
{
    if (size != sizeof(V)) return false;
    memcpy(dst, buf, size);
    return true;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    lt_desc *x = reinterpret_cast<lt_desc *>(d);
    bool ok;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = set(&x->ta, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = set(&x->tb, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = set(&x->epi, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = set(&x->bias, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = set(&x->aux, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = set(&x->aux_ld, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: ok = set(&x->aux_type, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = set(&x->bias_type, buf, size); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!known(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new cublasLtMatrixLayoutOpaque_t();
    *reinterpret_cast<lt_layout *>(*l) = lt_layout{ type, rows, cols, ld };
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }

/* the preference: data[0] the workspace bytes, data[1..4] the alignments of A, B, C, D */
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new cublasLtMatmulPreferenceOpaque_t();
    for (int i = 1; i <= 4; i++) (*p)->data[i] = 256;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size)
{
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return set(&p->data[0], buf, size) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    if (attr < CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES ||
        attr > CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    uint32_t a;
    if (!set(&a, buf, size) || a == 0 || a > 256 || (a & (a - 1)))
        return CUBLAS_STATUS_INVALID_VALUE;
    p->data[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + 1] = a;
    return CUBLAS_STATUS_SUCCESS;
}

/* The checks cuBLASLt documents for a matmul: shapes that agree (m x k times k x n), D of C's
** shape and type, A and B of one type, the epilogue's pointers, types and aux leading
** dimension. */
static cublasStatus_t lt_check(const lt_desc *x, const lt_layout *a, const lt_layout *b,
                               const lt_layout *c, const lt_layout *dl)
{
    bool epi_ok = x->epi == CUBLASLT_EPILOGUE_DEFAULT || x->epi == CUBLASLT_EPILOGUE_BIAS ||
                  x->epi == CUBLASLT_EPILOGUE_GELU_AUX || x->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                  x->epi == CUBLASLT_EPILOGUE_DGELU;
    if (!epi_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((x->ta != CUBLAS_OP_N && x->ta != CUBLAS_OP_T) || (x->tb != CUBLAS_OP_N && x->tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m = x->ta == CUBLAS_OP_N ? a->rows : a->cols, k = x->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t kb = x->tb == CUBLAS_OP_N ? b->rows : b->cols, n = x->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (k != kb || c->rows != m || c->cols != n || dl->rows != m || dl->cols != n ||
        c->type != dl->type || c->ld != dl->ld || a->type != b->type)
        return CUBLAS_STATUS_INVALID_VALUE;
    bool bias = x->epi & CUBLASLT_EPILOGUE_BIAS, aux = x->epi & 128;
    if (bias && (!x->bias || (x->bias_type != -1 && x->bias_type != dl->type)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (aux && (!x->aux || x->aux_ld % 8 != 0 || x->aux_ld < (int64_t)m ||
                (x->aux_type != -1 && x->aux_type != dl->type)))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned)
{
    if (!h || !p || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = lt_check(reinterpret_cast<lt_desc *>(d), reinterpret_cast<lt_layout *>(a),
                                 reinterpret_cast<lt_layout *>(b), reinterpret_cast<lt_layout *>(c),
                                 reinterpret_cast<lt_layout *>(dl));
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    memset(&results[0], 0, sizeof results[0]);
    for (int i = 0; i < 4; i++)     /* the algorithm's assumptions: the stated alignments */
        results[0].algo.data[i] = p->data[i + 1];
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its derivative, in f32 */
static float lt_gelu(float x)
{
    float u = 0.7978845608f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
static float lt_dgelu(float x)
{
    float u = 0.7978845608f * (x + 0.044715f * x * x * x), th = tanhf(u);
    float du = 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t al, const void *B,
                              cublasLtMatrixLayout_t bl, const void *beta, const void *C,
                              cublasLtMatrixLayout_t cl, void *D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t)
{
    const lt_desc *x = reinterpret_cast<lt_desc *>(d);
    const lt_layout *a = reinterpret_cast<lt_layout *>(al), *b = reinterpret_cast<lt_layout *>(bl);
    const lt_layout *c = reinterpret_cast<lt_layout *>(cl), *o = reinterpret_cast<lt_layout *>(dl);
    if (!h || !algo) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = lt_check(x, a, b, c, o);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const void *ptr[4] = { A, B, C, D };
    for (int i = 0; i < 4; i++)     /* aligned as the algorithm assumes (0: not a heuristic's) */
        if (algo->data[i] == 0 || (uintptr_t)ptr[i] % algo->data[i] != 0)
            return CUBLAS_STATUS_INVALID_VALUE;
    int m = (int)o->rows, n = (int)o->cols, k = (int)(x->ta == CUBLAS_OP_N ? a->cols : a->rows);
    float be = *static_cast<const float *>(beta), al_ = *static_cast<const float *>(alpha);
    /* op(A) op(B) in f32, as cublasGemmEx computes it */
    static thread_local std::vector<float> t;
    if (t.size() < (size_t)m * n) t.resize((size_t)m * n);
    const float one = 1.0f, zero = 0.0f;
    static emu_cublas blas;
    st = cublasGemmEx(&blas, (cublasOperation_t)x->ta,
                      (cublasOperation_t)x->tb, m, n, k, &one, A, a->type, (int)a->ld, B, b->type,
                      (int)b->ld, &zero, t.data(), CUDA_R_32F, m > 1 ? m : 1, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            long long ci = i + (long long)j * c->ld, ai = i + (long long)j * x->aux_ld;
            float v = al_ * t[(size_t)j * m + i] + (be == 0.0f ? 0.0f : be * load(C, c->type, ci));
            if (x->epi & CUBLASLT_EPILOGUE_BIAS) v += load(x->bias, o->type, i);
            if (x->epi == CUBLASLT_EPILOGUE_GELU_AUX || x->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                store(x->aux, o->type, ai, v);
                v = lt_gelu(v);
            } else if (x->epi == CUBLASLT_EPILOGUE_DGELU) {
                v *= lt_dgelu(load(x->aux, o->type, ai));
            }
            store(D, o->type, ci, v);
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* -- NCCL: no communicator of more than one rank in one process ----------------------------- */

static ncclResult_t refuse(const char *what)
{
    fprintf(stderr, "cuda_emu: %s: NCCL is not emulated (one rank, no communicators)\n", what);
    return ncclInvalidUsage;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return refuse("ncclGetUniqueId"); }
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int)
{
    return refuse("ncclCommInitRank");
}
ncclResult_t ncclCommDestroy(ncclComm_t) { return refuse("ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t) { return refuse("ncclCommAbort"); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *r)
{
    *r = ncclInvalidUsage;
    return refuse("ncclCommGetAsyncError");
}
const char *ncclGetErrorString(ncclResult_t r) { return r ? "invalid usage" : "no error"; }
const char *ncclGetLastError(ncclComm_t) { return "NCCL is not emulated"; }
ncclResult_t ncclGroupStart(void) { return refuse("ncclGroupStart"); }
ncclResult_t ncclGroupEnd(void) { return refuse("ncclGroupEnd"); }
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                           ncclComm_t, cudaStream_t)
{
    return refuse("ncclAllReduce");
}
ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                           cudaStream_t)
{
    return refuse("ncclAllGather");
}
ncclResult_t ncclReduceScatter(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t)
{
    return refuse("ncclReduceScatter");
}
ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t)
{
    return refuse("ncclBroadcast");
}
ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
{
    return refuse("ncclSend");
}
ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
{
    return refuse("ncclRecv");
}
