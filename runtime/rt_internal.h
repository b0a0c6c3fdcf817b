/*
** rt_internal.h: what the runtime's own files share and its callers never see: process state,
** the group record, the MPI layer (host-buffer collectives with the polling watchdog,
** rt_mpi.c), the thread pool, scratch buffers and trace (rt_common.c), bf16 conversion, the
** hooks that let a lower layer reach a higher one without naming it, and the entry points only
** the runtime's tests use. Included by C11 and by nvcc (C++).
*/
#ifndef RT_INTERNAL_H
#define RT_INTERNAL_H

#include "rt.h"     // defines: rt_group, rt_dtype, rt_op, rt_p2p_op, rt_fail, RT_CHECK, ...

#ifdef RT_NO_MPI
/* The single-rank build (rt_single.c, -DRT_NO_MPI): no MPI header; a group's communicator is
** an opaque handle that stays NULL. */
typedef void *rt__comm;
#else
#define OMPI_SKIP_MPICXX 1      /* C bindings only, also under nvcc */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
typedef MPI_Comm rt__comm;
#endif
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* -- Process state (rt_common.c) ----------------------------------------------------------- */

typedef struct {
    int    rank, world;          /* -1 / 0 before rt_init */
    int    local_rank, local_size;
    int    inited;               /* rt_init finished its MPI part */
    int    finalized;            /* rt_finalize (or the wrong-size exit) ran */
    int    aborting;             /* set once by the first rt_abort (atomic) */
    double timeout;              /* watchdog seconds; 0 = off */
} rt__state;

extern rt__state rt__st;

/* Hooks, so that each layer calls only the layers below it:
** rt__end_job: how rt_fail and the watchdog end the job; the MPI layer sets it to rt_abort at
**   start (before that, a failure exits the process with status 1).
** rt__abort_hook: called by rt_abort before MPI_Abort (CUDA: ncclCommAbort everything).
** rt__status_hook: the text of a failed status of a CUDA-side library (the CUDA backend's). */
extern void (*rt__end_job)(void);
extern void (*rt__abort_hook)(void);
extern void (*rt__status_hook)(rt_err_kind kind, int status, char *buf, size_t len);

/* Format "[rank r/w] " into buf (returns its length). */
int  rt__prefix(char *buf, size_t len);
/* Print "[rank r/w] <msg>" then abort; used by the watchdogs and other named failures. */
void rt__die(const char *fmt, ...) RT_PRINTF(1, 2) RT_NORETURN;

/* -- Groups -------------------------------------------------------------------------------- */

struct rt_group {
    rt__comm comm;               /* this group's communicator (MPI_ERRORS_RETURN; single: NULL) */
    char     name[32];
    int      rank, size;         /* this rank's position, member count */
    int     *members;            /* global ranks by group rank */
    int      is_world;
    char     desc[128];          /* "group tp (ranks 0,1)" for messages */
    void    *dev;                /* backend data (CUDA: NCCL communicator) */
    unsigned long seq;           /* collectives started on it (the MPI layer's message tags) */
};

/* -- Shared by the two start-up layers (rt_common.c) --------------------------------------- */

/* The start-up layer is rt_mpi.c (MPI) or, in the single-rank libraries built with
** -DRT_NO_MPI, rt_single.c (one rank, no MPI); both implement the rt__mpi_ and rt__h_ entry
** points below, rt_abort, rt_fail_status and rt_group_free's lower half. */

void rt__read_timeout(void);                     /* RT_TIMEOUT -> rt__st.timeout (or dies) */
void rt__start_done(void);       /* RT_TRACE, watchdog thread, inited, exit guard (rt.h) */
void rt__finalize_done(void);    /* watchdog stop, world record freed, finalized, trace written */
void rt__abort_begin(void);      /* trace flushed, rt__abort_hook run once; other threads park */
/* "file:line: <kind> error: <text> (<function in expr>)" and abort; text NULL: from
** rt__status_hook (else the number). */
void rt__fail_status(const char *file, int line, rt_err_kind kind, int status,
                     const char *expr, const char *text) RT_NORETURN;

/* rt_group_create's checks on this rank (dies naming the problem); returns the caller's
** position in members (-1 when n is 0) and the smallest member in *lowest. */
int       rt__group_validate(const char *name, const int *members, int n, int *lowest);
/* A group record on 'comm' with a copy of the members and its description ("group tp (ranks
** 0,1)"); rank is the caller's to set. rt__group_release frees the record, not the comm. */
rt_group *rt__group_alloc(rt__comm comm, const char *name, const int *members, int size);
void      rt__group_release(rt_group *g);

/* -- MPI layer (rt_mpi.c; rt_single.c without MPI): host buffers only ---------------------- */

/* MPI_Init_thread(MULTIPLE), world check (exits on mismatch), local rank, atexit guard, env. */
void rt__mpi_init(int *argc, char ***argv, int expected_world, const char *layout);
void rt__mpi_finalize(void);     /* aborts when a request was never waited */
extern rt_group *rt__world;      /* the world group (communicator: a dup of MPI_COMM_WORLD);
                                 ** defined in rt_common.c */

rt_group *rt__group_create(const char *name, const int *members, int n);   /* rt.h contract */
void      rt__group_destroy(rt_group *g);          /* aborts when a request on g is pending */
rt_group *rt__group_check(rt_group *g, const char *op); /* fails on NULL */

/* Requests on host buffers: the engine under rt.h's rt_req (rt_mpi.c). Allreduce and
** reduce-scatter exchange blocks with point-to-point messages and reduce each block in f32
** (bf16) or its own type in group-rank order, so the result does not depend on MPI's
** algorithms; allgather, p2p and barriers are nonblocking MPI calls. A start posts the first
** messages and returns; rt__h_progress takes every pending request as far as it can without
** waiting; rt__h_wait polls (with back-off, under the watchdog deadline, naming the operation,
** group and the peers not heard from on expiry) until r is complete, advancing every pending
** request meanwhile, and frees r. The blocking rt__h_ calls are a start and a wait. Arguments
** are checked at the start (aborting); contracts as rt.h's calls of the same names. */
typedef struct rt__hreq rt__hreq;
rt__hreq *rt__h_allreduce_start(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g);
rt__hreq *rt__h_allgather_start(const void *send, void *recv, size_t n, rt_dtype t,
                                rt_group *g);
rt__hreq *rt__h_reduce_scatter_start(const void *send, void *recv, size_t n, rt_dtype t,
                                     rt_group *g);
rt__hreq *rt__h_barrier_start(rt_group *g, const char *op);
rt__hreq *rt__h_p2p_start(const rt_p2p_op *ops, int nops);
void      rt__h_wait(rt__hreq *r);
void      rt__h_progress(void);
int       rt__h_test(rt__hreq *r);       /* rt__h_progress, then: is r complete? */

void rt__h_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g);
void rt__h_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g);
void rt__h_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g);
void rt__h_barrier(rt_group *g, const char *op);
void rt__h_p2p(const rt_p2p_op *ops, int nops);
/* Blocking MPI collectives (MPI_Alltoallv, MPI_Bcast) armed on the watchdog thread: they move
** the data of pending requests (MPI's progress) but take none of their steps. */
void rt__h_alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                     void *recv, const size_t *rcounts, const size_t *rdispls,
                     rt_dtype t, rt_group *g);
void rt__h_broadcast(void *buf, size_t n, rt_dtype t, int root, rt_group *g);

/* -- Polling with back-off (rt_common.c) ---------------------------------------------------- */

/* A wait loop calls rt__poll_pause between tests: the first polls spin, then the thread keeps
** polling (for 2 ms, or the time 'bytes' take at 1 GB/s if longer), spinning or, when the job
** has more threads on this node than CPUs, yielding between polls; then it sleeps with a delay
** growing with the time already waited (capped at 1 ms). Returns the seconds waited so far. */
typedef struct { double t0, yield_s; long polls; int spin; } rt__poll;
void   rt__poll_start(rt__poll *p, size_t bytes);
double rt__poll_pause(rt__poll *p);

/* -- Watchdog thread (rt_common.c) -------------------------------------------------------- */

/* Started by rt__mpi_init, stopped by rt__mpi_finalize. Arm before a call that may block
** (main thread), disarm after: if it is still armed rt_timeout() seconds later the thread
** prints "[rank r/w] watchdog: <op> on <group desc> did not complete within T s" and aborts the
** job (MPI_Abort from that thread: MPI runs at MPI_THREAD_MULTIPLE). 'op' and 'g' must stay
** valid until disarmed; g may be NULL. */
void rt__wd_start(void);
void rt__wd_stop(void);
void rt__wd_arm(const char *op, const rt_group *g);
void rt__wd_disarm(void);

/* -- Threads and scratch (rt_common.c) ----------------------------------------------------- */

void rt__pool_init(int nthreads);
void rt__pool_shutdown(void);
int  rt__default_threads(void);
int  rt__in_parallel(void);      /* inside an rt_parallel_for body (nested: run inline) */

/* Per-thread growable host scratch, slot 0..5 (0-3: the MPI layer, 4-5: the CPU GEMM);
** contents undefined; valid until the next call with the same slot on the same thread. */
enum { RT__SCRATCH_SLOTS = 6 };
void *rt__scratch(int slot, size_t bytes);

/* -- Device memory accounting (rt_common.c; rt.h's rt_mem_stats) ------------------------------ */

/* The backends' rt_malloc records each block with the bytes requested, rt_free forgets it and
** gets them back (aborting, named after 'op', for a pointer that is not recorded). */
void   rt__mem_add(void *p, size_t bytes);
size_t rt__mem_remove(void *p, const char *op);

/* -- GEMM arguments (rt_common.c) -------------------------------------------------------- */

/* Validate rt_gemm's arguments (aborts with the offending value). Returns 0 when there is
** nothing to do (m, n or batch is 0), 1 when C only needs scaling by beta (k == 0 or
** alpha == 0), 2 for a full GEMM. */
enum { RT__GEMM_NONE, RT__GEMM_SCALE, RT__GEMM_FULL };
int rt__gemm_check(int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda,
                   const void *B, int ldb, const void *C, int ldc, int batch, rt_dtype ab,
                   rt_dtype c);

/* -- bf16 ---------------------------------------------------------------------------------- */

static inline float rt__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest, ties to even; NaN stays a (quiet) NaN; overflow rounds to infinity. */
static inline uint16_t rt__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void rt__bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void rt__f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);

/* -- Requests, accounting and trace (rt_common.c; see rt.h) ----------------------------------- */

/* rt.h's request: what every backend shares (created by rt__req_new, freed by rt__req_free,
** which keep the list of live requests: started and not yet waited), the MPI layer's part and
** the backend's own. */
struct rt_req {
    const char     *op;          /* "allreduce", "allgather", "reduce_scatter", "p2p" */
    const rt_group *g;           /* NULL: p2p (the world) */
    long            id;          /* a start's number on this rank, from 1 (trace); 0: blocking */
    rt__hreq       *h;           /* the MPI layer's part, or NULL */
    void           *dev;         /* the backend's part (CUDA), or NULL */
    rt_req         *prev, *next; /* live requests, in start order */
};
rt_req *rt__req_new(const char *op, const rt_group *g, int async);  /* async: numbered */
void    rt__req_free(rt_req *r);
/* Dies naming the oldest live request when there is one on g (NULL: on any group) */
void    rt__req_none_live(const rt_group *g, const char *why);

/* Every communication call of rt.h: t0 = rt__comm_begin() at its entry, rt__comm_end(t0,
** blocked) at its exit, which adds the time to rt_comm_stats' counters (to *blocked too when
** the call waits: blocking calls, rt_wait) and ends the call's trace line. */
double rt__comm_begin(void);
void   rt__comm_end(double t0, int blocked);

/* Trace lines (rt.h "Trace"). A blocking call's or a wait's line is begun before the call and
** ended by rt__comm_end after it (its time appended when RT_TRACE_TIMES is set), so an abort
** in the call leaves it as the last line; a start's line (id > 0) is written whole. */
extern int rt__tracing;                          /* RT_TRACE was set: trace every call */
void rt__trace_open(const char *dir, int rank);  /* rt__start_done */
void rt__trace(const char *fmt, ...) RT_PRINTF(1, 2);   /* begins a line */
void rt__trace_coll(const char *op, const rt_group *g, size_t n, rt_dtype t, int has_n,
                    const char *red, long id);
void rt__trace_p2p(const rt_p2p_op *ops, int nops, long id);
void rt__trace_wait(const rt_req *r);
void rt__trace_close(void);                      /* rt_finalize, rt_abort */
/* Counts then displacements (2p elements, per-thread scratch) of p even blocks of n: what
** rt_alltoall hands to the all-to-all with counts. */
size_t *rt__even_counts(int p, size_t n);

/* The call site of the rt_ call being traced (RT_TRACE_SITES): each traced entry point sets it
** from its own return address before it writes its line. */
extern void *rt__trace_site;
#define RT_TRACE_SITE() (rt__trace_site = __builtin_return_address(0))
#define RT_TRACE_COLL(op, g, n, t, has_n, red, id) \
    do { if (rt__tracing) { RT_TRACE_SITE(); rt__trace_coll(op, g, n, t, has_n, red, id); } } \
    while (0)

/* -- For the runtime's tests only (not part of rt.h's interface) ---------------------------- */

const char *rt_dtype_name(rt_dtype t);           /* "f32"; "?" for an invalid value */
double rt_timeout(void);                         /* the watchdog's seconds (0: off) */
void   rt_group_free(rt_group *g);               /* collective over the members; world: no-op */
/* Broadcast n elements from group rank 'root' (blocking, watchdog-guarded; device buffers on
** CUDA). */
void   rt_broadcast(void *buf, size_t n, rt_dtype t, int root, rt_group *g);
/* One rt_progress step, then 1 when r is complete (its results in place after rt_wait, which
** is still needed: it frees r). Never waits. */
int    rt_test(rt_req *r);
/* The CPU GEMM's primitive cache: primitives created so far and those held now (at most
** RT__GEMM_CACHE_MAX); CUDA: 0, 0. */
enum { RT__GEMM_CACHE_MAX = 256 };
void   rt_gemm_cache_stats(long *created, int *cached);

#ifdef __cplusplus
}
#endif
#endif
