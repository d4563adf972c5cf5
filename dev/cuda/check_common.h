/*
 * check_common.h: what the kernel check programs in dev/cuda share.
 *
 *   - a seeded RNG: the seed comes from --seed N, else from the clock, and is
 *     printed, so inputs are fresh every run and any failure can be replayed;
 *   - host bf16 helpers (tests/check.h) so that the CPU reference reads exactly
 *     the bf16 values the kernel reads;
 *   - check_close: max relative error against a reference, with a floor under
 *     |ref| (a fraction of the reference's rms) so that results that cancel to
 *     near zero are judged against the scale of the data, not against zero;
 *   - check_within: |got - ref| against a bound per element, for results rounded
 *     several times at different magnitudes (bf16 gradients accumulated over
 *     GEMM calls), where no single relative tolerance is both safe and tight;
 *   - poisoning: outputs are filled with 0xFF bytes (NaN in bf16 and fp32) before a
 *     run, and NaN fails every comparison, so an element a kernel forgets to write
 *     is caught;
 *   - timing: warm-up of at least BENCH_WARMUP runs and BENCH_WARMUP_MS (the SM
 *     clock reads 345 MHz while the GPU idles during the CPU reference), then the
 *     median of BENCH_RUNS back-to-back runs timed with
 *     events, rotating over several input sets so that the L2 (50 MB on an H100)
 *     cannot hold them; GB/s from the bytes the kernel must move, and as a
 *     percentage of the cudaMemcpy device-to-device bandwidth measured here
 *     (bytes read + written).
 * Every check prints a PASS or FAIL line through tests/check.h's check(), the
 * CPU tests' bookkeeping; check_summary() returns non-zero if any failed.
 */
#ifndef DEV_CUDA_CHECK_COMMON_H
#define DEV_CUDA_CHECK_COMMON_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmc/common/cuda_common.h"
#include "tests/check.h"

#define BENCH_RUNS 60
#define BENCH_WARMUP 5
#define BENCH_WARMUP_MS 200.0f

static double copy_gbps = 0.0;

/* ---- RNG (splitmix64) ---- */

static uint64_t rng_state = 0;

static inline uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [0, 1) */
static inline double rng_uniform(void)
{
    return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0);
}
static inline float rng_range(float lo, float hi)
{
    return lo + (hi - lo) * (float)rng_uniform();
}
static inline int rng_int(int n)
{
    return (int)(rng_next() % (uint64_t)n);
}
static inline float rng_normal(void)
{
    double u1 = 1.0 - rng_uniform(), u2 = rng_uniform();
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* Seed from --seed N, else the clock; printed so that a failing run can be replayed. */
static inline void check_init(int argc, char **argv, const char *name)
{
    uint64_t seed = 0;
    int have_seed = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0) {
            seed = strtoull(argv[i + 1], NULL, 10);
            have_seed = 1;
        }
    }
    if (!have_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec;
        seed %= 1000000000000ull;
    }
    rng_state = seed;
    cudaDeviceProp prop;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    printf("== %s on %s (sm_%d%d, %d SMs, L2 %d MB), seed %llu (replay: --seed %llu)\n", name, prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20, (unsigned long long)seed,
           (unsigned long long)seed);
}

/* ---- bf16 on the host: tests/check.h ---- */

/* One round-to-nearest to bf16 (8 significant bits) errs by at most half an ulp:
 * 2^-8 of |x| just above a power of two, 2^-9 of it just below the next one. The
 * tolerances of bf16 results are built from this worst case. */
#define BF16_ROUNDING 0x1p-8

/* Random bf16 values (bits) and the floats they stand for: scale * normal, never all zeros. */
static inline void fill_bf16(uint16_t *bits, float *values, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) {
        bits[i] = bf16_bits(scale * rng_normal());
        if (values)
            values[i] = bf16_float(bits[i]);
    }
}
static inline void fill_float(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * rng_normal();
}
/* ---- device buffers ---- */

static inline void *dev_alloc(size_t bytes)
{
    return cuda_malloc_named(bytes, "check buffer");
}
/* Gives back the device buffers dev[n_dev] (cuda_free) and the host buffers host[n_host] (free) a test case
 * took; FREE_BUFFERS takes the two arrays themselves. */
static inline void free_buffers(void *const *dev, size_t n_dev, void *const *host, size_t n_host)
{
    for (size_t i = 0; i < n_dev; i++)
        cuda_free(dev[i]);
    for (size_t i = 0; i < n_host; i++)
        free(host[i]);
}
#define FREE_BUFFERS(dev, host)                                                                                        \
    free_buffers(dev, sizeof(dev) / sizeof((dev)[0]), host, sizeof(host) / sizeof((host)[0]))

/* Device buffers are given back with cuda_free. */
static inline void *dev_upload(const void *host, size_t bytes)
{
    void *d = dev_alloc(bytes);
    CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}
static inline void download(void *host, const void *dev, size_t bytes)
{
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}
static inline void *dev_clone(const void *dev, size_t bytes)
{
    void *d = dev_alloc(bytes);
    CUDA_CHECK(cudaMemcpy(d, dev, bytes, cudaMemcpyDeviceToDevice));
    return d;
}
/* 0xFF bytes: NaN as bf16 and as fp32 */
static inline void poison(void *dev, size_t bytes)
{
    CUDA_CHECK(cudaMemset(dev, 0xFF, bytes));
}

/* ---- comparisons ---- */

/* Max over i of |got - ref| / max(|ref|, floor_frac * rms(ref)); NaN anywhere fails. */
static inline void check_close(const char *what, const float *got, const float *ref, int64_t n, double tol,
                               double floor_frac)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)ref[i] * ref[i];
    double floor = floor_frac * sqrt(ss / (double)(n > 0 ? n : 1));
    if (!(floor > 0.0))
        floor = 1e-30;
    double worst = 0.0;
    int64_t worst_i = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = fabs((double)ref[i]);
        double err = fabs((double)got[i] - (double)ref[i]) / (a > floor ? a : floor);
        if (!(err <= tol))
            bad++;
        if (!(err <= worst) && !isnan(worst)) { /* the first NaN sticks */
            worst = err;
            worst_i = i;
        }
    }
    check(bad == 0, "%-46s max rel err %.3e (tol %.0e) at %lld: got %.8g want %.8g", what, worst, tol,
          (long long)worst_i, n > 0 ? got[worst_i] : 0.0f, n > 0 ? ref[worst_i] : 0.0f);
    if (bad)
        printf("     %lld of %lld elements out of tolerance\n", (long long)bad, (long long)n);
}

static inline double rms_of(const float *x, int64_t n)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    return sqrt(ss / (double)(n > 0 ? n : 1));
}

/* Max over i of |got - ref| / bound[i] must be <= 1; NaN anywhere fails. */
static inline void check_within(const char *what, const float *got, const float *ref, const float *bound, int64_t n)
{
    double worst = 0.0;
    int64_t worst_i = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)ref[i]) / (double)bound[i];
        if (!(err <= 1.0))
            bad++;
        if (!(err <= worst) && !isnan(worst)) { /* the first NaN sticks */
            worst = err;
            worst_i = i;
        }
    }
    check(bad == 0, "%-46s max err/bound %.3f at %lld: got %.8g want %.8g (bound %.3g)", what, worst,
          (long long)worst_i, n > 0 ? got[worst_i] : 0.0f, n > 0 ? ref[worst_i] : 0.0f, n > 0 ? bound[worst_i] : 0.0f);
    if (bad)
        printf("     %lld of %lld elements beyond their bound\n", (long long)bad, (long long)n);
}

static inline void check_identical(const char *what, const void *a, const void *b, size_t bytes)
{
    check(memcmp(a, b, bytes) == 0, "%-46s bit-identical (%zu bytes)", what, bytes);
}

/* The amax a kernel's *_amax launcher wrote (*d_amax, on the device) against max |x| of what it wrote (x: n bf16
 * values, downloaded): equal bit for bit, a max being exact. d_amax is set to 1e30 first by the caller's poison_amax,
 * so a launcher that did not zero it first fails. */
static inline void poison_amax(float *d_amax)
{
    const float big = 1e30f;
    CUDA_CHECK(cudaMemcpy(d_amax, &big, sizeof(big), cudaMemcpyHostToDevice));
}
static inline void check_amax(const char *what, const float *d_amax, const uint16_t *x, int64_t n)
{
    float got, want = 0.0f;
    download(&got, d_amax, sizeof(got));
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)x[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        want = fmaxf(want, fabsf(f));
    }
    check(got == want, "%-46s amax %.6g, max |x| of the output %.6g", what, got, want);
}

/* ---- timing ---- */

/* Runs the kernel(s) under test on input set `set`. */
typedef void (*bench_fn)(void *ctx, int set);

/* Input sets to rotate over so that together they are at least 3x the L2. */
static inline int bench_sets(size_t bytes_per_set)
{
    int device = 0, l2 = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    size_t want = 3 * (size_t)l2;
    int sets = (int)((want + bytes_per_set - 1) / bytes_per_set);
    return sets < 2 ? 2 : sets > 64 ? 64 : sets;
}

static int compare_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median ms of one call. Runs are enqueued back to back with an event between each,
 * so the GPU never idles waiting for the host and launch gaps are not timed. */
static inline float bench_median_ms(bench_fn fn, void *ctx, int n_sets)
{
    cudaEvent_t events[BENCH_RUNS + 1];
    float ms[BENCH_RUNS], warm_ms = 0.0f;
    for (int i = 0; i <= BENCH_RUNS; i++)
        CUDA_CHECK(cudaEventCreate(&events[i]));
    for (int round = 0; warm_ms < BENCH_WARMUP_MS && round < 1000; round++) {
        CUDA_CHECK(cudaEventRecord(events[0], 0));
        for (int i = 0; i < BENCH_WARMUP; i++)
            fn(ctx, i % n_sets);
        CUDA_CHECK(cudaEventRecord(events[1], 0));
        CUDA_CHECK(cudaEventSynchronize(events[1]));
        float round_ms;
        CUDA_CHECK(cudaEventElapsedTime(&round_ms, events[0], events[1]));
        warm_ms += round_ms;
    }
    CUDA_CHECK(cudaEventRecord(events[0], 0));
    for (int i = 0; i < BENCH_RUNS; i++) {
        fn(ctx, (i + BENCH_WARMUP) % n_sets);
        CUDA_CHECK(cudaEventRecord(events[i + 1], 0));
    }
    CUDA_CHECK(cudaEventSynchronize(events[BENCH_RUNS]));
    for (int i = 0; i < BENCH_RUNS; i++)
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], events[i], events[i + 1]));
    for (int i = 0; i <= BENCH_RUNS; i++)
        CUDA_CHECK(cudaEventDestroy(events[i]));
    qsort(ms, BENCH_RUNS, sizeof(float), compare_float);
    return ms[BENCH_RUNS / 2];
}

typedef struct {
    void *dst, *src;
    size_t bytes;
} CopyCtx;
static void copy_run(void *ctx, int set)
{
    CopyCtx *c = (CopyCtx *)ctx;
    (void)set;
    CUDA_CHECK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0));
}

/* cudaMemcpy device-to-device of 512 MB, counting bytes read + written: the
 * reference that the kernels' GB/s are reported against. */
static inline void bench_copy_bandwidth(void)
{
    CopyCtx c;
    c.bytes = (size_t)512 << 20;
    c.src = dev_alloc(c.bytes);
    c.dst = dev_alloc(c.bytes);
    CUDA_CHECK(cudaMemset(c.src, 1, c.bytes));
    float ms = bench_median_ms(copy_run, &c, 1);
    copy_gbps = 2.0 * (double)c.bytes / (ms * 1e-3) / 1e9;
    printf("BENCH %-40s %9.4f ms %8.1f GB/s (reference: bytes read + written)\n", "cudaMemcpy D2D 512 MB", ms,
           copy_gbps);
    cuda_free(c.src);
    cuda_free(c.dst);
}

static inline void bench_report(const char *what, bench_fn fn, void *ctx, int n_sets, double bytes)
{
    float ms = bench_median_ms(fn, ctx, n_sets);
    double gbps = bytes / (ms * 1e-3) / 1e9;
    printf("BENCH %-40s %9.4f ms %8.1f GB/s %5.1f%% of copy\n", what, ms, gbps,
           copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0.0);
}

#endif /* DEV_CUDA_CHECK_COMMON_H */
