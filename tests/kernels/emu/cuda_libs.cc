/*
** tests/kernels/emu/cuda_libs.cc: the CUDA runtime API, cuBLAS and NCCL calls of
** runtime/rt_cuda.cu, emulated for the CPU (cuda_runtime.h, cublas_v2.h, nccl.h here). Device
** memory is host memory; streams are always idle (everything runs at the call). The
** GEMMs follow cuBLAS's documentation, written here without reference to rt_cuda.cu's use of
** them: column-major operands, op(A) of m x k and op(B) of k x n, C = alpha op(A) op(B) +
** beta C with C not read when beta is 0, the product op(A) op(B) in f32 (OpenBLAS's sgemm on
** one thread: a fixed order) and alpha op(A) op(B) + beta C rounded once to C's type (bf16: to
** nearest even). Anything else (another type, compute mode, a
** transpose kind) returns CUBLAS_STATUS_NOT_SUPPORTED; NCCL returns ncclInvalidUsage.
*/
#include "cublas_v2.h"
#include "nccl.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

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
