/*
** rt_cpu.c: the CPU backend (build/librt_cpu.a): host memory (counted for rt_mem_stats), GEMM
** on oneDNN matmul primitives (OpenBLAS for small f32 ones) run single-threaded as parts on the
** runtime's one thread pool, Philox normals, and the rt_ communication entry points mapped onto
** the MPI layer (rt_mpi.c). CPU programs link it; they never call oneDNN, OpenBLAS or MPI
** themselves.
*/
#define _GNU_SOURCE
#include "rt_internal.h"   // defines: rt__h_*, rt__pool_*, rt__scratch, rt__bf16_to_f32, ...
#include "rt_philox.h"     // defines: rt__normal_at

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

static void gemm_init(void);
static void gemm_shutdown(void);

const char *rt_backend(void)
{
    return "cpu";
}

void *rt_workspace(size_t *bytes)
{
    *bytes = 0;
    return NULL;
}

/* -- Launch -------------------------------------------------------------------------------- */

/*
** Start MPI, check the world size, hold OpenBLAS to one thread, create the oneDNN engine and
** start the pool (rt_threads()). See rt.h for the environment variables.
*/
void rt_init(int *argc, char ***argv, int expected_world, const char *layout)
{
    rt__mpi_init(argc, argv, expected_world, layout);
    openblas_set_num_threads(1);
    gemm_init();
    rt__pool_init(rt__default_threads());
}

/*
** Guarded barrier over the world, end MPI, stop the pool, free the GEMM primitives.
*/
void rt_finalize(void)
{
    rt__req_none_live(NULL, "rt_finalize");
    rt__mpi_finalize();
    rt__pool_shutdown();
    gemm_shutdown();
}

/* -- Groups and communication: host buffers, straight to the MPI layer --------------------- */

rt_group *rt_group_create(const char *name, const int *members, int n)
{
    return rt__group_create(name, members, n);
}

void rt_group_free(rt_group *g)
{
    rt__group_destroy(g);
}

/* Every call: accounted (rt__comm_begin / rt__comm_end: rt_comm_stats, the trace line's end)
** and traced; a blocking collective is its start and a wait inside the MPI layer. */

static const char *red_name(rt_op op)
{
    return op == RT_MAX ? "max" : "sum";
}

void rt_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("allreduce", g, n, t, 1, red_name(op), 0);
    rt__h_allreduce(buf, n, t, op, g);
    rt__comm_end(t0, 1);
}

void rt_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("allgather", g, n, t, 1, NULL, 0);
    rt__h_allgather(send, recv, n, t, g);
    rt__comm_end(t0, 1);
}

void rt_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("reduce_scatter", g, n, t, 1, NULL, 0);
    rt__h_reduce_scatter(send, recv, n, t, g);
    rt__comm_end(t0, 1);
}

void rt_alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                  void *recv, const size_t *rcounts, const size_t *rdispls,
                  rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("alltoallv", g, 0, t, 0, NULL, 0);
    rt__h_alltoallv(send, scounts, sdispls, recv, rcounts, rdispls, t, g);
    rt__comm_end(t0, 1);
}

void rt_alltoall(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("alltoall", g, n, t, 1, NULL, 0);
    rt__group_check(g, "alltoall");
    size_t *c = rt__even_counts(g->size, n);
    rt__h_alltoallv(send, c, c + g->size, recv, c, c + g->size, t, g);
    rt__comm_end(t0, 1);
}

void rt_broadcast(void *buf, size_t n, rt_dtype t, int root, rt_group *g)
{
    double t0 = rt__comm_begin();
    RT_TRACE_COLL("broadcast", g, n, t, 1, NULL, 0);
    rt__h_broadcast(buf, n, t, root, g);
    rt__comm_end(t0, 1);
}

void rt_barrier(rt_group *g)
{
    double t0 = rt__comm_begin();
    if (rt__tracing)
        { RT_TRACE_SITE(); rt__trace("barrier %s", g ? g->name : "world"); }
    rt__h_barrier(g ? g : rt__world, "barrier");
    rt__comm_end(t0, 1);
}

void rt_p2p(const rt_p2p_op *ops, int nops)
{
    double t0 = rt__comm_begin();
    if (rt__tracing)
        { RT_TRACE_SITE(); rt__trace_p2p(ops, nops, 0); }
    rt__h_p2p(ops, nops);
    rt__comm_end(t0, 1);
}

/* -- Asynchronous communication: the MPI layer's requests ------------------------------------ */

rt_req *rt_allreduce_start(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    double t0 = rt__comm_begin();
    rt_req *r = rt__req_new("allreduce", g, 1);
    RT_TRACE_COLL("allreduce", g, n, t, 1, red_name(op), r->id);
    r->h = rt__h_allreduce_start(buf, n, t, op, g);
    rt__comm_end(t0, 0);
    return r;
}

rt_req *rt_allgather_start(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    double t0 = rt__comm_begin();
    rt_req *r = rt__req_new("allgather", g, 1);
    RT_TRACE_COLL("allgather", g, n, t, 1, NULL, r->id);
    r->h = rt__h_allgather_start(send, recv, n, t, g);
    rt__comm_end(t0, 0);
    return r;
}

rt_req *rt_reduce_scatter_start(const void *send, void *recv, size_t n, rt_dtype t,
                                rt_group *g)
{
    double t0 = rt__comm_begin();
    rt_req *r = rt__req_new("reduce_scatter", g, 1);
    RT_TRACE_COLL("reduce_scatter", g, n, t, 1, NULL, r->id);
    r->h = rt__h_reduce_scatter_start(send, recv, n, t, g);
    rt__comm_end(t0, 0);
    return r;
}

rt_req *rt_p2p_start(const rt_p2p_op *ops, int nops)
{
    double t0 = rt__comm_begin();
    rt_req *r = rt__req_new("p2p", NULL, 1);
    if (rt__tracing)
        { RT_TRACE_SITE(); rt__trace_p2p(ops, nops, r->id); }
    r->h = rt__h_p2p_start(ops, nops);
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
    rt__h_wait(r->h);
    rt__req_free(r);
    rt__comm_end(t0, 1);
}

void rt_progress(void)
{
    double t0 = rt__comm_begin();
    rt__h_progress();
    rt__comm_end(t0, 0);
}

int rt_test(rt_req *r)
{
    double t0 = rt__comm_begin();
    int done = !r || rt__h_test(r->h);
    rt__comm_end(t0, 0);
    return done;
}

void rt_sync(void)
{
}

/* -- Memory -------------------------------------------------------------------------------- */

/*
** Zero-filled host memory aligned to 256 bytes (as cudaMalloc's), from mappings of our own
** aligned to 2 MiB and marked for transparent huge pages: fresh pages are zero already (no
** memset), and the first touch of each 2 MiB costs one page fault instead of 512. A program's
** start is mostly that first touch of its memory plan (tiny, one rank: 25 MB in 130 blocks of
** 2 KiB to 1.7 MiB, 6,300 faults, 40 % of its CPU time before this). A block of REGION bytes
** or more is a mapping of its own; smaller ones are cut in order from the current REGION-sized
** mapping. A mapping is returned when its last block is freed (the current one excepted), so
** a loop of rt_malloc and rt_free reuses at most two.
*/
#define HUGE_PAGE ((size_t)2 << 20)
#define REGION    ((size_t)8 << 20)

static struct region { char *p; size_t len, used; int live; } *reg;
static int nreg, capreg, cur = -1;     // cur: the region small blocks are cut from, or -1
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

/* A new zero-filled mapping of 'len' bytes (a multiple of HUGE_PAGE) at a HUGE_PAGE boundary. */
static char *map_huge(size_t len)
{
    char *m = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > m)
        munmap(m, (size_t)(p - m));
    if (p + len < m + len + HUGE_PAGE)
        munmap(p + len, (size_t)(m + len + HUGE_PAGE - (p + len)));
    madvise(p, len, MADV_HUGEPAGE);    // advice: without THP the pages are small, still zero
    return p;
}

/* Register a new mapping of 'len' bytes; its index, or -1 when out of memory. */
static int region_new(size_t len)
{
    if (nreg == capreg) {
        int cap = capreg ? 2 * capreg : 64;
        struct region *nr = realloc(reg, (size_t)cap * sizeof *nr);
        if (!nr)
            return -1;
        reg = nr, capreg = cap;
    }
    char *p = map_huge(len);
    if (!p)
        return -1;
    reg[nreg] = (struct region){p, len, 0, 0};
    return nreg++;
}

/* Under AddressSanitizer every block is a heap block of its own (aligned_alloc, zeroed), with
** the redzones that make a kernel's overrun of its buffer an error at the write (make test
** SANITIZE=1); the regions' blocks lie next to each other, unguarded. */
#if defined(__SANITIZE_ADDRESS__)
#define HOST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOST_SANITIZED 1
#endif
#endif
#ifndef HOST_SANITIZED
#define HOST_SANITIZED 0
#endif

static void *host_alloc(size_t bytes, const char *op)
{
    size_t sz = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    char *p = NULL;
    if (HOST_SANITIZED) {
        p = aligned_alloc(256, sz);
        if (!p)
            rt__die("out of memory: %s(%zu)", op, bytes);
        return memset(p, 0, sz);
    }
    pthread_mutex_lock(&reg_lock);
    int r = -1;
    if (sz >= REGION)
        r = region_new((sz + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
    else if (cur >= 0 && reg[cur].len - reg[cur].used >= sz)
        r = cur;
    else if ((r = region_new(REGION)) >= 0) {
        if (cur >= 0 && reg[cur].live == 0) {     // the old current one held nothing live
            munmap(reg[cur].p, reg[cur].len);
            reg[cur] = reg[--nreg];
            if (r == nreg)
                r = cur;
        }
        cur = r;
    }
    if (r >= 0) {
        p = reg[r].p + reg[r].used;
        reg[r].used += sz;
        reg[r].live++;
    }
    pthread_mutex_unlock(&reg_lock);
    if (!p)
        rt__die("out of memory: %s(%zu)", op, bytes);
    return p;
}

static void host_free(void *p)
{
    if (HOST_SANITIZED) {
        free(p);
        return;
    }
    pthread_mutex_lock(&reg_lock);
    for (int i = nreg - 1; i >= 0; i--)
        if ((char *)p >= reg[i].p && (char *)p < reg[i].p + reg[i].len) {
            if (--reg[i].live == 0 && i != cur) {
                munmap(reg[i].p, reg[i].len);
                reg[i] = reg[--nreg];
                if (cur == nreg)
                    cur = i;
            }
            break;
        }
    pthread_mutex_unlock(&reg_lock);
}

/*
** rt.h's device memory, which is host memory here; counted (the bytes requested) for
** rt_mem_stats. Aborts naming the size when out of memory.
*/
void *rt_malloc(size_t bytes)
{
    void *p = host_alloc(bytes, "rt_malloc");
    rt__mem_add(p, bytes);
    return p;
}

void rt_free(void *p)
{
    if (!p)
        return;
    rt__mem_remove(p, "rt_free");
    host_free(p);
}

void rt_memcpy(void *dst, const void *src, size_t bytes, rt_copy kind)
{
    RT_CHECK((unsigned)kind <= RT_H2H, "rt_memcpy: invalid copy kind %d", (int)kind);
    if (bytes)
        memmove(dst, src, bytes);
}

void rt_memcpy_async(void *dst, const void *src, size_t bytes, rt_copy kind)
{
    rt_memcpy(dst, src, bytes, kind);
}

void rt_memset0(void *p, size_t bytes)
{
    if (bytes)
        memset(p, 0, bytes);
}

void *rt_host_malloc(size_t bytes)
{
    return host_alloc(bytes, "rt_host_malloc");
}

void rt_host_free(void *p)
{
    if (p)
        host_free(p);
}

/* -- GEMM ---------------------------------------------------------------------------------- */

/* Design (measured with bench/runtime_bench gemm and small on the 2-core Zen 4 dev VM, oneDNN
** 2.6, OpenBLAS 0.3.21; GFLOP/s are geometric means over the GPT-2 124M shapes at B*T = 256,
** 1 thread unless said otherwise; the other numbers are next to each constant below):
**
** Library. oneDNN's matmul: f32 101.7 (OpenBLAS 95.1), bf16 202.4 (on Zen 5 the gains were
** 1.7-1.9x and 3.5x OpenBLAS's f32); OpenBLAS has no bf16 GEMM. oneDNN picks
** brg:avx512_core(_bf16) when every operand is dense (row stride = row length) and its
** gemm-based gemm:jit otherwise (padded leading dimensions, column blocks, interleaved heads),
** which was as fast or faster here; for long sums (GEMM_LONG_K) rt_gemm asks for gemm:jit.
** Its per-call cost (primitive lookup, memory objects, dispatch) makes f32 GEMMs below
** GEMM_SMALL_FLOPS slower than OpenBLAS, which runs those. rt_gemm itself: f32 102.7, bf16
** 200.1, i.e. the parts below cost nothing measurable.
**
** Threads. One pool owns the cores (rt_parallel_for); oneDNN's OpenMP and OpenBLAS are held
** to one thread on every thread that calls them (omp_set_num_threads(1): oneDNN never starts
** an OpenMP team, nothing spins beside the pool), and rt_gemm cuts the GEMM into parts that the
** pool runs. The alternative, one oneDNN call with its own 2 OpenMP threads and the pool idle,
** was no faster (2 threads, bf16: rt_gemm 391.5, oneDNN's OpenMP 376.0), its threads would
** compete with the pool's elementwise loops (the trap of bench "threads"; OMP_WAIT_POLICY
** cannot be set once OpenMP has started), and its results can depend on the thread count
** (the same bits on 1 and 2 threads at most shapes tried, but bf16 gemm:jit at 32x32x30000
** splits k: 611 of 1024 elements differed).
**
** Determinism. The parts depend on the shape alone: batch items, each cut into blocks of
** GEMM_ROW_BLK rows (or, when m is small, GEMM_COL_BLK columns). A part is one
** single-threaded library call whose shape and pointers are the same whichever thread runs it
** and however many there are, so the result is bit-identical for any RT_THREADS and for
** nested calls. A split by the thread count would not be: halving the columns on 2 threads
** gave other last bits than one call on 1 (the halves run on gemm:jit, the whole on brg);
** halving the rows happened to give the same bits, which nothing promises.
**
** alpha and beta are built into the primitive: output scales for alpha (no slower than an
** eltwise linear post-op or than alpha = 1, within the noise) and a sum post-op for beta
** (dst = alpha * acc + beta * dst, in f32, one rounding to dst's type; beta = 0: none, so C is
** never read). f32 inputs with a bf16 C, which oneDNN 2.6 does not implement, run as f32
** GEMMs into per-thread scratch, then C = bf16(t + beta * C) here.
**
** Primitives are cached (GEMM_CACHE_MAX, least recently used evicted, under a mutex; entries
** in use are never evicted) by everything that defines one: shape, transposes, leading
** dimensions, dtypes, alpha and beta. Parts of one call share at most two primitives (a whole
** block and the last one), looked up by the calling thread. oneDNN's own primitive cache is
** turned off: this one bounds the memory. oneDNN's scratchpad is user-managed, in per-thread
** host scratch (rt.h: host memory outside the memory plan). */

/* Parts: blocks of this many rows (m > GEMM_ROW_BLK) or columns (m small, n > 2 blocks), each
** batch item separately. With 128-row parts rt_gemm keeps 99-100 % of one oneDNN call's rate
** (above); 64-row parts lost up to 25 % (bf16, LM head input grad: 141 vs 190), 32-row ones
** up to 45 %. */
#define GEMM_ROW_BLK 128
#define GEMM_COL_BLK 256
/* A batch item under this many flops is one part. */
#define GEMM_SPLIT_MIN_FLOPS 4e6
/* Below this many flops in all, the parts run on the calling thread (dispatch costs ~1 us). */
#define GEMM_PAR_MIN_FLOPS 4e6
/* f32 parts under this many flops run on OpenBLAS (bench/runtime_bench small: per-head
** attention GEMMs, us per call, OpenBLAS vs oneDNN): 64x64x64 (0.5 MFLOP) 5-7 vs 7-10,
** 96x96x64 (1.2) 14.5 vs 16.5, 112x112x64 (1.6) even, 128x128x64 (2.1) 24.5 vs 23.5,
** 256x256x64 (8.4) 91-96 vs 84-91. */
#define GEMM_SMALL_FLOPS 1.5e6
/* GEMM_GEMV: a call of one f32 row (m = 1: generation's decoding, one token a step) runs as
** matrix-vector products, sgemv on each part, which read B once; sgemm would pack B first
** and oneDNN's primitive costs more than the product at these sizes. */
/* From this k (the length of each sum) on, the gemm-based implementation instead of brgemm,
** which loses rate as k grows (128-row parts, n = 768, GFLOP/s f32 and bf16, brg vs gemm:jit:
** k 3072 105 / 111 and 206 / 200; k 12288 97 / 111 and 185 / 189; k 50304, the LM head's
** input grad, 74 / 112 and 171 / 188; OpenBLAS f32 96 there). */
#define GEMM_LONG_K 8192
/* Primitives kept (each holds its JIT code, tens of KiB). */
#define GEMM_CACHE_MAX RT__GEMM_CACHE_MAX

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc;
    int ab, c;                  /* rt_dtype of A and B, of what the primitive writes */
    uint32_t alpha, beta;       /* bit patterns: both are part of the primitive */
} prim_key;                     /* ints only: no padding, compared with memcmp */

typedef struct {
    prim_key           key;
    uint64_t           hash;
    dnnl_primitive_t   prim;
    dnnl_memory_desc_t md[4];   /* A, B, C, scratchpad */
    size_t             scratch; /* scratchpad bytes */
    unsigned long      used;    /* clock of the last lookup (LRU) */
    int                refs;    /* lookups not yet released */
    int                cached;  /* 0: evicted or never cached; destroyed at its last release */
} prim_entry;

static struct {
    pthread_mutex_t mu;
    dnnl_engine_t   engine;
    prim_entry     *e[GEMM_CACHE_MAX];
    int             n;
    unsigned long   clock;
    long            created;
} dn = { PTHREAD_MUTEX_INITIALIZER, NULL, { NULL }, 0, 0, 0 };

static void prim_desc(char *buf, size_t len, const prim_key *k)
{
    float alpha, beta;
    memcpy(&alpha, &k->alpha, 4);
    memcpy(&beta, &k->beta, 4);
    snprintf(buf, len, "matmul %s x %s -> %s, m %d n %d k %d, ta %d tb %d, lda %d ldb %d ldc %d, "
             "alpha %g beta %g", rt_dtype_name((rt_dtype)k->ab), rt_dtype_name((rt_dtype)k->ab),
             rt_dtype_name((rt_dtype)k->c), k->m, k->n, k->k, k->ta, k->tb, k->lda, k->ldb,
             k->ldc, alpha, beta);
}

/* "[rank r/w] runtime/rt_cpu.c:LINE: oneDNN error: <status> (<call>) creating|running <what>" */
static void dnnl_fail(int line, dnnl_status_t st, const char *expr, const char *doing,
                      const prim_key *k) RT_NORETURN;
static void dnnl_fail(int line, dnnl_status_t st, const char *expr, const char *doing,
                      const prim_key *k)
{
    char what[256] = "";
    if (k)
        prim_desc(what, sizeof what, k);
    rt_fail(__FILE__, line, "oneDNN error: %s (%s)%s%s%s%s", dnnl_status2str(st), expr,
            *doing ? " " : "", doing, *what ? " " : "", what);
}

#define DNNL_CHECK(x, doing, key) \
    do { dnnl_status_t st_ = (x); \
         if (st_ != dnnl_success) dnnl_fail(__LINE__, st_, #x, doing, key); } while (0)

/* Hold OpenMP (oneDNN's threading) to one thread on this thread: before a primitive is created
** (oneDNN sizes its work split by the creating thread's count) and before each run (its
** gemm-based kernels ask again then). Setting a per-thread variable: a few ns. */
static void thread_single(void)
{
    omp_set_num_threads(1);
}

static void gemm_init(void)
{
    thread_single();
    DNNL_CHECK(dnnl_set_primitive_cache_capacity(0), "", NULL);
    DNNL_CHECK(dnnl_engine_create(&dn.engine, dnnl_cpu, 0), "creating the CPU engine", NULL);
}

static void prim_destroy(prim_entry *e)
{
    dnnl_primitive_destroy(e->prim);
    free(e);
}

static void gemm_shutdown(void)
{
    for (int i = 0; i < dn.n; i++)
        prim_destroy(dn.e[i]);
    dn.n = 0;
    if (dn.engine)
        dnnl_engine_destroy(dn.engine);
    dn.engine = NULL;
}

void rt_gemm_cache_stats(long *created, int *cached)
{
    pthread_mutex_lock(&dn.mu);
    *created = dn.created;
    *cached = dn.n;
    pthread_mutex_unlock(&dn.mu);
}

static dnnl_data_type_t dnnl_type(int t)
{
    return t == RT_BF16 ? dnnl_bf16 : dnnl_f32;
}

/* A new primitive for k (2-D, strides from the leading dimensions; user scratchpad). */
static prim_entry *prim_create(const prim_key *k)
{
    prim_entry *e = calloc(1, sizeof *e);
    RT_CHECK(e, "out of memory");
    e->key = *k;
    dnnl_dims_t da = { k->m, k->k }, sa = { k->ta ? 1 : k->lda, k->ta ? k->lda : 1 };
    dnnl_dims_t db = { k->k, k->n }, sb = { k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1 };
    dnnl_dims_t dc = { k->m, k->n }, sc = { k->ldc, 1 };
    const char *doing = "creating";
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&e->md[0], 2, da, dnnl_type(k->ab), sa), doing, k);
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&e->md[1], 2, db, dnnl_type(k->ab), sb), doing, k);
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&e->md[2], 2, dc, dnnl_type(k->c), sc), doing, k);
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &e->md[0], &e->md[1], NULL, &e->md[2]), doing, k);
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(dnnl_primitive_attr_create(&attr), doing, k);
    DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), doing,
               k);
    float alpha, beta;
    memcpy(&alpha, &k->alpha, 4);
    memcpy(&beta, &k->beta, 4);
    if (alpha != 1.0f)
        DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), doing, k);
    if (beta != 0.0f) {
        dnnl_post_ops_t po;
        DNNL_CHECK(dnnl_post_ops_create(&po), doing, k);
        DNNL_CHECK(dnnl_post_ops_append_sum(po, beta), doing, k);
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po), doing, k);
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd = NULL;
    if (k->k >= GEMM_LONG_K) {          /* the first gemm-based implementation, if any */
        dnnl_primitive_desc_iterator_t it;
        DNNL_CHECK(dnnl_primitive_desc_iterator_create(&it, &desc, attr, dn.engine, NULL),
                   doing, k);
        do {
            dnnl_primitive_desc_t cand = dnnl_primitive_desc_iterator_fetch(it);
            const char *impl = NULL;
            if (cand && dnnl_primitive_desc_query(cand, dnnl_query_impl_info_str, 0, &impl) ==
                            dnnl_success && impl && strncmp(impl, "gemm:", 5) == 0) {
                pd = cand;
                break;
            }
            if (cand)
                dnnl_primitive_desc_destroy(cand);
        } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
        dnnl_primitive_desc_iterator_destroy(it);
    }
    if (!pd)
        DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, dn.engine, NULL), doing, k);
    dnnl_primitive_attr_destroy(attr);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    RT_CHECK(smd, "oneDNN: no scratchpad descriptor for a matmul");
    e->md[3] = *smd;
    e->scratch = dnnl_memory_desc_get_size(smd);
    DNNL_CHECK(dnnl_primitive_create(&e->prim, pd), doing, k);
    dnnl_primitive_desc_destroy(pd);
    dn.created++;
    return e;
}

static uint64_t key_hash(const prim_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The primitive for k, created on first use; release it with prim_put. */
static prim_entry *prim_get(const prim_key *k)
{
    thread_single();
    uint64_t h = key_hash(k);
    pthread_mutex_lock(&dn.mu);
    for (int i = 0; i < dn.n; i++) {
        prim_entry *e = dn.e[i];
        if (e->hash == h && memcmp(&e->key, k, sizeof *k) == 0) {
            e->refs++;
            e->used = ++dn.clock;
            pthread_mutex_unlock(&dn.mu);
            return e;
        }
    }
    prim_entry *e = prim_create(k);
    e->hash = h;
    e->refs = 1;
    e->used = ++dn.clock;
    int slot = -1;
    if (dn.n < GEMM_CACHE_MAX) {
        slot = dn.n++;
    } else {                    /* full: evict the least recently used idle primitive */
        for (int i = 0; i < dn.n; i++)
            if (dn.e[i]->refs == 0 && (slot < 0 || dn.e[i]->used < dn.e[slot]->used))
                slot = i;
        if (slot >= 0)
            prim_destroy(dn.e[slot]);
    }
    if (slot >= 0) {            /* else every entry is in use: e lives until released */
        dn.e[slot] = e;
        e->cached = 1;
    }
    pthread_mutex_unlock(&dn.mu);
    return e;
}

static void prim_put(prim_entry *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&dn.mu);
    if (--e->refs == 0 && !e->cached)
        prim_destroy(e);
    pthread_mutex_unlock(&dn.mu);
}

/* Run e on A, B, C (this thread, one OpenMP thread; scratchpad in this thread's scratch). */
static void prim_run(const prim_entry *e, const void *A, const void *B, void *C)
{
    dnnl_stream_t stream;
    dnnl_memory_t mem[4] = { NULL, NULL, NULL, NULL };
    void *ptr[4] = { (void *)A, (void *)B, C, NULL };
    static const int arg[4] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST,
                                DNNL_ARG_SCRATCHPAD };
    const char *doing = "running";
    thread_single();
    int nargs = e->scratch ? 4 : 3;
    if (e->scratch)
        ptr[3] = rt__scratch(4, e->scratch);
    dnnl_exec_arg_t args[4];
    for (int i = 0; i < nargs; i++) {
        DNNL_CHECK(dnnl_memory_create(&mem[i], &e->md[i], dn.engine, ptr[i]), doing, &e->key);
        args[i].arg = arg[i];
        args[i].memory = mem[i];
    }
    DNNL_CHECK(dnnl_stream_create(&stream, dn.engine, dnnl_stream_default_flags), doing,
               &e->key);
    DNNL_CHECK(dnnl_primitive_execute(e->prim, stream, nargs, args), doing, &e->key);
    dnnl_stream_destroy(stream);
    for (int i = 0; i < nargs; i++)
        dnnl_memory_destroy(mem[i]);
}

typedef struct {
    int ta, tb, m, n, k;
    float alpha, beta;
    const char *A, *B;
    char *C;
    int lda, ldb, ldc;
    long sA, sB, sC;            /* bytes between batch items */
    rt_dtype ab, c;
    int to_bf16;                /* f32 inputs, bf16 C: f32 parts into scratch, then round */
    int split_n;                /* blocks of columns (else rows) */
    int blk, nblk;              /* rows (columns) per block, blocks per batch item */
    prim_entry *prim[2];        /* a whole block and the last one; NULL: OpenBLAS */
    int gemv;                   /* m = 1, all f32: each part one OpenBLAS sgemv (GEMM_GEMV) */
} gemm_job;

/* C = bf16(t + beta * C) for an mp x np block; t is packed f32 (row stride np). */
static void round_block(const float *t, uint16_t *C, int mp, int np, int ldc, float beta)
{
    for (int i = 0; i < mp; i++) {
        const float *tr = t + (size_t)i * (size_t)np;
        uint16_t *cr = C + (size_t)i * (size_t)ldc;
        if (beta == 0.0f)
            for (int j = 0; j < np; j++)
                cr[j] = rt__f32_to_bf16(tr[j]);
        else
            for (int j = 0; j < np; j++)
                cr[j] = rt__f32_to_bf16(tr[j] + beta * rt__bf16_to_f32(cr[j]));
    }
}

/* Part p: block p % nblk of batch item p / nblk, one single-threaded library call. */
static void gemm_part(const gemm_job *j, int p)
{
    int b = p / j->nblk, q = p % j->nblk;
    int lo = q * j->blk, hi = lo + j->blk, dim = j->split_n ? j->n : j->m;
    if (hi > dim)
        hi = dim;
    size_t es = j->ab == RT_BF16 ? 2 : 4, cs = j->c == RT_BF16 ? 2 : 4;
    const char *A = j->A + b * j->sA, *B = j->B + b * j->sB;
    char *C = j->C + b * j->sC;
    int mp = j->m, np = j->n;
    if (j->split_n) {
        np = hi - lo;
        B += (j->tb ? (size_t)lo * (size_t)j->ldb : (size_t)lo) * es;
        C += (size_t)lo * cs;
    } else {
        mp = hi - lo;
        A += (j->ta ? (size_t)lo : (size_t)lo * (size_t)j->lda) * es;
        C += (size_t)lo * (size_t)j->ldc * cs;
    }
    const prim_entry *e = j->prim[hi - lo == j->blk ? 0 : 1];
    float *t = j->to_bf16 ? rt__scratch(5, (size_t)mp * (size_t)np * sizeof(float)) : NULL;
    void *out = t ? (void *)t : (void *)C;
    if (j->gemv) {              /* one f32 row: C's row = A's row (or column) times op(B) */
        if (j->beta == 0.0f)    /* C is written, never read (sgemv's beta 0 may scale NaN) */
            memset(C, 0, (size_t)np * sizeof(float));
        cblas_sgemv(CblasRowMajor, j->tb ? CblasNoTrans : CblasTrans, j->tb ? np : j->k,
                    j->tb ? j->k : np, j->alpha, (const float *)B, j->ldb, (const float *)A,
                    j->ta ? j->lda : 1, j->beta, (float *)C, 1);
        return;
    }
    if (e)
        prim_run(e, A, B, out);
    else
        cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                    j->tb ? CblasTrans : CblasNoTrans, mp, np, j->k, j->alpha,
                    (const float *)A, j->lda, (const float *)B, j->ldb, t ? 0.0f : j->beta,
                    (float *)out, t ? np : j->ldc);
    if (t)
        round_block(t, (uint16_t *)C, mp, np, j->ldc, j->beta);
}

static void gemm_body(void *ctx, int lo, int hi)
{
    for (int p = lo; p < hi; p++)
        gemm_part(ctx, p);
}

/* The primitive of a block of mp x np (NULL: OpenBLAS runs it). */
static prim_entry *block_prim(const gemm_job *j, int mp, int np)
{
    if (j->ab == RT_F32 && 2.0 * mp * np * (double)j->k < GEMM_SMALL_FLOPS)
        return NULL;
    prim_key key;
    memset(&key, 0, sizeof key);
    float beta = j->to_bf16 ? 0.0f : j->beta;
    key.ta = j->ta;
    key.tb = j->tb;
    key.m = mp;
    key.n = np;
    key.k = j->k;
    key.lda = j->lda;
    key.ldb = j->ldb;
    key.ldc = j->to_bf16 ? np : j->ldc;
    key.ab = j->ab;
    key.c = j->to_bf16 ? RT_F32 : j->c;
    memcpy(&key.alpha, &j->alpha, 4);
    memcpy(&key.beta, &beta, 4);
    return prim_get(&key);
}

/* C = beta * C (k == 0 or alpha == 0) in C's dtype; beta == 0 writes zeros without reading C. */
static void scale_c(void *C, rt_dtype c, int m, int n, int ldc, long sC, int batch, float beta)
{
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < m; i++) {
            size_t at = (size_t)b * (size_t)sC + (size_t)i * (size_t)ldc;
            if (c == RT_F32) {
                float *row = (float *)C + at;
                for (int j = 0; j < n; j++)
                    row[j] = beta == 0.0f ? 0.0f : beta * row[j];
            } else {
                uint16_t *row = (uint16_t *)C + at;
                for (int j = 0; j < n; j++)
                    row[j] = beta == 0.0f ? 0 : rt__f32_to_bf16(beta * rt__bf16_to_f32(row[j]));
            }
        }
}

/* No fused GEMM here (rt.h): the library's kernels add the bias and the GELU after rt_gemm,
** as they always have, and the results keep their bits. */
int rt_gemm_epi(int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
                int ldb, void *C, int ldc, rt_epilogue epi, const void *bias, void *aux,
                rt_dtype t)
{
    (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)A; (void)lda; (void)B; (void)ldb;
    (void)C; (void)ldc; (void)epi; (void)bias; (void)aux; (void)t;
    return 0;
}

/*
** The GEMM of rt.h on the CPU: validates, cuts the call into parts that depend on its shape
** alone (see above), looks up their primitives, and runs the parts on the pool, or in turn on
** the calling thread when the call is small, nested or the pool has one thread.
*/
void rt_gemm(int ta, int tb, int m, int n, int k, float alpha,
             const void *A, int lda, long sA, const void *B, int ldb, long sB,
             float beta, void *C, int ldc, long sC, int batch, rt_dtype ab, rt_dtype c)
{
    int what = rt__gemm_check(ta, tb, m, n, k, alpha, A, lda, B, ldb, C, ldc, batch, ab, c);
    if (what == RT__GEMM_NONE)
        return;
    if (what == RT__GEMM_SCALE) {
        scale_c(C, c, m, n, ldc, sC, batch, beta);
        return;
    }
    long es = ab == RT_BF16 ? 2 : 4, cs = c == RT_BF16 ? 2 : 4;
    gemm_job j = { ta != 0, tb != 0, m, n, k, alpha, beta, A, B, C, lda, ldb, ldc,
                   sA * es, sB * es, sC * cs, ab, c, ab == RT_F32 && c == RT_BF16, 0, m, 1,
                   { NULL, NULL }, m == 1 && ab == RT_F32 && c == RT_F32 };
    double item = 2.0 * m * n * (double)k;
    if (item >= GEMM_SPLIT_MIN_FLOPS) {
        if (m > GEMM_ROW_BLK) {
            j.blk = GEMM_ROW_BLK;
        } else if (n > 2 * GEMM_COL_BLK) {
            j.split_n = 1;
            j.blk = GEMM_COL_BLK;
        }
        int dim = j.split_n ? n : m;
        j.nblk = (dim + j.blk - 1) / j.blk;
    }
    int dim = j.split_n ? n : m, last = dim - (j.nblk - 1) * j.blk;
    if (!j.gemv)
        j.prim[0] = j.split_n ? block_prim(&j, m, j.blk) : block_prim(&j, j.blk, n);
    if (last != j.blk && !j.gemv)
        j.prim[1] = j.split_n ? block_prim(&j, m, last) : block_prim(&j, last, n);
    int parts = batch * j.nblk;
    if (parts == 1 || rt_threads() <= 1 || rt__in_parallel() || item * batch < GEMM_PAR_MIN_FLOPS)
        gemm_body(&j, 0, parts);
    else
        rt_parallel_for(parts, gemm_body, &j);
    prim_put(j.prim[0]);
    prim_put(j.prim[1]);
}

/* -- Randomness ---------------------------------------------------------------------------- */

typedef struct {
    float *dst;
    int cols, ld;
    uint64_t seed, stream, first, gld;
    double mean, std;
} rng_job;

static void rng_body(void *ctx, int lo, int hi)
{
    const rng_job *r = ctx;
    for (int i = lo; i < hi; i++) {
        float *row = r->dst + (size_t)i * (size_t)r->ld;
        uint64_t base = r->first + (uint64_t)i * r->gld;
        for (int j = 0; j < r->cols; j++)
            row[j] = (float)(r->mean + r->std * rt__normal_at(r->seed, r->stream,
                                                                base + (uint64_t)j));
    }
}

/*
** The normals of rt.h (Philox-4x32-10 + Box-Muller), rows split over the pool.
*/
void rt_rng_normal(float *dst, int rows, int cols, int ld, uint64_t seed, uint64_t stream,
                   uint64_t first, uint64_t gld, float mean, float std)
{
    RT_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "rt_rng_normal: rows %d, cols %d, ld %d",
             rows, cols, ld);
    if (rows == 0 || cols == 0)
        return;
    RT_CHECK(dst, "rt_rng_normal: NULL dst");
    rng_job r = { dst, cols, ld, seed, stream, first, gld, mean, std };
    rt_parallel_for(rows, rng_body, &r);
}
