/*
 * fp8.h: the two 8-bit float formats of FP8 training (OCP FP8, as Hopper's
 * tensor cores and cuBLASLt use them), converted exactly, on the host and the
 * device, so that the CPU reference can emulate what the GPU's FP8 GEMMs see.
 *
 *   E4M3 ("e4m3fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits; no
 *     infinities; S.1111.111 is NaN; largest finite 448, smallest subnormal 2^-9.
 *   E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like, with
 *     infinities and NaNs; largest finite 57344, smallest subnormal 2^-16.
 *
 * float -> fp8 rounds to nearest, ties to even, and saturates: every finite or
 * infinite value beyond the largest finite one becomes it (what cuBLASLt's and
 * CUDA's __NV_SATFINITE conversions do, so an overflow is clipped, never an
 * infinity). NaN stays NaN (0x7f, or 0xff with its sign). fp8 -> float is exact.
 * Scaling multiplies a block of values by scale = largest finite / amax (the
 * block's largest magnitude) before the conversion, and the GEMM divides by
 * it after. The recipes (issue #15) differ in the blocks, over an operand
 * stored [R, K] with K the summed dimension:
 *   tensor  the whole operand;
 *   row     each row (rows of x, of W, of dy; of the transposed copies the
 *           backward's GEMMs sum over the tokens with: columns of the
 *           originals);
 *   block   1 x 128 along K for activations and gradients, 128 x 128 for
 *           weights (DeepSeek-V3's, as Transformer Engine's blockwise recipe).
 *
 * Reads and writes only its arguments. Plain C; under nvcc also __device__.
 */
#ifndef LLMC_FP8_H
#define LLMC_FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FP8_FN __host__ __device__ static inline
#else
#define FP8_FN static inline
#endif

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } Fp8Format;

/* Exponent and mantissa bits, exponent bias, largest finite value. */
FP8_FN int fp8_mantissa_bits(Fp8Format f)
{
    return f == FP8_E4M3 ? 3 : 2;
}
FP8_FN int fp8_bias(Fp8Format f)
{
    return f == FP8_E4M3 ? 7 : 15;
}
FP8_FN float fp8_max(Fp8Format f)
{
    return f == FP8_E4M3 ? 448.0f : 57344.0f;
}

/* The exact value of code q (NaN for NaN codes, +-inf for E5M2's infinities). */
FP8_FN float fp8_to_float(uint8_t q, Fp8Format f)
{
    int M = fp8_mantissa_bits(f), exp_field = (q & 0x7f) >> M, man = q & ((1 << M) - 1);
    int exp_max = f == FP8_E4M3 ? 15 : 31;
    float sign = (q & 0x80) ? -1.0f : 1.0f;
    if (f == FP8_E4M3 && (q & 0x7f) == 0x7f)
        return NAN;
    if (f == FP8_E5M2 && exp_field == exp_max)
        return man ? NAN : sign * INFINITY;
    if (exp_field == 0) /* subnormal: man * 2^(1 - bias - M) */
        return sign * ldexpf((float)man, 1 - fp8_bias(f) - M);
    return sign * ldexpf((float)((1 << M) + man), exp_field - fp8_bias(f) - M);
}

/* x rounded to the nearest code, ties to even, saturating at the largest finite value. */
FP8_FN uint8_t fp8_from_float(float x, Fp8Format f)
{
    int M = fp8_mantissa_bits(f), bias = fp8_bias(f);
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return (uint8_t)(sign | 0x7f);
    float a = fabsf(x);
    uint8_t max_code = f == FP8_E4M3 ? 0x7e : 0x7b;
    if (a >= fp8_max(f)) /* beyond the largest finite value: clipped (no value rounds past it) */
        return (uint8_t)(sign | max_code);
    int e;
    frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    e -= 1;        /* a in [2^e, 2^(e+1)) */
    int e_min = 1 - bias;
    if (a == 0.0f || e < e_min) { /* subnormal: units of 2^(e_min - M), exact scaling, then rint (ties even) */
        int units = (int)rintf(ldexpf(a, M - e_min));
        return (uint8_t)(sign | units); /* units == 2^M is the smallest normal, encoded the same */
    }
    int units = (int)rintf(ldexpf(a, M - e)); /* in [2^M, 2^(M+1)] */
    if (units == (1 << (M + 1))) {
        units = 1 << M;
        e += 1;
    }
    /* a < the largest finite value, which is a code with an even mantissa: never rounds past it */
    return (uint8_t)(sign | ((e + bias) << M) | (units - (1 << M)));
}

/* Per-tensor scale for a tensor whose largest |value| is amax: values times it
 * fill the format's range; 1 where amax is 0 or not finite. */
FP8_FN float fp8_scale_from_amax(float amax, Fp8Format f)
{
    return (amax > 0.0f && isfinite(amax)) ? fp8_max(f) / amax : 1.0f;
}

/* --fp8-recipe: how fine the scales are (see above); 0 is no FP8. */
typedef enum { FP8_OFF = 0, FP8_TENSOR, FP8_ROW, FP8_BLOCK } Fp8Recipe;
static const char *const FP8_RECIPE_NAMES[] = {"off", "tensor", "row", "block"};

/* The recipe --fp8-recipe names, or FP8_OFF for a name that is none. */
static inline Fp8Recipe fp8_recipe_from_name(const char *name)
{
    for (int r = FP8_TENSOR; r <= FP8_BLOCK; r++)
        if (strcmp(name, FP8_RECIPE_NAMES[r]) == 0)
            return (Fp8Recipe)r;
    return FP8_OFF;
}

#endif /* LLMC_FP8_H */
