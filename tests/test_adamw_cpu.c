/* Tests of llmc/kernels/adamw_cpu.h and llmc/kernels/adamw_step.h: the CPU AdamW that the CPU
 * reference steps with, and that dev/cuda/adamw_check holds the GPU kernel to
 * bit for bit.
 *   - adamw_cpu_update (every core, vectorised) against a scalar loop in
 *     torch.optim.AdamW's order whose every float operation rounds on its own
 *     (each result stored through a volatile: no fused multiply-add, whatever
 *     the compiler and its flags): w, m, v and the bf16 weights bit-identical,
 *     for fp32 and bf16 gradients, with and without decay, at steps 1 and
 *     1000, over lengths that are not multiples of the vector width or of the
 *     threads' chunk;
 *   - against AdamW in double (the formula itself): 1e-5 relative to the
 *     weights' scale (about ten float roundings of a weight of that scale, an
 *     ulp being 6e-8 of it), m and v 1e-5 relative to their rms (m can cancel);
 *   - adamw_scalars against the formula in double, to a float rounding;
 *   - a scale that is not finite (the clip coefficient of a NaN gradient
 *     norm) writes nothing.
 * Prints the update's speed on this machine's cores (28 bytes per parameter
 * with fp32 gradients and the bf16 weights written). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmc/kernels/adamw_cpu.h"
#include "llmc/common/utils.h"
#include "tests/check.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rng_normal(void)
{
    double u[2];
    for (int k = 0; k < 2; k++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        u[k] = ((rng_state >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* adamw_element's operations one by one, each rounded to float by a volatile store. */
static float rounded_element(float w, float *m, float *v, float grad, float scale, float decay, AdamWScalars s)
{
    volatile float g = grad * scale, wd = w * decay;
    volatile float d = g - *m, t = s.one_minus_beta1 * d, mm = *m + t;
    volatile float a = *v * s.beta2, b = s.one_minus_beta2 * g, c = b * g, vv = a + c;
    volatile float r = sqrtf(vv), q = r / s.bc2_sqrt, den = q + s.eps, u = mm / den, step = s.step_size * u;
    *m = mm;
    *v = vv;
    return wd - step;
}

typedef struct {
    float *w, *m, *v, *g32;
    uint16_t *g16, *hi;
} Buffers;

static Buffers buffers_make(int64_t n)
{
    Buffers b;
    b.w = (float *)malloc_check((size_t)n * 4, "w");
    b.m = (float *)malloc_check((size_t)n * 4, "m");
    b.v = (float *)malloc_check((size_t)n * 4, "v");
    b.g32 = (float *)malloc_check((size_t)n * 4, "grad");
    b.g16 = (uint16_t *)malloc_check((size_t)n * 2, "grad bf16");
    b.hi = (uint16_t *)malloc_check((size_t)n * 2, "weights bf16");
    return b;
}

static void buffers_free(Buffers *b)
{
    free(b->w);
    free(b->m);
    free(b->v);
    free(b->g32);
    free(b->g16);
    free(b->hi);
}

static void buffers_fill(Buffers *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        b->w[i] = 0.02f * rng_normal();
        b->m[i] = 0.005f * rng_normal();
        b->v[i] = 1e-4f * fabsf(rng_normal()) * fabsf(rng_normal());
        b->g16[i] = bf16_bits(0.01f * rng_normal());
        b->g32[i] = i % 2 ? bf16_float(b->g16[i]) : 0.01f * rng_normal();
    }
}

static double rms(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s / (double)(n > 0 ? n : 1));
}

/* The largest |got - ref| over max(|ref|, floor), in double. */
static double worst_error(const float *got, const double *ref, int64_t n, double floor)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double scale = fabs(ref[i]) > floor ? fabs(ref[i]) : floor;
        double e = fabs((double)got[i] - ref[i]) / scale;
        worst = e > worst || isnan(e) ? e : worst;
    }
    return worst;
}

static void check_case(const AdamWConfig *cfg, int64_t n, int step, int bf16_grads, int decays, float scale)
{
    Buffers in = buffers_make(n), got = buffers_make(n), want = buffers_make(n);
    buffers_fill(&in, n);
    AdamWScalars s = adamw_scalars(cfg, cfg->lr, step);
    float decay = decays ? s.decay : 1.0f;
    memcpy(got.w, in.w, (size_t)n * 4);
    memcpy(got.m, in.m, (size_t)n * 4);
    memcpy(got.v, in.v, (size_t)n * 4);
    adamw_cpu_update(got.w, got.m, got.v, bf16_grads ? NULL : in.g32, bf16_grads ? in.g16 : NULL, got.hi, n, scale,
                     decay, s);

    double *ref_w = (double *)malloc_check((size_t)n * 8, "ref"), *ref_m = (double *)malloc_check((size_t)n * 8, "ref");
    double *ref_v = (double *)malloc_check((size_t)n * 8, "ref");
    double b1 = cfg->beta1, b2 = cfg->beta2, lr = cfg->lr;
    for (int64_t i = 0; i < n; i++) {
        float grad = bf16_grads ? bf16_float(in.g16[i]) : in.g32[i];
        want.m[i] = in.m[i];
        want.v[i] = in.v[i];
        want.w[i] = rounded_element(in.w[i], &want.m[i], &want.v[i], grad, scale, decay, s);
        want.hi[i] = master_hi(want.w[i]);
        double g = (double)grad * scale;
        ref_m[i] = b1 * in.m[i] + (1.0 - b1) * g;
        ref_v[i] = b2 * in.v[i] + (1.0 - b2) * g * g;
        ref_w[i] = in.w[i] * (decays ? 1.0 - lr * cfg->weight_decay : 1.0) -
                   lr / (1.0 - pow(b1, step)) * ref_m[i] / (sqrt(ref_v[i]) / sqrt(1.0 - pow(b2, step)) + cfg->eps);
    }
    char what[120];
    snprintf(what, sizeof(what), "n=%lld step=%d %s grads%s", (long long)n, step, bf16_grads ? "bf16" : "fp32",
             decays ? ", decay" : "");
    check(memcmp(got.w, want.w, (size_t)n * 4) == 0 && memcmp(got.m, want.m, (size_t)n * 4) == 0 &&
              memcmp(got.v, want.v, (size_t)n * 4) == 0 && memcmp(got.hi, want.hi, (size_t)n * 2) == 0,
          "%-44s w, m, v, bf16 weights bit-identical to the op-by-op scalar loop", what);
    double ew = worst_error(got.w, ref_w, n, rms(in.w, n));
    double em = worst_error(got.m, ref_m, n, rms(got.m, n)), ev = worst_error(got.v, ref_v, n, rms(got.v, n));
    check(ew < 1e-5 && em < 1e-5 && ev < 1e-5, "%-44s against AdamW in double: w %.1e, m %.1e, v %.1e (tol 1e-5)", what,
          ew, em, ev);
    free(ref_w);
    free(ref_m);
    free(ref_v);
    buffers_free(&in);
    buffers_free(&got);
    buffers_free(&want);
}

static void check_scalars(const AdamWConfig *cfg)
{
    int steps[3] = {1, 2, 1000};
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        int t = steps[k];
        double lr = 3e-4;
        AdamWScalars s = adamw_scalars(cfg, lr, t);
        double want[6] = {
            1.0 - lr * cfg->weight_decay,   1.0 - cfg->beta1, 1.0 - cfg->beta2, lr / (1.0 - pow(cfg->beta1, t)),
            sqrt(1.0 - pow(cfg->beta2, t)), cfg->eps};
        float got[6] = {s.decay, s.one_minus_beta1, s.one_minus_beta2, s.step_size, s.bc2_sqrt, s.eps};
        for (int i = 0; i < 6; i++)
            ok &= got[i] == (float)want[i];
    }
    check(ok, "adamw_scalars: each the float nearest the double formula, steps 1, 2, 1000");
}

static void check_skip(const AdamWConfig *cfg)
{
    int64_t n = 1003;
    Buffers in = buffers_make(n), got = buffers_make(n);
    buffers_fill(&in, n);
    float scales[2] = {NAN, INFINITY};
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        memcpy(got.w, in.w, (size_t)n * 4);
        memcpy(got.m, in.m, (size_t)n * 4);
        memcpy(got.v, in.v, (size_t)n * 4);
        memset(got.hi, 0xab, (size_t)n * 2);
        memcpy(in.hi, got.hi, (size_t)n * 2);
        adamw_cpu_update(got.w, got.m, got.v, in.g32, NULL, got.hi, n, scales[k], 1.0f, adamw_scalars(cfg, 1e-3, 1));
        ok &= memcmp(got.w, in.w, (size_t)n * 4) == 0 && memcmp(got.m, in.m, (size_t)n * 4) == 0 &&
              memcmp(got.v, in.v, (size_t)n * 4) == 0 && memcmp(got.hi, in.hi, (size_t)n * 2) == 0;
    }
    check(ok, "a NaN or infinite scale writes nothing");
    buffers_free(&in);
    buffers_free(&got);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void report_speed(const AdamWConfig *cfg)
{
    int64_t n = (int64_t)16 << 20;
    Buffers b = buffers_make(n);
    buffers_fill(&b, n);
    AdamWScalars s = adamw_scalars(cfg, cfg->lr, 1);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        adamw_cpu_update(b.w, b.m, b.v, b.g32, NULL, b.hi, n, 1.0f, s.decay, s);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    printf("speed: %lld parameters in %.1f ms on %d threads: %.2f G parameters/s, %.1f GB/s (28 bytes each)\n",
           (long long)n, best * 1e3, omp_get_max_threads(), n / best * 1e-9, 28.0 * n / best * 1e-9);
    buffers_free(&b);
}

int main(void)
{
    AdamWConfig cfg = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .grad_clip = 1.0};
    check_scalars(&cfg);
    int64_t sizes[4] = {1, 7, 1003, 3 * ADAMW_CPU_CHUNK + 5};
    for (int k = 0; k < 4; k++) {
        check_case(&cfg, sizes[k], 1, 0, 1, 1.0f);
        check_case(&cfg, sizes[k], 1000, 1, 0, 0.37f);
    }
    check_case(&cfg, 100003, 10, 1, 1, 1.0f);
    check_case(&cfg, 100003, 10, 0, 0, 0.5f);
    check_skip(&cfg);
    report_speed(&cfg);
    return check_summary();
}
