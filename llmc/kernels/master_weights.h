/*
 * master_weights.h: the fp32 master weights stored as the bf16 weights the
 * GEMMs use plus a 16-bit residual, so that the master costs no memory beyond
 * the bf16 copy a mixed-precision trainer keeps anyway (4 bytes per parameter
 * in all instead of 4 + 2).
 *
 *   hi = bf16 nearest to w (ties toward +inf, so the residual always fits)
 *   lo = (w - hi) / ulp32(w), an integer in [-32768, 32767], where
 *        ulp32(w) = 2^(max(E, 1) - 150) with E the biased fp32 exponent of w
 *   w  = hi + lo * ulp32(w)   exactly; decoding recovers E from hi, and from
 *        the sign of lo when hi is a power of two that w rounded up to
 *
 * The split is exact for every finite w below the bf16 overflow threshold
 * (|w| < 3.3961e38). Beyond it w becomes +-inf, as a bf16 cast makes it; NaN
 * stays NaN, +-inf stays +-inf. hi is what a bf16 cast of w gives except on
 * exact ties, which round toward +inf instead of to even.
 *
 * Host and device code; plain C when compiled without nvcc, so the CPU test
 * (tests/test_master_weights.c) checks the very functions the GPU runs.
 * Reads and writes only its arguments.
 */
#ifndef LLMC_MASTER_WEIGHTS_H
#define LLMC_MASTER_WEIGHTS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MASTER_HD __host__ __device__ __forceinline__
#else
#define MASTER_HD static inline
#endif

MASTER_HD uint32_t master_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

MASTER_HD float master_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The hi of master_split(w): the bf16 weight the GEMMs read. */
MASTER_HD uint16_t master_hi(float w)
{
    uint32_t u = master_float_bits(w);
    if (((u >> 23) & 0xffu) == 0xffu) /* inf or NaN: keep it one, quiet */
        return (uint16_t)((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));
    /* nearest, ties toward +inf: round the magnitude half up for w > 0, half down for w < 0 */
    return (uint16_t)((u + ((u >> 31) ? 0x7fffu : 0x8000u)) >> 16);
}

/* Splits w into *hi (bf16 bits) and *lo. */
MASTER_HD void master_split(float w, uint16_t *hi, int16_t *lo)
{
    uint32_t u = master_float_bits(w);
    uint32_t exponent = (u >> 23) & 0xffu;
    uint32_t h = master_hi(w);
    *hi = (uint16_t)h;
    if (exponent == 0xffu) {
        *lo = 0;
        return;
    }
    if (((h >> 7) & 0xffu) == 0xffu) { /* rounded past the largest bf16 */
        *lo = 0;
        return;
    }
    float r = w - master_bits_float(h << 16); /* exact: w and hi are within half a bf16 ulp */
    int e = exponent < 1u ? 1 : (int)exponent;
    *lo = (int16_t)(int32_t)ldexpf(r, 150 - e);
}

/* The fp32 value that master_split split into hi and lo. */
MASTER_HD float master_join(uint16_t hi, int16_t lo)
{
    uint32_t hb = (uint32_t)hi << 16;
    float h = master_bits_float(hb);
    int e = (int)((hb >> 23) & 0xffu);
    if (e == 0xff || lo == 0)
        return h;
    /* hi a power of two above |w| (w rounded up to it): w lies in the binade below */
    int sign = (int)(hb >> 31);
    int below = (hb & 0x7f0000u) == 0 && e > 1 && lo != 0 && ((lo < 0) != sign);
    int w_exponent = e < 1 ? 1 : e - below;
    return h + ldexpf((float)lo, w_exponent - 150);
}

#endif /* LLMC_MASTER_WEIGHTS_H */
