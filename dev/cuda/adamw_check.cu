/*
 * adamw_check: llmc/adamw.h. global_norm_squared against a double sum and for
 * determinism; clip_coefficient against the same float formula on the host;
 * adamw_update against a double-precision CPU AdamW (torch.optim.AdamW's math) on
 * the same fp32 inputs, at steps 1 and 10, with the bf16 copy checked to be exactly
 * round-to-nearest-even of the updated master; timing on a 4096 x 14336 tensor (a
 * Llama 3 8B MLP projection) and sizes with a ragged tail (n % 4 != 0).
 *
 * Tolerances:
 *   norm squared: 1e-5 relative (double sums, float block partials: ~1e-7).
 *   clip coefficient: 1e-6 relative (the same IEEE float operations on both sides).
 *   master (fp32): 1e-5 relative to max(|ref|, rms): one fp32 rounding of w -
 *     update is an ulp of the weights' scale, not of a weight that happens to
 *     sit near zero (measured 2e-5 with a 1%-of-rms floor, at a 1.7e-5 weight).
 *   m, v (fp32): 1e-5 relative, floor at 1% of the rms (m can cancel).
 *   master - master_before: 1e-4 relative, floor at the rms of the update (~lr): the
 *     fp32 rounding of master (ulp ~2e-9 to 8e-9 for |master| ~ 0.02 to 0.08) is up
 *     to ~3e-5 of a typical update, and more of one that cancels to near zero.
 *   param: bit-identical to bf16_rn(the kernel's own master), and within 4e-3
 *     (half a bf16 ulp, 2^-8 relative at worst) of the reference master.
 *
 * Usage: adamw_check [--seed N]
 */
#include "check_common.h"
#include "llmc/adamw.h"

#define LR 3e-4f
#define BETA1 0.9f
#define BETA2 0.95f
#define ADAM_EPS 1e-8f
#define WEIGHT_DECAY 0.1f
#define GRAD_SCALE 0.5f

static void ref_adamw(float *master, float *m, float *v, const float *grad, int64_t n, int step)
{
    double bc1 = 1.0 - pow((double)BETA1, step), bc2 = 1.0 - pow((double)BETA2, step);
    for (int64_t i = 0; i < n; i++) {
        double g = (double)grad[i] * GRAD_SCALE;
        double mm = (double)BETA1 * m[i] + (1.0 - (double)BETA1) * g;
        double vv = (double)BETA2 * v[i] + (1.0 - (double)BETA2) * g * g;
        double w = master[i] * (1.0 - (double)LR * WEIGHT_DECAY);
        w -= ((double)LR / bc1) * mm / (sqrt(vv) / sqrt(bc2) + (double)ADAM_EPS);
        master[i] = (float)w;
        m[i] = (float)mm;
        v[i] = (float)vv;
    }
}

typedef struct {
    int64_t n;
    float **master, **grad, **m, **v, *scale, *norm, *scratch;
    bf16 **param;
} Bench;

static void run_adamw(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    adamw_update(b->master[s], b->param[s], b->grad[s], b->m[s], b->v[s], b->n, LR, BETA1, BETA2, ADAM_EPS,
                 WEIGHT_DECAY, b->scale, 10, 0);
}
static void run_norm(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    global_norm_squared(b->norm, b->scratch, b->grad[s], b->n, 0);
}

static void check_norm(int64_t n)
{
    char what[128];
    float *x = (float *)malloc_check((size_t)n * 4, "grad");
    /* magnitudes over six decades, as gradients of different tensors have */
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * expf(rng_range(-7.0f, 7.0f));
    double want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    float *d_x = (float *)dev_upload(x, (size_t)n * 4), *d_out = (float *)dev_alloc(4);
    float *d_scratch = (float *)dev_alloc(NORM_BLOCKS * 4);
    float got[2];
    for (int rep = 0; rep < 2; rep++) {
        poison(d_out, 4);
        poison(d_scratch, NORM_BLOCKS * 4);
        global_norm_squared(d_out, d_scratch, d_x, n, 0);
        download(&got[rep], d_out, 4);
    }
    float want_f = (float)want;
    snprintf(what, sizeof(what), "global_norm_squared n=%lld", (long long)n);
    check_close(what, got, &want_f, 1, 1e-5, 0.0);
    snprintf(what, sizeof(what), "global_norm_squared determinism n=%lld", (long long)n);
    check_identical(what, &got[0], &got[1], 4);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(d_scratch));
    free(x);
}

static void check_clip(void)
{
    float cases[][2] = {/* norm squared, max_norm */ {4.0f, 1.0f}, {0.25f, 1.0f}, {1e6f, 1.0f}, {7.3f, 0.0f},
                        {0.0f, 1.0f}, {123.456f, 2.5f}};
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
    CUDA_CHECK(cudaFree(d_ns));
    CUDA_CHECK(cudaFree(d_coef));
}

static void check_adamw(int64_t n, int bench)
{
    char what[128];
    size_t fb = (size_t)n * 4;
    printf("-- adamw n = %lld\n", (long long)n);
    float *master = (float *)malloc_check(fb, "master"), *grad = (float *)malloc_check(fb, "grad");
    float *m = (float *)malloc_check(fb, "m"), *v = (float *)malloc_check(fb, "v");
    float *ref_master = (float *)malloc_check(fb, "ref master"), *ref_m = (float *)malloc_check(fb, "ref m");
    float *ref_v = (float *)malloc_check(fb, "ref v"), *got = (float *)malloc_check(fb, "got");
    float *got_master = (float *)malloc_check(fb, "got master"), *delta = (float *)malloc_check(fb, "delta");
    float *ref_delta = (float *)malloc_check(fb, "ref delta"), *param_f = (float *)malloc_check(fb, "param f");
    uint16_t *param = (uint16_t *)malloc_check((size_t)n * 2, "param");
    uint16_t *want_param = (uint16_t *)malloc_check((size_t)n * 2, "want param");
    fill_float(master, n, 0.02f);
    fill_float(grad, n, 0.01f);
    fill_float(m, n, 0.005f);
    for (int64_t i = 0; i < n; i++) v[i] = 1e-4f * fabsf(rng_normal()) * fabsf(rng_normal());
    float scale = GRAD_SCALE;
    float *d_master = (float *)dev_alloc(fb), *d_grad = (float *)dev_upload(grad, fb);
    float *d_m = (float *)dev_alloc(fb), *d_v = (float *)dev_alloc(fb), *d_scale = (float *)dev_upload(&scale, 4);
    bf16 *d_param = (bf16 *)dev_alloc((size_t)n * 2);

    int steps[2] = {1, 10};
    for (int k = 0; k < 2; k++) {
        int step = steps[k];
        memcpy(ref_master, master, fb);
        memcpy(ref_m, m, fb);
        memcpy(ref_v, v, fb);
        ref_adamw(ref_master, ref_m, ref_v, grad, n, step);
        CUDA_CHECK(cudaMemcpy(d_master, master, fb, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_m, m, fb, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_v, v, fb, cudaMemcpyHostToDevice));
        poison(d_param, (size_t)n * 2);
        adamw_update(d_master, d_param, d_grad, d_m, d_v, n, LR, BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY, d_scale, step,
                     0);
        download(got_master, d_master, fb);
        snprintf(what, sizeof(what), "adamw master n=%lld step=%d", (long long)n, step);
        check_close(what, got_master, ref_master, n, 1e-5, 1.0);
        for (int64_t i = 0; i < n; i++) {
            delta[i] = (float)((double)got_master[i] - master[i]);
            ref_delta[i] = (float)((double)ref_master[i] - master[i]);
        }
        snprintf(what, sizeof(what), "adamw master update n=%lld step=%d", (long long)n, step);
        check_close(what, delta, ref_delta, n, 1e-4, 1.0);
        download(got, d_m, fb);
        snprintf(what, sizeof(what), "adamw m n=%lld step=%d", (long long)n, step);
        check_close(what, got, ref_m, n, 1e-5, 1e-2);
        download(got, d_v, fb);
        snprintf(what, sizeof(what), "adamw v n=%lld step=%d", (long long)n, step);
        check_close(what, got, ref_v, n, 1e-5, 1e-2);
        download(param, d_param, (size_t)n * 2);
        for (int64_t i = 0; i < n; i++) want_param[i] = bf16_bits(got_master[i]);
        snprintf(what, sizeof(what), "adamw param = bf16_rn(master) n=%lld step=%d", (long long)n, step);
        check_identical(what, param, want_param, (size_t)n * 2);
        bf16_to_float(param_f, param, n);
        snprintf(what, sizeof(what), "adamw param n=%lld step=%d", (long long)n, step);
        check_close(what, param_f, ref_master, n, 4e-3, 1e-2);
    }

    if (bench) {
        Bench b;
        b.n = n;
        b.scale = d_scale;
        b.norm = (float *)dev_alloc(4);
        b.scratch = (float *)dev_alloc(NORM_BLOCKS * 4);
        int sets = bench_sets(fb * 4 + (size_t)n * 2);
        float ***lists[4] = {&b.master, &b.grad, &b.m, &b.v};
        for (int l = 0; l < 4; l++) *lists[l] = (float **)malloc_check(sets * sizeof(float *), "bench sets");
        b.param = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        for (int s = 0; s < sets; s++) {
            b.master[s] = (float *)dev_clone(d_master, fb);
            b.grad[s] = (float *)dev_clone(d_grad, fb);
            b.m[s] = (float *)dev_clone(d_m, fb);
            b.v[s] = (float *)dev_clone(d_v, fb);
            b.param[s] = (bf16 *)dev_alloc((size_t)n * 2);
        }
        /* master, m, v read and written, grad read, param written */
        snprintf(what, sizeof(what), "adamw_update n=%lld", (long long)n);
        bench_report(what, run_adamw, &b, sets, 30.0 * n);
        snprintf(what, sizeof(what), "global_norm_squared n=%lld", (long long)n);
        bench_report(what, run_norm, &b, sets, 4.0 * n);
        for (int s = 0; s < sets; s++) {
            for (int l = 0; l < 4; l++) CUDA_CHECK(cudaFree((*lists[l])[s]));
            CUDA_CHECK(cudaFree(b.param[s]));
        }
        for (int l = 0; l < 4; l++) free(*lists[l]);
        free(b.param);
        CUDA_CHECK(cudaFree(b.norm));
        CUDA_CHECK(cudaFree(b.scratch));
    }

    void *dev[] = {d_master, d_grad, d_m, d_v, d_scale, d_param};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) CUDA_CHECK(cudaFree(dev[i]));
    void *host[] = {master, grad, m, v, ref_master, ref_m, ref_v, got, got_master, delta, ref_delta, param_f,
                    param, want_param};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) free(host[i]);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "adamw_check");
    bench_copy_bandwidth();
    int64_t real = (int64_t)4096 * 14336;
    int64_t norm_sizes[] = {3, 37, 1001, 1000003, real};
    for (size_t i = 0; i < sizeof(norm_sizes) / sizeof(norm_sizes[0]); i++) check_norm(norm_sizes[i]);
    check_clip();
    int64_t adamw_sizes[] = {3, 1001, 1000003};
    for (size_t i = 0; i < sizeof(adamw_sizes) / sizeof(adamw_sizes[0]); i++) check_adamw(adamw_sizes[i], 0);
    check_adamw(real, 1);
    return check_exit();
}
