/*
** rt_philox.h: Philox-4x32-10 and the Box-Muller mapping of rt_rng_normal (see rt.h), as
** inline functions shared word for word by the CPU code (rt_cpu.c, tests) and the CUDA
** kernel (rt_cuda.cu). Private to runtime/ and tests/runtime/; generated code never sees it.
*/
#ifndef RT_PHILOX_H
#define RT_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define RT_HD __host__ __device__ __forceinline__
#else
#define RT_HD static inline
#endif

/* One Philox-4x32-10 block: 10 rounds, key bumped by the Weyl constants between rounds.
** ctr[4] is replaced by the output. Matches Random123's philox4x32_10 known answers. */
RT_HD void rt__philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1)
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    ctr[0] = c0; ctr[1] = c1; ctr[2] = c2; ctr[3] = c3;
}

/* The standard normal z(seed, stream, x) of rt.h, in double. */
RT_HD double rt__normal_at(uint64_t seed, uint64_t stream, uint64_t x)
{
    uint32_t c[4] = { (uint32_t)x, (uint32_t)(x >> 32), (uint32_t)stream,
                      (uint32_t)(stream >> 32) };
    rt__philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    double u1 = ((double)c[0] + 1.0) * (1.0 / 4294967296.0);   /* (0, 1] */
    double u2 = (double)c[1] * (1.0 / 4294967296.0);           /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

#endif
