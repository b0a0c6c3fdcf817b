/*
** rt_single.c: the start-up layer of the single-rank libraries (build/librt_cpu_single.a,
** build/librt_cuda_single.a, compiled with -DRT_NO_MPI): rt_mpi.c's internal interface for a
** world of one rank, with no MPI at all. Start-up checks that the program was built for one
** rank; a group has the one member; collectives are the copies their semantics imply, done
** at their start (every request is complete at once); p2p is refused (a world of one has no
** peers); rt_abort exits. The backends (rt_cpu.c, rt_cuda.cu)
** call it exactly as they call rt_mpi.c; what both layers share is in rt_common.c.
*/
#define _GNU_SOURCE
#include "rt_internal.h"   // defines: rt_group, rt__st, rt__group_alloc, rt__h_*, ...

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define USE_MPI "use train / train_cuda under mpirun"

/* -- Ending the job ------------------------------------------------------------------------ */

/*
** End the process: the backend hook (CUDA: ncclCommAbort), then exit status 1. The first
** caller wins (rt__abort_begin); the trace (RT_TRACE) is flushed first.
*/
void rt_abort(void)
{
    rt__abort_begin();
    _exit(1);
}

/*
** Behind RT_CUDA / RT_CUBLAS / RT_NCCL (and RT_MPI, which nothing here calls): "[rank 0/1]
** file:line: CUDA error: <text> (cudaMalloc)", the text from the backend's rt__status_hook.
*/
void rt_fail_status(const char *file, int line, rt_err_kind kind, int status, const char *expr)
{
    rt__fail_status(file, line, kind, status, expr, NULL);
}

/* -- Start-up ------------------------------------------------------------------------------ */

/* A launcher's rank count from its environment (Open MPI, PMI: MPICH, Slurm); 0: none. */
static int launcher_size(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0)
            return atoi(v);
    }
    return 0;
}

/*
** Rank 0 of a world of one: read RT_TIMEOUT, check 'expected_world' (a program built for more
** ranks prints "built for 8 ranks (tp2 pp2 dp2): this single-rank program (no MPI) runs
** layouts of one rank only; use train / train_cuda under mpirun" and exits 1; so does a launch
** by mpirun on several ranks, which would run that many independent copies), create the world
** group, open the trace, start the watchdog thread and arm the exit guard (rt_common.c).
** argc and argv are left as they are.
*/
void rt__mpi_init(int *argc, char ***argv, int expected_world, const char *layout)
{
    (void)argc;
    (void)argv;
    RT_CHECK(!rt__st.inited, "rt_init called twice");
    rt__end_job = rt_abort;
    rt__st.rank = 0;
    rt__st.world = 1;
    rt__st.local_rank = 0;
    rt__st.local_size = 1;
    rt__read_timeout();

    if (expected_world > 1) {
        if (layout && *layout)
            rt_log("built for %d ranks (%s): this single-rank program (no MPI) runs layouts of "
                   "one rank only; " USE_MPI, expected_world, layout);
        else
            rt_log("built for %d ranks: this single-rank program (no MPI) runs layouts of one "
                   "rank only; " USE_MPI, expected_world);
        rt__st.finalized = 1;
        exit(1);
    }
    int launched = launcher_size();
    if (launched > 1) {
        rt_log("launched on %d ranks (mpirun): this single-rank program (no MPI) runs as one "
               "process; start it directly, or " USE_MPI, launched);
        rt__st.finalized = 1;
        exit(1);
    }

    int self = 0;
    rt__world = rt__group_alloc(NULL, "world", &self, 1);
    rt__world->is_world = 1;
    rt__start_done();
}

/*
** Stop the watchdog, free the world group, write the trace (no other rank to meet).
*/
void rt__mpi_finalize(void)
{
    if (!rt__st.inited || rt__st.finalized)
        return;
    rt__finalize_done();
}

/* -- Groups -------------------------------------------------------------------------------- */

/*
** rt.h's rt_group_create in a world of one: the list is checked as rt_mpi.c checks it (so it
** can only be {0}, or empty: NULL); the group has this rank alone.
*/
rt_group *rt__group_create(const char *name, const int *members, int n)
{
    int lowest;
    int pos = rt__group_validate(name, members, n, &lowest);
    if (n == 0)
        return NULL;
    rt_group *g = rt__group_alloc(NULL, name, members, n);
    g->rank = pos;
    return g;
}

void rt__group_destroy(rt_group *g)
{
    if (!g || g->is_world)
        return;
    rt__req_none_live(g, "rt_group_free");
    rt__group_release(g);
}

/* -- Collectives over one member ------------------------------------------------------------ */

/* The arguments are checked as rt_mpi.c checks them; a one-member group's result is the
** caller's own data, so each call is a copy (memmove: in place is allowed) or nothing, done at
** the start: every request is complete when it is returned (the one record below; there is
** nothing to free, progress or wait for). */
struct rt__hreq { int done; };
static rt__hreq done_req = { 1 };

rt__hreq *rt__h_allreduce_start(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    (void)buf;
    (void)n;
    rt__group_check(g, "allreduce");
    RT_CHECK(op == RT_SUM || op == RT_MAX, "allreduce: invalid op %d", (int)op);
    rt_dtype_size(t);
    return &done_req;
}

rt__hreq *rt__h_allgather_start(const void *send, void *recv, size_t n, rt_dtype t,
                                rt_group *g)
{
    rt__group_check(g, "allgather");
    size_t bytes = n * rt_dtype_size(t);
    if (bytes && send != recv)
        memmove(recv, send, bytes);
    return &done_req;
}

rt__hreq *rt__h_reduce_scatter_start(const void *send, void *recv, size_t n, rt_dtype t,
                                     rt_group *g)
{
    rt__group_check(g, "reduce-scatter");
    size_t bytes = n * rt_dtype_size(t);
    if (bytes && send != recv)
        memmove(recv, send, bytes);
    return &done_req;
}

rt__hreq *rt__h_barrier_start(rt_group *g, const char *op)
{
    rt__group_check(g, op);
    return &done_req;
}

void rt__h_wait(rt__hreq *r)
{
    (void)r;
}

void rt__h_progress(void)
{
}

int rt__h_test(rt__hreq *r)
{
    (void)r;
    return 1;
}

void rt__h_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    rt__h_allreduce_start(buf, n, t, op, g);
}

void rt__h_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    rt__h_allgather_start(send, recv, n, t, g);
}

void rt__h_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    rt__h_reduce_scatter_start(send, recv, n, t, g);
}

void rt__h_barrier(rt_group *g, const char *op)
{
    rt__h_barrier_start(g, op);
}

void rt__h_alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                     void *recv, const size_t *rcounts, const size_t *rdispls,
                     rt_dtype t, rt_group *g)
{
    rt__group_check(g, "alltoallv");
    size_t es = rt_dtype_size(t);
    RT_CHECK(scounts && sdispls && rcounts && rdispls, "alltoallv: NULL count array");
    RT_CHECK(scounts[0] == rcounts[0], "alltoallv on %s: sends %zu to itself, expects %zu",
             g->desc, scounts[0], rcounts[0]);
    if (scounts[0])
        memmove((char *)recv + rdispls[0] * es, (const char *)send + sdispls[0] * es,
                scounts[0] * es);
}

void rt__h_broadcast(void *buf, size_t n, rt_dtype t, int root, rt_group *g)
{
    (void)buf;
    (void)n;
    rt__group_check(g, "broadcast");
    RT_CHECK(root == 0, "broadcast on %s: root %d is not a group rank", g->desc, root);
    rt_dtype_size(t);
}

/* -- Point-to-point: refused ---------------------------------------------------------------- */

/*
** A world of one has no peers, and no generated layout of one rank transfers anything (p2p
** carries the pipeline and the context-parallel ring): any op is a failure naming the first;
** no ops is a complete request.
*/
rt__hreq *rt__h_p2p_start(const rt_p2p_op *ops, int nops)
{
    if (nops <= 0)
        return &done_req;
    RT_CHECK(ops, "rt_p2p: NULL ops");
    rt__die("p2p: %s %zu %s %s rank %d tag %d: this single-rank program (no MPI) has no peers "
            "(pipeline and context parallelism need several ranks); " USE_MPI,
            ops[0].send ? "send" : "recv", ops[0].n, rt_dtype_name(ops[0].t),
            ops[0].send ? "to" : "from", ops[0].peer, ops[0].tag);
}

void rt__h_p2p(const rt_p2p_op *ops, int nops)
{
    rt__h_p2p_start(ops, nops);
}
