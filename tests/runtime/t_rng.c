/*
** t_rng.c: randomness. Philox-4x32-10 against Random123's published known answers,
** rt_rng_normal against values hard-coded from tests/runtime/philox_ref.lua (an independent
** Lua derivation), layout independence (sub-blocks, row and column shards, shards drawn on
** different ranks and gathered), mean/std, moments, FNV-1a 64 test vectors. Either backend.
**   t_rng                          the checks
**   t_rng dump SEED STREAM FIRST N print N values (%.9g) for the suite's Lua cross-check
*/
#include "t_util.h"        // defines: T_EXPECT, t_finish, t_to_dev, t_to_host, ...
#include "rt_philox.h"     // defines: rt__philox4x32_10, rt__normal_at (the host reference)

static float *draw(int rows, int cols, int ld, uint64_t seed, uint64_t stream, uint64_t first,
                   uint64_t gld, float mean, float std)
{
    size_t bytes = (size_t)(rows ? rows : 1) * (size_t)ld * sizeof(float);
    float *d = rt_malloc(bytes), *h = t_alloc(bytes);
    rt_rng_normal(d, rows, cols, ld, seed, stream, first, gld, mean, std);
    t_to_host(h, d, bytes);
    rt_free(d);
    return h;
}

static void test_kat(void)
{
    static const uint32_t kat[3][10] = {
        { 0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
        { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
          0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
        { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
          0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
    };
    for (int i = 0; i < 3; i++) {
        uint32_t c[4] = { kat[i][0], kat[i][1], kat[i][2], kat[i][3] };
        rt__philox4x32_10(c, kat[i][4], kat[i][5]);
        for (int j = 0; j < 4; j++)
            T_EXPECT(c[j] == kat[i][6 + j], "philox KAT %d word %d: %08x, want %08x", i, j, c[j],
                     kat[i][6 + j]);
    }
    T_EXPECT(rt_fnv1a64("") == 0xcbf29ce484222325ull, "fnv1a64(\"\")");
    T_EXPECT(rt_fnv1a64("a") == 0xaf63dc4c8601ec8cull, "fnv1a64(\"a\")");
    T_EXPECT(rt_fnv1a64("foobar") == 0x85944171f73967e8ull, "fnv1a64(\"foobar\")");
    T_EXPECT(rt_fnv1a64("layers.0.attn.qkv.weight") == 0xfe480316132b4b7cull,
             "fnv1a64(\"layers.0.attn.qkv.weight\")");
}

/* Values printed by: lua5.4 tests/runtime/philox_ref.lua normal SEED STREAM FIRST N */
static void test_known(void)
{
    static const struct { uint64_t seed, stream, first; float v[4]; int n; } known[] = {
        { 1234, 0xfe480316132b4b7cull, 0, { 0.9745785f, -0.152109399f, -0.550233901f,
                                            -0.610269308f }, 4 },
        { 1234, 0xfe480316132b4b7cull, 0x100000005ull, { -1.57668638f, 1.92225969f }, 2 },
        { 0xdeadbeef00c0ffeeull, 7, 123456789, { 0.773482263f, 0.920073688f }, 2 },
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
        float *h = draw(1, known[k].n, known[k].n, known[k].seed, known[k].stream, known[k].first,
                        (uint64_t)known[k].n, 0.0f, 1.0f);
        for (int j = 0; j < known[k].n; j++)
            T_EXPECT(fabsf(h[j] - known[k].v[j]) <= 2e-7f * fabsf(known[k].v[j]),
                     "rng known value %zu[%d]: %.9g, want %.9g", k, j, h[j], known[k].v[j]);
        free(h);
    }
    /* mean/std, against the host reference: one rounding of mean + std * z */
    uint64_t st = rt_fnv1a64("wte");
    float *h = draw(3, 5, 7, 99, st, 1000, 5, 0.5f, 0.02f);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) {
            float want = (float)(0.5 + (double)0.02f * rt__normal_at(99, st, 1000 + 5u * i + j));
            float got = h[i * 7 + j];
            T_EXPECT(fabsf(got - want) <= 1e-7f, "rng mean/std (%d,%d): %.9g, want %.9g", i, j,
                     got, want);
        }
    free(h);
}

static void test_layout(void)
{
    enum { R = 37, C = 53 };
    uint64_t seed = 42, st = rt_fnv1a64("layers.3.mlp.fc.weight");
    float *full = draw(R, C, C, seed, st, 0, C, 0.0f, 1.0f);
    /* sub-block rows 5..20, cols 7..40, written at a padded row stride */
    int r0 = 5, r1 = 21, c0 = 7, c1 = 41, ld = 40;
    float *sub = draw(r1 - r0, c1 - c0, ld, seed, st, (uint64_t)r0 * C + c0, C, 0.0f, 1.0f);
    int bad = 0;
    for (int i = r0; i < r1; i++)
        for (int j = c0; j < c1; j++)
            bad += memcmp(&sub[(i - r0) * ld + (j - c0)], &full[i * C + j], 4) != 0;
    T_EXPECT(bad == 0, "rng sub-block differs from the whole in %d places", bad);
    /* a 4-way column split and a 3-way row split (uneven) reproduce the whole */
    for (int p = 0; p < 4; p++) {
        int a = C * p / 4, b = C * (p + 1) / 4;
        float *s = draw(R, b - a, b - a, seed, st, (uint64_t)a, C, 0.0f, 1.0f);
        bad = 0;
        for (int i = 0; i < R; i++)
            for (int j = a; j < b; j++)
                bad += memcmp(&s[i * (b - a) + (j - a)], &full[i * C + j], 4) != 0;
        T_EXPECT(bad == 0, "rng column shard %d/4 differs in %d places", p, bad);
        free(s);
    }
    for (int p = 0; p < 3; p++) {
        int a = R * p / 3, b = R * (p + 1) / 3;
        float *s = draw(b - a, C, C, seed, st, (uint64_t)a * C, C, 0.0f, 1.0f);
        T_EXPECT(memcmp(s, full + a * C, (size_t)(b - a) * C * 4) == 0,
                 "rng row shard %d/3 differs", p);
        free(s);
    }
    /* across ranks: each rank draws its column shard of a W*11-column tensor, gathered */
    int w = rt_world(), r = rt_rank(), cols = 11, gc = w * cols;
    float *mine = rt_malloc((size_t)R * cols * 4), *all = rt_malloc((size_t)w * R * cols * 4);
    rt_rng_normal(mine, R, cols, cols, seed, st, (uint64_t)r * cols, (uint64_t)gc, 0.0f, 1.0f);
    rt_allgather(mine, all, (size_t)R * cols, RT_F32, rt_group_world());
    float *h = t_alloc((size_t)w * R * cols * 4);
    t_to_host(h, all, (size_t)w * R * cols * 4);
    float *ref = draw(R, gc, gc, seed, st, 0, (uint64_t)gc, 0.0f, 1.0f);
    bad = 0;
    for (int q = 0; q < w; q++)
        for (int i = 0; i < R; i++)
            for (int j = 0; j < cols; j++)
                bad += memcmp(&h[((size_t)q * R + i) * cols + j], &ref[i * gc + q * cols + j],
                              4) != 0;
    T_EXPECT(bad == 0, "rng shards drawn on %d ranks differ from one draw in %d places", w, bad);
    rt_free(mine);
    rt_free(all);
    free(h);
    free(ref);
    free(full);
    free(sub);
}

static void test_moments(void)
{
    int n = 1 << 20;
    float *h = draw(1024, 1024, 1024, 7, 3, 0, 1024, 0.0f, 1.0f);
    double s = 0, s2 = 0, s4 = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        s += h[i];
        s2 += (double)h[i] * h[i];
        s4 += (double)h[i] * h[i] * h[i] * h[i];
        bad += !isfinite(h[i]) || fabsf(h[i]) > 7.0f;
    }
    double mean = s / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
    T_EXPECT(bad == 0, "rng: %d values not finite or beyond 7 sigma", bad);
    T_EXPECT(fabs(mean) < 5e-3 && fabs(var - 1) < 5e-3 && fabs(kurt - 3) < 0.05,
             "rng moments of 2^20 draws: mean %.5f var %.5f kurtosis %.4f", mean, var, kurt);
    /* on the CPU backend every value equals the host reference bit for bit */
    if (!strcmp(rt_backend(), "cpu")) {
        bad = 0;
        for (int i = 0; i < 4096; i++)
            bad += h[i] != (float)rt__normal_at(7, 3, (uint64_t)i);
        T_EXPECT(bad == 0, "rng: %d of 4096 values differ from the host reference", bad);
    } else {
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double d = fabs(h[i] - (float)rt__normal_at(7, 3, (uint64_t)i));
            worst = d > worst ? d : worst;
        }
        T_EXPECT(worst <= 1e-6, "rng: device values differ from the host by up to %g", worst);
    }
    free(h);
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 0, NULL);
    if (argc == 6 && !strcmp(argv[1], "dump")) {
        uint64_t seed = strtoull(argv[2], NULL, 0), st = strtoull(argv[3], NULL, 0);
        uint64_t first = strtoull(argv[4], NULL, 0);
        int n = atoi(argv[5]);
        float *h = draw(1, n, n, seed, st, first, (uint64_t)n, 0.0f, 1.0f);
        for (int i = 0; i < n; i++)
            printf("%.9g\n", h[i]);
        free(h);
        rt_finalize();
        return 0;
    }
    test_kat();
    test_known();
    test_layout();
    test_moments();
    int bad = t_finish("rng");
    rt_finalize();
    return bad;
}
