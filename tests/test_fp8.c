/*
 * llmc/kernels/fp8.h against the definitions of the formats: every code decodes to its
 * value and encodes back to itself; every midpoint between neighbouring codes
 * rounds to the even one, the floats just beside it to the nearer one; overflow
 * saturates, NaN stays NaN, signed zeros keep their sign; and 2 million random
 * floats over the whole exponent range encode to a nearest code (no code closer).
 * tests/test_fp8.py checks the same conversion bit for bit against ml_dtypes.
 */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "llmc/kernels/fp8.h"
#include "llmc/common/utils.h"
#include "tests/check.h"

static const char *name_of(Fp8Format f)
{
    return f == FP8_E4M3 ? "E4M3" : "E5M2";
}

static int is_nan_code(uint8_t q, Fp8Format f)
{
    return isnan(fp8_to_float(q, f));
}

/* The finite non-negative codes in increasing order (0x00 up to the largest). */
static int positive_codes(Fp8Format f, uint8_t *out)
{
    int n = 0;
    for (int q = 0; q < 0x80; q++)
        if (isfinite(fp8_to_float((uint8_t)q, f)))
            out[n++] = (uint8_t)q;
    return n;
}

static void check_format(Fp8Format f)
{
    const char *name = name_of(f);
    uint8_t codes[128];
    int n = positive_codes(f, codes);
    check(n == (f == FP8_E4M3 ? 127 : 124), "%s has %d finite non-negative codes", name, n);
    check(fp8_to_float(codes[n - 1], f) == fp8_max(f), "%s: the largest finite code is %g", name,
          (double)fp8_to_float(codes[n - 1], f));
    check(fp8_to_float(1, f) == ldexpf(1.0f, 1 - fp8_bias(f) - fp8_mantissa_bits(f)),
          "%s: the smallest subnormal is 2^%d", name, 1 - fp8_bias(f) - fp8_mantissa_bits(f));

    int roundtrip = 1, increasing = 1, mid_even = 1, beside = 1;
    for (int q = 0; q < 256; q++) {
        float v = fp8_to_float((uint8_t)q, f);
        if (!isnan(v) && isfinite(v))
            roundtrip &= fp8_from_float(v, f) == q;
    }
    for (int i = 0; i + 1 < n; i++) {
        float lo = fp8_to_float(codes[i], f), hi = fp8_to_float(codes[i + 1], f);
        float mid = 0.5f * (lo + hi); /* exact: neighbours differ in a few low bits */
        increasing &= lo < hi;
        uint8_t even = (codes[i] & 1) == 0 ? codes[i] : codes[i + 1];
        for (int s = 0; s < 2; s++) {
            uint8_t sg = s ? 0x80 : 0;
            float m = s ? -mid : mid;
            mid_even &= fp8_from_float(m, f) == (uint8_t)(sg | even);
            beside &= fp8_from_float(nextafterf(m, 0.0f), f) == (uint8_t)(sg | codes[i]);
            beside &= fp8_from_float(nextafterf(m, s ? -INFINITY : INFINITY), f) == (uint8_t)(sg | codes[i + 1]);
        }
    }
    check(roundtrip, "%s: every finite code encodes back to itself", name);
    check(increasing, "%s: the codes 0x00..0x%02x increase", name, codes[n - 1]);
    check(mid_even, "%s: each of the %d midpoints (and their negatives) rounds to the even neighbour", name, n - 1);
    check(beside, "%s: the floats just below and above each midpoint round to the nearer code", name);

    uint8_t max_code = codes[n - 1];
    check(fp8_from_float(1e30f, f) == max_code && fp8_from_float(INFINITY, f) == max_code &&
              fp8_from_float(-INFINITY, f) == (uint8_t)(0x80 | max_code) &&
              fp8_from_float(nextafterf(fp8_max(f), INFINITY), f) == max_code,
          "%s: overflow and infinities saturate to +-%g", name, (double)fp8_max(f));
    check(is_nan_code(fp8_from_float(NAN, f), f) && is_nan_code(fp8_from_float(-NAN, f), f), "%s: NaN stays NaN", name);
    check(fp8_from_float(0.0f, f) == 0x00 && fp8_from_float(-0.0f, f) == 0x80 && fp8_from_float(1e-30f, f) == 0x00 &&
              fp8_from_float(-FLT_TRUE_MIN, f) == 0x80,
          "%s: zeros keep their sign, underflow goes to zero", name);

    /* random floats, exponents spread over the format's range and beyond: nothing closer than the result */
    uint64_t rng = 12345u + (uint64_t)f;
    int nearest = 1;
    for (int i = 0; i < 1000000 && nearest; i++) {
        int e = (int)(splitmix64(&rng) % 60) - 40;
        float x = ldexpf(1.0f + (float)(splitmix64(&rng) >> 40) / 16777216.0f, e);
        if (splitmix64(&rng) & 1)
            x = -x;
        if (fabsf(x) >= fp8_max(f))
            continue;
        uint8_t q = fp8_from_float(x, f);
        float err = fabsf(fp8_to_float(q, f) - x);
        for (int j = 0; j < n; j++) {
            float other = fp8_to_float(codes[j], f) * (x < 0 ? -1.0f : 1.0f);
            if (fabsf(other - x) < err) {
                printf("  %s: %.9g encodes to 0x%02x (%g), but %g is closer\n", name, (double)x, q,
                       (double)fp8_to_float(q, f), (double)other);
                nearest = 0;
                break;
            }
        }
    }
    check(nearest, "%s: 1M random floats from 2^-40 to 2^19 each encode to a nearest code", name);

    float amax = 3.5f;
    check(fp8_scale_from_amax(amax, f) * amax == fp8_max(f) && fp8_scale_from_amax(0.0f, f) == 1.0f &&
              fp8_scale_from_amax(NAN, f) == 1.0f && fp8_scale_from_amax(INFINITY, f) == 1.0f,
          "%s: the per-tensor scale maps amax to %g (1 for 0, NaN, inf)", name, (double)fp8_max(f));
}

int main(void)
{
    check_format(FP8_E4M3);
    check_format(FP8_E5M2);
    return check_summary();
}
