/*
** rt.h: the thin runtime under the training library and the generated programs. One header,
** two backends chosen at link time: build/librt_cpu.a (host memory, oneDNN and OpenBLAS, MPI) or
** build/librt_cuda.a (CUDA memory, cuBLAS, NCCL or MPI transport, MPI bootstrap). Callers
** include only this header and never ask which backend they run on. The runtime knows nothing
** about models. Layers, each calling only the ones below it: rt_common.c (log, failure text,
** watchdog, thread pool, scratch, trace; no MPI, no device) <- rt_mpi.c (MPI: start-up, groups,
** host collectives and p2p, ending the job; or rt_single.c, the same for a world of one rank
** without MPI: build/librt_cpu_single.a, build/librt_cuda_single.a) <- rt_cpu.c / rt_cuda.cu
** (memory, GEMM, collectives on device buffers, random numbers). What only the runtime's own
** tests need is in rt_internal.h.
**
** Linking (make variables from runtime/runtime.mk; compile with -Iruntime):
**   CPU : $(MPICC) prog.o $(RT_CPU_LIBS)     = -Lbuild -lrt_cpu <openblas> -ldnnl -lgomp ...
**   CUDA: $(MPICC) prog.o kernels.o $(RT_CUDA_LIBS)   (cudart, cublasLt, cublas, nccl, stdc++)
**
** Threads: every rt_ function is called from the main thread, except rt_gemm (CPU backend),
** rt_parallel_for, rt_log, rt_now, rt_fail, RT_CHECK and the rt_dtype_size / rt_fnv1a64
** helpers, which may also be called from inside an rt_parallel_for body. The runtime itself
** runs a watchdog thread and the pool's workers (MPI is initialised with MPI_THREAD_MULTIPLE so
** the watchdog may call MPI_Abort).
*/
#ifndef RT_H
#define RT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* -- Types ------------------------------------------------------------------------------- */

/* ORDER RT_DTYPE: name, printable name, size in bytes. */
#define RT_DTYPES(_) _(F32, "f32", 4) _(BF16, "bf16", 2) _(I32, "i32", 4) _(I64, "i64", 8)
typedef enum {
#define RT_DT_ENUM(name, str, size) RT_##name,
    RT_DTYPES(RT_DT_ENUM)
#undef RT_DT_ENUM
    RT_NDTYPES
} rt_dtype;

size_t      rt_dtype_size(rt_dtype t);      /* bytes; an invalid value aborts */

typedef enum { RT_SUM, RT_MAX } rt_op;

/* A communicator over some ranks (tp, dp, pp, ...). Opaque. */
typedef struct rt_group rt_group;

/* -- Launch and identity ------------------------------------------------------------------ */

/* Start the runtime (MPI, device, thread pool, watchdog settings). 'expected_world' is the
** world size the program was generated for and 'layout' its description ("tp8 pp8 dp1"); a
** different launch size prints, on rank 0 only, "[rank 0/8] built for 64 ranks (tp8 pp8 dp1),
** launched with 8" and every rank exits with status 1. expected_world <= 0 accepts any size.
** Works without mpirun (one rank). CUDA: one GPU per rank, local rank modulo the device
** count; kernels (the runtime's and generated ones) on the legacy default stream, the compute
** stream; each NCCL communicator's operations on a communication stream of its own (see
** "Asynchronous communication"); transport NCCL, or MPI through pinned host staging when
** RT_TRANSPORT=mpi or when two ranks drive the same GPU (same device UUID; NCCL refuses that).
** Environment: RT_TIMEOUT (watchdog seconds, default 300, 0 = off), RT_THREADS (CPU pool
** size, see rt_threads), RT_TRANSPORT=nccl|mpi (CUDA only), RT_TRACE and RT_TRACE_TIMES (see
** "Trace" below).
** A process that exits after rt_init without rt_finalize (exit(), return from main) aborts
** the whole job with "[rank r/w] exited without rt_finalize". */
void        rt_init(int *argc, char ***argv, int expected_world, const char *layout);
/* Waits (watchdog-guarded) until every rank arrives, frees everything, ends MPI. */
void        rt_finalize(void);
int         rt_rank(void);
int         rt_world(void);
int         rt_local_rank(void);             /* rank among the processes on this node */
const char *rt_backend(void);                /* "cpu", "cuda-nccl" or "cuda-mpi" */

/* -- Groups ------------------------------------------------------------------------------- */

/* A communicator of one kind (tp, dp-cp, pp, ...). Collective over the whole world: every rank
** calls it once per kind, in the same order, with the members (global ranks, in group-rank
** order) of its own group of that kind, or n = 0 when it is in no group of that kind (embd on
** a middle stage; members may then be NULL), and gets its group, or NULL. Scale-free: a rank
** passes its own group only. Checked: every listed rank is in the world, none twice, the
** caller among them; every member passed the same list (else all abort, naming the group and
** the caller's list). 'name' is copied (messages, watchdog, trace). n = 1 gives a valid group
** of one member. Call it for each kind at start; groups live until rt_finalize. */
rt_group   *rt_group_create(const char *name, const int *members, int n);
rt_group   *rt_group_world(void);                            /* all ranks, name "world" */
int         rt_group_rank(const rt_group *g);                /* position inside the group */
int         rt_group_size(const rt_group *g);
const char *rt_group_name(const rt_group *g);
const int  *rt_group_members(const rt_group *g);             /* global ranks, by group rank */

/* -- Collectives -------------------------------------------------------------------------- */

/* Blocking and watchdog-guarded; buffers are device memory on CUDA. Every member calls with
** the same n, t, op and root. n = 0 returns at once on every member (no communication), so
** it is a no-op that cannot hang. Reductions: on the MPI paths (CPU, cuda-mpi) every member
** reduces its share of the data in group-rank order, ((x0 + x1) + x2) + ..., in f32 for f32 and
** for bf16 (bf16 -> f32 exactly, one rounding back to bf16, to nearest even; NaN stays NaN),
** whatever MPI's algorithms, so the bits depend on the values and the member count only
** (rt_mpi.c); NCCL reduces in its own order (bf16 natively, rounding at each step). All
** members get the same bits, and each call gives the bits of its asynchronous form (below).
** i32/i64 sums wrap as two's complement (MPI/NCCL semantics). On the MPI paths allreduce,
** allgather, reduce-scatter, broadcast and p2p move any size; the counts and displacements of
** alltoallv must fit in an int (2^31-1 elements), else the call aborts saying so. */
void rt_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g);    /* in place */
/* recv[size * n]: block i (n elements) is member i's send[n]. send may be recv + rank*n
** (in place); other overlaps are not allowed. */
void rt_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g);
/* send[size * n] (block i destined for member i), recv[n] = sum over members of block
** rank(g). recv may be send + rank*n (in place; the other blocks of send are left as they
** were); other overlaps abort. Pad tensors whose length is not a multiple of the group size. */
void rt_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g);
/* Counts and displacements in elements, indexed by group rank; any count may be 0. Member
** i's scounts[j] must equal member j's rcounts[i]. */
void rt_alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                  void *recv, const size_t *rcounts, const size_t *rdispls,
                  rt_dtype t, rt_group *g);
/* The even case: block i (n elements) of send[size * n] to member i, member i's block into
** recv + i*n. send and recv must not overlap. */
void rt_alltoall(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g);
void rt_barrier(rt_group *g);                                                /* NULL: world */

/* -- Point-to-point: all ops posted together and completed together ----------------------- */

/* Watchdog-guarded. Peers are global ranks (self allowed). Messages are matched per
** (sender, receiver, tag) in the order they appear in each side's ops (and, across requests in
** flight, in start order); receive counts must equal send counts. Tags (0 .. 32767) keep two
** kinds of message between the same pair apart (pipeline activations and gradients when
** prev == next); on NCCL, which has no tags, each side posts its ops sorted by (peer, tag), so
** the same rule holds as long as a call carries at most one message per (peer, tag,
** direction). A simultaneous exchange (both sides send and receive in one call) cannot
** deadlock. rt_p2p_start is its asynchronous form (below). */
typedef struct {
    int         send;       /* 1 send, 0 receive */
    void       *buf;
    size_t      n;          /* elements; 0 allowed (still matched) */
    rt_dtype    t;
    int         peer;       /* global rank */
    int         tag;        /* message kind, 0 .. 32767 */
} rt_p2p_op;

void rt_p2p(const rt_p2p_op *ops, int nops);

/* -- Asynchronous communication: start, progress, wait -------------------------------------- */

/* A communication in flight: started by an rt_*_start call, completed and freed by rt_wait.
** Opaque; the caller holds it until then.
**
** Starts. rt_allreduce_start, rt_allgather_start and rt_reduce_scatter_start take the
** arguments of the blocking calls with their semantics (in-place forms, dtypes, n = 0) and give
** their bits: on every backend each blocking collective is its start followed by rt_wait, so a
** program computes the same whether it overlaps its communication or not. rt_p2p_start posts
** one rt_p2p call's ops. A start checks its arguments at once (a NULL group, a bad dtype or
** peer aborts there) and never waits for another rank. n = 0, a group of one member or no ops
** give a request that is complete already; it is still waited (and traced).
**
** Buffers. Until rt_wait returns, a send buffer (a collective's input, a p2p send) must not be
** written and a receive buffer (a collective's output, which for allreduce and the in-place
** forms is also its input; a p2p receive) neither read nor written -- on CUDA by kernels or by
** the host; the runtime reads and writes them at any time in between.
**
** Order. Several requests may be in flight, on one group and on several. The members of a
** group start its collectives in the same order (MPI's and NCCL's rule), a blocking collective
** counting as its start followed by its wait, so a blocking call made while requests are
** pending comes after them in its group's order; p2p messages are matched as rt_p2p says.
** Requests may be waited in any order. Progress: data move only inside runtime calls on the
** MPI paths (Open MPI has no progress thread), and the reductions of pending collectives are
** done by this rank's main thread: rt_wait, rt_progress and every blocking call take every
** pending request as far as it goes, but rt_alltoallv (MPI_Alltoallv), which moves their data
** and takes their steps only after it returns. Call rt_progress between kernels (every
** millisecond or so of compute) to overlap; without it a request still completes in its
** rt_wait. CUDA with NCCL: a start orders the operation after the work enqueued on the compute
** stream (an event) and enqueues it on its communicator's communication stream, which carries
** all of that communicator's operations, blocking ones too, in call order; NCCL then runs them
** on its own, and rt_progress only serves the MPI transport. NCCL runs one communicator's
** operations one after another, so p2p requests (all on the world communicator) run in start
** order: each must be able to complete given those started before it on every rank -- post
** both directions of an exchange in one request (Megatron's batched isend/irecv); the MPI
** paths match messages across requests and need not.
**
** Completion. rt_wait(r) returns when r is complete, its receive buffers holding the results
** (CUDA: the host waits for the operation's event and the compute stream is ordered after it),
** and frees r; NULL does nothing. It is watchdog-guarded like a blocking call, its time
** counted from its entry. Each request is waited exactly once: rt_finalize, and rt_group_free
** for the requests on its group, abort naming the oldest request not waited.
** Memory: the MPI paths receive a reduction's blocks into host scratch, at most 4 MiB per
** pending request, kept in a pool for later requests; the CUDA MPI transport stages each
** request's buffers in pinned host memory, also pooled. */
typedef struct rt_req rt_req;

rt_req *rt_allreduce_start(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g);
rt_req *rt_allgather_start(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g);
rt_req *rt_reduce_scatter_start(const void *send, void *recv, size_t n, rt_dtype t,
                                rt_group *g);
rt_req *rt_p2p_start(const rt_p2p_op *ops, int nops);
void    rt_wait(rt_req *r);
void    rt_progress(void);
/* Communication time of this rank since rt_init, wall seconds on the main thread: *blocked in
** blocking communication calls and rt_wait (the communication the rank waited for: exposed),
** *inside in every communication call (blocked, plus the starts and rt_progress, where the MPI
** paths do the reductions and copies of pending requests). Either may be NULL. Two clock
** reads per call; read it per step (without RT_TRACE) to measure exposed communication. */
void    rt_comm_stats(double *blocked, double *inside);

/* -- Compute ------------------------------------------------------------------------------ */

/* Row-major: C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, for 'batch' matrices at
** strides sA, sB, sC (elements; batch item b uses A + b*sA, ...; a stride may be 0: a shared
** operand). ta/tb: 0 = as stored, 1 = transposed. Storage: ta=0: A is m x k with row stride
** lda >= k; ta=1: A is k x m, lda >= m. tb=0: B is k x n, ldb >= n; tb=1: B is n x k,
** ldb >= k. C is m x n, ldc >= n. A and B have dtype 'ab' (RT_F32 or RT_BF16), C dtype 'c'
** (RT_F32 or RT_BF16), any of the four pairs. Accumulation in f32 (bf16 inputs widened
** exactly; cuBLAS f32 uses no TF32); the old C is read in its dtype (bf16 widened exactly);
** alpha * sum + beta * C_old is formed in f32 and rounded once to c (bf16: round to nearest
** even, NaN stays NaN, overflow gives infinity). beta = 0 ignores C's old contents (NaN too).
** m, n, k, batch = 0 are allowed (k = 0 or alpha = 0: C = beta * C, rounded as above).
** Exception: with bf16 inputs, the CPU backend on CPUs with AVX512_BF16 (oneDNN uses its
** dot-product instructions) treats subnormal inputs (|x| < 2^-126) as zero and flushes
** subnormal products and sums to zero (measured); f32 inputs keep subnormals.
** CPU: oneDNN matmul (OpenBLAS for f32 parts under 1.5 MFLOP, where it is faster),
** split into parts (batch items x blocks of 128 rows, or of 256 columns when m is small) that
** depend on the shape alone and run on the rt_threads() pool; called inside an
** rt_parallel_for body the parts run in turn on the calling thread. Every element of a part is
** computed the same way wherever the part runs, so the result is bit-identical for any
** RT_THREADS and whether or not the call is nested (tests/runtime checks 1, 2 and 3 threads).
** Calls with different shapes may round differently (a row's values may differ in the last
** bit between a 100-row and a 300-row call). CUDA: one cuBLAS call (f32 inputs with a bf16
** C go through f32 staging, RT_CUDA_STAGE_BYTES at a time). */
void rt_gemm(int ta, int tb, int m, int n, int k, float alpha,
             const void *A, int lda, long sA, const void *B, int ldb, long sB,
             float beta, void *C, int ldc, long sC, int batch, rt_dtype ab, rt_dtype c);

/* rt_gemm_epi: C = epi(op(A) op(B)) for one product of one type t (f32 or bf16 A, B, C, bias
** and aux; alpha 1, beta 0, batch 1), as the backend's fused GEMM where it has one:
**   RT_EPI_BIAS       C = A.B + bias                    (bias: n values)
**   RT_EPI_GELU       aux = A.B + bias; C = gelu(aux)   (bias may be NULL; aux: m x n at ldc)
**   RT_EPI_DGELU      C = A.B * gelu'(aux)              (aux: m x n at ldc, read)
** gelu is GPT-2's tanh form; the sums, the bias and the GELU in f32, each result rounded once
** to t. Returns 1 when it is done, 0 when this backend or this call has no fused form: the CPU
** backend (its kernels then run as before, the same bits); CUDA without a cuBLASLt algorithm
** for the shape, or an aux leading dimension that is not a multiple of 8, or a matmul cuBLASLt
** refuses (a warning on stderr, the first time). On 0 nothing was
** written: the caller computes the same with rt_gemm and its kernels. CUDA: cuBLASLt's
** epilogues (CUBLASLT_EPILOGUE_BIAS, _GELU_AUX(_BIAS), _DGELU). */
typedef enum { RT_EPI_BIAS = 1, RT_EPI_GELU, RT_EPI_DGELU } rt_epilogue;
int  rt_gemm_epi(int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
                 int ldb, void *C, int ldc, rt_epilogue epi, const void *bias, void *aux,
                 rt_dtype t);
void rt_sync(void);                  /* wait for the device (cudaDeviceSynchronize); CPU: no-op */

/* -- CPU threads -------------------------------------------------------------------------- */

/* One pool owns this rank's cores; oneDNN and OpenBLAS are each held to one thread per
** calling thread and never spin beside it (rt_gemm runs its parts as single-threaded library
** calls on the pool: as fast as oneDNN's own OpenMP threads at GPT-2 shapes, and nothing else
** spins while the pool runs elementwise loops; see runtime/rt_cpu.c and bench/). The CPU
** runtime sets OpenMP's thread count to 1 on every thread that calls rt_gemm (OpenMP is
** oneDNN's threading runtime): generated code does not use OpenMP.
** Size: RT_THREADS if set (capped, with a warning, to the online CPUs), else the CPUs in this
** process's affinity mask (when the launcher bound it), else the online CPUs divided by the
** ranks on this node; at least 1. Note that
** OpenMPI's mpirun binds each rank to one core by default when np <= 2: give a rank several
** cores with --bind-to none or --map-by slot:PE=N.
** rt_parallel_for splits [0, n) into at most rt_threads() contiguous ranges of near-equal
** size and calls fn(ctx, lo, hi) once per nonempty range, concurrently (the caller runs one
** range); it returns when all are done. Nested calls (from inside fn) run fn(ctx, 0, n)
** inline. n <= 0 does nothing. Dispatch costs ~1 us while the workers spin (they spin 1 ms
** after each job, then sleep; waking them costs 25-60 us): give each range at least ~10 us
** of work (e.g. parallelise over rows, or over (batch, head) with rt_gemm inside). */
int  rt_threads(void);
void rt_parallel_for(int n, void (*fn)(void *ctx, int lo, int hi), void *ctx);

/* -- Memory ------------------------------------------------------------------------------- */

typedef enum { RT_H2D, RT_D2H, RT_D2D, RT_H2H } rt_copy;

/* Device memory (host on CPU), zero-filled, 256-byte aligned; aborts naming the size on OOM.
** rt_free of a pointer rt_malloc did not return (or returned and was freed) aborts. */
void *rt_malloc(size_t bytes);
void  rt_free(void *p);              /* NULL: no-op */
/* Device bytes held now and the most held at once since rt_init: the bytes requested from
** rt_malloc (exactly those: alignment padding and the 256 bytes a 0-byte request gets are not
** counted, so a memory plan can predict the numbers) plus the runtime's own device
** workspaces, allocated at rt_init and counted the same way:
**   CUDA: RT_CUDA_WORKSPACE_BYTES, cuBLAS's workspace, installed with cublasSetWorkspace so
**         cuBLAS never allocates device memory of its own, and RT_CUDA_STAGE_BYTES, the f32
**         staging of GEMMs with f32 inputs and a bf16 C (cuBLAS has no such GEMM).
**   CPU:  none. Its host scratch, reused, is ordinary host memory outside the plan: the
**         communication scratch of pending requests (above: 4 MiB per reduction; an
**         allgather whose send overlaps recv: a copy of send) and GEMM
**         scratch (oneDNN's scratchpad, under 1 MiB at GPT-2 shapes; for f32 inputs with a
**         bf16 C, one part of C in f32: up to 128 rows, or 256 columns).
** Not counted on CUDA: the CUDA context, and NCCL's buffers, which NCCL allocates itself:
** per communicator about channels x peers x NCCL_BUFFSIZE (4 MiB by default) for its simple
** protocol plus smaller LL and LL128 buffers (a ring allreduce on 8 GPUs with 2 channels: 2 x 2
** neighbours x 4 MiB = 16 MiB), and NCCL's own state. Callable from the main thread. */
void  rt_mem_stats(size_t *live, size_t *peak);
#define RT_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)   /* cuBLAS's recommendation for Hopper */
#define RT_CUDA_STAGE_BYTES     ((size_t)4 << 20)
/* That workspace (CUDA: RT_CUDA_WORKSPACE_BYTES in *bytes; CPU: NULL and 0). cuBLAS uses it
** only during its calls, all on the kernels' stream, so another library may use it between them
** on that stream (lib/attn_cudnn.cu: cuDNN's, which then needs no memory outside the plan). */
void *rt_workspace(size_t *bytes);
void  rt_memcpy(void *dst, const void *src, size_t bytes, rt_copy kind);  /* synchronous */
/* The same copy in stream order with the kernels, the host not waiting for them (CUDA:
** cudaMemcpyAsync on the kernels' stream; CPU: at once). src must keep its bytes until the next
** rt_sync. From pinned host memory (rt_host_malloc) an H2D copy does not stop the host; from
** pageable memory CUDA still waits for the kernels before it. */
void  rt_memcpy_async(void *dst, const void *src, size_t bytes, rt_copy kind);
/* Host memory for rt_memcpy_async's copies: zero-filled; pinned on CUDA; aborts on OOM. */
void *rt_host_malloc(size_t bytes);
void  rt_host_free(void *p);
void  rt_memset0(void *p, size_t bytes);

/* -- Randomness (Philox-4x32-10, counter based) ------------------------------------------- */

/* dst (f32, device) gets rows x cols values at row stride ld: element (i, j) is
** mean + std * z(seed, stream, first + i*gld + j), where for a 64-bit global index x:
**   counter = { lo32(x), hi32(x), lo32(stream), hi32(stream) },  key = { lo32(seed), hi32(seed) }
**   (r0, r1, r2, r3) = Philox-4x32-10(counter, key)      (Random123's philox4x32_10, whose
**                                                          published known answers it matches)
**   u1 = (r0 + 1) / 2^32  in (0, 1],   u2 = r1 / 2^32  in [0, 1)
**   z  = sqrt(-2 ln u1) * cos(2 pi u2)                    (Box-Muller, cosine branch only)
** evaluated in double and rounded once to f32 (r2, r3 are unused). The value depends on
** (seed, stream, index) only, so every layout draws the same model; the CUDA kernel computes
** the same formula (results agree with the CPU to the last bit but for rare 1-ulp cases from
** the device's double log/cos). 'stream' is rt_fnv1a64 of the tensor's global name. */
void     rt_rng_normal(float *dst, int rows, int cols, int ld, uint64_t seed, uint64_t stream,
                       uint64_t first, uint64_t gld, float mean, float std);
/* FNV-1a 64 over the bytes of s (no terminator): offset 0xcbf29ce484222325, prime
** 0x100000001b3. The generator emits the same value as a constant. */
uint64_t rt_fnv1a64(const char *s);

/* -- Failure, watchdog, log, time --------------------------------------------------------- */

#ifdef __GNUC__
#define RT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define RT_NORETURN __attribute__((noreturn))
#else
#define RT_PRINTF(a, b)
#define RT_NORETURN
#endif

/* Print "[rank r/w] file:line: message" on stderr and abort the whole job (never returns).
** rt_abort: ncclCommAbort on every NCCL communicator, then MPI_Abort (exit(1) before
** rt_init; the prefix is then "[rank ?/?]"). A second failure while aborting (another thread)
** just waits to be killed. */
void rt_fail(const char *file, int line, const char *fmt, ...) RT_PRINTF(3, 4) RT_NORETURN;
void rt_abort(void) RT_NORETURN;
#define RT_CHECK(cond, ...) \
    do { if (!(cond)) rt_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)

/* Status checks for the four libraries; each status type has 0 = success. On failure print
** "[rank r/w] file:line: NCCL error: <library's text> (ncclAllReduce)" and abort. The CUDA
** kinds need the CUDA backend for their text (the CPU backend prints the number). */
#define RT_ERR_KINDS(_) _(MPI, "MPI") _(CUDA, "CUDA") _(CUBLAS, "cuBLAS") _(NCCL, "NCCL")
typedef enum {
#define RT_ERR_ENUM(name, str) RT_ERR_##name,
    RT_ERR_KINDS(RT_ERR_ENUM)
#undef RT_ERR_ENUM
    RT_NERR_KINDS
} rt_err_kind;
void rt_fail_status(const char *file, int line, rt_err_kind kind, int status,
                    const char *expr) RT_NORETURN;
#define RT_STATUS_(kind, x) \
    do { int rt_s_ = (int)(x); \
         if (rt_s_ != 0) rt_fail_status(__FILE__, __LINE__, kind, rt_s_, #x); } while (0)
#define RT_MPI(x)    RT_STATUS_(RT_ERR_MPI, x)
#define RT_CUDA(x)   RT_STATUS_(RT_ERR_CUDA, x)
#define RT_CUBLAS(x) RT_STATUS_(RT_ERR_CUBLAS, x)
#define RT_NCCL(x)   RT_STATUS_(RT_ERR_NCCL, x)

/* Watchdog: every collective, p2p transfer, barrier, rt_wait and NCCL call has a deadline.
** On the MPI paths allreduce, allgather, reduce-scatter, p2p and barriers are requests (blocking
** calls a start and a wait) completed by a polling loop (spin, then sched_yield, then short
** sleeps) that checks it; MPI_Alltoallv and MPI_Bcast, and NCCL calls plus their completion,
** are armed on a watchdog thread that checks every 50 ms. On expiry the job aborts with
** "[rank r/w] watchdog: allreduce on group tp (ranks 0,1) did not complete within 5 s
** (waiting for rank 1)", naming the members not heard from where the MPI layer knows them
** (p2p: "watchdog: p2p (recv 10 f32 from rank 1 tag 0) did not complete within 5 s", naming
** the pending ops); on CUDA every NCCL communicator is aborted first. Default 300 s or env
** RT_TIMEOUT, read by rt_init; this call overrides both; 0 = off. A rank that dies makes its
** peers' pending calls expire (mpirun usually ends the job sooner). */
void   rt_set_timeout(double seconds);
void   rt_log(const char *fmt, ...) RT_PRINTF(1, 2);   /* "[rank r/w] msg\n" on stderr */
double rt_now(void);                     /* monotonic seconds */

/* Trace: when RT_TRACE names a directory at rt_init, every rank writes
** RT_TRACE/rank_<r>.trace (r zero-padded to 5 digits), one line per communication call, in
** call order, on both backends alike (dtype: f32 bf16 i32 i64; group: its name, "world"):
**   allreduce <group> <n> <dtype> <sum|max>
**   allgather <group> <n> <dtype>            (n: elements per member)
**   reduce_scatter <group> <n> <dtype>       (n: elements per member)
**   alltoallv <group> <dtype>                (the counts vary with the data)
**   alltoall <group> <n> <dtype>             (n: elements per member)
**   barrier <group>
**   p2p send|recv <peer> <n> <dtype> <tag> ...   (every op of the call, in the order given)
** A start writes its blocking call's line followed by "start <id>", its request's number on
** this rank (1, 2, ... in start order), and rt_wait writes "wait <id> <op> [<group>]" (op:
** allreduce, allgather, reduce_scatter or p2p; no group for p2p); rt_progress writes nothing:
**   allreduce dp 4096 f32 sum start 3   ...   wait 3 allreduce dp
** With RT_TRACE_SITES=1 every line then ends with " at <file>+0x<offset>": where the call was
** made, the return address of the rt_ call in the executable or library that made it, minus its
** load address (addr2line -e <file> <offset - 1> names the source line of the call). With
** RT_TRACE_TIMES=1 the line of every blocking call and wait ends with " t=<seconds>", the wall
** time the rank was blocked in it (rt_comm_stats' *blocked, call by call); without either a
** trace depends on the program only, so two runs can be compared whole. The file is written
** whole by rt_finalize and flushed by an abort (a call in progress is its last line); the
** generator's tests compare it with the collectives the program declares (build/gen --dump
** program). Unset, the trace costs one branch per call. */

#ifdef __cplusplus
}
#endif
#endif
