/*
 * matmul_check: llmc/kernels/matmul.h's three GEMMs against a double-precision CPU
 * reference on the same random bf16 operands, then their speed at Llama 3.2 1B
 * sizes next to a plain cuBLAS 8192^3 bf16 GEMM measured in the same run.
 *
 * With --autotune the same checks and timings run on the algorithms that
 * matmul.h's autotuning picks (the Llama shapes are large enough to be tuned).
 *
 * forward runs twice, the second time with a bias added by cuBLASLt's epilogue
 * (matmul_forward_bias). Small odd shapes are checked in full; at Llama sizes (N = 8192 tokens) 4096
 * output elements drawn at random are checked, each a full-length dot product.
 * forward and backward input outputs are poisoned (NaN) first. backward weight
 * (bf16) runs twice: accumulate = 0 over random garbage (100x the result's scale),
 * which must be overwritten, then accumulate = 1 onto random bf16 values of the
 * result's scale, which the reference adds to.
 *
 * Tolerances:
 *   bf16 outputs (forward, backward input): 1e-2
 *     relative. Products of bf16 values are exact in fp32 and accumulate with
 *     ~sqrt(K) * 6e-8 relative error; rounding the result to bf16 adds at most
 *     2^-8 = 3.9e-3. 1e-2 leaves room and still catches a wrong operand or layout.
 *     Errors are relative to max(|ref|, rms(ref)): a dot product of random signs
 *     can land near zero, where a relative error measures only cancellation, while
 *     the rounding errors scale with the terms, i.e. with the rms.
 *   backward weight (bf16), a bound per element, with P the product dout^T inp:
 *     |got - ref| <= 2^-8 |ref| + 1e-3 rms(P)                     (=)
 *     |got - ref| <= 2^-8 (|P| + |ref|) + 1e-3 rms(P)             (+=)
 *     1e-3 rms(P): the fp32 accumulation of up to 8192 exact products (the fp32
 *     dweight of before was held to it; the tensor cores measured ~5e-5 of the rms
 *     on an H100). 2^-8 |ref|: the final rounding to bf16, half an ulp. With
 *     accumulate, cuBLASLt first rounds P to bf16 and then adds C and rounds again
 *     (matmul.h), so half an ulp of |P| comes on top: a single relative tolerance
 *     would have to allow 2^-8 |P| where ref cancels to near zero.
 *
 * Usage: matmul_check [--seed N]
 */
#include <cublas_v2.h>

#include "check_common.h"
#include "llmc/kernels/matmul.h"

#define SAMPLES 4096

typedef struct {
    const char *name;
    int N, in_dim, out_dim;
} Shape;

/* sum_k a[k * sa] * b[k * sb] in double */
static float dot(const float *a, int64_t sa, const float *b, int64_t sb, int K)
{
    double s = 0.0;
    for (int k = 0; k < K; k++)
        s += (double)a[k * sa] * b[k * sb];
    return (float)s;
}

/* The indices to check: all of them, or SAMPLES drawn at random. */
static int64_t pick(int64_t *idx, int64_t total, int full)
{
    if (full) {
        for (int64_t i = 0; i < total; i++)
            idx[i] = i;
        return total;
    }
    for (int64_t i = 0; i < SAMPLES; i++)
        idx[i] = (int64_t)(rng_uniform() * (double)total);
    return SAMPLES;
}

typedef struct {
    Shape s;
    bf16 *inp, *w, *dout, *out, *dinp, *dw;
} Bench;

static void run_forward(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    matmul_forward(b->out, b->inp, b->w, b->s.N, b->s.in_dim, b->s.out_dim, 0);
}
static void run_backward_input(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    matmul_backward_input(b->dinp, b->dout, b->w, b->s.N, b->s.in_dim, b->s.out_dim, 0);
}
static void run_backward_weight(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    matmul_backward_weight(b->dw, b->dout, b->inp, b->s.N, b->s.in_dim, b->s.out_dim, 0, 0);
}
static void run_backward_weight_acc(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    matmul_backward_weight(b->dw, b->dout, b->inp, b->s.N, b->s.in_dim, b->s.out_dim, 1, 0);
}

static void check_shape(Shape s, int full, double ref_tflops)
{
    int64_t N = s.N, I = s.in_dim, O = s.out_dim;
    int64_t n_inp = N * I, n_w = O * I, n_dout = N * O;
    char what[160];
    printf("-- %s: N = %lld, in = %lld, out = %lld (%s)\n", s.name, (long long)N, (long long)I, (long long)O,
           full ? "every element" : "4096 random elements");
    uint16_t *inp_b = (uint16_t *)malloc_check(n_inp * 2, "inp"), *w_b = (uint16_t *)malloc_check(n_w * 2, "w");
    uint16_t *dout_b = (uint16_t *)malloc_check(n_dout * 2, "dout");
    float *inp = (float *)malloc_check(n_inp * 4, "inp f"), *w = (float *)malloc_check(n_w * 4, "w f");
    float *dout = (float *)malloc_check(n_dout * 4, "dout f");
    uint16_t *dw0_b = (uint16_t *)malloc_check(n_w * 2, "dw0");
    float *dw0 = (float *)malloc_check(n_w * 4, "dw0 f");
    fill_bf16(inp_b, inp, n_inp, 1.0f);
    fill_bf16(w_b, w, n_w, 0.05f);
    fill_bf16(dout_b, dout, n_dout, 1.0f);
    /* what accumulate = 1 adds to: the scale of the products (sums of N unit terms) */
    fill_bf16(dw0_b, dw0, n_w, sqrtf((float)N));

    int64_t biggest = n_inp > n_w ? n_inp : n_w;
    biggest = biggest > n_dout ? biggest : n_dout;
    int64_t n_checked = full ? biggest : SAMPLES;
    int64_t *idx = (int64_t *)malloc_check(n_checked * sizeof(int64_t), "indices");
    float *got = (float *)malloc_check(n_checked * 4, "got"), *ref = (float *)malloc_check(n_checked * 4, "ref");
    float *prod = (float *)malloc_check(n_checked * 4, "product"),
          *bound = (float *)malloc_check(n_checked * 4, "bound");
    uint16_t *host_b = (uint16_t *)malloc_check(biggest * 2, "download bf16");

    bf16 *d_inp = (bf16 *)dev_upload(inp_b, n_inp * 2), *d_w = (bf16 *)dev_upload(w_b, n_w * 2);
    bf16 *d_dout = (bf16 *)dev_upload(dout_b, n_dout * 2);
    bf16 *d_out = (bf16 *)dev_alloc(n_dout * 2), *d_dinp = (bf16 *)dev_alloc(n_inp * 2);
    bf16 *d_dw = (bf16 *)dev_alloc(n_w * 2);

    /* forward: out[n, o] = inp[n, :] . w[o, :] */
    poison(d_out, n_dout * 2);
    matmul_forward(d_out, d_inp, d_w, s.N, s.in_dim, s.out_dim, 0);
    download(host_b, d_out, n_dout * 2);
    int64_t m = pick(idx, n_dout, full);
    for (int64_t j = 0; j < m; j++) {
        int64_t n = idx[j] / O, o = idx[j] % O;
        got[j] = bf16_float(host_b[idx[j]]);
        ref[j] = dot(inp + n * I, 1, w + o * I, 1, (int)I);
    }
    snprintf(what, sizeof(what), "matmul_forward %s", s.name);
    check_close(what, got, ref, m, 1e-2, 1.0);

    /* forward with a bias (cuBLASLt's epilogue): out[n, o] = inp[n, :] . w[o, :] + bias[o], the same tolerance */
    uint16_t *bias_b = (uint16_t *)malloc_check(O * 2, "bias");
    float *bias = (float *)malloc_check(O * 4, "bias f");
    fill_bf16(bias_b, bias, O, 1.0f);
    bf16 *d_bias = (bf16 *)dev_upload(bias_b, O * 2);
    poison(d_out, n_dout * 2);
    matmul_forward_bias(d_out, d_inp, d_w, d_bias, s.N, s.in_dim, s.out_dim, 0);
    download(host_b, d_out, n_dout * 2);
    for (int64_t j = 0; j < m; j++) {
        got[j] = bf16_float(host_b[idx[j]]);
        ref[j] += bias[idx[j] % O];
    }
    snprintf(what, sizeof(what), "matmul_forward_bias %s", s.name);
    check_close(what, got, ref, m, 1e-2, 1.0);
    cuda_free(d_bias);
    free(bias_b);
    free(bias);

    /* backward input: dinp[n, i] = dout[n, :] . w[:, i] */
    poison(d_dinp, n_inp * 2);
    matmul_backward_input(d_dinp, d_dout, d_w, s.N, s.in_dim, s.out_dim, 0);
    download(host_b, d_dinp, n_inp * 2);
    m = pick(idx, n_inp, full);
    for (int64_t j = 0; j < m; j++) {
        int64_t n = idx[j] / I, i = idx[j] % I;
        got[j] = bf16_float(host_b[idx[j]]);
        ref[j] = dot(dout + n * O, 1, w + i, I, (int)O);
    }
    snprintf(what, sizeof(what), "matmul_backward_input %s", s.name);
    check_close(what, got, ref, m, 1e-2, 1.0);

    /* backward weight: dw[o, i] (= or +=) dout[:, o] . inp[:, i], bf16 */
    m = pick(idx, n_w, full);
    for (int64_t j = 0; j < m; j++) {
        int64_t o = idx[j] / I, i = idx[j] % I;
        prod[j] = dot(dout + o, O, inp + i, I, (int)N);
    }
    double fp32_err = 1e-3 * rms_of(prod, m);
    for (int acc = 0; acc < 2; acc++) {
        if (acc) {
            CUDA_CHECK(cudaMemcpy(d_dw, dw0_b, n_w * 2, cudaMemcpyHostToDevice));
        } else { /* garbage that an add instead of an overwrite would leave in the result */
            fill_bf16(host_b, NULL, n_w, 100.0f * sqrtf((float)N));
            CUDA_CHECK(cudaMemcpy(d_dw, host_b, n_w * 2, cudaMemcpyHostToDevice));
        }
        matmul_backward_weight(d_dw, d_dout, d_inp, s.N, s.in_dim, s.out_dim, acc, 0);
        download(host_b, d_dw, n_w * 2);
        for (int64_t j = 0; j < m; j++) {
            got[j] = bf16_float(host_b[idx[j]]);
            ref[j] = acc ? (float)((double)dw0[idx[j]] + prod[j]) : prod[j];
            bound[j] = (float)(BF16_ROUNDING * (fabs(ref[j]) + (acc ? fabs(prod[j]) : 0.0)) + fp32_err);
        }
        snprintf(what, sizeof(what), "matmul_backward_weight %s (%s)", s.name, acc ? "+=" : "=");
        check_within(what, got, ref, bound, m);
    }

    if (ref_tflops > 0.0) {
        Bench b = {s, d_inp, d_w, d_dout, d_out, d_dinp, d_dw};
        double flops = 2.0 * (double)N * I * O;
        bench_fn fns[4] = {run_forward, run_backward_input, run_backward_weight, run_backward_weight_acc};
        const char *names[4] = {"forward", "backward input", "backward weight (=)", "backward weight (+=)"};
        for (int k = 0; k < 4; k++) {
            float ms = bench_median_ms(fns[k], &b, 1);
            double tflops = flops / (ms * 1e-3) / 1e12;
            printf("BENCH %-40s %9.4f ms %7.1f TFLOP/s %5.1f%% of cuBLAS 8192^3\n", names[k], ms, tflops,
                   100.0 * tflops / ref_tflops);
        }
    }

    cuda_free(d_inp);
    cuda_free(d_w);
    cuda_free(d_dout);
    cuda_free(d_out);
    cuda_free(d_dinp);
    cuda_free(d_dw);
    free(inp_b);
    free(w_b);
    free(dout_b);
    free(inp);
    free(w);
    free(dout);
    free(dw0);
    void *host[] = {dw0_b, idx, got, ref, prod, bound, host_b};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
}

typedef struct {
    cublasHandle_t handle;
    bf16 *a, *b, *c;
    int n;
} CublasBench;

static void run_cublas(void *ctx, int set)
{
    CublasBench *c = (CublasBench *)ctx;
    const float alpha = 1.0f, beta = 0.0f;
    (void)set;
    CUBLAS_CHECK(cublasGemmEx(c->handle, CUBLAS_OP_T, CUBLAS_OP_N, c->n, c->n, c->n, &alpha, c->a, CUDA_R_16BF, c->n,
                              c->b, CUDA_R_16BF, c->n, &beta, c->c, CUDA_R_16BF, c->n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

/* The yardstick: what plain cuBLAS reaches on a large square bf16 GEMM on this GPU. */
static double bench_cublas_square(int n)
{
    CublasBench c;
    size_t bytes = (size_t)n * n * 2;
    CUBLAS_CHECK(cublasCreate(&c.handle));
    c.n = n;
    c.a = (bf16 *)dev_alloc(bytes);
    c.b = (bf16 *)dev_alloc(bytes);
    c.c = (bf16 *)dev_alloc(bytes);
    uint16_t *h = (uint16_t *)malloc_check(bytes, "square operand");
    fill_bf16(h, NULL, (int64_t)n * n, 1.0f);
    CUDA_CHECK(cudaMemcpy(c.a, h, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(c.b, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    float ms = bench_median_ms(run_cublas, &c, 1);
    double tflops = 2.0 * (double)n * n * n / (ms * 1e-3) / 1e12;
    printf("BENCH %-40s %9.4f ms %7.1f TFLOP/s (reference)\n", "cublasGemmEx bf16 8192^3", ms, tflops);
    cuda_free(c.a);
    cuda_free(c.b);
    cuda_free(c.c);
    CUBLAS_CHECK(cublasDestroy(c.handle));
    return tflops;
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "matmul_check");
    matmul_setup();
    /* --autotune: the algorithms the trainer's --gemm-autotune picks, checked and timed */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--autotune") == 0)
            matmul_set_autotune(1);
    Shape small[] = {{"odd 37x64->96", 37, 64, 96}, {"odd 129x200->56", 129, 200, 56}, {"odd 5x24->1000", 5, 24, 1000}};
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++)
        check_shape(small[i], 1, 0.0);

    double ref_tflops = bench_cublas_square(8192);
    /* Llama 3.2 1B: C = 2048, H*D = 2048, KV*D = 512, F = 8192; N = 8192 tokens */
    Shape llama[] = {{"qkv_proj", 8192, 2048, 3072},
                     {"o_proj", 8192, 2048, 2048},
                     {"gate_up_proj", 8192, 2048, 2 * 8192},
                     {"down_proj", 8192, 8192, 2048}};
    for (size_t i = 0; i < sizeof(llama) / sizeof(llama[0]); i++)
        check_shape(llama[i], 0, ref_tflops);
    matmul_teardown();
    return check_summary();
}
