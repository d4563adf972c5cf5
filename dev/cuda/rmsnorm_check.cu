/*
 * rmsnorm_check: llmc/kernels/rmsnorm.h against a double-precision CPU reference of the
 * same math, on bf16 inputs both sides read identically; backward's bf16 dweight
 * both overwritten (accumulate = 0, over random garbage) and added to (accumulate
 * = 1, onto random bf16 values); determinism of backward; the backward that also
 * writes the forward's output again (rmsnorm_backward_recompute, recompute levels 1
 * and 2), whose outputs must equal the plain backward's and the forward's to the bit;
 * timing at Llama 3 sizes (N = 8192 tokens, C = 2048 / 4096), the recomputing
 * backward beside the forward + backward it replaces.
 *
 * Tolerances:
 *   bf16 outputs (out, residual_out, dinp): 4e-3 relative. Rounding to bf16 errs by
 *     at most half an ulp, 2^-8 = 3.9e-3 relative just above a power of two; fp32 vs
 *     double adds ~1e-6. residual_out is rounded identically on both sides, so it
 *     matches to the bit in practice; it is held to the same bound.
 *   dweight (bf16): 4e-3 relative. The kernel sums in fp32 (up to 8192 terms, ~1e-6,
 *     which the fp32 dweight of before met at 1e-5), adds the old bf16 value in fp32
 *     when accumulating, and rounds once to bf16: 2^-8 + 1e-5 < 4e-3 in both modes.
 *   rstd (fp32): 1e-5 relative.
 * The relative error's floor is 1% of the rms of the reference (dinp sums values of
 * either sign), 10% for dweight.
 *
 * Usage: rmsnorm_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/rmsnorm.h"

#define EPS 1e-5f

/* x: the input rows (bf16 values), with branch != NULL: x = bf16(inp + branch). */
static void ref_forward(float *out, float *rstd, float *residual_out, const float *inp, const float *branch,
                        const float *w, int N, int C)
{
    float *x = (float *)malloc_check((size_t)C * sizeof(float), "reference row");
    for (int n = 0; n < N; n++) {
        const float *row = inp + (int64_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) {
            x[c] = branch ? bf16_round(row[c] + branch[(int64_t)n * C + c]) : row[c];
            if (residual_out)
                residual_out[(int64_t)n * C + c] = x[c];
            ss += (double)x[c] * x[c];
        }
        double r = 1.0 / sqrt(ss / C + (double)EPS);
        rstd[n] = (float)r;
        for (int c = 0; c < C; c++)
            out[(int64_t)n * C + c] = (float)(x[c] * r * w[c]);
    }
    free(x);
}

/* dinp is accumulated into, as the kernel does; dw[c] = sum_n dout * xhat (double). */
static void ref_backward(float *dinp, double *dw, const float *dout, const float *inp, const float *w,
                         const float *rstd, int N, int C)
{
    for (int c = 0; c < C; c++)
        dw[c] = 0.0;
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C, *x = inp + (int64_t)n * C;
        double rs = rstd[n], dot = 0.0;
        for (int c = 0; c < C; c++)
            dot += (double)w[c] * d[c] * (x[c] * rs);
        double mean = dot / C;
        for (int c = 0; c < C; c++) {
            double xhat = x[c] * rs;
            dinp[(int64_t)n * C + c] = (float)(dinp[(int64_t)n * C + c] + rs * (w[c] * (double)d[c] - xhat * mean));
            dw[c] += d[c] * xhat;
        }
    }
}

typedef struct {
    int N, C;
    bf16 **inp, **branch, **residual, **out, **dout, **dinp;
    float **rstd;
    bf16 *weight, *dweight;
    float *scratch;
} Bench;

static void run_forward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    rmsnorm_forward(b->out[s], b->rstd[s], b->inp[s], b->weight, b->N, b->C, EPS, 0);
}
static void run_fused(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    fused_residual_rmsnorm_forward(b->residual[s], b->out[s], b->rstd[s], b->inp[s], b->branch[s], b->weight, b->N,
                                   b->C, EPS, 0);
}
static void run_backward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    rmsnorm_backward(b->dinp[s], b->dweight, b->scratch, b->dout[s], b->inp[s], b->weight, b->rstd[s], b->N, b->C, 1,
                     0);
}
static void run_forward_then_backward(void *ctx, int s)
{
    run_forward(ctx, s);
    run_backward(ctx, s);
}
static void run_backward_recompute(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    rmsnorm_backward_recompute(b->dinp[s], b->dweight, b->scratch, b->out[s], b->dout[s], b->inp[s], b->weight,
                               b->rstd[s], b->N, b->C, 1, NULL, NULL, 0);
}

static void check_size(int N, int C, int bench)
{
    int64_t NC = (int64_t)N * C;
    size_t bf = (size_t)NC * sizeof(uint16_t);
    char what[128];
    printf("-- N = %d, C = %d\n", N, C);

    uint16_t *inp_b = (uint16_t *)malloc_check(bf, "inp"), *branch_b = (uint16_t *)malloc_check(bf, "branch");
    uint16_t *w_b = (uint16_t *)malloc_check((size_t)C * 2, "w"), *dout_b = (uint16_t *)malloc_check(bf, "dout");
    uint16_t *dinp_b = (uint16_t *)malloc_check(bf, "dinp"), *got_b = (uint16_t *)malloc_check(bf, "got");
    float *inp = (float *)malloc_check(NC * 4, "inp f"), *branch = (float *)malloc_check(NC * 4, "branch f");
    float *w = (float *)malloc_check((size_t)C * 4, "w f"), *dout = (float *)malloc_check(NC * 4, "dout f");
    float *ref_out = (float *)malloc_check(NC * 4, "ref out"), *ref_res = (float *)malloc_check(NC * 4, "ref res");
    float *ref_rstd = (float *)malloc_check((size_t)N * 4, "ref rstd"), *got = (float *)malloc_check(NC * 4, "got");
    float *got_rstd = (float *)malloc_check((size_t)N * 4, "got rstd");
    float *ref_dinp = (float *)malloc_check(NC * 4, "ref dinp");
    double *dw_sum = (double *)malloc_check((size_t)C * 8, "ref dw sum");
    uint16_t *dw0_b = (uint16_t *)malloc_check((size_t)C * 2, "dweight0"),
             *junk_b = (uint16_t *)malloc_check((size_t)C * 2, "junk");
    uint16_t *got_dw_b = (uint16_t *)malloc_check((size_t)C * 2, "got dw"),
             *got_dw_b2 = (uint16_t *)malloc_check((size_t)C * 2, "got dw2");
    float *dw0 = (float *)malloc_check((size_t)C * 4, "dweight0 f"),
          *ref_dw = (float *)malloc_check((size_t)C * 4, "ref dw");
    float *got_dw = (float *)malloc_check((size_t)C * 4, "got dw f");
    uint16_t *got_b2 = (uint16_t *)malloc_check(bf, "got2");

    /* rows of very different scale, so that rstd varies over three decades */
    for (int n = 0; n < N; n++) {
        float scale = expf(rng_range(-3.0f, 3.0f));
        fill_bf16(inp_b + (int64_t)n * C, inp + (int64_t)n * C, C, scale);
        fill_bf16(branch_b + (int64_t)n * C, branch + (int64_t)n * C, C, 0.5f * scale);
    }
    for (int c = 0; c < C; c++) {
        w_b[c] = bf16_bits(1.0f + 0.2f * rng_normal());
        w[c] = bf16_float(w_b[c]);
    }
    fill_bf16(dout_b, dout, NC, 1.0f);
    fill_bf16(dinp_b, ref_dinp, NC, 1.0f);
    /* dweight to accumulate onto, at the scale of the sums (N terms of size ~1: ~sqrt(N)) */
    fill_bf16(dw0_b, dw0, C, sqrtf((float)N));

    bf16 *d_inp = (bf16 *)dev_upload(inp_b, bf), *d_branch = (bf16 *)dev_upload(branch_b, bf);
    bf16 *d_w = (bf16 *)dev_upload(w_b, (size_t)C * 2), *d_dout = (bf16 *)dev_upload(dout_b, bf);
    bf16 *d_out = (bf16 *)dev_alloc(bf), *d_res = (bf16 *)dev_alloc(bf), *d_dinp = (bf16 *)dev_alloc(bf);
    float *d_rstd = (float *)dev_alloc((size_t)N * 4), *d_amax = (float *)dev_alloc(4);
    bf16 *d_dw = (bf16 *)dev_alloc((size_t)C * 2);
    float *d_scratch = (float *)dev_alloc(rmsnorm_backward_scratch_floats(N, C) * 4);

    /* plain forward */
    ref_forward(ref_out, ref_rstd, NULL, inp, NULL, w, N, C);
    poison(d_out, bf);
    poison(d_rstd, (size_t)N * 4);
    poison_amax(d_amax);
    rmsnorm_forward_amax(d_out, d_rstd, d_inp, d_w, N, C, EPS, d_amax, 0);
    download(got_b, d_out, bf);
    download(got_rstd, d_rstd, (size_t)N * 4);
    bf16_to_float(got, got_b, NC);
    snprintf(what, sizeof(what), "rmsnorm_forward out N=%d C=%d", N, C);
    check_close(what, got, ref_out, NC, 4e-3, 1e-2);
    check_amax(what, d_amax, got_b, NC);
    snprintf(what, sizeof(what), "rmsnorm_forward rstd N=%d C=%d", N, C);
    check_close(what, got_rstd, ref_rstd, N, 1e-5, 0.0);

    /* fused residual forward */
    ref_forward(ref_out, ref_rstd, ref_res, inp, branch, w, N, C);
    poison(d_out, bf);
    poison(d_res, bf);
    poison(d_rstd, (size_t)N * 4);
    poison_amax(d_amax);
    fused_residual_rmsnorm_forward_amax(d_res, d_out, d_rstd, d_inp, d_branch, d_w, N, C, EPS, d_amax, 0);
    download(got_b, d_res, bf);
    bf16_to_float(got, got_b, NC);
    snprintf(what, sizeof(what), "fused_residual residual_out N=%d C=%d", N, C);
    check_close(what, got, ref_res, NC, 4e-3, 1e-2);
    download(got_b, d_out, bf);
    download(got_rstd, d_rstd, (size_t)N * 4);
    bf16_to_float(got, got_b, NC);
    snprintf(what, sizeof(what), "fused_residual out N=%d C=%d", N, C);
    check_close(what, got, ref_out, NC, 4e-3, 1e-2);
    check_amax(what, d_amax, got_b, NC);
    snprintf(what, sizeof(what), "fused_residual rstd N=%d C=%d", N, C);
    check_close(what, got_rstd, ref_rstd, N, 1e-5, 0.0);

    /* backward, from the plain forward's input and the reference's rstd, fed to both sides */
    ref_forward(ref_out, ref_rstd, NULL, inp, NULL, w, N, C);
    CUDA_CHECK(cudaMemcpy(d_rstd, ref_rstd, (size_t)N * 4, cudaMemcpyHostToDevice));
    ref_backward(ref_dinp, dw_sum, dout, inp, w, ref_rstd, N, C);
    /* accumulate = 0, twice, over different random garbage in dweight: overwritten, and
     * the same bits both times */
    for (int rep = 0; rep < 2; rep++) {
        CUDA_CHECK(cudaMemcpy(d_dinp, dinp_b, bf, cudaMemcpyHostToDevice));
        fill_bf16(junk_b, NULL, C, 100.0f * sqrtf((float)N)); /* 100x the sums */
        CUDA_CHECK(cudaMemcpy(d_dw, junk_b, (size_t)C * 2, cudaMemcpyHostToDevice));
        poison(d_scratch, rmsnorm_backward_scratch_floats(N, C) * 4);
        poison_amax(d_amax);
        rmsnorm_backward_amax(d_dinp, d_dw, d_scratch, d_dout, d_inp, d_w, d_rstd, N, C, 0, d_amax, 0);
        download(rep ? got_b2 : got_b, d_dinp, bf);
        download(rep ? got_dw_b2 : got_dw_b, d_dw, (size_t)C * 2);
    }
    bf16_to_float(got, got_b, NC);
    snprintf(what, sizeof(what), "rmsnorm_backward dinp N=%d C=%d", N, C);
    check_close(what, got, ref_dinp, NC, 4e-3, 1e-2);
    check_amax(what, d_amax, got_b2, NC); /* the second run's */
    for (int c = 0; c < C; c++)
        ref_dw[c] = (float)dw_sum[c];
    bf16_to_float(got_dw, got_dw_b, C);
    snprintf(what, sizeof(what), "rmsnorm_backward dweight (=) N=%d C=%d", N, C);
    check_close(what, got_dw, ref_dw, C, 4e-3, 1e-1);
    snprintf(what, sizeof(what), "rmsnorm_backward determinism N=%d C=%d", N, C);
    check(memcmp(got_b, got_b2, bf) == 0 && memcmp(got_dw_b, got_dw_b2, (size_t)C * 2) == 0,
          "%-46s dinp and dweight bit-identical over two runs", what);

    /* accumulate = 1: added onto random bf16 values of the sums' scale */
    CUDA_CHECK(cudaMemcpy(d_dinp, dinp_b, bf, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dw, dw0_b, (size_t)C * 2, cudaMemcpyHostToDevice));
    poison(d_scratch, rmsnorm_backward_scratch_floats(N, C) * 4);
    rmsnorm_backward(d_dinp, d_dw, d_scratch, d_dout, d_inp, d_w, d_rstd, N, C, 1, 0);
    download(got_dw_b, d_dw, (size_t)C * 2);
    download(got_b2, d_dinp, bf);
    for (int c = 0; c < C; c++)
        ref_dw[c] = (float)((double)dw0[c] + dw_sum[c]);
    bf16_to_float(got_dw, got_dw_b, C);
    snprintf(what, sizeof(what), "rmsnorm_backward dweight (+=) N=%d C=%d", N, C);
    check_close(what, got_dw, ref_dw, C, 4e-3, 1e-1);
    snprintf(what, sizeof(what), "rmsnorm_backward dinp (accumulate=1) N=%d C=%d", N, C);
    check_identical(what, got_b2, got_b, bf);

    /* the recomputing backward, with the GPU forward's own rstd: dinp and dweight as rmsnorm_backward's, out as
     * rmsnorm_forward's, to the bit, and both amaxes */
    uint16_t *rec_b = (uint16_t *)malloc_check(bf, "recompute out");
    float *d_out_amax = (float *)dev_alloc(4);
    rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C, EPS, 0);
    download(got_b, d_out, bf);
    CUDA_CHECK(cudaMemcpy(d_dinp, dinp_b, bf, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dw, dw0_b, (size_t)C * 2, cudaMemcpyHostToDevice));
    rmsnorm_backward(d_dinp, d_dw, d_scratch, d_dout, d_inp, d_w, d_rstd, N, C, 1, 0);
    download(got_b2, d_dinp, bf);
    download(got_dw_b, d_dw, (size_t)C * 2);
    CUDA_CHECK(cudaMemcpy(d_dinp, dinp_b, bf, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dw, dw0_b, (size_t)C * 2, cudaMemcpyHostToDevice));
    poison(d_out, bf);
    poison_amax(d_amax);
    poison_amax(d_out_amax);
    rmsnorm_backward_recompute(d_dinp, d_dw, d_scratch, d_out, d_dout, d_inp, d_w, d_rstd, N, C, 1, d_amax, d_out_amax,
                               0);
    snprintf(what, sizeof(what), "rmsnorm_backward_recompute dinp N=%d C=%d", N, C);
    download(rec_b, d_dinp, bf);
    check_identical(what, rec_b, got_b2, bf);
    check_amax(what, d_amax, rec_b, NC);
    snprintf(what, sizeof(what), "rmsnorm_backward_recompute dweight N=%d C=%d", N, C);
    download(got_dw_b2, d_dw, (size_t)C * 2);
    check_identical(what, got_dw_b2, got_dw_b, (size_t)C * 2);
    snprintf(what, sizeof(what), "rmsnorm_backward_recompute out N=%d C=%d", N, C);
    download(rec_b, d_out, bf);
    check_identical(what, rec_b, got_b, bf);
    check_amax(what, d_out_amax, rec_b, NC);

    if (bench) {
        Bench b;
        b.N = N;
        b.C = C;
        int sets = bench_sets(6 * bf);
        bf16 ***lists[6] = {&b.inp, &b.branch, &b.residual, &b.out, &b.dout, &b.dinp};
        for (int l = 0; l < 6; l++)
            *lists[l] = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        b.rstd = (float **)malloc_check(sets * sizeof(float *), "bench sets");
        for (int s = 0; s < sets; s++) {
            b.inp[s] = (bf16 *)dev_clone(d_inp, bf);
            b.branch[s] = (bf16 *)dev_clone(d_branch, bf);
            b.dout[s] = (bf16 *)dev_clone(d_dout, bf);
            b.dinp[s] = (bf16 *)dev_clone(d_dinp, bf);
            b.residual[s] = (bf16 *)dev_alloc(bf);
            b.out[s] = (bf16 *)dev_alloc(bf);
            b.rstd[s] = (float *)dev_clone(d_rstd, (size_t)N * 4);
        }
        b.weight = d_w;
        b.dweight = d_dw;
        b.scratch = d_scratch;
        double scratch_bytes = 2.0 * rmsnorm_backward_scratch_floats(N, C) * 4;
        snprintf(what, sizeof(what), "rmsnorm_forward N=%d C=%d", N, C);
        bench_report(what, run_forward, &b, sets, 2.0 * bf + N * 4.0);
        snprintf(what, sizeof(what), "fused_residual_rmsnorm N=%d C=%d", N, C);
        bench_report(what, run_fused, &b, sets, 4.0 * bf + N * 4.0);
        snprintf(what, sizeof(what), "rmsnorm_backward N=%d C=%d", N, C);
        bench_report(what, run_backward, &b, sets, 4.0 * bf + N * 4.0 + scratch_bytes);
        snprintf(what, sizeof(what), "rmsnorm_forward + backward N=%d C=%d", N, C);
        bench_report(what, run_forward_then_backward, &b, sets, 6.0 * bf + 2.0 * N * 4.0 + scratch_bytes);
        snprintf(what, sizeof(what), "rmsnorm_backward_recompute N=%d C=%d", N, C);
        bench_report(what, run_backward_recompute, &b, sets, 5.0 * bf + N * 4.0 + scratch_bytes);
        for (int s = 0; s < sets; s++) {
            bf16 *bufs[6] = {b.inp[s], b.branch[s], b.dout[s], b.dinp[s], b.residual[s], b.out[s]};
            for (int l = 0; l < 6; l++)
                cuda_free(bufs[l]);
            cuda_free(b.rstd[s]);
        }
        for (int l = 0; l < 6; l++)
            free(*lists[l]);
        free(b.rstd);
    }

    void *dev[] = {d_inp, d_branch, d_w, d_dout, d_out, d_res, d_dinp, d_rstd, d_dw, d_scratch, d_amax, d_out_amax};
    void *host[] = {inp_b, branch_b, w_b,      dout_b,    dinp_b,   got_b,  got_b2,   inp,      branch,
                    w,     dout,     ref_out,  ref_res,   ref_rstd, got,    got_rstd, ref_dinp, dw_sum,
                    dw0_b, junk_b,   got_dw_b, got_dw_b2, dw0,      ref_dw, got_dw,   rec_b};
    FREE_BUFFERS(dev, host);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "rmsnorm_check");
    bench_copy_bandwidth();
    int sizes[][3] = {
        /* N, C, bench */
        {37, 64, 0},     {37, 96, 0},     {5, 8, 0},       {17, 8192, 0},
        {8192, 2048, 1}, {8192, 3072, 0}, {8192, 4096, 1}, {32768, 4096, 1},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_size(sizes[i][0], sizes[i][1], sizes[i][2]);
    return check_summary();
}
