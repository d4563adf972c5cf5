/*
 * adamw_check: llmc/kernels/adamw.h.
 *   global_norm_squared on bf16 gradients against a double sum of their squares, and
 *   for determinism; clip_coefficient against the same float formula on the host;
 *   adamw_update against a double-precision CPU AdamW (torch.optim.AdamW's math) run
 *   on the joined fp32 master, master_join(param, master_lo) (llmc/kernels/master_weights.h),
 *   at steps 1 and 10, with bf16 gradients, and bit for bit against the CPU AdamW
 *   (llmc/kernels/adamw_cpu.h: the same float operations in the same order, adamw_step.h).
 *   Each case is a flat buffer of several
 *   tensors with different weight-decay flags, updated by one launch through a run
 *   table, whole and as a shard (a range with first > 0, a multiple of 4 inside a run,
 *   and n % 4 != 0, so the scalar tail runs too):
 *     - 3 elements: the tail alone;
 *     - 1001 elements in 5 tensors, two adjacent ones with the same flag (merged runs);
 *     - ~1M elements in 700 tensors of alternating flags: more runs than a block has
 *       threads, so the kernel's copy of the table to shared memory loops;
 *     - 4096 x 14336 (a Llama 3 8B MLP projection's size) in tensors whose boundaries
 *       fall in the second and later passes of the grid-stride loop (one pass covers
 *       ADAMW_MAX_BLOCKS x ADAMW_THREADS x 4 = 8388608 elements) and off block
 *       boundaries; the whole buffer is timed, the shard spans several passes.
 *   Elements outside the range must come back bit-identical (param, master_lo, m, v).
 *
 * Tolerances:
 *   norm squared: 1e-5 relative (squares of bf16 values are exact in fp32; sums of 8
 *     of them in fp32, then double; float block partials: ~1e-6 in all).
 *   clip coefficient: 1e-6 relative (the same IEEE float operations on both sides).
 *   master = master_join(param, master_lo): an exact fp32 number, the kernel's own
 *     fp32 result, so held to what the fp32 master of before was: 1e-5 relative to
 *     max(|ref|, rms): one fp32 rounding of w - update is an ulp of the weights'
 *     scale, not of a weight that happens to sit near zero (measured 2e-5 with a
 *     1%-of-rms floor, at a 1.7e-5 weight).
 *   m, v (fp32): 1e-5 relative, floor at 1% of the rms (m can cancel).
 *   master - master_before: 1e-4 relative, floor at the rms of the update (~lr): the
 *     fp32 rounding of master (ulp ~2e-9 to 8e-9 for |master| ~ 0.02 to 0.08) is up
 *     to ~3e-5 of a typical update, and more of one that cancels to near zero. A
 *     decay applied to the wrong run moves the update by lr * wd * w, ~2e-3 of it.
 *   param: bit-identical to the bf16 nearest to the kernel's joined master, ties
 *     toward +inf (master_split's rounding, computed here from the round-to-nearest-
 *     even helper); (param, master_lo) bit-identical to master_split of the joined
 *     master (the pair is the canonical one); param within 4e-3 (half a bf16 ulp,
 *     2^-8 relative at worst) of the reference master.
 * Timing: the update moves 26 bytes per parameter (reads param, master_lo, grad: 2
 * bytes each, m, v: 4 each; writes param, master_lo, m, v), the norm 2 (reads grad).
 *
 * Usage: adamw_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/adamw.h"
#include "llmc/kernels/adamw_cpu.h"

#define LR 3e-4f
#define BETA1 0.9f
#define BETA2 0.95f
#define ADAM_EPS 1e-8f
#define WEIGHT_DECAY 0.1f
#define GRAD_SCALE 0.5f
static const AdamWConfig CONFIG = {
    .lr = LR, .beta1 = BETA1, .beta2 = BETA2, .eps = ADAM_EPS, .weight_decay = WEIGHT_DECAY, .grad_clip = 1.0};
/* elements one pass of adamw_kernel's grid-stride loop covers */
#define GRID_PASS ((int64_t)ADAMW_MAX_BLOCKS * ADAMW_THREADS * 4)

/* AdamW of n elements in double from w0, m0, v0; decay[i]: whether element i decays. */
static void ref_adamw(float *w_out, float *m_out, float *v_out, const float *w0, const float *m0, const float *v0,
                      const uint16_t *grad, const unsigned char *decay, int64_t n, int step)
{
    double bc1 = 1.0 - pow((double)BETA1, step), bc2 = 1.0 - pow((double)BETA2, step);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double g = (double)bf16_float(grad[i]) * GRAD_SCALE;
        double mm = (double)BETA1 * m0[i] + (1.0 - (double)BETA1) * g;
        double vv = (double)BETA2 * v0[i] + (1.0 - (double)BETA2) * g * g;
        double w = w0[i] * (decay[i] ? 1.0 - (double)LR * WEIGHT_DECAY : 1.0);
        w -= ((double)LR / bc1) * mm / (sqrt(vv) / sqrt(bc2) + (double)ADAM_EPS);
        w_out[i] = (float)w;
        m_out[i] = (float)mm;
        v_out[i] = (float)vv;
    }
}

/* The bf16 nearest to w with ties toward +inf, as master_split rounds, written
 * independently of it: round-to-nearest-even except on exact ties. */
static uint16_t bf16_nearest_ties_up(float w)
{
    uint32_t u;
    memcpy(&u, &w, 4);
    if ((u & 0xffffu) != 0x8000u)
        return bf16_bits(w);
    return (uint16_t)((u >> 16) + ((u >> 31) ? 0u : 1u)); /* tie: up for w > 0, toward zero for w < 0 */
}

/* A flat buffer of tensors: tensor r starts at start[r] (multiples of 4, start[0] = 0). */
typedef struct {
    const char *name;
    int64_t total;
    int n_tensors;
    int64_t *start;
    unsigned char *decay;
} Layout;

static Layout layout_make(const char *name, int64_t total, int n_tensors)
{
    Layout l;
    l.name = name;
    l.total = total;
    l.n_tensors = n_tensors;
    l.start = (int64_t *)malloc_check(sizeof(int64_t) * n_tensors, "layout starts");
    l.decay = (unsigned char *)malloc_check((size_t)n_tensors, "layout decay");
    return l;
}

static void layout_free(Layout *l)
{
    free(l->start);
    free(l->decay);
}

typedef struct {
    int64_t n, first;
    const AdamWRuns *runs;
    float **m, **v, *scale, *norm, *scratch;
    bf16 **param, **grad;
    int16_t **lo;
} Bench;

static void run_adamw(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    adamw_update(b->param[s], b->lo[s], b->grad[s], b->m[s], b->v[s], b->first, b->n, b->runs,
                 adamw_scalars(&CONFIG, LR, 10), b->scale, 0);
}
static void run_norm(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    global_norm_squared(b->norm, b->scratch, b->grad[s], b->n, 0);
}

static void check_norm(int64_t n)
{
    char what[128];
    uint16_t *x = (uint16_t *)malloc_check((size_t)n * 2, "grad");
    /* magnitudes over six decades, as gradients of different tensors have */
    for (int64_t i = 0; i < n; i++)
        x[i] = bf16_bits(rng_normal() * expf(rng_range(-7.0f, 7.0f)));
    double want = 0.0;
    for (int64_t i = 0; i < n; i++)
        want += (double)bf16_float(x[i]) * bf16_float(x[i]);
    bf16 *d_x = (bf16 *)dev_upload(x, (size_t)n * 2);
    float *d_out = (float *)dev_alloc(4), *d_scratch = (float *)dev_alloc(NORM_BLOCKS * 4);
    float got[2];
    for (int rep = 0; rep < 2; rep++) {
        poison(d_out, 4);
        poison(d_scratch, NORM_BLOCKS * 4);
        global_norm_squared(d_out, d_scratch, d_x, n, 0);
        download(&got[rep], d_out, 4);
    }
    float want_f = (float)want;
    snprintf(what, sizeof(what), "global_norm_squared bf16 n=%lld", (long long)n);
    check_close(what, got, &want_f, 1, 1e-5, 0.0);
    snprintf(what, sizeof(what), "global_norm_squared determinism n=%lld", (long long)n);
    check_identical(what, &got[0], &got[1], 4);
    cuda_free(d_x);
    cuda_free(d_out);
    cuda_free(d_scratch);
    free(x);
}

static void check_clip(void)
{
    float cases[][2] = {/* norm squared, max_norm */ {4.0f, 1.0f},
                        {0.25f, 1.0f},
                        {1e6f, 1.0f},
                        {7.3f, 0.0f},
                        {0.0f, 1.0f},
                        {123.456f, 2.5f}};
    int n = (int)(sizeof(cases) / sizeof(cases[0]));
    float *d_ns = (float *)dev_alloc(4), *d_coef = (float *)dev_alloc(4);
    for (int i = 0; i < n; i++) {
        float ns = cases[i][0], max_norm = cases[i][1], got;
        float want = max_norm > 0.0f ? fminf(1.0f, max_norm / (sqrtf(ns) + 1e-6f)) : 1.0f;
        CUDA_CHECK(cudaMemcpy(d_ns, &ns, 4, cudaMemcpyHostToDevice));
        poison(d_coef, 4);
        clip_coefficient(d_coef, d_ns, max_norm, 0);
        download(&got, d_coef, 4);
        char what[128];
        snprintf(what, sizeof(what), "clip_coefficient ns=%g max_norm=%g", ns, max_norm);
        check_close(what, &got, &want, 1, 1e-6, 0.0);
    }
    /* a non-finite gradient norm: the coefficient is NaN, whatever max_norm */
    float bad[] = {NAN, INFINITY};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) {
            float max_norm = k ? 1.0f : 0.0f, got;
            CUDA_CHECK(cudaMemcpy(d_ns, &bad[i], 4, cudaMemcpyHostToDevice));
            clip_coefficient(d_coef, d_ns, max_norm, 0);
            download(&got, d_coef, 4);
            check(isnan(got), "clip_coefficient of ns=%g, max_norm=%g is NaN (the update is skipped)", bad[i],
                  max_norm);
        }
    }
    cuda_free(d_ns);
    cuda_free(d_coef);
}

/* adamw_update_change over [first, first + n) from the state (hi0, lo0, m0, v0): the same state as adamw_update's
 * (got_*), and each weight's change code (--update-gather delta) delta_code of its old and new bf16 bits. */
static void check_change_codes(const char *range, int step, bf16 *d_hi, int16_t *d_lo, const bf16 *d_grad, float *d_m,
                               float *d_v, const uint16_t *hi0, const int16_t *lo0, const float *m0, const float *v0,
                               const uint16_t *got_hi, const int16_t *got_lo, const float *got_m, const float *got_v,
                               int64_t first, int64_t n, int64_t total, const AdamWRuns *runs, AdamWScalars scalars,
                               const float *d_scale)
{
    size_t fb = (size_t)total * 4, hb = (size_t)total * 2;
    CUDA_CHECK(cudaMemcpy(d_hi, hi0, hb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_lo, lo0, hb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_m, m0, fb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_v, v0, fb, cudaMemcpyHostToDevice));
    int8_t *d_change = (int8_t *)dev_alloc((size_t)n + 4), *change = (int8_t *)malloc_check((size_t)n + 4, "codes");
    poison(d_change, (size_t)n + 4);
    adamw_update_change(d_hi + first, d_lo + first, d_grad + first, d_m + first, d_v + first, first, n, runs, scalars,
                        d_scale, d_change, 0);
    uint16_t *hi = (uint16_t *)malloc_check(hb, "param");
    int16_t *lo = (int16_t *)malloc_check(hb, "master_lo");
    float *m = (float *)malloc_check(fb, "m"), *v = (float *)malloc_check(fb, "v");
    download(hi, d_hi, hb);
    download(lo, d_lo, hb);
    download(m, d_m, fb);
    download(v, d_v, fb);
    download(change, d_change, (size_t)n + 4);
    int64_t wrong = 0, escapes = 0, moved = 0;
    for (int64_t i = 0; i < n; i++) {
        wrong += change[i] != delta_code(hi0[first + i], hi[first + i]);
        escapes += change[i] == DELTA_ESCAPE;
        moved += hi[first + i] != hi0[first + i];
    }
    char what[160];
    snprintf(what, sizeof(what), "adamw_update_change %s step=%d", range, step);
    check(memcmp(hi, got_hi, hb) == 0 && memcmp(lo, got_lo, hb) == 0 && memcmp(m, got_m, fb) == 0 &&
              memcmp(v, got_v, fb) == 0 && wrong == 0 && change[n] == -1,
          "%-46s state as adamw_update's, %lld codes wrong (%lld of %lld moved, %lld escapes), nothing past n", what,
          (long long)wrong, (long long)moved, (long long)n, (long long)escapes);
    cuda_free(d_change);
    free(change);
    free(hi);
    free(lo);
    free(m);
    free(v);
}

/* ranges[r] = {first, n}; bench: time one update of the whole buffer (and the norm). */
static void check_adamw(const Layout *L, const int64_t (*ranges)[2], int n_ranges, int bench)
{
    char what[160];
    int64_t total = L->total;
    size_t fb = (size_t)total * 4, hb = (size_t)total * 2;
    printf("-- adamw %s: %lld elements, %d tensors\n", L->name, (long long)total, L->n_tensors);
    float *w0 = (float *)malloc_check(fb, "master"), *m0 = (float *)malloc_check(fb, "m");
    float *v0 = (float *)malloc_check(fb, "v");
    uint16_t *hi0 = (uint16_t *)malloc_check(hb, "param"), *grad = (uint16_t *)malloc_check(hb, "grad");
    int16_t *lo0 = (int16_t *)malloc_check(hb, "master_lo");
    unsigned char *decay = (unsigned char *)malloc_check((size_t)total, "decay per element");
    uint16_t *got_hi = (uint16_t *)malloc_check(hb, "got param");
    int16_t *got_lo = (int16_t *)malloc_check(hb, "got master_lo");
    float *got_m = (float *)malloc_check(fb, "got m"), *got_v = (float *)malloc_check(fb, "got v");
    float *ref_w = (float *)malloc_check(fb, "ref master"), *ref_m = (float *)malloc_check(fb, "ref m");
    float *ref_v = (float *)malloc_check(fb, "ref v"), *got_w = (float *)malloc_check(fb, "got master");
    float *delta = (float *)malloc_check(fb, "delta"), *ref_delta = (float *)malloc_check(fb, "ref delta");
    float *param_f = (float *)malloc_check(fb, "param f");
    uint16_t *want_hi = (uint16_t *)malloc_check(hb, "want param"), *split_hi = (uint16_t *)malloc_check(hb, "split");
    int16_t *split_lo = (int16_t *)malloc_check(hb, "split lo");
    float *cpu_w = (float *)malloc_check(fb, "CPU master"), *cpu_m = (float *)malloc_check(fb, "CPU m");
    float *cpu_v = (float *)malloc_check(fb, "CPU v");
    uint16_t *cpu_hi = (uint16_t *)malloc_check(hb, "CPU param");

    for (int64_t i = 0; i < total; i++) {
        float w = 0.02f * rng_normal();
        master_split(w, &hi0[i], &lo0[i]);
        w0[i] = master_join(hi0[i], lo0[i]); /* the reference starts from the joined master */
        grad[i] = bf16_bits(0.01f * rng_normal());
        m0[i] = 0.005f * rng_normal();
        v0[i] = 1e-4f * fabsf(rng_normal()) * fabsf(rng_normal());
    }
    for (int r = 0; r < L->n_tensors; r++) {
        int64_t end = r + 1 < L->n_tensors ? L->start[r + 1] : total;
        memset(decay + L->start[r], L->decay[r], (size_t)(end - L->start[r]));
    }
    AdamWRuns runs = adamw_runs_create(L->start, L->decay, L->n_tensors);
    printf("   %d decay runs after merging\n", runs.n_runs);
    float scale = GRAD_SCALE;
    bf16 *d_hi = (bf16 *)dev_alloc(hb), *d_grad = (bf16 *)dev_upload(grad, hb);
    int16_t *d_lo = (int16_t *)dev_alloc(hb);
    float *d_m = (float *)dev_alloc(fb), *d_v = (float *)dev_alloc(fb), *d_scale = (float *)dev_upload(&scale, 4);

    for (int r = 0; r < n_ranges; r++) {
        int64_t first = ranges[r][0], n = ranges[r][1];
        char range[64];
        snprintf(range, sizeof(range), "[%lld, +%lld)", (long long)first, (long long)n);
        int steps[2] = {1, 10};
        for (int k = 0; k < 2; k++) {
            int step = steps[k];
            CUDA_CHECK(cudaMemcpy(d_hi, hi0, hb, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(d_lo, lo0, hb, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(d_m, m0, fb, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(d_v, v0, fb, cudaMemcpyHostToDevice));
            AdamWScalars scalars = adamw_scalars(&CONFIG, LR, step);
            adamw_update(d_hi + first, d_lo + first, d_grad + first, d_m + first, d_v + first, first, n, &runs, scalars,
                         d_scale, 0);
            download(got_hi, d_hi, hb);
            download(got_lo, d_lo, hb);
            download(got_m, d_m, fb);
            download(got_v, d_v, fb);
            ref_adamw(ref_w, ref_m, ref_v, w0 + first, m0 + first, v0 + first, grad + first, decay + first, n, step);

            /* everything outside [first, first + n) untouched */
            int64_t end = first + n;
            int outside_ok = memcmp(got_hi, hi0, (size_t)first * 2) == 0 &&
                             memcmp(got_lo, lo0, (size_t)first * 2) == 0 && memcmp(got_m, m0, (size_t)first * 4) == 0 &&
                             memcmp(got_v, v0, (size_t)first * 4) == 0 &&
                             memcmp(got_hi + end, hi0 + end, (size_t)(total - end) * 2) == 0 &&
                             memcmp(got_lo + end, lo0 + end, (size_t)(total - end) * 2) == 0 &&
                             memcmp(got_m + end, m0 + end, (size_t)(total - end) * 4) == 0 &&
                             memcmp(got_v + end, v0 + end, (size_t)(total - end) * 4) == 0;
            snprintf(what, sizeof(what), "adamw %s step=%d outside the range", range, step);
            check(outside_ok, "%-46s %lld elements bit-identical", what, (long long)(total - n));

            for (int64_t i = 0; i < n; i++) {
                int64_t at = first + i;
                got_w[i] = master_join(got_hi[at], got_lo[at]);
                delta[i] = (float)((double)got_w[i] - w0[at]);
                ref_delta[i] = (float)((double)ref_w[i] - w0[at]);
                want_hi[i] = bf16_nearest_ties_up(got_w[i]);
                master_split(got_w[i], &split_hi[i], &split_lo[i]);
                param_f[i] = bf16_float(got_hi[at]);
            }
            /* the CPU AdamW (adamw_cpu.h) on the same inputs, a call per tensor: the same bits */
            memcpy(cpu_w, w0 + first, (size_t)n * 4);
            memcpy(cpu_m, m0 + first, (size_t)n * 4);
            memcpy(cpu_v, v0 + first, (size_t)n * 4);
            for (int t = 0; t < L->n_tensors; t++) {
                int64_t lo = L->start[t] > first ? L->start[t] : first;
                int64_t hi = t + 1 < L->n_tensors ? L->start[t + 1] : total;
                hi = hi < end ? hi : end;
                if (hi > lo)
                    adamw_cpu_update(cpu_w + (lo - first), cpu_m + (lo - first), cpu_v + (lo - first), NULL, grad + lo,
                                     cpu_hi + (lo - first), hi - lo, GRAD_SCALE, L->decay[t] ? scalars.decay : 1.0f,
                                     scalars);
            }
            snprintf(what, sizeof(what), "adamw = CPU AdamW %s step=%d", range, step);
            check(memcmp(got_w, cpu_w, (size_t)n * 4) == 0 && memcmp(got_m + first, cpu_m, (size_t)n * 4) == 0 &&
                      memcmp(got_v + first, cpu_v, (size_t)n * 4) == 0 &&
                      memcmp(got_hi + first, cpu_hi, (size_t)n * 2) == 0,
                  "%-46s master, m, v and param bit-identical", what);
            snprintf(what, sizeof(what), "adamw master %s step=%d", range, step);
            check_close(what, got_w, ref_w, n, 1e-5, 1.0);
            snprintf(what, sizeof(what), "adamw master update %s step=%d", range, step);
            check_close(what, delta, ref_delta, n, 1e-4, 1.0);
            snprintf(what, sizeof(what), "adamw m %s step=%d", range, step);
            check_close(what, got_m + first, ref_m, n, 1e-5, 1e-2);
            snprintf(what, sizeof(what), "adamw v %s step=%d", range, step);
            check_close(what, got_v + first, ref_v, n, 1e-5, 1e-2);
            snprintf(what, sizeof(what), "adamw param = bf16 nearest(master) %s s=%d", range, step);
            check_identical(what, got_hi + first, want_hi, (size_t)n * 2);
            snprintf(what, sizeof(what), "adamw (param, lo) = split(master) %s s=%d", range, step);
            check(memcmp(got_hi + first, split_hi, (size_t)n * 2) == 0 &&
                      memcmp(got_lo + first, split_lo, (size_t)n * 2) == 0,
                  "%-46s bit-identical", what);
            snprintf(what, sizeof(what), "adamw param %s step=%d", range, step);
            check_close(what, param_f, ref_w, n, 4e-3, 1e-2);
            check_change_codes(range, step, d_hi, d_lo, d_grad, d_m, d_v, hi0, lo0, m0, v0, got_hi, got_lo, got_m,
                               got_v, first, n, total, &runs, scalars, d_scale);
        }
    }

    /* a NaN gradient scale (the clip coefficient of a non-finite gradient norm): nothing written anywhere */
    float nan_scale = NAN;
    CUDA_CHECK(cudaMemcpy(d_scale, &nan_scale, 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_hi, hi0, hb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_lo, lo0, hb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_m, m0, fb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_v, v0, fb, cudaMemcpyHostToDevice));
    adamw_update(d_hi, d_lo, d_grad, d_m, d_v, 0, total, &runs, adamw_scalars(&CONFIG, LR, 1), d_scale, 0);
    download(got_hi, d_hi, hb);
    download(got_lo, d_lo, hb);
    download(got_m, d_m, fb);
    download(got_v, d_v, fb);
    check(memcmp(got_hi, hi0, hb) == 0 && memcmp(got_lo, lo0, hb) == 0 && memcmp(got_m, m0, fb) == 0 &&
              memcmp(got_v, v0, fb) == 0,
          "%-46s weights, residuals and moments bit-identical", "adamw with a NaN grad scale skips the step");
    /* and its change codes say no weight changed (--update-gather delta's decode adds them all the same) */
    int8_t *d_change = (int8_t *)dev_alloc((size_t)total), *change = (int8_t *)malloc_check((size_t)total, "codes");
    poison(d_change, (size_t)total);
    adamw_update_change(d_hi, d_lo, d_grad, d_m, d_v, 0, total, &runs, adamw_scalars(&CONFIG, LR, 1), d_scale, d_change,
                        0);
    download(change, d_change, (size_t)total);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < total; i++)
        nonzero += change[i] != 0;
    check(nonzero == 0, "%-46s %lld change codes not 0", "adamw_update_change, NaN grad scale", (long long)nonzero);
    cuda_free(d_change);
    free(change);
    CUDA_CHECK(cudaMemcpy(d_scale, &scale, 4, cudaMemcpyHostToDevice));

    if (bench) {
        Bench b;
        b.n = total;
        b.first = 0;
        b.runs = &runs;
        b.scale = d_scale;
        b.norm = (float *)dev_alloc(4);
        b.scratch = (float *)dev_alloc(NORM_BLOCKS * 4);
        int sets = bench_sets((size_t)total * 26);
        b.m = (float **)malloc_check(sets * sizeof(float *), "bench sets");
        b.v = (float **)malloc_check(sets * sizeof(float *), "bench sets");
        b.param = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        b.grad = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        b.lo = (int16_t **)malloc_check(sets * sizeof(int16_t *), "bench sets");
        CUDA_CHECK(cudaMemcpy(d_hi, hi0, hb, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_lo, lo0, hb, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_m, m0, fb, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_v, v0, fb, cudaMemcpyHostToDevice));
        for (int s = 0; s < sets; s++) {
            b.param[s] = (bf16 *)dev_clone(d_hi, hb);
            b.lo[s] = (int16_t *)dev_clone(d_lo, hb);
            b.grad[s] = (bf16 *)dev_clone(d_grad, hb);
            b.m[s] = (float *)dev_clone(d_m, fb);
            b.v[s] = (float *)dev_clone(d_v, fb);
        }
        /* param, master_lo (2 bytes each), m, v (4 each) read and written, grad (2) read */
        snprintf(what, sizeof(what), "adamw_update n=%lld, %d runs", (long long)total, runs.n_runs);
        bench_report(what, run_adamw, &b, sets, 26.0 * total);
        snprintf(what, sizeof(what), "global_norm_squared bf16 n=%lld", (long long)total);
        bench_report(what, run_norm, &b, sets, 2.0 * total);
        for (int s = 0; s < sets; s++) {
            void *bufs[5] = {b.param[s], b.lo[s], b.grad[s], b.m[s], b.v[s]};
            for (int i = 0; i < 5; i++)
                cuda_free(bufs[i]);
        }
        free(b.m);
        free(b.v);
        free(b.param);
        free(b.grad);
        free(b.lo);
        cuda_free(b.norm);
        cuda_free(b.scratch);
    }

    adamw_runs_free(&runs);
    void *dev[] = {d_hi, d_grad, d_lo, d_m, d_v, d_scale};
    void *host[] = {w0,      m0,       v0,       hi0,   grad,  lo0,   decay, got_hi,    got_lo,
                    got_m,   got_v,    ref_w,    ref_m, ref_v, got_w, delta, ref_delta, param_f,
                    want_hi, split_hi, split_lo, cpu_w, cpu_m, cpu_v, cpu_hi};
    FREE_BUFFERS(dev, host);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "adamw_check");
    bench_copy_bandwidth();
    int64_t real = (int64_t)4096 * 14336;
    int64_t norm_sizes[] = {3, 37, 1001, 1000003, real};
    for (size_t i = 0; i < sizeof(norm_sizes) / sizeof(norm_sizes[0]); i++)
        check_norm(norm_sizes[i]);
    check_clip();

    /* 3 elements, one tensor: the scalar tail alone */
    Layout tiny = layout_make("tiny", 3, 1);
    tiny.start[0] = 0;
    tiny.decay[0] = 1;
    const int64_t tiny_ranges[][2] = {{0, 3}};
    check_adamw(&tiny, tiny_ranges, 1, 0);
    layout_free(&tiny);

    /* 1001 elements, 5 tensors; the 2nd and 3rd share a flag and merge into one run */
    Layout small = layout_make("small", 1001, 5);
    const int64_t small_start[5] = {0, 4, 8, 104, 1000};
    const unsigned char small_decay[5] = {0, 1, 1, 0, 1};
    memcpy(small.start, small_start, sizeof(small_start));
    memcpy(small.decay, small_decay, sizeof(small_decay));
    const int64_t small_ranges[][2] = {{0, 1001}, {100, 899}};
    check_adamw(&small, small_ranges, 2, 0);
    layout_free(&small);

    /* ~1M elements, 700 tensors of random sizes (multiples of 4) and alternating flags,
     * every 50th pair with the same flag: ~690 runs, more than the 256 threads of a block */
    Layout many = layout_make("700 tensors", 0, 700);
    int64_t at = 0;
    for (int r = 0; r < 700; r++) {
        many.start[r] = at;
        many.decay[r] = (unsigned char)(r % 50 == 1 ? many.decay[r - 1] : r % 2);
        at += 4 * (1 + rng_int(715));
    }
    many.total = at + 3; /* the last tensor is not a multiple of 4 long */
    const int64_t many_ranges[][2] = {{0, many.total}, {4 * (many.total / 16) + 4, 4 * (many.total / 8) + 3}};
    check_adamw(&many, many_ranges, 2, 0);
    layout_free(&many);

    /* 4096 x 14336 in 11 tensors, boundaries in later grid-stride passes and off block edges */
    Layout big = layout_make("4096 x 14336", real, 11);
    const int64_t G = GRID_PASS;
    const int64_t big_start[11] = {0,         4,          1024,         G - 4,         G + 260, 2 * G + 1032,
                                   3 * G + 4, 3 * G + 12, 5 * G - 1024, 6 * G + 12288, real - 8};
    const unsigned char big_decay[11] = {1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0};
    memcpy(big.start, big_start, sizeof(big_start));
    memcpy(big.decay, big_decay, sizeof(big_decay));
    const int64_t big_ranges[][2] = {{0, real}, {G - 4000, 3 * G + 3}};
    check_adamw(&big, big_ranges, 2, 1);
    layout_free(&big);
    return check_summary();
}
