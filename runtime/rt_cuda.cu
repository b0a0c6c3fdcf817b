/*
** rt_cuda.cu: the CUDA backend (build/librt_cuda.a): one device per rank (local rank modulo
** device count), device memory (counted for rt_mem_stats, cuBLAS's workspace included), cuBLAS
** GEMM (f32 without TF32; f32 or bf16 inputs and output), the Philox kernel, and
** communication over NCCL (one communicator per group, ids broadcast over the group's MPI
** communicator, and a communication stream per communicator) or, with RT_TRANSPORT=mpi or
** ranks sharing a GPU, over MPI through pinned host staging; blocking calls are a start and a
** wait (rt.h's requests). Kernels, the runtime's and the generated ones, run on the legacy
** default stream (the compute stream). NCCL calls and their completion are armed on the
** runtime's watchdog thread (rt_common.c), which aborts the communicators and the job on expiry.
*/
#include "rt_internal.h"   // defines: rt_group, rt__st, rt__h_*, rt__poll, rt__die, ...
#include "rt_launch.h"     // defines: KERNEL_LAUNCH
#include "rt_philox.h"     // defines: rt__normal_at (host and device)

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

static struct {
    int             inited;
    int             device, ndev;
    int             nccl;            /* 1: NCCL transport, 0: MPI through pinned staging */
    cublasHandle_t  blas;
    cublasLtHandle_t lt;             /* the fused GEMMs (rt_gemm_epi) */
    int             lt_warned;       /* a refused cublasLtMatmul was reported */
    ncclComm_t     *comms;           /* every live communicator (for ncclCommAbort) */
    int             ncomms, capcomms;
    void           *stage[2];        /* pinned staging of alltoallv, broadcast (MPI transport) */
    size_t          stagecap[2];
    void           *workspace;       /* cuBLAS's, RT_CUDA_WORKSPACE_BYTES (counted) */
    float          *gemm_stage;      /* f32 GEMM results for a bf16 C, RT_CUDA_STAGE_BYTES */
} cu;

static void pool_free_all(void);

/* -- Errors ---------------------------------------------------------------------------------- */

/* The MPI layer's rt__status_hook: the text of a failed CUDA, cuBLAS or NCCL status. */
static void status_text(rt_err_kind kind, int status, char *buf, size_t len)
{
    switch (kind) {
    case RT_ERR_CUDA:
        snprintf(buf, len, "%s: %s", cudaGetErrorName((cudaError_t)status),
                 cudaGetErrorString((cudaError_t)status));
        break;
    case RT_ERR_CUBLAS:
        snprintf(buf, len, "%s: %s", cublasGetStatusName((cublasStatus_t)status),
                 cublasGetStatusString((cublasStatus_t)status));
        break;
    case RT_ERR_NCCL: {
        const char *last = ncclGetLastError(NULL);
        snprintf(buf, len, "%s%s%s", ncclGetErrorString((ncclResult_t)status),
                 last && *last ? ": " : "", last ? last : "");
        break;
    }
    default:
        snprintf(buf, len, "status %d", status);
        break;
    }
}

/* rt_abort's hook: abort every NCCL communicator so no kernel or host call waits forever. */
static void abort_nccl(void)
{
    for (int i = 0; i < cu.ncomms; i++)
        if (cu.comms[i])
            ncclCommAbort(cu.comms[i]);
    cu.ncomms = 0;
}

static void comm_register(ncclComm_t c)
{
    if (cu.ncomms == cu.capcomms) {
        cu.capcomms = cu.capcomms ? 2 * cu.capcomms : 16;
        cu.comms = (ncclComm_t *)realloc(cu.comms, (size_t)cu.capcomms * sizeof *cu.comms);
        RT_CHECK(cu.comms, "out of memory");
    }
    cu.comms[cu.ncomms++] = c;
}

static void comm_forget(ncclComm_t c)
{
    for (int i = 0; i < cu.ncomms; i++)
        if (cu.comms[i] == c) {
            cu.comms[i] = cu.comms[--cu.ncomms];
            return;
        }
}

/* A group's NCCL communicator (rt_group.dev), the stream its operations run on, and an event
** for ordering that stream after the compute stream. */
typedef struct {
    ncclComm_t   comm;
    cudaStream_t stream;
    cudaEvent_t  ready;
} nccl_comm;

/* -- Launch ---------------------------------------------------------------------------------- */

const char *rt_backend(void)
{
    if (!cu.inited)
        return "cuda";
    return cu.nccl ? "cuda-nccl" : "cuda-mpi";
}

void *rt_workspace(size_t *bytes)
{
    *bytes = cu.workspace ? RT_CUDA_WORKSPACE_BYTES : 0;
    return cu.workspace;
}

static ncclDataType_t nccl_type(rt_dtype t)
{
    switch (t) {
    case RT_F32:  return ncclFloat32;
    case RT_BF16: return ncclBfloat16;
    case RT_I32:  return ncclInt32;
    case RT_I64:  return ncclInt64;
    default:      break;
    }
    rt__die("invalid dtype %d", (int)t);
}

/* NCCL communicator for a group of more than one rank: id from group rank 0, broadcast over
** the group's MPI communicator (watchdog-guarded), then ncclCommInitRank under the watchdog. */
static void nccl_setup(rt_group *g)
{
    if (!cu.nccl || g->size < 2)
        return;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (g->rank == 0)
        RT_NCCL(ncclGetUniqueId(&id));
    rt__h_broadcast(&id, sizeof id / sizeof(int32_t), RT_I32, 0, g);
    nccl_comm *c = (nccl_comm *)calloc(1, sizeof *c);
    RT_CHECK(c, "out of memory");
    rt__wd_arm("NCCL communicator setup", g);
    RT_NCCL(ncclCommInitRank(&c->comm, g->size, id, g->rank));
    rt__wd_disarm();
    RT_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    RT_CUDA(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
    comm_register(c->comm);
    g->dev = c;
}

/* Free a group's communicator record (its NCCL communicator destroyed by the caller). */
static void nccl_free(rt_group *g)
{
    nccl_comm *c = (nccl_comm *)g->dev;
    if (!c)
        return;
    cudaStreamDestroy(c->stream);
    cudaEventDestroy(c->ready);
    free(c);
    g->dev = NULL;
}

/*
** Start MPI and the watchdog (rt__mpi_init), pick the device by local rank, choose the
** transport (RT_TRANSPORT=nccl|mpi; by default MPI when any two ranks drive the same GPU,
** judged by device UUID), create cuBLAS (default math: no TF32), the world NCCL communicator
** and the thread pool.
*/
void rt_init(int *argc, char ***argv, int expected_world, const char *layout)
{
    rt__status_hook = status_text;
    rt__mpi_init(argc, argv, expected_world, layout);
    cudaError_t e = cudaGetDeviceCount(&cu.ndev);
    if (e != cudaSuccess || cu.ndev < 1)
        rt__die("CUDA backend: no usable GPU (%s)",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    cu.device = rt__st.local_rank % cu.ndev;
    RT_CUDA(cudaSetDevice(cu.device));

    /* Do two ranks drive the same GPU (NCCL refuses that)? Compare device UUIDs over the
    ** world: launchers that give each rank its own CUDA_VISIBLE_DEVICES make "local size >
    ** device count" a wrong test. */
    cudaDeviceProp prop;
    RT_CUDA(cudaGetDeviceProperties(&prop, cu.device));
    int64_t mine[2], *all = (int64_t *)malloc((size_t)rt__st.world * sizeof mine);
    RT_CHECK(all, "out of memory");
    memcpy(mine, prop.uuid.bytes, sizeof mine);
    rt__h_allgather(mine, all, 2, RT_I64, rt__world);
    int want_mpi = 0;
    for (int r = 0; r < rt__st.world; r++)
        if (r != rt__st.rank && all[2 * r] == mine[0] && all[2 * r + 1] == mine[1])
            want_mpi = 1;
    free(all);
    const char *tr = getenv("RT_TRANSPORT");
    if (tr && *tr) {
        if (!strcmp(tr, "mpi"))
            want_mpi = 1;
        else if (!strcmp(tr, "nccl"))
            want_mpi = 0;
        else
            rt__die("RT_TRANSPORT='%s': expected 'nccl' or 'mpi'", tr);
    }
    int32_t any = want_mpi;
    rt__h_allreduce(&any, 1, RT_I32, RT_MAX, rt__world);     /* one transport for the job */
    cu.nccl = !any;

    RT_CUBLAS(cublasCreate(&cu.blas));
    RT_CUBLAS(cublasSetMathMode(cu.blas, CUBLAS_DEFAULT_MATH));
    RT_CUBLAS(cublasSetStream(cu.blas, 0));
    /* after cublasSetStream, which resets the workspace to cuBLAS's own pool: from here on
    ** cuBLAS allocates no device memory behind rt_mem_stats */
    cu.workspace = rt_malloc(RT_CUDA_WORKSPACE_BYTES);
    RT_CUBLAS(cublasSetWorkspace(cu.blas, cu.workspace, RT_CUDA_WORKSPACE_BYTES));
    RT_CUBLAS(cublasLtCreate(&cu.lt));
    cu.gemm_stage = (float *)rt_malloc(RT_CUDA_STAGE_BYTES);

    rt__abort_hook = abort_nccl;
    cu.inited = 1;
    nccl_setup(rt__world);
    rt__pool_init(rt__default_threads());
}

/*
** Wait for the device, destroy every NCCL communicator (groups not freed included; their
** rt_group records must not be used afterwards) and the handles, then end MPI and the pool.
*/
void rt_finalize(void)
{
    rt__req_none_live(NULL, "rt_finalize");
    RT_CUDA(cudaDeviceSynchronize());
    rt__abort_hook = NULL;
    for (int i = 0; i < cu.ncomms; i++)         /* the world's and any group not freed */
        ncclCommDestroy(cu.comms[i]);
    cu.ncomms = 0;
    if (rt__world)
        nccl_free(rt__world);
    for (int i = 0; i < 2; i++)
        if (cu.stage[i])
            cudaFreeHost(cu.stage[i]);
    pool_free_all();
    cublasLtDestroy(cu.lt);
    cublasDestroy(cu.blas);
    rt_free(cu.workspace);
    rt_free(cu.gemm_stage);
    cu.workspace = cu.gemm_stage = NULL;
    rt__mpi_finalize();
    rt__pool_shutdown();
}

/* -- Groups ---------------------------------------------------------------------------------- */

rt_group *rt_group_create(const char *name, const int *members, int n)
{
    rt_group *g = rt__group_create(name, members, n);
    if (g)
        nccl_setup(g);
    return g;
}

void rt_group_free(rt_group *g)
{
    if (!g || g->is_world)
        return;
    rt__req_none_live(g, "rt_group_free");
    if (g->dev) {
        nccl_comm *c = (nccl_comm *)g->dev;
        RT_CUDA(cudaStreamSynchronize(c->stream));
        comm_forget(c->comm);
        RT_NCCL(ncclCommDestroy(c->comm));
        nccl_free(g);
    }
    rt__group_destroy(g);
}

/* -- Communication: requests ------------------------------------------------------------------ */

/*
** NCCL. Each communicator has a communication stream of its own, which carries all its
** operations, blocking ones too, in call order (so every member runs them in the same order,
** as NCCL requires): a start records an event on the compute stream (the legacy default
** stream, where the runtime's and the generated kernels run), makes the communication stream
** wait for it, enqueues the NCCL operation and records a done event after it. rt_wait polls
** that event on the host (with the communicator's asynchronous error; armed on the watchdog
** thread), then orders the compute stream after it. A blocking call is a start and a wait.
** MPI transport. A start copies the device inputs into pinned host staging (cudaMemcpy:
** after the compute stream's work so far) and starts the MPI layer's request on them; rt_wait
** completes it and copies the results back to the device. rt_progress drives those requests.
*/
enum { REQ_DONE, REQ_NCCL, REQ_STAGED };

typedef struct {                     /* a copy back to the device at rt_wait */
    void       *dev;
    const void *host;
    size_t      bytes;
} copy_out;

typedef struct {
    int          kind;               /* REQ_*: complete at start, NCCL, MPI transport */
    cudaEvent_t  done;               /* REQ_NCCL: recorded after the operation */
    ncclComm_t   comm;
    char         what[96];           /* REQ_NCCL p2p: the watchdog's name for it */
    void        *stage;              /* REQ_STAGED: pinned host staging (the pool's) */
    size_t       cap;
    copy_out    *out;                /* results to copy back */
    int          nout;
} dev_req;

/* Events and pinned staging, kept for later requests. */
enum { POOL_MAX = 16 };
static struct {
    cudaEvent_t ev[64];
    int         nev;
    struct { void *p; size_t cap; } pin[POOL_MAX];
    int         npin;
} pool;

static cudaEvent_t event_get(void)
{
    if (pool.nev > 0)
        return pool.ev[--pool.nev];
    cudaEvent_t e;
    RT_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

static void event_put(cudaEvent_t e)
{
    if (pool.nev < (int)(sizeof pool.ev / sizeof pool.ev[0]))
        pool.ev[pool.nev++] = e;
    else
        RT_CUDA(cudaEventDestroy(e));
}

/* Pinned host memory of at least 'bytes' (the smallest pooled block that fits, else new). */
static void *pinned_get(size_t bytes, size_t *cap)
{
    int best = -1;
    for (int i = 0; i < pool.npin; i++)
        if (pool.pin[i].cap >= bytes && (best < 0 || pool.pin[i].cap < pool.pin[best].cap))
            best = i;
    if (best >= 0) {
        void *p = pool.pin[best].p;
        *cap = pool.pin[best].cap;
        pool.pin[best] = pool.pin[--pool.npin];
        return p;
    }
    *cap = bytes + bytes / 4 + 256;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, *cap);
    if (e != cudaSuccess)
        rt__die("out of pinned host memory: communication staging of %zu bytes: %s", *cap,
                cudaGetErrorString(e));
    return p;
}

static void pinned_put(void *p, size_t cap)
{
    if (!p)
        return;
    if (pool.npin < POOL_MAX) {
        pool.pin[pool.npin].p = p;
        pool.pin[pool.npin++].cap = cap;
    } else {
        RT_CUDA(cudaFreeHost(p));
    }
}

static void pool_free_all(void)
{
    for (int i = 0; i < pool.nev; i++)
        cudaEventDestroy(pool.ev[i]);
    for (int i = 0; i < pool.npin; i++)
        cudaFreeHost(pool.pin[i].p);
    pool.nev = pool.npin = 0;
}

static void d2h(void *h, const void *d, size_t bytes)
{
    if (bytes)
        RT_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static void h2d(void *d, const void *h, size_t bytes)
{
    if (bytes)
        RT_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
}

static void d2d(void *d, const void *s, size_t bytes)
{
    if (bytes && d != s)
        RT_CUDA(cudaMemcpy(d, s, bytes, cudaMemcpyDeviceToDevice));
}

/* A new request for 'op' on g (NULL: p2p) with its device part, complete until made NCCL or
** staged; numbered for the trace when it is a start's ('async'), not a blocking call's. */
static rt_req *req_new(const char *op, const rt_group *g, int async)
{
    rt_req *r = rt__req_new(op, g, async);
    dev_req *d = (dev_req *)calloc(1, sizeof *d);
    RT_CHECK(d, "out of memory");
    d->kind = REQ_DONE;
    r->dev = d;
    return r;
}

/* The NCCL communicator's stream, ordered after the compute stream's work so far. */
static cudaStream_t nccl_begin(const nccl_comm *c)
{
    RT_CUDA(cudaEventRecord(c->ready, 0));
    RT_CUDA(cudaStreamWaitEvent(c->stream, c->ready, 0));
    return c->stream;
}

/* The operation just enqueued on c's stream is r's: its done event. */
static void nccl_end(rt_req *r, const nccl_comm *c)
{
    dev_req *d = (dev_req *)r->dev;
    d->kind = REQ_NCCL;
    d->comm = c->comm;
    d->done = event_get();
    RT_CUDA(cudaEventRecord(d->done, c->stream));
}

/* Pinned staging of 'bytes' for r (MPI transport). */
static char *stage_for(rt_req *r, size_t bytes, int nout)
{
    dev_req *d = (dev_req *)r->dev;
    d->kind = REQ_STAGED;
    d->stage = pinned_get(bytes, &d->cap);
    d->out = (copy_out *)calloc((size_t)(nout > 0 ? nout : 1), sizeof *d->out);
    RT_CHECK(d->out, "out of memory");
    return (char *)d->stage;
}

static void out_add(rt_req *r, void *dev, const void *host, size_t bytes)
{
    dev_req *d = (dev_req *)r->dev;
    d->out[d->nout].dev = dev;
    d->out[d->nout].host = host;
    d->out[d->nout++].bytes = bytes;
}

/* Complete r's device part: NCCL: poll its event (the watchdog thread armed, the
** communicator's asynchronous error checked), then order the compute stream after it; MPI
** transport: the MPI layer's wait, then the copies back. Frees the device part. */
static void dev_wait(rt_req *r)
{
    dev_req *d = (dev_req *)r->dev;
    if (d->kind == REQ_NCCL) {
        rt__wd_arm(d->what[0] ? d->what : r->op, r->g);
        rt__poll p;
        rt__poll_start(&p, 0);
        for (;;) {
            cudaError_t e = cudaEventQuery(d->done);
            if (e == cudaSuccess)
                break;
            if (e != cudaErrorNotReady)
                RT_CUDA(e);
            ncclResult_t ar = ncclSuccess;
            RT_NCCL(ncclCommGetAsyncError(d->comm, &ar));
            if (ar != ncclSuccess && ar != ncclInProgress)
                rt_fail_status(__FILE__, __LINE__, RT_ERR_NCCL, (int)ar,
                               "ncclCommGetAsyncError(comm)");
            rt__h_progress();
            rt__poll_pause(&p);
        }
        rt__wd_disarm();
        RT_CUDA(cudaStreamWaitEvent(0, d->done, 0));
        event_put(d->done);
    } else if (d->kind == REQ_STAGED) {
        rt__h_wait(r->h);
        r->h = NULL;
        for (int i = 0; i < d->nout; i++)
            h2d(d->out[i].dev, d->out[i].host, d->out[i].bytes);
        pinned_put(d->stage, d->cap);
        free(d->out);
    }
    free(d);
    r->dev = NULL;
}

/* -- Collectives ------------------------------------------------------------------------------ */

/* Each rt.h collective is its start (below) and a wait, both accounted and traced by the
** public functions at the end of this section. */

static rt_req *allreduce_start(rt_req *r, void *buf, size_t n, rt_dtype t, rt_op op,
                               rt_group *g)
{
    rt__group_check(g, "allreduce");
    RT_CHECK(op == RT_SUM || op == RT_MAX, "allreduce: invalid op %d", (int)op);
    size_t bytes = n * rt_dtype_size(t);
    if (n == 0 || g->size == 1)
        return r;
    if (!cu.nccl) {
        char *h = stage_for(r, bytes, 1);
        d2h(h, buf, bytes);
        r->h = rt__h_allreduce_start(h, n, t, op, g);
        out_add(r, buf, h, bytes);
        return r;
    }
    const nccl_comm *c = (const nccl_comm *)g->dev;
    RT_NCCL(ncclAllReduce(buf, buf, n, nccl_type(t), op == RT_MAX ? ncclMax : ncclSum, c->comm,
                          nccl_begin(c)));
    nccl_end(r, c);
    return r;
}

static rt_req *allgather_start(rt_req *r, const void *send, void *recv, size_t n, rt_dtype t,
                               rt_group *g)
{
    rt__group_check(g, "allgather");
    size_t bytes = n * rt_dtype_size(t), all = bytes * (size_t)g->size;
    if (n == 0)
        return r;
    if (g->size == 1) {
        d2d(recv, send, bytes);
        return r;
    }
    if (!cu.nccl) {         /* gathered in place on the host */
        char *h = stage_for(r, all, 1), *mine = h + (size_t)g->rank * bytes;
        d2h(mine, send, bytes);
        r->h = rt__h_allgather_start(mine, h, n, t, g);
        out_add(r, recv, h, all);
        return r;
    }
    const nccl_comm *c = (const nccl_comm *)g->dev;
    RT_NCCL(ncclAllGather(send, recv, n, nccl_type(t), c->comm, nccl_begin(c)));
    nccl_end(r, c);
    return r;
}

static rt_req *reduce_scatter_start(rt_req *r, const void *send, void *recv, size_t n,
                                    rt_dtype t, rt_group *g)
{
    rt__group_check(g, "reduce-scatter");
    size_t bytes = n * rt_dtype_size(t), all = bytes * (size_t)g->size;
    if (n == 0)
        return r;
    if (g->size == 1) {
        d2d(recv, send, bytes);
        return r;
    }
    if (!cu.nccl) {         /* reduced in place on the host: only this rank's block comes back */
        char *h = stage_for(r, all, 1), *mine = h + (size_t)g->rank * bytes;
        d2h(h, send, all);
        r->h = rt__h_reduce_scatter_start(h, mine, n, t, g);
        out_add(r, recv, mine, bytes);
        return r;
    }
    const nccl_comm *c = (const nccl_comm *)g->dev;
    RT_NCCL(ncclReduceScatter(send, recv, n, nccl_type(t), ncclSum, c->comm, nccl_begin(c)));
    nccl_end(r, c);
    return r;
}

/*
** Point-to-point over the world communicator: an NCCL group of sends and receives on the
** world's communication stream (n = 0 ops are skipped on both sides, messages to self are
** device copies there), or staged through pinned memory over MPI.
*/
static rt_req *p2p_start(rt_req *r, const rt_p2p_op *ops, int nops)
{
    if (nops <= 0)
        return r;
    RT_CHECK(ops, "rt_p2p: NULL ops");
    for (int i = 0; i < nops; i++)
        if (ops[i].peer < 0 || ops[i].peer >= rt__st.world)
            rt__die("p2p: op %d has peer %d, not a rank of the world of %d", i, ops[i].peer,
                    rt__st.world);
    if (!cu.nccl || rt__st.world == 1) {
        size_t total = 0;
        for (int i = 0; i < nops; i++)
            total += (ops[i].n * rt_dtype_size(ops[i].t) + 255) & ~(size_t)255;
        char *h = stage_for(r, total, nops);
        rt_p2p_op *hops = (rt_p2p_op *)malloc((size_t)nops * sizeof *hops);
        RT_CHECK(hops, "out of memory");
        size_t off = 0;
        for (int i = 0; i < nops; i++) {
            size_t b = ops[i].n * rt_dtype_size(ops[i].t);
            hops[i] = ops[i];
            hops[i].buf = h + off;
            if (ops[i].send)
                d2h(h + off, ops[i].buf, b);
            else
                out_add(r, ops[i].buf, h + off, b);
            off += (b + 255) & ~(size_t)255;
        }
        r->h = rt__h_p2p_start(hops, nops);
        free(hops);
        return r;
    }
    const nccl_comm *c = (const nccl_comm *)rt__world->dev;
    cudaStream_t s = nccl_begin(c);
    /* messages to self: the k-th send to self goes to the k-th receive from self (a copy) */
    for (int i = 0, j = 0; i < nops; i++) {
        if (!ops[i].send || ops[i].peer != rt__st.rank)
            continue;
        while (j < nops && (ops[j].send || ops[j].peer != rt__st.rank))
            j++;
        RT_CHECK(j < nops, "p2p: a send to self (op %d) without a receive from self", i);
        RT_CHECK(ops[j].n == ops[i].n && ops[j].t == ops[i].t,
                 "p2p: send to self (op %d) and receive from self (op %d) differ in size", i, j);
        if (ops[i].n)
            RT_CUDA(cudaMemcpyAsync(ops[j].buf, ops[i].buf, ops[i].n * rt_dtype_size(ops[i].t),
                                    cudaMemcpyDeviceToDevice, s));
        j++;
    }
    /* NCCL matches in posting order and has no tags: post sorted by (peer, tag), stably */
    int *order = (int *)malloc((size_t)nops * sizeof *order);
    RT_CHECK(order, "out of memory");
    for (int i = 0; i < nops; i++) {
        int j = i;
        while (j > 0 && (ops[order[j - 1]].peer > ops[i].peer ||
                         (ops[order[j - 1]].peer == ops[i].peer &&
                          ops[order[j - 1]].tag > ops[i].tag))) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    RT_NCCL(ncclGroupStart());
    for (int i = 0; i < nops; i++) {
        const rt_p2p_op *o = &ops[order[i]];
        if (o->n == 0 || o->peer == rt__st.rank)
            continue;
        if (o->send)
            RT_NCCL(ncclSend(o->buf, o->n, nccl_type(o->t), o->peer, c->comm, s));
        else
            RT_NCCL(ncclRecv(o->buf, o->n, nccl_type(o->t), o->peer, c->comm, s));
    }
    RT_NCCL(ncclGroupEnd());
    free(order);
    nccl_end(r, c);
    snprintf(((dev_req *)r->dev)->what, sizeof ((dev_req *)r->dev)->what,
             "p2p (%d ops, first: %s rank %d)", nops, ops[0].send ? "send to" : "recv from",
             ops[0].peer);
    return r;
}

/* The MPI layer's or NCCL's part of a blocking call: its start's request, completed. */
static void complete(rt_req *r)
{
    dev_wait(r);
    rt__req_free(r);
}

static const char *red_name(rt_op op)
{
    return op == RT_MAX ? "max" : "sum";
}

void rt_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("allreduce", g, n, t, 1, red_name(op), 0);
    complete(allreduce_start(req_new("allreduce", g, 0), buf, n, t, op, g));
    rt__comm_end(t0, 1);
}

void rt_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("allgather", g, n, t, 1, NULL, 0);
    complete(allgather_start(req_new("allgather", g, 0), send, recv, n, t, g));
    rt__comm_end(t0, 1);
}

void rt_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("reduce_scatter", g, n, t, 1, NULL, 0);
    complete(reduce_scatter_start(req_new("reduce_scatter", g, 0), send, recv, n, t, g));
    rt__comm_end(t0, 1);
}

void rt_p2p(const rt_p2p_op *ops, int nops)
{
    double t0 = rt__comm_begin();
    if (rt__tracing)
        { RT_TRACE_SITE(); rt__trace_p2p(ops, nops, 0); }
    complete(p2p_start(req_new("p2p", NULL, 0), ops, nops));
    rt__comm_end(t0, 1);
}

rt_req *rt_allreduce_start(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    double t0 = rt__comm_begin();
    rt_req *r = req_new("allreduce", g, 1);
    RT_TRACE_COLL("allreduce", g, n, t, 1, red_name(op), r->id);
    allreduce_start(r, buf, n, t, op, g);
    rt__comm_end(t0, 0);
    return r;
}

rt_req *rt_allgather_start(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    rt_req *r = req_new("allgather", g, 1);
    RT_TRACE_COLL("allgather", g, n, t, 1, NULL, r->id);
    allgather_start(r, send, recv, n, t, g);
    rt__comm_end(t0, 0);
    return r;
}

rt_req *rt_reduce_scatter_start(const void *send, void *recv, size_t n, rt_dtype t,
                                rt_group *g)
{
    double t0 = rt__comm_begin();
    rt_req *r = req_new("reduce_scatter", g, 1);
    RT_TRACE_COLL("reduce_scatter", g, n, t, 1, NULL, r->id);
    reduce_scatter_start(r, send, recv, n, t, g);
    rt__comm_end(t0, 0);
    return r;
}

rt_req *rt_p2p_start(const rt_p2p_op *ops, int nops)
{
    double t0 = rt__comm_begin();
    rt_req *r = req_new("p2p", NULL, 1);
    if (rt__tracing)
        { RT_TRACE_SITE(); rt__trace_p2p(ops, nops, r->id); }
    p2p_start(r, ops, nops);
    rt__comm_end(t0, 0);
    return r;
}

void rt_wait(rt_req *r)
{
    if (!r)
        return;
    double t0 = rt__comm_begin();
    if (rt__tracing)
        { RT_TRACE_SITE(); rt__trace_wait(r); }
    complete(r);
    rt__comm_end(t0, 1);
}

/* The MPI transport's requests move here; NCCL's run on their own. */
void rt_progress(void)
{
    double t0 = rt__comm_begin();
    rt__h_progress();
    rt__comm_end(t0, 0);
}

int rt_test(rt_req *r)
{
    if (!r)
        return 1;
    dev_req *d = (dev_req *)r->dev;
    if (d->kind == REQ_NCCL) {
        cudaError_t e = cudaEventQuery(d->done);
        if (e != cudaErrorNotReady)
            RT_CUDA(e);
        return e == cudaSuccess;
    }
    return d->kind == REQ_DONE || rt__h_test(r->h);
}

/* -- Blocking only: all-to-all, broadcast, barrier -------------------------------------------- */

static void *stage(int i, size_t bytes)
{
    if (bytes > cu.stagecap[i]) {
        if (cu.stage[i])
            RT_CUDA(cudaFreeHost(cu.stage[i]));
        size_t cap = bytes + bytes / 4 + 256;
        RT_CUDA(cudaMallocHost(&cu.stage[i], cap));
        cu.stagecap[i] = cap;
    }
    return cu.stage[i];
}

/* A blocking call's NCCL work: enqueued on blocking_begin's stream (after the compute
** stream's work), then waited for as rt_wait does by blocking_end. */
static cudaStream_t blocking_begin(const nccl_comm *c)
{
    return nccl_begin(c);
}

static void blocking_end(const nccl_comm *c, const char *op, rt_group *g)
{
    rt_req *r = req_new(op, g, 0);
    nccl_end(r, c);
    complete(r);
}

static void alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                      void *recv, const size_t *rcounts, const size_t *rdispls,
                      rt_dtype t, rt_group *g)
{
    rt__group_check(g, "alltoallv");
    RT_CHECK(scounts && sdispls && rcounts && rdispls, "alltoallv: NULL count array");
    size_t es = rt_dtype_size(t);
    int p = g->size, me = g->rank;
    const char *s = (const char *)send;
    char *r = (char *)recv;
    if (p == 1) {
        RT_CHECK(scounts[0] == rcounts[0], "alltoallv on %s: sends %zu to itself, expects %zu",
                 g->desc, scounts[0], rcounts[0]);
        d2d(r + rdispls[0] * es, s + sdispls[0] * es, scounts[0] * es);
    } else if (!cu.nccl) {
        size_t sext = 0, rext = 0;
        for (int i = 0; i < p; i++) {
            if (scounts[i] && sdispls[i] + scounts[i] > sext)
                sext = sdispls[i] + scounts[i];
            if (rcounts[i] && rdispls[i] + rcounts[i] > rext)
                rext = rdispls[i] + rcounts[i];
        }
        char *hs = (char *)stage(0, sext * es), *hr = (char *)stage(1, rext * es);
        for (int i = 0; i < p; i++)
            d2h(hs + sdispls[i] * es, s + sdispls[i] * es, scounts[i] * es);
        rt__h_alltoallv(hs, scounts, sdispls, hr, rcounts, rdispls, t, g);
        for (int i = 0; i < p; i++)
            h2d(r + rdispls[i] * es, hr + rdispls[i] * es, rcounts[i] * es);
    } else {
        const nccl_comm *c = (const nccl_comm *)g->dev;
        cudaStream_t cs = blocking_begin(c);
        RT_NCCL(ncclGroupStart());
        for (int i = 0; i < p; i++) {
            if (i == me) {
                RT_CHECK(scounts[i] == rcounts[i],
                         "alltoallv on %s: sends %zu to itself, expects %zu", g->desc,
                         scounts[i], rcounts[i]);
                if (scounts[i])
                    RT_CUDA(cudaMemcpyAsync(r + rdispls[i] * es, s + sdispls[i] * es,
                                            scounts[i] * es, cudaMemcpyDeviceToDevice, cs));
                continue;
            }
            if (scounts[i])
                RT_NCCL(ncclSend(s + sdispls[i] * es, scounts[i], nccl_type(t), i, c->comm, cs));
            if (rcounts[i])
                RT_NCCL(ncclRecv(r + rdispls[i] * es, rcounts[i], nccl_type(t), i, c->comm, cs));
        }
        RT_NCCL(ncclGroupEnd());
        blocking_end(c, "alltoallv", g);
    }
}

void rt_alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                  void *recv, const size_t *rcounts, const size_t *rdispls,
                  rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("alltoallv", g, 0, t, 0, NULL, 0);
    alltoallv(send, scounts, sdispls, recv, rcounts, rdispls, t, g);
    rt__comm_end(t0, 1);
}

void rt_alltoall(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("alltoall", g, n, t, 1, NULL, 0);
    rt__group_check(g, "alltoall");
    size_t *c = rt__even_counts(g->size, n);
    alltoallv(send, c, c + g->size, recv, c, c + g->size, t, g);
    rt__comm_end(t0, 1);
}

void rt_broadcast(void *buf, size_t n, rt_dtype t, int root, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("broadcast", g, n, t, 1, NULL, 0);
    rt__group_check(g, "broadcast");
    RT_CHECK(root >= 0 && root < g->size, "broadcast on %s: root %d is not a group rank",
             g->desc, root);
    size_t bytes = n * rt_dtype_size(t);
    if (n == 0 || g->size == 1) {
    } else if (!cu.nccl) {
        void *h = stage(0, bytes);
        if (g->rank == root)
            d2h(h, buf, bytes);
        rt__h_broadcast(h, n, t, root, g);
        if (g->rank != root)
            h2d(buf, h, bytes);
    } else {
        const nccl_comm *c = (const nccl_comm *)g->dev;
        RT_NCCL(ncclBroadcast(buf, buf, n, nccl_type(t), root, c->comm, blocking_begin(c)));
        blocking_end(c, "broadcast", g);
    }
    rt__comm_end(t0, 1);
}

void rt_barrier(rt_group *g)
{
    double t0 = rt__comm_begin();
    if (rt__tracing)
        { RT_TRACE_SITE(); rt__trace("barrier %s", g ? g->name : "world"); }
    RT_CUDA(cudaDeviceSynchronize());
    rt__h_barrier(g ? g : rt__world, "barrier");
    rt__comm_end(t0, 1);
}

void rt_sync(void)
{
    RT_CUDA(cudaDeviceSynchronize());
}

/* -- Memory ---------------------------------------------------------------------------------- */

/*
** Zero-filled device memory (cudaMalloc: 256-byte aligned), counted for rt_mem_stats by the
** bytes requested; aborts naming the size and the GPU when out of memory.
*/
void *rt_malloc(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess)
        rt__die("out of device memory: rt_malloc(%zu) on GPU %d: %s", bytes, cu.device,
                cudaGetErrorString(e));
    RT_CUDA(cudaMemset(p, 0, bytes ? bytes : 256));
    rt__mem_add(p, bytes);
    return p;
}

void rt_free(void *p)
{
    if (!p)
        return;
    rt__mem_remove(p, "rt_free");
    RT_CUDA(cudaFree(p));
}

/* rt_memcpy and rt_memcpy_async: async, on the legacy default stream, the one every kernel
** launch (rt_launch.h) uses */
static void copy(void *dst, const void *src, size_t bytes, rt_copy kind, int async)
{
    static const cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                            cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost };
    RT_CHECK((unsigned)kind <= RT_H2H, "%s: invalid copy kind %d",
             async ? "rt_memcpy_async" : "rt_memcpy", (int)kind);
    if (!bytes)
        return;
    if (kind == RT_H2H)
        memmove(dst, src, bytes);
    else if (async)
        RT_CUDA(cudaMemcpyAsync(dst, src, bytes, kinds[kind], 0));
    else
        RT_CUDA(cudaMemcpy(dst, src, bytes, kinds[kind]));
}

void rt_memcpy(void *dst, const void *src, size_t bytes, rt_copy kind)
{
    copy(dst, src, bytes, kind, 0);
}

void rt_memcpy_async(void *dst, const void *src, size_t bytes, rt_copy kind)
{
    copy(dst, src, bytes, kind, 1);
}

void rt_memset0(void *p, size_t bytes)
{
    if (bytes)
        RT_CUDA(cudaMemset(p, 0, bytes));
}

void *rt_host_malloc(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 64);
    if (e != cudaSuccess)
        rt__die("out of pinned host memory: rt_host_malloc(%zu): %s", bytes,
                cudaGetErrorString(e));
    memset(p, 0, bytes);
    return p;
}

void rt_host_free(void *p)
{
    if (p)
        RT_CUDA(cudaFreeHost(p));
}

/* -- GEMM ------------------------------------------------------------------------------------ */

/* C = beta * C in C's dtype (k == 0 or alpha == 0); beta == 0 writes zeros without reading C. */
__global__ void scale_kernel(float *C, int m, int n, int ldc, long sC, int batch, float beta)
{
    long total = (long)m * n * batch;
    for (long x = blockIdx.x * (long)blockDim.x + threadIdx.x; x < total;
         x += (long)gridDim.x * blockDim.x) {
        long b = x / ((long)m * n), r = x % ((long)m * n);
        float *c = C + b * sC + (r / n) * (long)ldc + r % n;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

__global__ void scale_bf16_kernel(__nv_bfloat16 *C, int m, int n, int ldc, long sC, int batch,
                                  float beta)
{
    long total = (long)m * n * batch;
    for (long x = blockIdx.x * (long)blockDim.x + threadIdx.x; x < total;
         x += (long)gridDim.x * blockDim.x) {
        long b = x / ((long)m * n), r = x % ((long)m * n);
        __nv_bfloat16 *c = C + b * sC + (r / n) * (long)ldc + r % n;
        *c = __float2bfloat16_rn(beta == 0.0f ? 0.0f : beta * __bfloat162float(*c));
    }
}

/* C (rows x cols at ldc, bf16) = bf16(t + beta * C), t packed f32 (row stride cols): one
** rounding, to nearest even. */
__global__ void round_bf16_kernel(const float *t, __nv_bfloat16 *C, int rows, int cols, int ldc,
                                  float beta)
{
    long total = (long)rows * cols;
    for (long x = blockIdx.x * (long)blockDim.x + threadIdx.x; x < total;
         x += (long)gridDim.x * blockDim.x) {
        __nv_bfloat16 *c = C + (x / cols) * (long)ldc + x % cols;
        float v = t[x];
        if (beta != 0.0f)
            v += beta * __bfloat162float(*c);
        *c = __float2bfloat16_rn(v);
    }
}

static int grid_for(long total)
{
    return (int)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
}

/* A bf16 C through f32 staging: f32 results (alpha op(A) op(B), inputs of type 'in', elements
** of 'size' bytes) into the staging buffer, a block of rows (and columns, for very wide C) of
** one batch item at a time, then bf16(t + beta C) rounded once into C. For f32 inputs (cuBLAS
** has no such GEMM), and for bf16 inputs with beta != 0: there cuBLAS's kernels round the
** product to bf16 before adding beta C (seen on an H200, CUDA 13: off by one bf16 step from
** the single rounding rt.h promises). */
static void gemm_staged_bf16(int ta, int tb, int m, int n, int k, float alpha, const void *A,
                             int lda, long sA, const void *B, int ldb, long sB, float beta,
                             __nv_bfloat16 *C, int ldc, long sC, int batch, cudaDataType_t in,
                             size_t size)
{
    const float zero = 0.0f;
    long cap = (long)(RT_CUDA_STAGE_BYTES / sizeof(float));
    int cols = n < cap ? n : (int)cap;
    int rows = (int)(cap / cols < m ? cap / cols : m);
    for (int b = 0; b < batch; b++)
        for (int i0 = 0; i0 < m; i0 += rows)
            for (int j0 = 0; j0 < n; j0 += cols) {
                int mr = m - i0 < rows ? m - i0 : rows, nc = n - j0 < cols ? n - j0 : cols;
                const char *Ap = (const char *)A +
                                 (b * sA + (ta ? (long)i0 : (long)i0 * lda)) * (long)size;
                const char *Bp = (const char *)B +
                                 (b * sB + (tb ? (long)j0 * ldb : (long)j0)) * (long)size;
                RT_CUBLAS(cublasGemmEx(cu.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       ta ? CUBLAS_OP_T : CUBLAS_OP_N, nc, mr, k, &alpha,
                                       Bp, in, ldb, Ap, in, lda, &zero,
                                       cu.gemm_stage, CUDA_R_32F, nc, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
                KERNEL_LAUNCH(grid_for((long)mr * nc), 256, 0, round_bf16_kernel)(
                    cu.gemm_stage, C + b * sC + (long)i0 * ldc + j0, mr, nc, ldc, beta);
                RT_CUDA(cudaGetLastError());
            }
}

/*
** rt.h's row-major GEMM as cuBLAS's column-major C^T = op(B)^T op(A)^T: one
** cublasGemmStridedBatchedEx with f32 or bf16 inputs, an f32 or bf16 C and CUBLAS_COMPUTE_32F
** (the handle's default math mode never substitutes TF32; alpha * acc + beta * C is formed in
** f32 and rounded once to C's type). A bf16 C goes through f32 staging where its inputs are f32
** or beta is not 0 (gemm_staged_bf16).
*/
void rt_gemm(int ta, int tb, int m, int n, int k, float alpha,
             const void *A, int lda, long sA, const void *B, int ldb, long sB,
             float beta, void *C, int ldc, long sC, int batch, rt_dtype ab, rt_dtype c)
{
    int what = rt__gemm_check(ta, tb, m, n, k, alpha, A, lda, B, ldb, C, ldc, batch, ab, c);
    if (what == RT__GEMM_NONE)
        return;
    if (what == RT__GEMM_SCALE) {
        int blocks = grid_for((long)m * n * batch);
        if (c == RT_BF16)
            KERNEL_LAUNCH(blocks, 256, 0, scale_bf16_kernel)((__nv_bfloat16 *)C, m, n, ldc, sC,
                                                             batch, beta);
        else
            KERNEL_LAUNCH(blocks, 256, 0, scale_kernel)((float *)C, m, n, ldc, sC, batch, beta);
        RT_CUDA(cudaGetLastError());
        return;
    }
    if (c == RT_BF16 && (ab == RT_F32 || beta != 0.0f)) {
        gemm_staged_bf16(ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta,
                         (__nv_bfloat16 *)C, ldc, sC, batch,
                         ab == RT_BF16 ? CUDA_R_16BF : CUDA_R_32F, rt_dtype_size(ab));
        return;
    }
    cudaDataType_t in = ab == RT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType_t out = c == RT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    RT_CUBLAS(cublasGemmStridedBatchedEx(cu.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
                                         B, in, ldb, (long long)sB, A, in, lda, (long long)sA,
                                         &beta, C, out, ldc, (long long)sC, batch,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* The largest power of two up to 256 that divides p's address */
static uint32_t lt_align(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a != 0)
        a /= 2;
    return a;
}

/*
** rt.h's fused GEMM as one cublasLtMatmul, in the column-major form of rt_gemm above (D^T =
** op(B)^T op(A)^T: cuBLASLt's A is ours B): D has n rows (the bias's length, one value per row
** as cuBLASLt's epilogues broadcast it) and m columns at ldc, and the aux matrix (the GELU's
** input) the same shape and leading dimension. Compute and scale types f32 (no TF32); bias
** and aux of D's type. It shares cuBLAS's workspace (one stream: the calls never overlap).
** The heuristic is told the pointers' alignments (it assumes 256 bytes otherwise, and an
** algorithm chosen so may fail on a buffer at an offset of the memory plan). cuBLASLt returns
** no algorithm for some shapes and alignments: then 0, and the caller runs the unfused
** kernels.
*/
int rt_gemm_epi(int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
                int ldb, void *C, int ldc, rt_epilogue epi, const void *bias, void *aux,
                rt_dtype t)
{
    RT_CHECK(epi == RT_EPI_BIAS || epi == RT_EPI_GELU || epi == RT_EPI_DGELU,
             "rt_gemm_epi: epilogue %d", (int)epi);
    RT_CHECK(epi != RT_EPI_BIAS || bias, "rt_gemm_epi: RT_EPI_BIAS without a bias");
    RT_CHECK(epi == RT_EPI_BIAS || aux, "rt_gemm_epi: RT_EPI_%s without aux",
             epi == RT_EPI_GELU ? "GELU" : "DGELU");
    if (rt__gemm_check(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, C, ldc, 1, t, t) != RT__GEMM_FULL)
        return 0;
    if (epi != RT_EPI_BIAS && ldc % 8 != 0)
        return 0;
    cudaDataType_t dt = t == RT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    int32_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int32_t type = dt;
    uint32_t e = epi == RT_EPI_BIAS ? CUBLASLT_EPILOGUE_BIAS
               : epi == RT_EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
               : bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    int64_t aux_ld = ldc;
    uint64_t ws = RT_CUDA_WORKSPACE_BYTES;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    RT_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (bias) {
        RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                 sizeof bias));
        RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                 &type, sizeof type));
    }
    if (epi != RT_EPI_BIAS) {
        RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                 &aux, sizeof aux));
        RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                 &aux_ld, sizeof aux_ld));
        RT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                 &type, sizeof type));
    }
    RT_CUBLAS(cublasLtMatrixLayoutCreate(&la, dt, tb ? k : n, tb ? n : k, ldb));
    RT_CUBLAS(cublasLtMatrixLayoutCreate(&lb, dt, ta ? m : k, ta ? k : m, lda));
    RT_CUBLAS(cublasLtMatrixLayoutCreate(&lc, dt, n, m, ldc));
    RT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    RT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof ws));
    /* the alignments the pointers have (the heuristic assumes 256 bytes otherwise) */
    uint32_t align[3] = { lt_align(B), lt_align(A), lt_align(C) };
    RT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                   &align[0], sizeof align[0]));
    RT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                   &align[1], sizeof align[1]));
    RT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                   &align[2], sizeof align[2]));
    RT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                   &align[2], sizeof align[2]));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cu.lt, desc, la, lb, lc, lc, pref, 1, &h,
                                                       &found);
    int done = 0;
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        const float one = 1.0f, zero = 0.0f;
        st = cublasLtMatmul(cu.lt, desc, &one, B, la, A, lb, &zero, C, lc, C, lc, &h.algo,
                            cu.workspace, RT_CUDA_WORKSPACE_BYTES, 0);
        done = st == CUBLAS_STATUS_SUCCESS;
        /* refused after its own heuristic chose the algorithm: the unfused kernels do it (a
        ** fault on the device is sticky, and the next CUDA call ends the job) */
        if (!done && !cu.lt_warned) {
            cu.lt_warned = 1;
            rt_log("warning: cuBLASLt refused a matmul with epilogue %u (m %d, n %d, k %d, %s): "
                   "%s; the unfused kernels run instead (said once)", e, m, n, k,
                   rt_dtype_name(t), cublasGetStatusName(st));
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(desc);
    return done;
}

/* The CPU backend's primitive cache has no counterpart here. */
void rt_gemm_cache_stats(long *created, int *cached)
{
    *created = 0;
    *cached = 0;
}

/* -- Randomness ------------------------------------------------------------------------------ */

__global__ void rng_kernel(float *dst, int rows, int cols, int ld, uint64_t seed,
                           uint64_t stream, uint64_t first, uint64_t gld, float mean, float std)
{
    long total = (long)rows * cols;
    for (long x = blockIdx.x * (long)blockDim.x + threadIdx.x; x < total;
         x += (long)gridDim.x * blockDim.x) {
        long i = x / cols, j = x % cols;
        double z = rt__normal_at(seed, stream, first + (uint64_t)i * gld + (uint64_t)j);
        dst[i * (long)ld + j] = (float)((double)mean + (double)std * z);
    }
}

void rt_rng_normal(float *dst, int rows, int cols, int ld, uint64_t seed, uint64_t stream,
                   uint64_t first, uint64_t gld, float mean, float std)
{
    RT_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "rt_rng_normal: rows %d, cols %d, ld %d",
             rows, cols, ld);
    if (rows == 0 || cols == 0)
        return;
    RT_CHECK(dst, "rt_rng_normal: NULL dst");
    long total = (long)rows * cols;
    int blocks = (int)((total + 255) / 256 < 8192 ? (total + 255) / 256 : 8192);
    KERNEL_LAUNCH(blocks, 256, 0, rng_kernel)(dst, rows, cols, ld, seed, stream, first, gld, mean,
                                              std);
    RT_CUDA(cudaGetLastError());
}
