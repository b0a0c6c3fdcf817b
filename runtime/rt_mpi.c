/*
** rt_mpi.c: the MPI layer shared by both backends: start-up and the world-size check, local
** rank, groups, ending the job (rt_abort: MPI_Abort) and MPI's error text, and every
** collective and point-to-point transfer on host buffers, as requests of one engine (rt.h's
** asynchronous calls; a blocking call is a start and a wait). Allreduce and reduce-scatter are
** our own point-to-point algorithm, which reduces in group-rank order, so a result has the same
** bits blocking or not whatever MPI's algorithms; allgather, p2p and barriers are nonblocking
** MPI calls. Every wait polls (advancing every pending request) and checks the watchdog
** deadline itself; alltoallv and broadcast stay blocking MPI calls armed on the watchdog thread.
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

/* Largest element count per MPI message (allgather, broadcast and p2p are split into pieces
** of at most this many elements; MPI counts are int). */
#define CHUNK ((size_t)1 << 30)

/* -- Errors ---------------------------------------------------------------------------------- */

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

/* A blocking MPI collective under the watchdog thread. */
#define COLL(x, op, g) \
    do { rt__wd_arm(op, g); CHECK_MPI(x, op, g); rt__wd_disarm(); } while (0)

static MPI_Datatype mpi_type(rt_dtype t)
{
    switch (t) {
    case RT_F32:  return MPI_FLOAT;
    case RT_BF16: return MPI_UINT16_T;     /* moved as bits; reduced here */
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

/* -- Requests: the engine --------------------------------------------------------------------- */

/*
** Every transfer is a request (rt_internal.h). REQ_MPI holds a set of nonblocking MPI calls
** (allgather, barrier, p2p), complete when all are. REQ_REDUCE is an allreduce or a
** reduce-scatter of our own:
**
** Why our own. Open MPI 4.1's MPI_Allreduce (coll/tuned) and MPI_Iallreduce (coll/libnbc) run
** other algorithms that add in other orders: on 3 and 5 ranks most f32 sums differ in their
** last bits (measured, bench/runtime_bench overlap reports it), so a program would train
** differently with its gradient reductions overlapped than without. Here the order is fixed:
** a slice of the data is cut into one block per member; every member sends block b to member b
** (point to point); member b adds the blocks in group-rank order, ((x0 + x1) + x2) + ..., in
** f32 for f32 and bf16 (bf16 widened exactly, rounded once at the end), wrapping for integers,
** and an allreduce then sends each member's result to every member. The bytes are a ring's
** (2 (p-1)/p of the buffer each way for an allreduce) in two steps instead of 2 (p-1), every
** member computes its block in the same order, and all members get the same bits: blocking or
** not, on the CPU and over the CUDA backend's MPI transport alike.
**
** Slices. A slice's step receives at most SLOT_BYTES (a message from each of the p-1 peers),
** and DEPTH slices are in flight: a request's scratch is DEPTH SLOT_BYTES (4 MiB) whatever the
** group size, slices are reduced while the next travel, and each rt_progress can move DEPTH
** slices a step on (measured with bench/runtime_bench overlap, 30 M f32 on 2 ranks: with 2
** slices of 1 MiB in flight and one round per rt_progress, 200 ms of the 300 ms allreduce were
** left to rt_wait; with 4, none).
** An allreduce of at most SMALL_BYTES sends the whole buffer to every member, which reduces all
** of it in the same order (one step instead of two, the same bits). (Whole slices on two
** members, which move the same bytes in one step, measured slower from 100 K elements up: each
** member adds twice as much.)
**
** Order. A request's messages carry the tag 2 (seq mod TAG_SEQS) + step, seq counting the
** collectives started on the group, the same on every member (rt.h: members start a group's
** collectives in the same order); messages with one tag are matched in posting order, so the
** slices of a request enter their second step in slice order on every member.
**
** Progress. Nothing moves unless a runtime call runs (no progress thread): rt__h_progress
** takes every pending request as far as it goes without waiting, reducing at most DEPTH slices
** of each (a call stays short between kernels), a wait takes them until its request completes.
*/
#define SLOT_BYTES  ((size_t)1 << 20)
#define DEPTH       4
#define SMALL_BYTES ((size_t)4096)
#define TAG_SEQS    16384          /* tags up to 32767, the least MPI_TAG_UB MPI allows */

enum { REQ_MPI, REQ_REDUCE };
enum { SLOT_FREE, SLOT_EXCHANGE, SLOT_GATHER };

typedef struct {
    int          state;        /* SLOT_*: free, blocks being exchanged, results being gathered */
    size_t       slice;
    char        *scr;          /* the peers' blocks, (p-1) x blk elements by peer */
    size_t       cap;          /* bytes of scr (the pool's) */
    MPI_Request *mr;           /* 2 (p-1): receives from the peers, then sends, by group rank */
} slot;

struct rt__hreq {
    int             kind, done;
    const char     *op;        /* "allreduce", ... for messages */
    const rt_group *g;         /* NULL: p2p (the world) */
    size_t          bytes;     /* this rank's share of the traffic (the wait's back-off) */
    rt__hreq       *prev, *next;   /* pending requests, in start order */
    /* REQ_MPI */
    MPI_Request    *mr;
    int             nmr;
    int            *peer;      /* each MPI call's peer, group rank (-1: none) */
    rt_p2p_op      *ops;       /* p2p: a copy of the ops; peer[] holds each call's op */
    int             nops;
    char           *copy;      /* allgather: a copy of a send buffer that overlaps recv */
    /* REQ_REDUCE */
    int             gather;    /* allreduce in two steps (results gathered back) */
    int             whole;     /* allreduce in one step: every member reduces all the data */
    const char     *in;        /* reduce-scatter: send (p blocks of n); allreduce: buf */
    char           *out;       /* reduce-scatter: recv; allreduce: buf */
    size_t          n, c, blk, es;  /* n: allreduce: elements; reduce-scatter: per member;
                                ** c: slice length; blk: most elements of a received block */
    rt_dtype        t;
    rt_op           rop;
    int             tag;
    size_t          nslices, started, reduced, finished;
    const void    **src;       /* p block pointers for the reduction */
    slot            slots[DEPTH];
};

static rt__hreq *pend_first, *pend_last;    /* pending (incomplete) requests, in start order */

/* -- Scratch pool: the reductions' receive buffers, kept for the next requests -- */

enum { POOL_MAX = 16 };
static struct { void *p; size_t cap; } pool[POOL_MAX];
static int npool;

/* A buffer of at least 'bytes' (the smallest pooled one that fits, else a new one); *cap its
** size, for pool_put. */
static void *pool_get(size_t bytes, size_t *cap)
{
    int best = -1;
    for (int i = 0; i < npool; i++)
        if (pool[i].cap >= bytes && (best < 0 || pool[i].cap < pool[best].cap))
            best = i;
    if (best >= 0) {
        void *p = pool[best].p;
        *cap = pool[best].cap;
        pool[best] = pool[--npool];
        return p;
    }
    *cap = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, *cap ? *cap : 64);
    if (!p)
        rt__die("out of host memory: communication scratch of %zu bytes", *cap);
    return p;
}

/* Keep a buffer for later (the largest POOL_MAX are kept). */
static void pool_put(void *p, size_t cap)
{
    if (!p)
        return;
    if (npool < POOL_MAX) {
        pool[npool].p = p;
        pool[npool++].cap = cap;
        return;
    }
    int small = 0;
    for (int i = 1; i < npool; i++)
        if (pool[i].cap < pool[small].cap)
            small = i;
    if (pool[small].cap < cap) {
        free(pool[small].p);
        pool[small].p = p;
        pool[small].cap = cap;
    } else {
        free(p);
    }
}

static void pool_free_all(void)
{
    for (int i = 0; i < npool; i++)
        free(pool[i].p);
    npool = 0;
}

/* -- Requests ---------------------------------------------------------------------------------- */

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    RT_CHECK(p, "out of memory");
    return p;
}

/* A new pending request of 'kind' for 'op' on g, with room for nmr MPI calls (REQ_MPI). */
static rt__hreq *req_new(int kind, const char *op, const rt_group *g, int nmr)
{
    rt__hreq *r = xcalloc(1, sizeof *r);
    r->kind = kind;
    r->op = op;
    r->g = g;
    r->nmr = nmr;
    if (kind == REQ_MPI) {
        r->mr = xcalloc((size_t)nmr, sizeof *r->mr);
        r->peer = xcalloc((size_t)nmr, sizeof *r->peer);
        for (int i = 0; i < nmr; i++) {
            r->mr[i] = MPI_REQUEST_NULL;
            r->peer[i] = -1;
        }
    }
    r->prev = pend_last;
    if (pend_last)
        pend_last->next = r;
    else
        pend_first = r;
    pend_last = r;
    return r;
}

static void req_unlink(rt__hreq *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else if (pend_first == r)
        pend_first = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else if (pend_last == r)
        pend_last = r->prev;
    r->prev = r->next = NULL;
}

/* Mark complete (nothing left to do at start: n = 0, one member). */
static rt__hreq *req_done(rt__hreq *r)
{
    r->done = 1;
    req_unlink(r);
    return r;
}

static void req_free(rt__hreq *r)
{
    req_unlink(r);
    for (int i = 0; i < DEPTH; i++) {
        pool_put(r->slots[i].scr, r->slots[i].cap);
        free(r->slots[i].mr);
    }
    free(r->mr);
    free(r->peer);
    free(r->ops);
    free(r->copy);
    free(r->src);
    free(r);
}

/* MPI_Testall for r's calls: 1 when all completed (they are then MPI_REQUEST_NULL). */
static int testall(MPI_Request *mr, int n, const rt__hreq *r)
{
    int flag = 0;
    int rc = MPI_Testall(n, mr, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
        mpi_fail(__FILE__, __LINE__, rc, "MPI_Testall", r->op, r->g);
    return flag;
}

/* Post a send (send = 1) or receive of n elements in pieces of at most CHUNK into r's calls
** from index *k on (each recorded with 'peer', the group rank or op it belongs to). */
static void post(rt__hreq *r, int *k, int send, void *buf, size_t n, rt_dtype t, int rank,
                 int tag, MPI_Comm comm, int peer)
{
    size_t es = rt_dtype_size(t), off = 0;
    do {
        size_t c = n - off < CHUNK ? n - off : CHUNK;
        char *b = (char *)buf + off * es;
        if (send)
            CHECK_MPI(MPI_Isend(b, (int)c, mpi_type(t), rank, tag, comm, &r->mr[*k]), r->op,
                      r->g);
        else
            CHECK_MPI(MPI_Irecv(b, (int)c, mpi_type(t), rank, tag, comm, &r->mr[*k]), r->op,
                      r->g);
        r->peer[(*k)++] = peer;
        off += c;
    } while (off < n);
}

/* -- Reductions ------------------------------------------------------------------------------ */

/* Group rank b's index among this rank's peers (its block in the scratch, its calls). */
static int peer_index(const rt__hreq *r, int b)
{
    return b < r->g->rank ? b : b - 1;
}

/* The elements member b reduces in slice s of r: *at (from the start of r->in), the count. */
static size_t part(const rt__hreq *r, size_t s, int b, size_t *at)
{
    size_t p = (size_t)r->g->size, off = s * r->c, len = r->n - off < r->c ? r->n - off : r->c;
    if (r->whole) {
        *at = off;
        return len;
    }
    if (!r->gather) {
        *at = (size_t)b * r->n + off;
        return len;
    }
    size_t lo = len * (size_t)b / p, hi = len * (size_t)(b + 1) / p;
    *at = off + lo;
    return hi - lo;
}

/* Where slice s's result of this rank goes, from the start of r->out. */
static size_t result_at(const rt__hreq *r, size_t s)
{
    size_t at;
    if (r->whole || !r->gather)
        return s * r->c;
    part(r, s, r->g->rank, &at);
    return at;
}

/* out[cnt] = src[0] + src[1] + ... + src[p-1] (or the maximum), element by element in this
** order, in f32 for f32 and bf16 (one rounding), wrapping for integers; out may be one of the
** sources (each tile is read whole before it is written). */
enum { TILE = 256 };

static void add_tile(float *restrict acc, const float *restrict v)
{
    for (size_t j = 0; j < TILE; j++)
        acc[j] += v[j];
}

static void reduce_f32(void *out, const void *const *src, int p, size_t cnt, int bf16,
                       rt_op op)
{
    float acc[TILE];
    for (size_t j0 = 0; j0 < cnt; j0 += TILE) {
        size_t m = cnt - j0 < TILE ? cnt - j0 : TILE;
        for (int b = 0; b < p; b++) {
            float w[TILE];
            const float *v = (const float *)src[b] + j0;
            if (bf16) {
                rt__bf16_to_f32_n(w, (const uint16_t *)src[b] + j0, m);
                v = w;
            }
            if (b == 0) {
                memcpy(acc, v, m * sizeof(float));
            } else if (op == RT_MAX) {
                for (size_t j = 0; j < m; j++)
                    if (v[j] > acc[j] || v[j] != v[j]) acc[j] = v[j];   /* NaN stays NaN */
            } else if (m == TILE) {
                add_tile(acc, v);
            } else {
                for (size_t j = 0; j < m; j++) acc[j] += v[j];
            }
        }
        if (bf16)
            rt__f32_to_bf16_n((uint16_t *)out + j0, acc, m);
        else
            memcpy((float *)out + j0, acc, m * sizeof(float));
    }
}

#define REDUCE_INT(type, utype) \
    do { \
        type *o = (type *)out; \
        for (size_t j0 = 0; j0 < cnt; j0 += TILE) { \
            size_t m = cnt - j0 < TILE ? cnt - j0 : TILE; \
            type acc[TILE]; \
            memcpy(acc, (const type *)src[0] + j0, m * sizeof(type)); \
            for (int b = 1; b < p; b++) { \
                const type *x = (const type *)src[b] + j0; \
                if (op == RT_MAX) { \
                    for (size_t j = 0; j < m; j++) if (x[j] > acc[j]) acc[j] = x[j]; \
                } else { \
                    for (size_t j = 0; j < m; j++) \
                        acc[j] = (type)((utype)acc[j] + (utype)x[j]); \
                } \
            } \
            memcpy(o + j0, acc, m * sizeof(type)); \
        } \
    } while (0)

static void reduce(void *out, const void *const *src, int p, size_t cnt, rt_dtype t, rt_op op)
{
    switch (t) {
    case RT_F32:  reduce_f32(out, src, p, cnt, 0, op); break;
    case RT_BF16: reduce_f32(out, src, p, cnt, 1, op); break;
    case RT_I32:  REDUCE_INT(int32_t, uint32_t); break;
    default:      REDUCE_INT(int64_t, uint64_t); break;
    }
}

/* Step 1 of slice s in slot k: receive this rank's block from every peer, send each peer its. */
static void post_exchange(rt__hreq *r, slot *k, size_t s)
{
    const rt_group *g = r->g;
    int p = g->size, me = g->rank, j = 0;
    size_t at, mine = part(r, s, me, &at);
    MPI_Datatype dt = mpi_type(r->t);
    for (int b = 0; b < p; b++)
        if (b != me)
            CHECK_MPI(MPI_Irecv(k->scr + (size_t)peer_index(r, b) * r->blk * r->es, (int)mine,
                                dt, b, r->tag, g->comm, &k->mr[j++]), r->op, g);
    for (int b = 0; b < p; b++)
        if (b != me) {
            size_t cnt = part(r, s, b, &at);
            CHECK_MPI(MPI_Isend(r->in + at * r->es, (int)cnt, dt, b, r->tag, g->comm,
                                &k->mr[j++]), r->op, g);
        }
    k->slice = s;
    k->state = SLOT_EXCHANGE;
}

/* The exchange of slot k is complete: reduce this rank's block in group-rank order. */
static void reduce_slot(rt__hreq *r, slot *k)
{
    int p = r->g->size, me = r->g->rank;
    size_t at, cnt = part(r, k->slice, me, &at);
    for (int b = 0; b < p; b++)
        r->src[b] = b == me ? (const void *)(r->in + at * r->es)
                            : (const void *)(k->scr + (size_t)peer_index(r, b) * r->blk * r->es);
    reduce(r->out + result_at(r, k->slice) * r->es, r->src, p, cnt, r->t, r->rop);
}

/* Step 2 of an allreduce's slice: this rank's result to every peer, theirs into place. */
static void post_gather(rt__hreq *r, slot *k)
{
    const rt_group *g = r->g;
    int p = g->size, me = g->rank, j = 0;
    size_t at, mine = part(r, k->slice, me, &at), mine_at = at;
    MPI_Datatype dt = mpi_type(r->t);
    for (int b = 0; b < p; b++)
        if (b != me) {
            size_t cnt = part(r, k->slice, b, &at);
            CHECK_MPI(MPI_Irecv(r->out + at * r->es, (int)cnt, dt, b, r->tag + 1, g->comm,
                                &k->mr[j++]), r->op, g);
        }
    for (int b = 0; b < p; b++)
        if (b != me)
            CHECK_MPI(MPI_Isend(r->out + mine_at * r->es, (int)mine, dt, b, r->tag + 1, g->comm,
                                &k->mr[j++]), r->op, g);
    k->state = SLOT_GATHER;
}

/* Take r's steps that need no waiting, reducing at most 'budget' slices (0: no limit). */
static void reduce_step(rt__hreq *r, size_t budget)
{
    int nm = 2 * (r->g->size - 1);
    size_t stop = budget ? r->reduced + budget : r->nslices;
    for (;;) {
        int moved = 0;
        while (r->reduced < r->started && r->reduced < stop) {  /* in slice order: "Order" */
            slot *k = &r->slots[r->reduced % DEPTH];
            if (!testall(k->mr, nm, r))
                break;
            reduce_slot(r, k);
            r->reduced++;
            moved = 1;
            if (r->gather) {
                post_gather(r, k);
            } else {
                k->state = SLOT_FREE;
                r->finished++;
            }
        }
        for (int i = 0; i < DEPTH; i++) {
            slot *k = &r->slots[i];
            if (k->state == SLOT_GATHER && testall(k->mr, nm, r)) {
                k->state = SLOT_FREE;
                r->finished++;
                moved = 1;
            }
        }
        while (r->started < r->nslices && r->slots[r->started % DEPTH].state == SLOT_FREE) {
            post_exchange(r, &r->slots[r->started % DEPTH], r->started);
            r->started++;
            moved = 1;
        }
        if (r->finished == r->nslices) {
            r->done = 1;
            return;
        }
        if (!moved)
            return;
    }
}

/* A reduction request: 'in' to 'out' (see struct rt__hreq), posted as far as it goes. */
static rt__hreq *reduce_start(rt__hreq *r, const void *in, void *out, size_t n, rt_dtype t,
                              rt_op op, int gather)
{
    const rt_group *g = r->g;
    size_t p = (size_t)g->size, es = rt_dtype_size(t);
    size_t msg = SLOT_BYTES / (p - 1) / es;     /* elements a message carries at most */
    r->kind = REQ_REDUCE;
    r->in = (const char *)in;
    r->out = (char *)out;
    r->n = n;
    r->t = t;
    r->rop = op;
    r->es = es;
    r->tag = (int)(2 * (g->seq % TAG_SEQS));
    if (gather && n * es <= SMALL_BYTES) {
        r->whole = 1;
        r->c = r->blk = n;
    } else if (gather) {
        r->gather = 1;
        r->c = msg * p;
        r->blk = n < r->c ? (n + p - 1) / p : msg;
    } else {
        r->c = msg;
        r->blk = n < msg ? n : msg;
    }
    r->nslices = (n + r->c - 1) / r->c;
    r->bytes = (gather ? 2 : p) * n * es;
    r->src = xcalloc(p, sizeof *r->src);
    for (size_t i = 0; i < DEPTH && i < r->nslices; i++) {
        r->slots[i].mr = xcalloc(2 * (p - 1), sizeof(MPI_Request));
        r->slots[i].scr = pool_get((p - 1) * r->blk * es, &r->slots[i].cap);
    }
    reduce_step(r, 1);
    if (r->done)
        req_unlink(r);
    return r;
}

/* -- Progress and waiting -------------------------------------------------------------------- */

/* One request's steps (budget as reduce_step's); unlinked from the pending list when done. */
static void step(rt__hreq *r, size_t budget)
{
    if (r->kind == REQ_REDUCE)
        reduce_step(r, budget);
    else if (testall(r->mr, r->nmr, r))
        r->done = 1;
    if (r->done)
        req_unlink(r);
}

/*
** Take every pending request one step further, without waiting (rt.h's rt_progress).
*/
void rt__h_progress(void)
{
    for (rt__hreq *r = pend_first, *next; r; r = next) {
        next = r->next;
        step(r, DEPTH);
    }
}

int rt__h_test(rt__hreq *r)
{
    rt__h_progress();
    return r->done;
}

/* The watchdog's message for r, pending after the deadline: the operation, its group and the
** peers it still waits for (p2p: the pending ops). */
static void expire(rt__hreq *r) RT_NORETURN;
static void expire(rt__hreq *r)
{
    char msg[1024];
    int len = 0;
    if (r->ops) {                       /* p2p: the ops with a pending call */
        int last = -1;
        for (int j = 0; j < r->nmr && len < (int)sizeof msg - 64; j++) {
            int flag = 0;
            if (r->mr[j] != MPI_REQUEST_NULL)
                MPI_Test(&r->mr[j], &flag, MPI_STATUS_IGNORE);
            else
                flag = 1;
            if (flag || r->peer[j] == last)
                continue;
            const rt_p2p_op *o = &r->ops[r->peer[j]];
            len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s %zu %s %s rank %d tag %d",
                            len ? ", " : "", o->send ? "send" : "recv", o->n, rt_dtype_name(o->t),
                            o->send ? "to" : "from", o->peer, o->tag);
            last = r->peer[j];
        }
        rt__die("watchdog: p2p (%s) did not complete within %g s", msg, rt__st.timeout);
    }
    /* a collective: the group ranks with a pending call */
    int p = r->g->size, me = r->g->rank;
    char *waiting = xcalloc((size_t)p, 1);
    if (r->kind == REQ_MPI) {
        for (int j = 0; j < r->nmr; j++) {
            int flag = 1;
            if (r->mr[j] != MPI_REQUEST_NULL)
                MPI_Test(&r->mr[j], &flag, MPI_STATUS_IGNORE);
            if (!flag && r->peer[j] >= 0)
                waiting[r->peer[j]] = 1;
        }
    } else {
        for (int i = 0; i < DEPTH; i++) {
            slot *k = &r->slots[i];
            if (k->state == SLOT_FREE)
                continue;
            for (int j = 0; j < 2 * (p - 1); j++) {
                int flag = 1, b = j % (p - 1);
                if (k->mr[j] != MPI_REQUEST_NULL)
                    MPI_Test(&k->mr[j], &flag, MPI_STATUS_IGNORE);
                if (!flag)
                    waiting[b < me ? b : b + 1] = 1;
            }
        }
    }
    int nw = 0;
    for (int b = 0; b < p && len < (int)sizeof msg - 16; b++)
        if (waiting[b])
            len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%d", nw++ ? "," : "",
                            r->g->members ? r->g->members[b] : b);
    free(waiting);
    rt__die("watchdog: %s on %s did not complete within %g s%s%s%s", r->op, r->g->desc,
            rt__st.timeout, nw ? (nw > 1 ? " (waiting for ranks " : " (waiting for rank ") : "",
            nw ? msg : "", nw ? ")" : "");
}

/*
** Complete r (see rt_internal.h): poll with back-off, taking every pending request's steps,
** until r is done; past the watchdog deadline (counted from this call) die naming it. Frees r;
** NULL is ignored.
*/
void rt__h_wait(rt__hreq *r)
{
    if (!r)
        return;
    if (!r->done) {
        rt__poll p;
        rt__poll_start(&p, r->bytes);
        for (;;) {
            for (rt__hreq *q = pend_first, *next; q; q = next) {
                next = q->next;
                step(q, 0);
            }
            if (r->done)
                break;
            double waited = rt__poll_pause(&p);
            if (rt__st.timeout > 0 && waited > rt__st.timeout)
                expire(r);
        }
    }
    req_free(r);
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

/* A group record for comm, which takes the group's name (MPI_Comm_set_name: MPI tools and the
** PMPI counting shims of bench/ tell the communicators apart by it). */
static rt_group *group_new(MPI_Comm comm, const char *name, const int *members, int size)
{
    rt_group *g = rt__group_alloc(comm, name, members, size);
    CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "group setup", g);
    CHECK_MPI(MPI_Comm_set_name(comm, g->name), "group setup", g);
    CHECK_MPI(MPI_Comm_rank(comm, &g->rank), "group setup", g);
    return g;
}

/*
** Start MPI (MPI_THREAD_MULTIPLE: the watchdog thread may call MPI_Abort), learn
** rank/world/local rank, read RT_TIMEOUT, and check the world size against 'expected_world'
** (mismatch: rank 0 prints the one message, every rank finalizes and exits 1). Creates the
** world group and the p2p communicator (named "world" and "p2p": two copies of
** MPI_COMM_WORLD, so p2p tags never meet a collective's), starts the watchdog thread, and arms
** the guard that aborts the job when a rank exits without rt_finalize.
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
    RT_MPI(MPI_Comm_set_name(p2p_comm, "p2p"));

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
    pool_free_all();
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
    rt_group probe = { .comm = comm, .size = size };
    snprintf(probe.name, sizeof probe.name, "%s", name);
    snprintf(probe.desc, sizeof probe.desc, "group %s (being created)", name);
    rt__hreq *r = req_new(REQ_MPI, "group creation", &probe, 1);
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, comm, r->mr),
              "group creation", &probe);
    rt__h_wait(r);
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
    rt__req_none_live(g, "rt_group_free");
    CHECK_MPI(MPI_Comm_free(&g->comm), "group free", g);
    rt__group_release(g);
}

/* -- Collectives on host buffers ----------------------------------------------------------- */

/* A request for 'op' on g (checked: not NULL), counted in g's sequence (the tags). */
static rt__hreq *coll_new(int kind, const char *op, rt_group *g, int nmr)
{
    rt__group_check(g, op);
    rt__hreq *r = req_new(kind, op, g, nmr);
    g->seq++;
    return r;
}

/*
** In-place allreduce of n elements (sum or max), reduced in group-rank order (see "Requests:
** the engine"); started, completed by rt__h_wait.
*/
rt__hreq *rt__h_allreduce_start(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    RT_CHECK(op == RT_SUM || op == RT_MAX, "allreduce: invalid op %d", (int)op);
    rt_dtype_size(t);
    rt__hreq *r = coll_new(REQ_REDUCE, "allreduce", g, 0);
    if (n == 0 || g->size == 1)
        return req_done(r);
    RT_CHECK(buf, "allreduce on %s: NULL buffer", g->desc);
    return reduce_start(r, buf, buf, n, t, op, 1);
}

/*
** recv[n] <- sum over members of their send block rank(g) (send holds size*n elements), in
** group-rank order. recv may be send + rank*n (in place: the other blocks of send are only
** read); no other overlap.
*/
rt__hreq *rt__h_reduce_scatter_start(const void *send, void *recv, size_t n, rt_dtype t,
                                     rt_group *g)
{
    size_t es = rt_dtype_size(t);
    rt__hreq *r = coll_new(REQ_REDUCE, "reduce-scatter", g, 0);
    if (n == 0)
        return req_done(r);
    const char *mine = (const char *)send + (size_t)g->rank * n * es;
    if ((const char *)recv != mine && overlaps(send, n * es * (size_t)g->size, recv, n * es))
        rt__die("reduce-scatter on %s: recv overlaps send, not in place (recv = send + rank*n)",
                g->desc);
    if (g->size == 1) {
        if (send != recv)
            memcpy(recv, send, n * es);
        return req_done(r);
    }
    return reduce_start(r, send, recv, n, t, RT_SUM, 0);
}

/*
** recv[size*n] <- every member's send[n], by group rank. send may be recv + rank*n (in place);
** a send that overlaps recv otherwise is copied first.
*/
rt__hreq *rt__h_allgather_start(const void *send, void *recv, size_t n, rt_dtype t,
                                rt_group *g)
{
    size_t es = rt_dtype_size(t), bytes = n * es, pieces = (n + CHUNK - 1) / CHUNK;
    rt__group_check(g, "allgather");
    int p = g->size, me = g->rank, k = 0;
    rt__hreq *r = coll_new(REQ_MPI, "allgather", g, n ? (int)(2 * (size_t)(p - 1) * pieces) : 0);
    if (n == 0)
        return req_done(r);
    char *mine = (char *)recv + (size_t)me * bytes;
    if (send != mine) {
        const void *src = send;
        if (overlaps(send, bytes, recv, bytes * (size_t)p)) {
            r->copy = malloc(bytes);
            RT_CHECK(r->copy, "out of memory");
            memcpy(r->copy, send, bytes);
            src = r->copy;
        }
        memcpy(mine, src, bytes);
    }
    if (p == 1)
        return req_done(r);
    r->bytes = 2 * bytes * (size_t)(p - 1);
    int tag = (int)(2 * (g->seq % TAG_SEQS));
    for (int b = 0; b < p; b++)
        if (b != me)
            post(r, &k, 0, (char *)recv + (size_t)b * bytes, n, t, b, tag, g->comm, b);
    for (int b = 0; b < p; b++)
        if (b != me)
            post(r, &k, 1, mine, n, t, b, tag, g->comm, b);
    step(r, 1);
    return r;
}

rt__hreq *rt__h_barrier_start(rt_group *g, const char *op)
{
    rt__hreq *r = coll_new(REQ_MPI, op, g, 1);
    CHECK_MPI(MPI_Ibarrier(g->comm, r->mr), op, g);
    return r;
}

void rt__h_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    rt__h_wait(rt__h_allreduce_start(buf, n, t, op, g));
}

void rt__h_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    rt__h_wait(rt__h_allgather_start(send, recv, n, t, g));
}

void rt__h_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    rt__h_wait(rt__h_reduce_scatter_start(send, recv, n, t, g));
}

void rt__h_barrier(rt_group *g, const char *op)
{
    rt__h_wait(rt__h_barrier_start(g, op));
}

/*
** All-to-all with per-peer counts and displacements (elements, by group rank): MPI_Alltoallv,
** blocking, armed on the watchdog thread.
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

/* -- Point-to-point ------------------------------------------------------------------------ */

/*
** Post every receive, then every send (in op order, each split into CHUNK pieces; n = 0 is
** one empty message) as one request; messages between two ranks with one tag are matched in
** posting order, across requests. On expiry the watchdog lists the ops still pending.
*/
rt__hreq *rt__h_p2p_start(const rt_p2p_op *ops, int nops)
{
    if (nops <= 0)
        return req_done(req_new(REQ_MPI, "p2p", NULL, 0));
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
    rt__hreq *r = req_new(REQ_MPI, "p2p", NULL, (int)nreq);
    r->ops = xcalloc((size_t)nops, sizeof *r->ops);
    memcpy(r->ops, ops, (size_t)nops * sizeof *r->ops);
    r->nops = nops;
    r->bytes = bytes;
    int k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < nops; i++)
            if (!!ops[i].send == pass)
                post(r, &k, pass, ops[i].buf, ops[i].n, ops[i].t, ops[i].peer, ops[i].tag,
                     p2p_comm, i);
    step(r, 1);
    return r;
}

void rt__h_p2p(const rt_p2p_op *ops, int nops)
{
    rt__h_wait(rt__h_p2p_start(ops, nops));
}
