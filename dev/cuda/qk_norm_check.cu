/*
 * qk_norm_check: llmc/kernels/qk_norm.h against a double-precision CPU reference on the
 * same bf16 inputs (train_llama_ref.c's qk_norm_forward / qk_norm_backward in double).
 *   forward: the normed q and k heads (4e-3 relative: half a bf16 ulp is at most 2^-8,
 *     floor at 1% of the rms), raw bit-identical to the heads before, rstd 1e-5 relative
 *     (fp32 sums of D squares), the v part of every row untouched;
 *   backward: the raw heads' gradient (4e-3, floor 1% of the rms: the mean term can
 *     cancel), the v part untouched, the stacked weight gradient [2 D] (4e-3 relative, floor
 *     1% of the rms: fp32 sums of N x heads terms, then bf16), the same bits on a second
 *     run (a fixed summation order), and with accumulate twice the first within a bf16
 *     rounding.
 * Sizes: Qwen3's heads (D = 128, 16 query and 8 key heads), the test dump's D = 24 (lanes
 * partly idle), D = 256 (the most a warp takes), odd N; timed at N = 8192.
 *
 * Usage: qk_norm_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/qk_norm.h"

#define EPS 1e-6f

typedef struct {
    int N, H, KV, D;
    bf16 *qkv, *raw, *dqkv, *dw, *w;
    float *rstd, *scratch;
} Bench;

static void run_forward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    qk_norm_forward(b->qkv, b->raw, b->rstd, b->w, b->w + b->D, b->N, b->H, b->KV, b->D, EPS, 0);
}
static void run_backward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    qk_norm_backward(b->dqkv, b->dw, b->scratch, b->raw, b->rstd, b->w, b->w + b->D, b->N, b->H, b->KV, b->D, 0, 0);
}

static void check_size(int N, int H, int KV, int D, int bench)
{
    int heads = H + KV, row = (H + 2 * KV) * D;
    int64_t n = (int64_t)N * row, nh = (int64_t)N * heads;
    char what[160];
    printf("-- N = %d, H = %d, KV = %d, D = %d\n", N, H, KV, D);
    uint16_t *x_b = (uint16_t *)malloc_check(n * 2, "qkv"), *dy_b = (uint16_t *)malloc_check(n * 2, "dqkv");
    uint16_t *w_b = (uint16_t *)malloc_check(2 * D * 2, "w"), *got_b = (uint16_t *)malloc_check(n * 2, "got");
    uint16_t *raw_b = (uint16_t *)malloc_check(nh * D * 2, "raw"), *dw_b = (uint16_t *)malloc_check(2 * D * 2, "dw");
    uint16_t *dw2_b = (uint16_t *)malloc_check(2 * D * 2, "dw 2"), *acc_b = (uint16_t *)malloc_check(2 * D * 2, "acc");
    float *x = (float *)malloc_check(n * 4, "x"), *dy = (float *)malloc_check(n * 4, "dy");
    float *w = (float *)malloc_check(2 * D * 4, "w f"), *got = (float *)malloc_check(n * 4, "got f");
    float *ref_y = (float *)malloc_check(nh * D * 4, "ref y"), *ref_dx = (float *)malloc_check(nh * D * 4, "ref dx");
    float *ref_r = (float *)malloc_check(nh * 4, "ref rstd"), *got_r = (float *)malloc_check(nh * 4, "got rstd");
    float *ref_dw = (float *)malloc_check(2 * D * 4, "ref dw"), *heads_got = (float *)malloc_check(nh * D * 4, "h");
    double *dw_sum = (double *)calloc_check(2 * (size_t)D, sizeof(double), "dw sum");
    fill_bf16(x_b, x, n, 2.0f);
    fill_bf16(dy_b, dy, n, 1.0f);
    for (int c = 0; c < 2 * D; c++) {
        w_b[c] = bf16_bits(1.0f + 0.2f * rng_normal());
        w[c] = bf16_float(w_b[c]);
    }
    /* the reference, per head, in double */
    for (int64_t t = 0; t < N; t++) {
        for (int h = 0; h < heads; h++) {
            const float *xh = x + t * row + (int64_t)h * D, *d = dy + t * row + (int64_t)h * D;
            const float *wh = w + (h < H ? 0 : D);
            int64_t at = (t * heads + h) * D;
            double ss = 0.0, gx = 0.0;
            for (int c = 0; c < D; c++)
                ss += (double)xh[c] * xh[c];
            double r = 1.0 / sqrt(ss / D + EPS);
            ref_r[t * heads + h] = (float)r;
            for (int c = 0; c < D; c++) {
                ref_y[at + c] = (float)(wh[c] * xh[c] * r);
                gx += wh[c] * d[c] * xh[c] * r;
                dw_sum[(h < H ? 0 : D) + c] += d[c] * xh[c] * r;
            }
            gx /= D;
            for (int c = 0; c < D; c++)
                ref_dx[at + c] = (float)(r * (wh[c] * d[c] - xh[c] * r * gx));
        }
    }
    for (int c = 0; c < 2 * D; c++)
        ref_dw[c] = (float)dw_sum[c];

    bf16 *d_qkv = (bf16 *)dev_upload(x_b, n * 2), *d_dqkv = (bf16 *)dev_upload(dy_b, n * 2);
    bf16 *d_w = (bf16 *)dev_upload(w_b, 2 * D * 2), *d_raw = (bf16 *)dev_alloc(nh * D * 2);
    bf16 *d_dw = (bf16 *)dev_alloc(2 * D * 2);
    float *d_rstd = (float *)dev_alloc(nh * 4),
          *d_scratch = (float *)dev_alloc(qk_norm_backward_scratch_floats(N, D) * 4);

    qk_norm_forward(d_qkv, d_raw, d_rstd, d_w, d_w + D, N, H, KV, D, EPS, 0);
    download(got_b, d_qkv, n * 2);
    download(raw_b, d_raw, nh * D * 2);
    download(got_r, d_rstd, nh * 4);
    int v_same = 1, raw_same = 1;
    for (int64_t t = 0; t < N; t++) {
        v_same &=
            memcmp(got_b + t * row + (int64_t)heads * D, x_b + t * row + (int64_t)heads * D, (size_t)KV * D * 2) == 0;
        raw_same &= memcmp(raw_b + t * heads * D, x_b + t * row, (size_t)heads * D * 2) == 0;
        for (int64_t i = 0; i < (int64_t)heads * D; i++)
            heads_got[t * heads * D + i] = bf16_float(got_b[t * row + i]);
    }
    snprintf(what, sizeof(what), "qk_norm_forward N=%d H=%d KV=%d D=%d", N, H, KV, D);
    check_close(what, heads_got, ref_y, nh * D, 4e-3, 1e-2);
    check_close("  its rstd", got_r, ref_r, nh, 1e-5, 1e-2);
    check(v_same && raw_same, "%-46s v untouched, raw = the heads before, bit for bit", what);

    qk_norm_backward(d_dqkv, d_dw, d_scratch, d_raw, d_rstd, d_w, d_w + D, N, H, KV, D, 0, 0);
    download(got_b, d_dqkv, n * 2);
    download(dw_b, d_dw, 2 * D * 2);
    v_same = 1;
    for (int64_t t = 0; t < N; t++) {
        v_same &=
            memcmp(got_b + t * row + (int64_t)heads * D, dy_b + t * row + (int64_t)heads * D, (size_t)KV * D * 2) == 0;
        for (int64_t i = 0; i < (int64_t)heads * D; i++)
            heads_got[t * heads * D + i] = bf16_float(got_b[t * row + i]);
    }
    snprintf(what, sizeof(what), "qk_norm_backward N=%d H=%d KV=%d D=%d", N, H, KV, D);
    check_close(what, heads_got, ref_dx, nh * D, 4e-3, 1e-2);
    check(v_same, "%-46s v's gradient untouched", what);
    bf16_to_float(got, dw_b, 2 * D);
    check_close("  its dw (q_norm's, k_norm's)", got, ref_dw, 2 * D, 4e-3, 1e-2);
    /* again on the same gradient, then accumulating */
    CUDA_CHECK(cudaMemcpy(d_dqkv, dy_b, n * 2, cudaMemcpyHostToDevice));
    qk_norm_backward(d_dqkv, d_dw, d_scratch, d_raw, d_rstd, d_w, d_w + D, N, H, KV, D, 0, 0);
    download(dw2_b, d_dw, 2 * D * 2);
    check_identical("  its dw on a second run", dw2_b, dw_b, 2 * D * 2);
    CUDA_CHECK(cudaMemcpy(d_dqkv, dy_b, n * 2, cudaMemcpyHostToDevice));
    qk_norm_backward(d_dqkv, d_dw, d_scratch, d_raw, d_rstd, d_w, d_w + D, N, H, KV, D, 1, 0);
    download(acc_b, d_dw, 2 * D * 2);
    int ok = 1;
    for (int c = 0; c < 2 * D; c++)
        ok &= fabsf(bf16_float(acc_b[c]) - 2.0f * bf16_float(dw_b[c])) <=
              BF16_ROUNDING * 2.0f * fabsf(bf16_float(dw_b[c]));
    check(ok, "%-46s = 2 x dw within a bf16 rounding", "  its dw accumulated");

    if (bench) {
        Bench b = {N, H, KV, D, d_qkv, d_raw, d_dqkv, d_dw, d_w, d_rstd, d_scratch};
        snprintf(what, sizeof(what), "qk_norm_forward N=%d H=%d KV=%d D=%d", N, H, KV, D);
        bench_report(what, run_forward, &b, 1, 3.0 * nh * D * 2);
        snprintf(what, sizeof(what), "qk_norm_backward N=%d H=%d KV=%d D=%d", N, H, KV, D);
        bench_report(what, run_backward, &b, 1, 3.0 * nh * D * 2);
    }

    void *dev[] = {d_qkv, d_dqkv, d_w, d_raw, d_dw, d_rstd, d_scratch};
    void *host[] = {x_b, dy_b, w_b,   got_b,  raw_b, dw_b,  dw2_b,  acc_b,     x,     dy,
                    w,   got,  ref_y, ref_dx, ref_r, got_r, ref_dw, heads_got, dw_sum};
    FREE_BUFFERS(dev, host);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "qk_norm_check");
    bench_copy_bandwidth();
    int sizes[][5] = {
        /* N, H, KV, D, bench */
        {37, 4, 2, 24, 0},
        {5, 2, 1, 256, 0},
        {100, 16, 8, 128, 0},
        {8192, 16, 8, 128, 1},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_size(sizes[i][0], sizes[i][1], sizes[i][2], sizes[i][3], sizes[i][4]);
    return check_summary();
}
