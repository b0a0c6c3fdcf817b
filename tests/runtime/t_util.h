/*
** t_util.h: the few helpers the runtime's test programs share: failure counting with the
** first mismatches printed (rank-prefixed through rt_log), device <-> host staging with
** rt_memcpy (so one test source runs on either backend), and a bf16 rounding written
** independently of the runtime's. Header-only; test programs only.
*/
#ifndef T_UTIL_H
#define T_UTIL_H

#include "rt_internal.h"   // defines: rt.h's interface and the test-only entry points

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failures;          /* mismatches seen by this rank */
static int t_checks;            /* comparisons made */

/* Record one comparison; print the first 10 failures in full. */
#define T_EXPECT(cond, ...) \
    do { t_checks++; if (!(cond)) { if (t_failures++ < 10) rt_log(__VA_ARGS__); } } while (0)

/* Every rank's failure count summed (world allreduce); rank 0 prints "ok N checks". */
static inline int t_finish(const char *what)
{
    int64_t v[2] = { t_failures, t_checks };
    rt_allreduce(v, 2, RT_I64, RT_SUM, rt_group_world());
    if (rt_rank() == 0) {
        if (v[0])
            rt_log("%s: %lld of %lld checks failed", what, (long long)v[0], (long long)v[1]);
        else
            printf("ok %s: %lld checks on %d ranks\n", what, (long long)v[1], rt_world());
    }
    return v[0] != 0;
}

/* All groups of one kind as a table (test fixtures: hand-written, or converted from the
** generator's topology.json): ngroups rows of 'size' global ranks; a rank's position in its
** row is its group rank; a rank may be in no row. */
typedef struct {
    const char *name;
    int         ngroups, size;
    const int  *ranks;
} t_table;

/* This rank's group of the table's kind: rt_group_create with its own row (or none). */
static inline rt_group *t_group_from_table(const t_table *t)
{
    for (int i = 0; i < t->ngroups * t->size; i++)
        if (t->ranks[i] == rt_rank())
            return rt_group_create(t->name, t->ranks + (size_t)(i / t->size) * t->size, t->size);
    return rt_group_create(t->name, NULL, 0);
}

/* Device copy of a host buffer (rt_malloc + H2D) and back. */
static inline void *t_to_dev(const void *host, size_t bytes)
{
    void *d = rt_malloc(bytes ? bytes : 1);
    if (bytes)
        rt_memcpy(d, host, bytes, RT_H2D);
    return d;
}

static inline void t_to_host(void *host, const void *dev, size_t bytes)
{
    if (bytes)
        rt_memcpy(host, dev, bytes, RT_D2H);
}

static inline void *t_alloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

/* bf16 by arithmetic rather than bit tricks: round |x| to 8 significant bits, ties to even. */
static inline float t_round_bf16(float x)
{
    if (x == 0 || !isfinite(x))
        return x;
    int e;
    double m = frexp((double)x, &e);        /* x = m * 2^e, 0.5 <= |m| < 1 */
    double scaled = m * 256.0;              /* 8 significant bits */
    double r = nearbyint(scaled);           /* default rounding mode: ties to even */
    return (float)ldexp(r / 256.0, e);
}

static inline uint16_t t_bf16_bits(float x)
{
    float r = t_round_bf16(x);
    uint32_t u;
    memcpy(&u, &r, 4);
    return (uint16_t)(u >> 16);
}

static inline float t_bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
