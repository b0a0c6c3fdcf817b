/*
** t_coll.c: every communication primitive of rt.h on several groups (world, pairs, by
** parity, solo, reversed order), every dtype, the sizes given on the command line, each
** result checked against values this rank computes on its own. Runs on 1..N ranks and on
** either backend (buffers staged with rt_memcpy).
**   t_coll SIZE...           all primitives on all groups for each size
**   t_coll --large SIZE      allreduce / allgather / reduce-scatter (also in place, which
**                            goes in slices above 8 MiB) / broadcast / p2p on world
**   ... --dtype T            the large tests in dtype T alone (f32, bf16, i32, i64)
*/
#include "t_util.h"   // defines: T_EXPECT, t_finish, t_to_dev, t_to_host, t_round_bf16, ...

static const rt_dtype dtypes[] = { RT_F32, RT_BF16, RT_I32, RT_I64 };

static int is_float(rt_dtype t)
{
    return t == RT_F32 || t == RT_BF16;
}

/* -- Values ---------------------------------------------------------------------------------- */

/* A small integer for reductions: exact in f32 and bf16 when summed over <= 8 members. */
static int64_t red_val(rt_dtype t, int member, size_t i)
{
    if (is_float(t))
        return (int64_t)((member * 7 + (long)(i % 1000) * 3) % 11) - 5;
    if (t == RT_I32)
        return (int64_t)member * 100003 - (int64_t)(i % 50000) * 3;
    return ((int64_t)member << 33) - (int64_t)i * 5 + 1;
}

static void put_num(void *b, rt_dtype t, size_t i, int64_t v)
{
    switch (t) {
    case RT_F32:  ((float *)b)[i] = (float)v; break;
    case RT_BF16: ((uint16_t *)b)[i] = t_bf16_bits((float)v); break;
    case RT_I32:  ((int32_t *)b)[i] = (int32_t)v; break;
    default:      ((int64_t *)b)[i] = v; break;
    }
}

static double get_num(const void *b, rt_dtype t, size_t i)
{
    switch (t) {
    case RT_F32:  return ((const float *)b)[i];
    case RT_BF16: return t_bf16_value(((const uint16_t *)b)[i]);
    case RT_I32:  return ((const int32_t *)b)[i];
    default:      return (double)((const int64_t *)b)[i];
    }
}

/* A bit pattern for data movement, unique per (who, index). */
static uint64_t key(int a, int b, size_t i)
{
    uint64_t k = (uint64_t)a * 1000003u + (uint64_t)b * 7919u + i * 2654435761u;
    return k ^ (k >> 17);
}

static void put_key(void *buf, rt_dtype t, size_t i, uint64_t k)
{
    switch (t) {
    case RT_F32:  ((float *)buf)[i] = (float)(k & 0xffffff); break;
    case RT_BF16: ((uint16_t *)buf)[i] = (uint16_t)k; break;
    case RT_I32:  ((uint32_t *)buf)[i] = (uint32_t)k; break;
    default:      ((uint64_t *)buf)[i] = k; break;
    }
}

static int has_key(const void *buf, rt_dtype t, size_t i, uint64_t k)
{
    switch (t) {
    case RT_F32:  return ((const float *)buf)[i] == (float)(k & 0xffffff);
    case RT_BF16: return ((const uint16_t *)buf)[i] == (uint16_t)k;
    case RT_I32:  return ((const uint32_t *)buf)[i] == (uint32_t)k;
    default:      return ((const uint64_t *)buf)[i] == k;
    }
}

/* -- Collectives on one group ---------------------------------------------------------------- */

static void test_allreduce(rt_group *g, rt_dtype t, size_t n, rt_op op)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    size_t es = rt_dtype_size(t);
    void *h = t_alloc(n * es);
    for (size_t i = 0; i < n; i++)
        put_num(h, t, i, red_val(t, gr, i));
    void *d = t_to_dev(h, n * es);
    rt_allreduce(d, n, t, op, g);
    t_to_host(h, d, n * es);
    for (size_t i = 0; i < n; i++) {
        int64_t want = red_val(t, 0, i);
        for (int m = 1; m < p; m++) {
            int64_t v = red_val(t, m, i);
            want = op == RT_SUM ? want + v : (v > want ? v : want);
        }
        double got = get_num(h, t, i);
        T_EXPECT(got == (double)want,
                 "allreduce %s %s n=%zu on %s (%d ranks): [%zu] = %.17g, want %lld",
                 op == RT_SUM ? "sum" : "max", rt_dtype_name(t), n, rt_group_name(g), p, i, got,
                 (long long)want);
    }
    rt_free(d);
    free(h);
}

/* Non-integer f32 sums (tolerance) and bf16 round-to-nearest-even at exact ties. */
static void test_allreduce_real(rt_group *g, size_t n)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    float *h = t_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = sinf(0.37f * (float)i + (float)gr);
    float *d = t_to_dev(h, n * sizeof(float));
    rt_allreduce(d, n, RT_F32, RT_SUM, g);
    t_to_host(h, d, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double want = 0, mag = 0;
        for (int m = 0; m < p; m++) {
            want += sinf(0.37f * (float)i + (float)m);
            mag += fabs(sinf(0.37f * (float)i + (float)m));
        }
        T_EXPECT(fabs(h[i] - want) <= 1e-6 * mag + 1e-7,
                 "allreduce f32 real n=%zu on %s: [%zu] = %.9g, want %.9g", n, rt_group_name(g),
                 i, h[i], want);
    }
    rt_free(d);
    free(h);
    if (p < 2)
        return;
    /* member 0 holds a, member 1 holds b, others 0: sum exact in f32, one bf16 rounding */
    static const float a[] = { 1.0f + 0x1p-7f, 1.0f, 1.0f, -3.0f, 0x1p-130f };
    static const float b[] = { 0x1p-8f, 0x1p-8f, 0x1p-8f + 0x1p-12f, -0x1p-7f, 0.0f };
    enum { NT = sizeof a / sizeof a[0] };
    uint16_t hb[NT];
    for (int i = 0; i < NT; i++)
        hb[i] = gr == 0 ? t_bf16_bits(a[i]) : gr == 1 ? t_bf16_bits(b[i]) : 0;
    uint16_t *db = t_to_dev(hb, sizeof hb);
    rt_allreduce(db, NT, RT_BF16, RT_SUM, g);
    t_to_host(hb, db, sizeof hb);
    for (int i = 0; i < NT; i++) {
        float want = t_round_bf16(t_bf16_value(t_bf16_bits(a[i])) +
                                  t_bf16_value(t_bf16_bits(b[i])));
        T_EXPECT(t_bf16_value(hb[i]) == want, "bf16 rounding on %s: case %d = %.9g, want %.9g",
                 rt_group_name(g), i, t_bf16_value(hb[i]), want);
    }
    rt_free(db);
}

static void test_allgather(rt_group *g, rt_dtype t, size_t n, int in_place)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    size_t es = rt_dtype_size(t);
    void *hs = t_alloc(n * es), *hr = t_alloc(n * es * (size_t)p);
    for (size_t i = 0; i < n; i++)
        put_key(hs, t, i, key(gr, 0, i));
    void *dr = t_to_dev(hr, n * es * (size_t)p);
    char *ds;
    if (in_place) {
        ds = (char *)dr + (size_t)gr * n * es;
        rt_memcpy(ds, hs, n * es, RT_H2D);
    } else {
        ds = t_to_dev(hs, n * es);
    }
    rt_allgather(ds, dr, n, t, g);
    t_to_host(hr, dr, n * es * (size_t)p);
    for (int b = 0; b < p; b++)
        for (size_t i = 0; i < n; i++)
            T_EXPECT(has_key(hr, t, (size_t)b * n + i, key(b, 0, i)),
                     "allgather%s %s n=%zu on %s: block %d [%zu] wrong",
                     in_place ? " in place" : "", rt_dtype_name(t), n, rt_group_name(g), b, i);
    if (!in_place)
        rt_free(ds);
    rt_free(dr);
    free(hs);
    free(hr);
}

static void test_reduce_scatter(rt_group *g, rt_dtype t, size_t n, int in_place)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    size_t es = rt_dtype_size(t), all = n * (size_t)p;
    void *hs = t_alloc(all * es), *hr = t_alloc(n * es);
    for (size_t i = 0; i < all; i++)
        put_num(hs, t, i, red_val(t, gr, i));
    void *ds = t_to_dev(hs, all * es), *dr = in_place ? (char *)ds + (size_t)gr * n * es
                                                      : t_to_dev(hr, n * es);
    rt_reduce_scatter(ds, dr, n, t, g);
    t_to_host(hr, dr, n * es);
    for (size_t i = 0; i < n; i++) {
        int64_t want = 0;
        for (int m = 0; m < p; m++)
            want += red_val(t, m, (size_t)gr * n + i);
        double got = get_num(hr, t, i);
        T_EXPECT(got == (double)want, "reduce-scatter%s %s n=%zu on %s: [%zu] = %.17g, want %lld",
                 in_place ? " in place" : "", rt_dtype_name(t), n, rt_group_name(g), i, got,
                 (long long)want);
    }
    if (in_place) {   /* the other members' blocks of send are left as they were */
        void *back = t_alloc(all * es);
        t_to_host(back, ds, all * es);
        for (int m = 0; m < p; m++)
            if (m != gr)
                T_EXPECT(!memcmp((char *)back + (size_t)m * n * es,
                                 (char *)hs + (size_t)m * n * es, n * es),
                         "reduce-scatter in place %s n=%zu on %s: block %d of send changed",
                         rt_dtype_name(t), n, rt_group_name(g), m);
        free(back);
    }
    rt_free(ds);
    if (!in_place)
        rt_free(dr);
    free(hs);
    free(hr);
}

static void test_broadcast(rt_group *g, rt_dtype t, size_t n)
{
    int gr = rt_group_rank(g), p = rt_group_size(g), root = (int)((n + 1) % (size_t)p);
    size_t es = rt_dtype_size(t);
    void *h = t_alloc(n * es);
    for (size_t i = 0; i < n; i++)
        put_key(h, t, i, key(gr, 1, i));
    void *d = t_to_dev(h, n * es);
    rt_broadcast(d, n, t, root, g);
    t_to_host(h, d, n * es);
    for (size_t i = 0; i < n; i++)
        T_EXPECT(has_key(h, t, i, key(root, 1, i)), "broadcast %s n=%zu root %d on %s: [%zu] wrong",
                 rt_dtype_name(t), n, root, rt_group_name(g), i);
    rt_free(d);
    free(h);
}

static size_t a2a_count(int from, int to, size_t n)
{
    return (size_t)((from * 3 + to * 5 + (int)(n % 7)) % 4) * (n / 3 + 1);
}

static void test_alltoallv(rt_group *g, rt_dtype t, size_t n)
{
    int gr = rt_group_rank(g), p = rt_group_size(g);
    size_t es = rt_dtype_size(t);
    size_t *sc = t_alloc((size_t)p * sizeof(size_t)), *sd = t_alloc((size_t)p * sizeof(size_t));
    size_t *rc = t_alloc((size_t)p * sizeof(size_t)), *rd = t_alloc((size_t)p * sizeof(size_t));
    size_t stot = 0, rtot = 0;
    for (int b = 0; b < p; b++) {       /* gaps of 1 (send) and 2 (receive) between blocks */
        sc[b] = a2a_count(gr, b, n);
        sd[b] = stot;
        stot += sc[b] + 1;
        rc[b] = a2a_count(b, gr, n);
        rd[b] = rtot;
        rtot += rc[b] + 2;
    }
    void *hs = t_alloc(stot * es), *hr = t_alloc(rtot * es);
    for (int b = 0; b < p; b++)
        for (size_t i = 0; i < sc[b]; i++)
            put_key(hs, t, sd[b] + i, key(gr, b, i));
    for (size_t i = 0; i < rtot; i++)
        put_key(hr, t, i, 77);
    void *ds = t_to_dev(hs, stot * es), *dr = t_to_dev(hr, rtot * es);
    rt_alltoallv(ds, sc, sd, dr, rc, rd, t, g);
    t_to_host(hr, dr, rtot * es);
    for (int a = 0; a < p; a++) {
        for (size_t i = 0; i < rc[a]; i++)
            T_EXPECT(has_key(hr, t, rd[a] + i, key(a, gr, i)),
                     "alltoallv %s n=%zu on %s: from %d [%zu] wrong", rt_dtype_name(t), n,
                     rt_group_name(g), a, i);
        T_EXPECT(has_key(hr, t, rd[a] + rc[a], 77) && has_key(hr, t, rd[a] + rc[a] + 1, 77),
                 "alltoallv %s n=%zu on %s: wrote into the gap after block %d", rt_dtype_name(t),
                 n, rt_group_name(g), a);
    }
    rt_free(ds);
    rt_free(dr);
    free(hs);
    free(hr);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void test_group(rt_group *g, const size_t *sizes, int nsizes)
{
    const int *mem = rt_group_members(g);
    T_EXPECT(mem[rt_group_rank(g)] == rt_rank(), "group %s: members[%d] = %d, not this rank %d",
             rt_group_name(g), rt_group_rank(g), mem[rt_group_rank(g)], rt_rank());
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
            rt_dtype t = dtypes[k];
            test_allreduce(g, t, n, RT_SUM);
            test_allreduce(g, t, n, RT_MAX);
            test_allgather(g, t, n, 0);
            test_allgather(g, t, n, 1);
            test_reduce_scatter(g, t, n, 0);
            test_reduce_scatter(g, t, n, 1);
            test_broadcast(g, t, n);
            test_alltoallv(g, t, n);
        }
        test_allreduce_real(g, n);
        rt_barrier(g);
    }
}

/* -- Point-to-point (world) ------------------------------------------------------------------ */

/* rt_p2p_start / rt_wait as the context-parallel ring uses them: three hops of a block
** around the world's ring, double-buffered, with work on the block in hand between start and
** wait; after hop k every rank holds the block of rank r - k. */
static void test_p2p_split(rt_dtype t, size_t n)
{
    int r = rt_rank(), w = rt_world(), next = (r + 1) % w, prev = (r + w - 1) % w;
    size_t es = rt_dtype_size(t);
    void *h = t_alloc(n * es + 1), *g = t_alloc(n * es + 1);
    for (size_t i = 0; i < n; i++)
        put_key(h, t, i, key(r, 7, i));
    void *buf[2] = { t_to_dev(h, n * es), rt_malloc(n * es + 1) };
    void *work = rt_malloc(n * es + 1);
    for (int k = 0; k < 3; k++) {
        rt_p2p_op ops[] = { { 1, buf[k % 2], n, t, next, 2 },
                            { 0, buf[(k + 1) % 2], n, t, prev, 2 } };
        rt_req *hop = rt_p2p_start(ops, 2);
        rt_memcpy(work, buf[k % 2], n * es, RT_D2D);    /* reading the block being sent */
        rt_wait(hop);
        t_to_host(g, buf[(k + 1) % 2], n * es);
        int from = ((r - k - 1) % w + w) % w;
        for (size_t i = 0; i < n; i++)
            T_EXPECT(has_key(g, t, i, key(from, 7, i)), "p2p_start %s n=%zu hop %d: [%zu] is not "
                     "rank %d's", rt_dtype_name(t), n, k, i, from);
    }
    rt_wait(NULL);                  /* no request: returns */
    rt_free(buf[0]);
    rt_free(buf[1]);
    rt_free(work);
    free(h);
    free(g);
}

/* Ring (send to next, receive from previous), a two-way exchange with a partner, a message to
** self, two ordered messages to the next rank, and two tagged messages to the next rank that
** the sender posts in the opposite order of the receiver (pipeline activations and gradients
** between the same pair) -- all posted in one rt_p2p call. */
static void test_p2p(rt_dtype t, size_t n)
{
    int r = rt_rank(), w = rt_world(), next = (r + 1) % w, prev = (r + w - 1) % w;
    int partner = (r ^ 1) < w ? (r ^ 1) : r;
    size_t es = rt_dtype_size(t);
    enum { NB = 6 };
    size_t cnt[NB] = { n, n, n + 1, n, n, n };
    void *h[NB], *d[NB];
    for (int b = 0; b < NB; b++) {
        h[b] = t_alloc(cnt[b] * es);
        for (size_t i = 0; i < cnt[b]; i++)
            put_key(h[b], t, i, key(r, b, i));
        d[b] = t_to_dev(h[b], cnt[b] * es);
    }
    /* buffers: 0 send ring, 1 send ring (2nd msg, n+1 via slot 2), 3 recv ring 1st, ... */
    void *rr1 = rt_malloc(n * es + 1), *rr2 = rt_malloc((n + 1) * es), *rx = rt_malloc(n * es + 1);
    void *rs = rt_malloc(n * es + 1);
    void *rt1 = rt_malloc(n * es + 1), *rt2 = rt_malloc(n * es + 1);
    rt_p2p_op ops[] = {
        { 0, rr1, n, t, prev, 0 },       /* 1st message from prev */
        { 1, d[0], n, t, next, 0 },
        { 0, rx, n, t, partner, 0 },
        { 1, d[3], n, t, partner, 0 },
        { 0, rr2, n + 1, t, prev, 0 },   /* 2nd message from prev, after the first */
        { 1, d[2], n + 1, t, next, 0 },
        { 1, d[4], n, t, r, 0 },         /* self */
        { 0, rs, n, t, r, 0 },
        { 1, d[5], n, t, next, 2 },      /* tag 2 sent before tag 1 ... */
        { 1, d[1], n, t, next, 1 },
        { 0, rt1, n, t, prev, 1 },       /* ... but received after it */
        { 0, rt2, n, t, prev, 2 },
    };
    rt_p2p(ops, (int)(sizeof ops / sizeof ops[0]));
    void *g1 = t_alloc(n * es + 1), *g2 = t_alloc((n + 1) * es), *gx = t_alloc(n * es + 1);
    void *gs = t_alloc(n * es + 1), *gt1 = t_alloc(n * es + 1), *gt2 = t_alloc(n * es + 1);
    t_to_host(gt1, rt1, n * es);
    t_to_host(gt2, rt2, n * es);
    t_to_host(g1, rr1, n * es);
    t_to_host(g2, rr2, (n + 1) * es);
    t_to_host(gx, rx, n * es);
    t_to_host(gs, rs, n * es);
    for (size_t i = 0; i < n; i++) {
        T_EXPECT(has_key(g1, t, i, key(prev, 0, i)), "p2p %s n=%zu: ring msg 1 [%zu] wrong",
                 rt_dtype_name(t), n, i);
        T_EXPECT(has_key(gx, t, i, key(partner, 3, i)), "p2p %s n=%zu: exchange [%zu] wrong",
                 rt_dtype_name(t), n, i);
        T_EXPECT(has_key(gs, t, i, key(r, 4, i)), "p2p %s n=%zu: self [%zu] wrong",
                 rt_dtype_name(t), n, i);
        T_EXPECT(has_key(gt1, t, i, key(prev, 1, i)) && has_key(gt2, t, i, key(prev, 5, i)),
                 "p2p %s n=%zu: tagged messages [%zu] matched by order, not by tag",
                 rt_dtype_name(t), n, i);
    }
    for (size_t i = 0; i < n + 1; i++)
        T_EXPECT(has_key(g2, t, i, key(prev, 2, i)), "p2p %s n=%zu: ring msg 2 [%zu] wrong",
                 rt_dtype_name(t), n, i);
    for (int b = 0; b < NB; b++) {
        rt_free(d[b]);
        free(h[b]);
    }
    rt_free(rr1);
    rt_free(rr2);
    rt_free(rx);
    rt_free(rs);
    rt_free(rt1);
    rt_free(rt2);
    free(gt1);
    free(gt2);
    free(g1);
    free(g2);
    free(gx);
    free(gs);
}

/* -- Groups ---------------------------------------------------------------------------------- */

static t_table table_of(const char *name, int ngroups, int size, int *ranks)
{
    t_table t = { name, ngroups, size, ranks };
    return t;
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 0, NULL);
    int w = rt_world(), r = rt_rank();
    size_t sizes[64];
    int nsizes = 0, large = 0, only = -1;
    static const char *names[] = { "f32", "bf16", "i32", "i64" };
    for (int i = 1; i < argc && nsizes < 64; i++) {
        if (!strcmp(argv[i], "--large"))
            large = 1;
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            for (int k = 0; k < 4; k++)
                if (!strcmp(argv[i + 1], names[k])) only = k;
            T_EXPECT(only >= 0, "--dtype %s: not one of f32, bf16, i32, i64", argv[i + 1]);
            i++;
        } else
            sizes[nsizes++] = (size_t)strtoull(argv[i], NULL, 10);
    }
    if (nsizes == 0) {
        static const size_t def[] = { 0, 1, 2, 3, 7, 31, 257, 4099 };
        memcpy(sizes, def, sizeof def);
        nsizes = (int)(sizeof def / sizeof def[0]);
    }

    if (large) {
        rt_group *g = rt_group_world();
        for (int s = 0; s < nsizes; s++) {
            for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
                rt_dtype t = dtypes[k];
                if (only >= 0 && (int)k != only) continue;
                test_allreduce(g, t, sizes[s], RT_SUM);
                test_allgather(g, t, sizes[s], 0);
                test_reduce_scatter(g, t, sizes[s], 0);
                test_reduce_scatter(g, t, sizes[s], 1);
                test_broadcast(g, t, sizes[s]);
                test_p2p(t, sizes[s]);
            }
        }
        int bad = t_finish("large");
        rt_finalize();
        return bad;
    }

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
        table_of("pairs", w / 2, 2, pairs),                /* odd world: last rank in none */
        table_of("parity", w % 2 ? 1 : 2, w % 2 ? (w + 1) / 2 : w / 2, parity),
        table_of("solo", w, 1, solo),
        table_of("rev", 1, w, rev),
    };
    rt_group *groups[5] = { rt_group_world() };
    for (int k = 0; k < 4; k++) {
        groups[k + 1] = t_group_from_table(&tabs[k]);
        int listed = 0;
        for (int i = 0; i < tabs[k].ngroups * tabs[k].size; i++)
            listed |= tabs[k].ranks[i] == r;
        T_EXPECT(listed == (groups[k + 1] != NULL), "group %s: listed %d but group %s",
                 tabs[k].name, listed, groups[k + 1] ? "returned" : "NULL");
    }
    if (groups[4])
        T_EXPECT(rt_group_rank(groups[4]) == w - 1 - r, "rev: group rank %d, want %d",
                 rt_group_rank(groups[4]), w - 1 - r);

    for (int k = 0; k < 5; k++)
        if (groups[k])
            test_group(groups[k], sizes, nsizes);
    for (int s = 0; s < nsizes; s++)
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
            test_p2p(dtypes[k], sizes[s]);
            test_p2p_split(dtypes[k], sizes[s]);
        }
    rt_barrier(NULL);

    int bad = t_finish("collectives");
    for (int k = 1; k < 5; k++)
        rt_group_free(groups[k]);
    free(pairs);
    free(parity);
    free(solo);
    free(rev);
    rt_finalize();
    return bad;
}
