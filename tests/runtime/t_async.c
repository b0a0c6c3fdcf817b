/*
** t_async.c: rt.h's asynchronous calls (rt_*_start, rt_wait, rt_progress) against the blocking
** ones, bit for bit, on several groups (world, pairs, by parity, solo, reversed), every dtype,
** the sizes on the command line; reductions also against a sum formed here in group-rank
** order (rt.h: the MPI paths add in that order whatever MPI's algorithms). Then several
** requests in flight on one group and on several, waited in other orders, with blocking calls
** and rt_progress between; p2p requests in flight together; rt_progress alone completing a
** large allreduce. Runs on 1..N ranks, on either backend (buffers staged with rt_memcpy).
**   t_async SIZE...           all of it for each size (default 0 1 2 5 1000 70001)
**   t_async --large SIZE...   the collectives on world only, f32 and bf16, in flight, progress
*/
#include "t_util.h"   // defines: T_EXPECT, t_finish, t_to_dev, t_to_host, t_round_bf16, ...

static const rt_dtype dtypes[] = { RT_F32, RT_BF16, RT_I32, RT_I64 };

/* -- Values ---------------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

/* Member m's element i (of stream 'what'): floats of mixed sign and magnitude (2^-10 .. 2^10),
** so that the order of a sum shows in its bits; bf16 values are bf16 already. */
static void put_val(void *b, rt_dtype t, size_t i, int what, int m, size_t at)
{
    uint64_t h = mix(((uint64_t)what << 56) ^ ((uint64_t)m << 40) ^ at);
    uint32_t bits = (uint32_t)(h >> 63) << 31 | (uint32_t)(117 + (h >> 32) % 21) << 23 |
                    (uint32_t)(h & 0x7fffff);   /* sign, exponent -10 .. 10, mantissa */
    float f;
    memcpy(&f, &bits, sizeof f);
    switch (t) {
    case RT_F32:  ((float *)b)[i] = f; break;
    case RT_BF16: ((uint16_t *)b)[i] = t_bf16_bits(f); break;
    case RT_I32:  ((int32_t *)b)[i] = (int32_t)(h >> 8); break;
    default:      ((int64_t *)b)[i] = (int64_t)h; break;
    }
}

/* The reduction of member values 0..p-1 at 'at', formed in group-rank order as rt.h states:
** f32 adds in f32, bf16 in f32 rounded once, integers wrap; max keeps the larger. */
static void put_ref(void *b, rt_dtype t, size_t i, int what, int p, size_t at, rt_op op)
{
    char v[8];
    float facc = 0;
    uint64_t iacc = 0;
    int64_t imax = 0;
    for (int m = 0; m < p; m++) {
        put_val(v, t, 0, what, m, at);
        float f = t == RT_BF16 ? t_bf16_value(*(uint16_t *)v) : *(float *)v;
        int64_t x = t == RT_I32 ? *(int32_t *)v : t == RT_I64 ? *(int64_t *)v : 0;
        if (m == 0) {
            facc = f;
            iacc = (uint64_t)x;
            imax = x;
        } else if (op == RT_MAX) {
            facc = f > facc ? f : facc;
            imax = x > imax ? x : imax;
        } else {
            facc += f;
            iacc += (uint64_t)x;
        }
    }
    int64_t ires = op == RT_MAX ? imax : (int64_t)iacc;
    switch (t) {
    case RT_F32:  ((float *)b)[i] = facc; break;
    case RT_BF16: ((uint16_t *)b)[i] = t_bf16_bits(facc); break;
    case RT_I32:  ((int32_t *)b)[i] = (int32_t)(uint32_t)(uint64_t)ires; break;
    default:      ((int64_t *)b)[i] = ires; break;
    }
}

/* First differing element of two host buffers of n elements (n when equal). */
static size_t first_diff(const void *a, const void *b, size_t n, size_t es)
{
    if (!memcmp(a, b, n * es))
        return n;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es))
            return i;
    return n;
}

/* -- One collective, blocking and asynchronous ------------------------------------------------- */

/* A device buffer holding member m's values of stream 'what' at positions base + i. */
static void *dev_vals(rt_dtype t, size_t n, int what, int m, size_t base)
{
    size_t es = rt_dtype_size(t);
    void *h = t_alloc(n * es);
    for (size_t i = 0; i < n; i++)
        put_val(h, t, i, what, m, base + i);
    void *d = t_to_dev(h, n * es);
    free(h);
    return d;
}

/* Compare the n elements of device buffers da (async) and db (blocking) bit for bit, and with
** the host reference ref (NULL: none). */
static void check(const char *what, rt_group *g, rt_dtype t, size_t n, const void *da,
                  const void *db, const void *ref)
{
    size_t es = rt_dtype_size(t);
    void *a = t_alloc(n * es), *b = t_alloc(n * es);
    t_to_host(a, da, n * es);
    t_to_host(b, db, n * es);
    size_t i = first_diff(a, b, n, es);
    T_EXPECT(i == n, "%s %s n=%zu on %s: async and blocking differ first at [%zu]", what,
             rt_dtype_name(t), n, rt_group_name(g), i);
    if (ref) {
        i = first_diff(a, ref, n, es);
        T_EXPECT(i == n, "%s %s n=%zu on %s: [%zu] is not the group-rank-order result", what,
                 rt_dtype_name(t), n, rt_group_name(g), i);
    }
    free(a);
    free(b);
}

static void test_allreduce(rt_group *g, rt_dtype t, size_t n, rt_op op)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    size_t es = rt_dtype_size(t);
    void *da = dev_vals(t, n, 1, gr, 0), *db = dev_vals(t, n, 1, gr, 0);
    rt_allreduce(db, n, t, op, g);
    rt_wait(rt_allreduce_start(da, n, t, op, g));
    void *ref = t_alloc(n * es);
    for (size_t i = 0; i < n; i++)
        put_ref(ref, t, i, 1, p, i, op);
    /* NCCL adds in its own order: the reference holds for the MPI paths only */
    int mpi_order = strcmp(rt_backend(), "cuda-nccl") != 0 || p == 1;
    check(op == RT_MAX ? "allreduce max" : "allreduce sum", g, t, n, da, db,
          mpi_order ? ref : NULL);
    free(ref);
    rt_free(da);
    rt_free(db);
}

static void test_reduce_scatter(rt_group *g, rt_dtype t, size_t n, int in_place)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    size_t es = rt_dtype_size(t), all = n * (size_t)p;
    char *sa = dev_vals(t, all, 2, gr, 0), *sb = dev_vals(t, all, 2, gr, 0);
    char *ra = in_place ? sa + (size_t)gr * n * es : rt_malloc(n * es + 1);
    char *rb = in_place ? sb + (size_t)gr * n * es : rt_malloc(n * es + 1);
    rt_reduce_scatter(sb, rb, n, t, g);
    rt_wait(rt_reduce_scatter_start(sa, ra, n, t, g));
    void *ref = t_alloc(n * es);
    for (size_t i = 0; i < n; i++)
        put_ref(ref, t, i, 2, p, (size_t)gr * n + i, RT_SUM);
    int mpi_order = strcmp(rt_backend(), "cuda-nccl") != 0 || p == 1;
    check(in_place ? "reduce-scatter in place" : "reduce-scatter", g, t, n, ra, rb,
          mpi_order ? ref : NULL);
    if (in_place)           /* the rest of send as it was, in both */
        check("reduce-scatter in place, send", g, t, all, sa, sb, NULL);
    free(ref);
    if (!in_place) {
        rt_free(ra);
        rt_free(rb);
    }
    rt_free(sa);
    rt_free(sb);
}

static void test_allgather(rt_group *g, rt_dtype t, size_t n, int in_place)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    size_t es = rt_dtype_size(t), all = n * (size_t)p;
    char *ra = rt_malloc(all * es + 1), *rb = rt_malloc(all * es + 1);
    char *sa, *sb;
    if (in_place) {
        sa = ra + (size_t)gr * n * es;
        sb = rb + (size_t)gr * n * es;
        void *d = dev_vals(t, n, 3, gr, 0);
        rt_memcpy(sa, d, n * es, RT_D2D);
        rt_memcpy(sb, d, n * es, RT_D2D);
        rt_free(d);
    } else {
        sa = dev_vals(t, n, 3, gr, 0);
        sb = dev_vals(t, n, 3, gr, 0);
    }
    rt_allgather(sb, rb, n, t, g);
    rt_wait(rt_allgather_start(sa, ra, n, t, g));
    void *ref = t_alloc(all * es);
    for (int m = 0; m < p; m++)
        for (size_t i = 0; i < n; i++)
            put_val(ref, t, (size_t)m * n + i, 3, m, i);
    check(in_place ? "allgather in place" : "allgather", g, t, all, ra, rb, ref);
    free(ref);
    if (!in_place) {
        rt_free(sa);
        rt_free(sb);
    }
    rt_free(ra);
    rt_free(rb);
}

/* -- Several requests in flight ---------------------------------------------------------------- */

/*
** On world, pairs and solo at once: two allreduces and an in-place reduce-scatter on world, an
** allgather on pairs, an allreduce on solo and one of n = 0; rt_progress and a blocking
** allreduce on world (after them in world's order) between the starts and the waits; waits in
** an order other than the starts'. Each result against the same call made blocking before.
*/
static void test_in_flight(rt_group *world, rt_group *pairs, rt_group *solo, size_t n,
                           int wait_order)
{
    int wr = rt_group_rank(world), w = rt_group_size(world);
    size_t es = sizeof(float);
    enum { K = 7 };
    char *a[K], *b[K];
    /* the blocking results first, in the same order of calls (world's order: 0 1 2 then 6) */
    for (int k = 0; k < K; k++) {
        size_t len = k == 2 ? n * (size_t)w : k == 3 ? 2 * n : n;
        a[k] = dev_vals(RT_F32, len + 1, 10 + k, wr, 0);
        b[k] = dev_vals(RT_F32, len + 1, 10 + k, wr, 0);
    }
    int pr = pairs ? rt_group_rank(pairs) : 0;
    rt_allreduce(b[0], n, RT_F32, RT_SUM, world);
    rt_allreduce(b[1], n, RT_F32, RT_MAX, world);
    rt_reduce_scatter(b[2], b[2] + (size_t)wr * n * es, n, RT_F32, world);
    if (pairs)
        rt_allgather(b[3] + (size_t)pr * n * es, b[3], n, RT_F32, pairs);
    rt_allreduce(b[4], n, RT_F32, RT_SUM, solo);
    rt_allreduce(b[5], 0, RT_F32, RT_SUM, world);
    rt_allreduce(b[6], n, RT_F32, RT_SUM, world);

    rt_req *q[K] = { NULL };
    q[0] = rt_allreduce_start(a[0], n, RT_F32, RT_SUM, world);
    q[3] = pairs ? rt_allgather_start(a[3] + (size_t)pr * n * es, a[3], n, RT_F32, pairs)
                 : NULL;
    rt_progress();
    q[1] = rt_allreduce_start(a[1], n, RT_F32, RT_MAX, world);
    q[4] = rt_allreduce_start(a[4], n, RT_F32, RT_SUM, solo);
    q[2] = rt_reduce_scatter_start(a[2], a[2] + (size_t)wr * n * es, n, RT_F32, world);
    rt_progress();
    q[5] = rt_allreduce_start(a[5], 0, RT_F32, RT_SUM, world);
    rt_allreduce(a[6], n, RT_F32, RT_SUM, world);       /* blocking, while the others pend */
    static const int orders[3][K] = { { 6, 5, 4, 3, 2, 1, 0 }, { 2, 0, 5, 1, 3, 6, 4 },
                                      { 0, 1, 2, 3, 4, 5, 6 } };
    for (int i = 0; i < K; i++) {
        int k = orders[wait_order % 3][i];
        rt_wait(q[k]);
        if (i == 2)
            rt_progress();
    }
    const char *name[K] = { "allreduce sum", "allreduce max", "reduce-scatter in place",
                            "allgather in place", "allreduce (solo)", "allreduce n=0",
                            "allreduce (blocking among requests)" };
    rt_group *grp[K] = { world, world, world, pairs, solo, world, world };
    for (int k = 0; k < K; k++) {
        size_t len = k == 2 ? n * (size_t)w : k == 3 ? 2 * n : n;
        if (k == 3 && !pairs)
            continue;
        char tag[96];
        snprintf(tag, sizeof tag, "in flight (wait order %d): %s", wait_order, name[k]);
        check(tag, grp[k], RT_F32, len + 1, a[k], b[k], NULL);
        rt_free(a[k]);
        rt_free(b[k]);
    }
    if (!pairs) {
        rt_free(a[3]);
        rt_free(b[3]);
    }
}

/* -- p2p requests ------------------------------------------------------------------------------ */

#ifndef RT_NO_MPI       /* the single-rank library refuses p2p (no peers) */

/*
** Three requests in flight, each able to complete on its own (rt.h's portable rule): a ring
** exchange on tag 0, a two-way exchange with the partner on tag 1, a second ring exchange on
** tag 0 (matched after the first: start order); waited 2, 3, 1. Then, on the MPI paths only,
** a send and its receive as two requests (matched across requests), waited receive first.
*/
static void test_p2p(rt_dtype t, size_t n)
{
    int r = rt_rank(), w = rt_world(), next = (r + 1) % w, prev = (r + w - 1) % w;
    int partner = (r ^ 1) < w ? (r ^ 1) : r;
    size_t es = rt_dtype_size(t);
    char *s1 = dev_vals(t, n, 20, r, 0), *s2 = dev_vals(t, n, 21, r, 0);
    char *s3 = dev_vals(t, n, 22, r, 0), *s4 = dev_vals(t, n, 23, r, 0);
    char *r1 = rt_malloc(n * es + 1), *r2 = rt_malloc(n * es + 1);
    char *r3 = rt_malloc(n * es + 1), *r4 = rt_malloc(n * es + 1);
    rt_p2p_op o1[] = { { 1, s1, n, t, next, 0 }, { 0, r1, n, t, prev, 0 } };
    rt_p2p_op o2[] = { { 0, r2, n, t, partner, 1 }, { 1, s2, n, t, partner, 1 } };
    rt_p2p_op o3[] = { { 1, s3, n, t, next, 0 }, { 0, r3, n, t, prev, 0 } };
    rt_req *q1 = rt_p2p_start(o1, 2), *q2 = rt_p2p_start(o2, 2);
    rt_progress();
    rt_req *q3 = rt_p2p_start(o3, 2);
    rt_wait(q2);
    rt_wait(q3);
    rt_wait(q1);
    int split = strcmp(rt_backend(), "cuda-nccl") != 0;
    if (split) {
        rt_p2p_op os = { 1, s4, n, t, next, 5 }, orc = { 0, r4, n, t, prev, 5 };
        rt_req *qs = rt_p2p_start(&os, 1), *qr = rt_p2p_start(&orc, 1);
        rt_wait(qr);
        rt_wait(qs);
    }
    void *h = t_alloc(n * es), *want = t_alloc(n * es);
    struct { char *buf; int what, from; const char *name; } c[] = {
        { r1, 20, prev, "ring 1" }, { r2, 21, partner, "exchange" }, { r3, 22, prev, "ring 2" },
        { r4, 23, prev, "split send/receive" } };
    for (int k = 0; k < (split ? 4 : 3); k++) {
        t_to_host(h, c[k].buf, n * es);
        for (size_t i = 0; i < n; i++)
            put_val(want, t, i, c[k].what, c[k].from, i);
        size_t i = first_diff(h, want, n, es);
        T_EXPECT(i == n, "p2p requests %s n=%zu: %s [%zu] is not rank %d's", rt_dtype_name(t),
                 n, c[k].name, i, c[k].from);
    }
    free(h);
    free(want);
    rt_free(s1);
    rt_free(s2);
    rt_free(s3);
    rt_free(s4);
    rt_free(r1);
    rt_free(r2);
    rt_free(r3);
    rt_free(r4);
}
#endif

/* -- Progress -------------------------------------------------------------------------------- */

/* rt_progress alone (rt_test: a step and a look) completes a large allreduce on world; it
** is then waited, and its result is the blocking one's. */
static void test_progress(size_t n)
{
    rt_group *g = rt_group_world();
    int gr = rt_group_rank(g);
    void *da = dev_vals(RT_F32, n, 30, gr, 0), *db = dev_vals(RT_F32, n, 30, gr, 0);
    rt_allreduce(db, n, RT_F32, RT_SUM, g);
    rt_req *q = rt_allreduce_start(da, n, RT_F32, RT_SUM, g);
    double t0 = rt_now();
    long steps = 0;
    int done = 0;
    while (!(done = rt_test(q)) && rt_now() - t0 < 100) {
        volatile double x = 0;           /* "compute" between progress calls */
        for (int i = 0; i < 20000; i++)
            x += i;
        steps++;
    }
    T_EXPECT(done, "progress: an allreduce of %zu f32 on world did not complete in 100 s of "
             "rt_progress (%ld steps)", n, steps);
    rt_wait(q);
    check("allreduce completed by rt_progress", g, RT_F32, n, da, db, NULL);
    rt_free(da);
    rt_free(db);
}

/* -- Main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 0, NULL);
    int w = rt_world(), r = rt_rank();
    size_t sizes[64];
    int nsizes = 0, large = 0;
    for (int i = 1; i < argc && nsizes < 64; i++) {
        if (!strcmp(argv[i], "--large"))
            large = 1;
        else
            sizes[nsizes++] = (size_t)strtoull(argv[i], NULL, 10);
    }
    if (nsizes == 0) {
        static const size_t def[] = { 0, 1, 2, 5, 1000, 70001 };
        memcpy(sizes, def, sizeof def);
        nsizes = (int)(sizeof def / sizeof def[0]);
    }
    size_t largest = 0;
    for (int s = 0; s < nsizes; s++)
        largest = sizes[s] > largest ? sizes[s] : largest;

    /* group kinds: world, consecutive pairs, by parity, solo, all ranks in reverse order */
    int *pairs = t_alloc((size_t)w * sizeof(int)), *parity = t_alloc((size_t)w * sizeof(int));
    int *solo = t_alloc((size_t)w * sizeof(int)), *rev = t_alloc((size_t)w * sizeof(int));
    for (int i = 0; i < w; i++) {
        pairs[i] = i;
        solo[i] = i;
        rev[i] = w - 1 - i;
        parity[i] = i < (w + 1) / 2 ? 2 * i : 2 * (i - (w + 1) / 2) + 1;
    }
    t_table tabs[4] = {
        { "pairs", w / 2, 2, pairs },                       /* odd world: last rank in none */
        { "parity", w % 2 ? 1 : 2, w % 2 ? (w + 1) / 2 : w / 2, parity },
        { "solo", w, 1, solo },
        { "rev", 1, w, rev },
    };
    rt_group *groups[5] = { rt_group_world() };
    for (int k = 0; k < 4; k++)
        groups[k + 1] = t_group_from_table(&tabs[k]);

    for (int k = 0; k < (large ? 1 : 5); k++) {
        rt_group *g = groups[k];
        if (!g)
            continue;
        for (int s = 0; s < nsizes; s++)
            for (size_t d = 0; d < (large ? 2 : sizeof dtypes / sizeof dtypes[0]); d++) {
                rt_dtype t = dtypes[d];
                size_t n = sizes[s];
                test_allreduce(g, t, n, RT_SUM);
                test_allreduce(g, t, n, RT_MAX);
                test_reduce_scatter(g, t, n, 0);
                test_reduce_scatter(g, t, n, 1);
                test_allgather(g, t, n, 0);
                test_allgather(g, t, n, 1);
            }
    }
    for (int s = 0; s < nsizes; s++) {
        for (int order = 0; order < 3; order++)
            test_in_flight(groups[0], groups[1], groups[3], sizes[s], order);
#ifndef RT_NO_MPI       /* the single-rank library refuses p2p (no peers) */
        for (size_t d = 0; d < (large ? 1 : sizeof dtypes / sizeof dtypes[0]); d++)
            test_p2p(dtypes[d], sizes[s]);
#endif
    }
    rt_wait(rt_p2p_start(NULL, 0));     /* no ops: a complete request, on every library */
    test_progress(largest > 4096 ? largest : 4096);
    (void)r;

    int bad = t_finish("async");
    for (int k = 1; k < 5; k++)
        rt_group_free(groups[k]);
    free(pairs);
    free(parity);
    free(solo);
    free(rev);
    rt_finalize();
    return bad;
}
