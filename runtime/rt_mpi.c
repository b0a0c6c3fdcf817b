/*
** rt_mpi.c: the MPI layer shared by both backends: start-up and the world-size check, local
** rank, groups, ending the job (rt_abort: MPI_Abort) and MPI's error text, and every
** collective and point-to-point transfer on host buffers. Collectives are blocking MPI calls
** armed on the watchdog thread; p2p and barriers are nonblocking calls completed by a polling
** loop that checks the deadline itself.
** The CPU backend calls it directly; the CUDA backend calls it for bootstrap and for its MPI
** transport (device buffers staged through pinned host memory). What needs no MPI (group
** records, the exit guard, the error-kind names) is in rt_common.c; the single-rank libraries
** link rt_single.c in its place.
*/
#define _GNU_SOURCE
#include "rt_internal.h"   // defines: rt_group, rt__st, rt__poll, rt__scratch, rt__h_* ...

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static MPI_Comm p2p_comm = MPI_COMM_NULL;

/* Largest element count per MPI message (allreduce, broadcast and p2p are split into pieces
** of at most this many elements; MPI counts are int). */
#define CHUNK ((size_t)1 << 30)
#define PACK_BYTES ((size_t)8 << 20)   /* scratch for a packed reduce-scatter or a bf16 sum */

/* -- Errors and waiting -------------------------------------------------------------------- */

static void mpi_fail(const char *file, int line, int rc, const char *call, const char *op,
                     const rt_group *g)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    rt_fail(file, line, "MPI error: %s (%s, %s on %s)", text, call, op,
            g ? g->desc : "group world");
}

/* Check an MPI call made for 'op' on group 'g' (a name for messages). */
#define CHECK_MPI(x, op, g) \
    do { \
        int rc_ = (x); \
        if (rc_ != MPI_SUCCESS) \
            mpi_fail(__FILE__, __LINE__, rc_, #x, op, g); \
    } while (0)

/* Poll n requests (moving 'bytes' in all) to completion. Returns 0 when all completed, 1 when
** the watchdog deadline passed first (the requests are then left as they are). */
static int wait_reqs(MPI_Request *r, int n, size_t bytes, const char *op, const rt_group *g)
{
    rt__poll p;
    rt__poll_start(&p, bytes);
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            mpi_fail(__FILE__, __LINE__, rc, "MPI_Testall", op, g);
        if (done)
            return 0;
        double waited = rt__poll_pause(&p);
        if (rt__st.timeout > 0 && waited > rt__st.timeout)
            return 1;
    }
}

/* A blocking MPI collective under the watchdog thread. */
#define COLL(x, op, g) \
    do { rt__wd_arm(op, g); CHECK_MPI(x, op, g); rt__wd_disarm(); } while (0)

static void wait_coll(MPI_Request *r, int n, const char *op, const rt_group *g)
{
    if (wait_reqs(r, n, 0, op, g))
        rt__die("watchdog: %s on %s did not complete within %g s", op, g->desc,
                rt__st.timeout);
}

static MPI_Datatype mpi_type(rt_dtype t)
{
    switch (t) {
    case RT_F32:  return MPI_FLOAT;
    case RT_BF16: return MPI_UINT16_T;     /* moved as bits; reduced by bf16_reduce_block */
    case RT_I32:  return MPI_INT32_T;
    case RT_I64:  return MPI_INT64_T;
    default:      break;
    }
    rt__die("invalid dtype %d", (int)t);
}

static int int_count(size_t n, const char *what, const char *op, const rt_group *g)
{
    if (n > INT_MAX)
        rt__die("%s on %s: %s %zu exceeds MPI's int range; split the call", op, g->desc,
                what, n);
    return (int)n;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    const char *pa = (const char *)a, *pb = (const char *)b;
    return na && nb && pa < pb + nb && pb < pa + na;
}

/* -- Ending the job ------------------------------------------------------------------------ */

/*
** Abort the whole job: the backend hook (ncclCommAbort), then MPI_Abort, or exit(1) when MPI
** is not running. The first caller wins; a failure in another thread during the abort parks
** that thread until the process is killed; a failure inside the hook goes straight on. The
** trace (RT_TRACE) is flushed first.
*/
void rt_abort(void)
{
    rt__abort_begin();
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down)
        MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

/*
** Behind RT_MPI / RT_CUDA / RT_CUBLAS / RT_NCCL: print "[rank r/w] file:line: NCCL error:
** <text> (ncclAllReduce)" and abort. MPI's text from MPI_Error_string; the CUDA libraries'
** from the backend's rt__status_hook (without it, the number).
*/
void rt_fail_status(const char *file, int line, rt_err_kind kind, int status, const char *expr)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (kind != RT_ERR_MPI)
        rt__fail_status(file, line, kind, status, expr, NULL);
    if (MPI_Error_string(status, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", status);
    rt__fail_status(file, line, kind, status, expr, text);
}

/* -- Start-up ------------------------------------------------------------------------------ */

static rt_group *group_new(MPI_Comm comm, const char *name, const int *members, int size)
{
    rt_group *g = rt__group_alloc(comm, name, members, size);
    CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "group setup", g);
    CHECK_MPI(MPI_Comm_rank(comm, &g->rank), "group setup", g);
    return g;
}

/*
** Start MPI (MPI_THREAD_MULTIPLE: the watchdog thread may call MPI_Abort), learn
** rank/world/local rank, read RT_TIMEOUT, and check the world size against 'expected_world'
** (mismatch: rank 0 prints the one message, every rank finalizes and exits 1). Creates the
** world group and the p2p communicator, starts the watchdog thread, and arms the guard that
** aborts the job when a rank exits without rt_finalize.
*/
void rt__mpi_init(int *argc, char ***argv, int expected_world, const char *layout)
{
    RT_CHECK(!rt__st.inited, "rt_init called twice");
    rt__end_job = rt_abort;
    int up = 0, provided = 0;
    MPI_Initialized(&up);
    if (!up && MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "[rank ?/?] MPI_Init_thread failed\n");
        exit(1);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rt__st.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &rt__st.world);
    if (provided < MPI_THREAD_MULTIPLE && !up && rt__st.rank == 0)
        rt_log("warning: MPI gives thread level %d, not MPI_THREAD_MULTIPLE: the watchdog "
               "thread will still call MPI_Abort when a call hangs", provided);

    rt__read_timeout();

    if (expected_world > 0 && rt__st.world != expected_world) {
        if (rt__st.rank == 0) {
            if (layout && *layout)
                rt_log("built for %d ranks (%s), launched with %d", expected_world, layout,
                       rt__st.world);
            else
                rt_log("built for %d ranks, launched with %d", expected_world, rt__st.world);
        }
        rt__st.finalized = 1;
        MPI_Finalize();
        exit(1);
    }

    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (lr && ls && atoi(ls) > 0) {
        rt__st.local_rank = atoi(lr);
        rt__st.local_size = atoi(ls);
    } else {
        MPI_Comm node;
        RT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rt__st.rank,
                                   MPI_INFO_NULL, &node));
        RT_MPI(MPI_Comm_rank(node, &rt__st.local_rank));
        RT_MPI(MPI_Comm_size(node, &rt__st.local_size));
        RT_MPI(MPI_Comm_free(&node));
    }

    MPI_Comm wc;
    RT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &wc));
    int *all = malloc((size_t)rt__st.world * sizeof *all);
    RT_CHECK(all, "out of memory");
    for (int i = 0; i < rt__st.world; i++)
        all[i] = i;
    rt__world = group_new(wc, "world", all, rt__st.world);
    rt__world->is_world = 1;
    free(all);
    RT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &p2p_comm));
    RT_MPI(MPI_Comm_set_errhandler(p2p_comm, MPI_ERRORS_RETURN));

    rt__start_done();
}

/*
** Meet every rank (watchdog-guarded barrier named "finalize"), free the world group and
** p2p communicator, end MPI.
*/
void rt__mpi_finalize(void)
{
    if (!rt__st.inited || rt__st.finalized)
        return;
    rt__h_barrier(rt__world, "finalize");
    RT_MPI(MPI_Comm_free(&p2p_comm));
    RT_MPI(MPI_Comm_free(&rt__world->comm));
    rt__finalize_done();
    MPI_Finalize();
}

/* -- Groups -------------------------------------------------------------------------------- */

/*
** Build this rank's communicator of kind 'name' from the members of its own group (see rt.h
** rt_group_create; collective over the world). Checks the list locally (ranks in range, no
** rank twice, the caller in it), splits the world by the group's smallest member (key: the
** caller's position), then checks inside the new communicator that it has n members and that
** every member passed the same list (a hash reduced with MAX, and of its complement).
*/
rt_group *rt__group_create(const char *name, const int *members, int n)
{
    int lowest;
    int pos = rt__group_validate(name, members, n, &lowest);
    int color = n > 0 ? lowest : MPI_UNDEFINED;

    MPI_Comm comm;
    COLL(MPI_Comm_split(rt__world->comm, color, pos < 0 ? 0 : pos, &comm), "group creation",
         rt__world);
    if (n == 0)
        return NULL;
    int size = 0;
    CHECK_MPI(MPI_Comm_size(comm, &size), "group creation", rt__world);
    uint64_t h = rt_fnv1a64(name);
    for (int i = 0; i < n; i++) {
        const unsigned char *q = (const unsigned char *)&members[i];
        for (size_t k = 0; k < sizeof(int); k++)
            h = (h ^ q[k]) * 0x100000001b3ull;
    }
    uint64_t v[2] = { h, ~h };
    MPI_Request req;
    rt_group probe = { .comm = comm, .size = size };
    snprintf(probe.name, sizeof probe.name, "%s", name);
    snprintf(probe.desc, sizeof probe.desc, "group %s (being created)", name);
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, comm, &req),
              "group creation", &probe);
    wait_coll(&req, 1, "group creation", &probe);
    if (size != n || v[0] != h || ~v[1] != h) {
        char list[160];
        int len = 0;
        for (int i = 0; i < n && len < (int)sizeof list - 16; i++)
            len += snprintf(list + len, sizeof list - (size_t)len, "%s%d", i ? "," : "",
                            members[i]);
        rt__die("rt_group_create: group %s: ranks disagree on the members (rank %d lists %s%s;"
                " %d ranks joined)", name, rt__st.rank, list, len >= (int)sizeof list - 16 ?
                ",..." : "", size);
    }
    rt_group *g = group_new(comm, name, members, n);
    RT_CHECK(g->rank == pos, "group %s: MPI placed rank %d at %d, its list at %d", name,
             rt__st.rank, g->rank, pos);
    return g;
}

void rt__group_destroy(rt_group *g)
{
    if (!g || g->is_world)
        return;
    CHECK_MPI(MPI_Comm_free(&g->comm), "group free", g);
    rt__group_release(g);
}

/* -- Collectives on host buffers ----------------------------------------------------------- */

/*
** bf16 reductions. MPI has no bf16 sum, and a user-defined one would round at every step of
** MPI's algorithm. So bf16 travels as bf16 and is reduced here: pk holds one block of c
** elements per member; an all-to-all gives each member its block from every member (the
** bytes a ring reduce-scatter moves), which it reduces in f32 in group-rank order and rounds
** once into out. Every member gets the same bits whatever MPI's algorithm (rt.h).
*/
static void bf16_reduce_block(uint16_t *out, const uint16_t *pk, size_t c, rt_op op,
                              rt_group *g, const char *opn)
{
    size_t all = c * (size_t)g->size;
    uint16_t *rv = rt__scratch(1, all * sizeof(uint16_t));
    float *acc = rt__scratch(2, c * sizeof(float));
    COLL(MPI_Alltoall(pk, (int)c, MPI_UINT16_T, rv, (int)c, MPI_UINT16_T, g->comm), opn, g);
    rt__bf16_to_f32_n(acc, rv, c);
    for (int b = 1; b < g->size; b++) {
        const uint16_t *r = rv + (size_t)b * c;
        if (op == RT_MAX) {
            for (size_t j = 0; j < c; j++) {
                float x = rt__bf16_to_f32(r[j]);
                if (x > acc[j] || x != x) acc[j] = x;   /* NaN stays NaN */
            }
        } else {
            for (size_t j = 0; j < c; j++) acc[j] += rt__bf16_to_f32(r[j]);
        }
    }
    rt__f32_to_bf16_n(out, acc, c);
}

/*
** In-place allreduce of n elements (sum or max). bf16: in slices of at most PACK_BYTES, each
** cut into one block per member (the last padded with zeros), reduced by bf16_reduce_block and
** all-gathered back.
*/
void rt__h_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    rt__group_check(g, "allreduce");
    const char *opn = "allreduce";
    MPI_Op mop = op == RT_MAX ? MPI_MAX : MPI_SUM;
    RT_CHECK(op == RT_SUM || op == RT_MAX, "allreduce: invalid op %d", (int)op);
    size_t es = rt_dtype_size(t);
    if (n == 0 || g->size == 1)
        return;
    if (t == RT_BF16) {
        uint16_t *h = (uint16_t *)buf;
        size_t p = (size_t)g->size, slice = PACK_BYTES / sizeof(uint16_t) / p * p;
        for (size_t off = 0; off < n; off += slice) {
            size_t c = n - off < slice ? n - off : slice, blk = (c + p - 1) / p;
            uint16_t *pk = rt__scratch(0, blk * p * sizeof(uint16_t));
            uint16_t *mine = rt__scratch(3, blk * sizeof(uint16_t));
            memcpy(pk, h + off, c * sizeof(uint16_t));
            memset(pk + c, 0, (blk * p - c) * sizeof(uint16_t));
            bf16_reduce_block(mine, pk, blk, op, g, opn);
            COLL(MPI_Allgather(mine, (int)blk, MPI_UINT16_T, pk, (int)blk, MPI_UINT16_T,
                               g->comm), opn, g);
            memcpy(h + off, pk, c * sizeof(uint16_t));
        }
        return;
    }
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t c = n - off < CHUNK ? n - off : CHUNK;
        COLL(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)c, mpi_type(t), mop,
                           g->comm), opn, g);
    }
}

/*
** recv[size*n] <- every member's send[n], by group rank. send may be recv + rank*n (in place).
*/
void rt__h_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    rt__group_check(g, "allgather");
    size_t es = rt_dtype_size(t), bytes = n * es;
    if (n == 0)
        return;
    char *mine = (char *)recv + (size_t)g->rank * bytes;
    if (g->size == 1) {
        if (send != recv)
            memmove(recv, send, bytes);
        return;
    }
    int c = int_count(n, "count", "allgather", g);
    const void *src = send;
    if (send == mine) {
        src = MPI_IN_PLACE;
    } else if (overlaps(send, bytes, recv, bytes * (size_t)g->size)) {
        void *tmp = rt__scratch(0, bytes);
        memcpy(tmp, send, bytes);
        src = tmp;
    }
    COLL(MPI_Allgather(src, c, mpi_type(t), recv, c, mpi_type(t), g->comm), "allgather", g);
}

/*
** recv[n] <- sum over members of their send block rank(g) (send holds size*n elements).
** recv may alias send (in place: send + rank*n); bf16 is reduced by bf16_reduce_block. Those
** two cases go through scratch, a slice of every block at a time (PACK_BYTES in all), so the
** transient copy stays small however large the buffer -- the distributed optimizer
** reduce-scatters its whole gradient buffer in place. A slice is packed before its result is
** written, so the rest of send is read as it was.
*/
void rt__h_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    rt__group_check(g, "reduce-scatter");
    const char *opn = "reduce-scatter";
    size_t es = rt_dtype_size(t), all = n * (size_t)g->size;
    if (n == 0)
        return;
    if (g->size == 1) {
        if (send != recv)
            memmove(recv, send, n * es);
        return;
    }
    int bf16 = t == RT_BF16;
    if (!bf16 && !overlaps(send, all * es, recv, n * es)) {
        int c = int_count(n, "count", opn, g);
        COLL(MPI_Reduce_scatter_block(send, recv, c, mpi_type(t), MPI_SUM, g->comm), opn, g);
        return;
    }
    size_t slice = PACK_BYTES / (es * (size_t)g->size);
    if (slice == 0)
        slice = 1;
    for (size_t off = 0; off < n; off += slice) {
        size_t c = n - off < slice ? n - off : slice;
        char *pk = rt__scratch(0, c * es * (size_t)g->size);
        for (int b = 0; b < g->size; b++)
            memcpy(pk + (size_t)b * c * es, (const char *)send + ((size_t)b * n + off) * es,
                   c * es);
        if (bf16)
            bf16_reduce_block((uint16_t *)recv + off, (const uint16_t *)pk, c, RT_SUM, g, opn);
        else
            COLL(MPI_Reduce_scatter_block(pk, (char *)recv + off * es, (int)c, mpi_type(t),
                                          MPI_SUM, g->comm), opn, g);
    }
}

/*
** All-to-all with per-peer counts and displacements (elements, by group rank).
*/
void rt__h_alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                     void *recv, const size_t *rcounts, const size_t *rdispls,
                     rt_dtype t, rt_group *g)
{
    rt__group_check(g, "alltoallv");
    const char *opn = "alltoallv";
    size_t es = rt_dtype_size(t);
    RT_CHECK(scounts && sdispls && rcounts && rdispls, "alltoallv: NULL count array");
    int p = g->size;
    if (p == 1) {
        RT_CHECK(scounts[0] == rcounts[0], "alltoallv on %s: sends %zu to itself, expects %zu",
                 g->desc, scounts[0], rcounts[0]);
        if (scounts[0])
            memmove((char *)recv + rdispls[0] * es, (const char *)send + sdispls[0] * es,
                    scounts[0] * es);
        return;
    }
    int *ic = rt__scratch(2, 4 * (size_t)p * sizeof(int));
    for (int i = 0; i < p; i++) {
        ic[i] = int_count(scounts[i], "send count", opn, g);
        ic[p + i] = int_count(sdispls[i], "send displacement", opn, g);
        ic[2 * p + i] = int_count(rcounts[i], "receive count", opn, g);
        ic[3 * p + i] = int_count(rdispls[i], "receive displacement", opn, g);
    }
    COLL(MPI_Alltoallv(send, ic, ic + p, mpi_type(t), recv, ic + 2 * p, ic + 3 * p, mpi_type(t),
                       g->comm), opn, g);
}

void rt__h_broadcast(void *buf, size_t n, rt_dtype t, int root, rt_group *g)
{
    rt__group_check(g, "broadcast");
    RT_CHECK(root >= 0 && root < g->size, "broadcast on %s: root %d is not a group rank",
             g->desc, root);
    size_t es = rt_dtype_size(t);
    if (n == 0 || g->size == 1)
        return;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t c = n - off < CHUNK ? n - off : CHUNK;
        COLL(MPI_Bcast((char *)buf + off * es, (int)c, mpi_type(t), root, g->comm), "broadcast",
             g);
    }
}

void rt__h_barrier(rt_group *g, const char *op)
{
    MPI_Request req;
    CHECK_MPI(MPI_Ibarrier(g->comm, &req), op, g);
    wait_coll(&req, 1, op, g);
}

/* -- Point-to-point ------------------------------------------------------------------------ */

/*
** Post every receive, then every send (in op order, each split into CHUNK pieces; n = 0 is
** one empty message), and complete them together under the watchdog. On expiry the message
** lists the operations still pending. rt__h_p2p_post and rt__h_p2p_complete are the two
** halves (one call in flight at a time: its ops are copied, its requests kept here).
*/
static struct {
    int active, nops, nreq;
    size_t bytes;
    rt_p2p_op *ops;              /* a copy of the posted ops (the caller's may go away) */
    MPI_Request *req;
    int *owner;                  /* op of each request */
} p2p_flight;

void rt__h_p2p_post(const rt_p2p_op *ops, int nops)
{
    RT_CHECK(!p2p_flight.active, "p2p: a call is posted while another is in flight (a bug)");
    if (nops <= 0)
        return;
    RT_CHECK(ops, "rt_p2p: NULL ops");
    size_t nreq = 0, bytes = 0;
    for (int i = 0; i < nops; i++) {
        if (ops[i].peer < 0 || ops[i].peer >= rt__st.world)
            rt__die("p2p: op %d has peer %d, not a rank of the world of %d", i, ops[i].peer,
                    rt__st.world);
        RT_CHECK(ops[i].buf || ops[i].n == 0, "p2p: op %d has a NULL buffer", i);
        RT_CHECK(ops[i].tag >= 0 && ops[i].tag <= 32767, "p2p: op %d has tag %d (0..32767)", i,
                 ops[i].tag);
        bytes += ops[i].n * rt_dtype_size(ops[i].t);
        nreq += ops[i].n == 0 ? 1 : (ops[i].n + CHUNK - 1) / CHUNK;
    }
    RT_CHECK(nreq <= INT_MAX, "p2p: too many operations");
    /* requests, owners, then the ops' copies at an offset rounded up to 16 bytes (aligned) */
    size_t at = (nreq * (sizeof(MPI_Request) + sizeof(int)) + 15) & ~(size_t)15;
    char *mem = rt__scratch(3, at + (size_t)nops * sizeof(rt_p2p_op));
    MPI_Request *req = (MPI_Request *)mem;
    int *owner = (int *)(mem + nreq * sizeof(MPI_Request));
    rt_p2p_op *copy = (rt_p2p_op *)(mem + at);
    memcpy(copy, ops, (size_t)nops * sizeof *copy);
    int k = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < nops; i++) {
            const rt_p2p_op *o = &ops[i];
            if (o->send != pass)
                continue;
            size_t es = rt_dtype_size(o->t), off = 0;
            do {
                size_t c = o->n - off < CHUNK ? o->n - off : CHUNK;
                char *b = (char *)o->buf + off * es;
                if (pass)
                    CHECK_MPI(MPI_Isend(b, (int)c, mpi_type(o->t), o->peer, o->tag, p2p_comm,
                                        &req[k]), "p2p send", rt__world);
                else
                    CHECK_MPI(MPI_Irecv(b, (int)c, mpi_type(o->t), o->peer, o->tag, p2p_comm,
                                        &req[k]), "p2p receive", rt__world);
                owner[k++] = i;
                off += c;
            } while (off < o->n);
        }
    }
    p2p_flight.active = 1;
    p2p_flight.nops = nops;
    p2p_flight.nreq = k;
    p2p_flight.bytes = bytes;
    p2p_flight.ops = copy;
    p2p_flight.req = req;
    p2p_flight.owner = owner;
}

void rt__h_p2p_complete(void)
{
    if (!p2p_flight.active)
        return;
    MPI_Request *req = p2p_flight.req;
    int k = p2p_flight.nreq, *owner = p2p_flight.owner;
    const rt_p2p_op *ops = p2p_flight.ops;
    p2p_flight.active = 0;
    if (!wait_reqs(req, k, p2p_flight.bytes, "p2p", rt__world))
        return;
    char msg[1024];
    int len = 0, last = -1;
    for (int j = 0; j < k && len < (int)sizeof msg - 64; j++) {
        int flag = 0;
        if (req[j] != MPI_REQUEST_NULL)
            MPI_Test(&req[j], &flag, MPI_STATUS_IGNORE);
        if (flag || owner[j] == last)
            continue;
        const rt_p2p_op *o = &ops[owner[j]];
        len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s %zu %s %s rank %d tag %d",
                        len ? ", " : "", o->send ? "send" : "recv", o->n, rt_dtype_name(o->t),
                        o->send ? "to" : "from", o->peer, o->tag);
        last = owner[j];
    }
    rt__die("watchdog: p2p (%s) did not complete within %g s", msg, rt__st.timeout);
}

void rt__h_p2p(const rt_p2p_op *ops, int nops)
{
    rt__h_p2p_post(ops, nops);
    rt__h_p2p_complete();
}
