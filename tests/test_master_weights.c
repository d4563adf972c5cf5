/* Tests of llmc/kernels/master_weights.h: the fp32 master split into bf16 + 16-bit
 * residual must give back every finite float bit for bit, and its bf16 half
 * must be the nearest bf16.
 *
 * Default: every one of the 65536 upper halves with 40 lower halves each (the
 * edges 0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff and 34 random ones), 2.6
 * million floats, a second. --exhaustive: all 2^32 bit patterns (a few minutes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/kernels/master_weights.h"
#include "llmc/common/utils.h"

static int passed = 0, failed = 0;

static void check(const char *what, int ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    ok ? passed++ : failed++;
}

/* bf16 bits nearest to f, ties toward +inf (what master_split promises), by a
 * different route: compare the distances to the two candidates in double. */
static uint16_t nearest_bf16_ties_up(float f)
{
    uint32_t u = master_float_bits(f);
    uint32_t down = u & 0xffff0000u, up = down + 0x10000u; /* the two bf16 neighbours of |f| */
    double dd = fabs((double)f - (double)master_bits_float(down));
    double du = fabs((double)f - (double)master_bits_float(up));
    if (dd < du)
        return (uint16_t)(down >> 16);
    if (du < dd)
        return (uint16_t)(up >> 16);
    return (uint16_t)((f > 0 ? up : down) >> 16); /* tie: the larger value */
}

/* Returns 1 when bits u survive the split as promised; counts the kind of case. */
static long finite_count, special_count, overflow_count;
static int split_ok(uint32_t u)
{
    float w = master_bits_float(u);
    uint16_t hi;
    int16_t lo;
    master_split(w, &hi, &lo);
    float back = master_join(hi, lo);
    uint32_t ub = master_float_bits(back);
    if (isnan(w)) {
        special_count++;
        return isnan(back) && isnan(master_bits_float((uint32_t)hi << 16));
    }
    if (isinf(w)) {
        special_count++;
        return ub == u;
    }
    if (fabsf(w) >= 3.3961e38f && isinf(master_bits_float((uint32_t)hi << 16))) {
        overflow_count++;
        return isinf(back) && (back > 0) == (w > 0);
    }
    finite_count++;
    return ub == u && hi == nearest_bf16_ties_up(w);
}

int main(int argc, char **argv)
{
    int exhaustive = argc > 1 && strcmp(argv[1], "--exhaustive") == 0;
    long bad = 0;
    uint32_t first_bad = 0;
    if (exhaustive) {
        for (uint64_t u = 0; u <= 0xffffffffull; u++) {
            if (!split_ok((uint32_t)u) && bad++ == 0)
                first_bad = (uint32_t)u;
        }
    } else {
        static const uint32_t edges[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
        uint64_t rng = 12345;
        for (uint32_t upper = 0; upper <= 0xffffu; upper++) {
            for (int k = 0; k < 40; k++) {
                uint32_t lower = k < 6 ? edges[k] : (uint32_t)(splitmix64(&rng) & 0xffffu);
                uint32_t u = upper << 16 | lower;
                if (!split_ok(u) && bad++ == 0)
                    first_bad = u;
            }
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "%ld finite floats split and joined bit for bit, bf16 half the nearest (%s)",
             finite_count, exhaustive ? "all of them" : "sampled");
    check(what, bad == 0 && finite_count > 0);
    if (bad)
        printf("  %ld failures, first at bits 0x%08x\n", bad, first_bad);
    check("inf and NaN kept, values past the bf16 range become inf", special_count > 0 && overflow_count > 0);

    /* the cases the decoder must tell apart by hand */
    struct {
        float w;
        const char *what;
    } cases[] = {
        {1.0f, "1"},
        {nextafterf(1.0f, 0.0f), "just below 1 (rounds up to a power of two)"},
        {-nextafterf(1.0f, 0.0f), "just above -1"},
        {1.0f + 1.0f / 256.0f, "a tie above 1"},
        {-(1.0f + 1.0f / 256.0f), "a tie below -1"},
        {1e-45f, "the smallest denormal"},
        {-1.1754942e-38f, "the largest negative denormal"},
        {nextafterf(1.17549435e-38f, 0.0f), "just below the smallest normal"},
        {-0.0f, "minus zero"},
        {3.3895e38f, "near the largest bf16"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t hi;
        int16_t lo;
        master_split(cases[i].w, &hi, &lo);
        float back = master_join(hi, lo);
        snprintf(what, sizeof(what), "%s: %.9g -> hi 0x%04x lo %d -> %.9g", cases[i].what, cases[i].w, hi, lo, back);
        check(what, master_float_bits(back) == master_float_bits(cases[i].w));
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
