/*
 * bias_check: llmc/kernels/bias.h against the CPU on the same bf16 inputs.
 *   forward: bit-identical to bf16(out + bias) rounded to nearest even on the host (one
 *     fp32 add of two bf16 values is exact, so only the final rounding is left);
 *   backward: the column sums against a double sum: 1e-5 relative to the column's sum
 *     of |dout| (fp32 sums of up to 16K bf16 values, then the bf16 rounding of the result:
 *     compared before that rounding is impossible, so the tolerance is half a bf16 ulp,
 *     4e-3, of max(|sum|, 1% of the sums' rms));
 *   the same bits on a second run (a fixed summation order), and with accumulate the
 *   bf16 sum of the old value and the new, as the GPU model's micro-steps add them.
 * Sizes: Qwen2.5-1.5B's stacked q, k, v (OC = (12 + 2 x 2) x 128 = 2048) at N = 16384 and
 * odd N and OC (a last partial block of rows, columns that leave threads idle); timed at
 * the big size.
 *
 * Usage: bias_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/bias.h"

typedef struct {
    int N, OC;
    bf16 *out, *bias, *dout, *dbias;
    float *scratch;
} Bench;

static void run_forward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    bias_forward(b->out, b->bias, b->N, b->OC, 0);
}
static void run_backward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    bias_backward(b->dbias, b->scratch, b->dout, b->N, b->OC, 0, 0);
}

static void check_size(int N, int OC, int bench)
{
    int64_t n = (int64_t)N * OC;
    char what[128];
    printf("-- N = %d, OC = %d\n", N, OC);
    uint16_t *out_b = (uint16_t *)malloc_check(n * 2, "out"), *bias_b = (uint16_t *)malloc_check(OC * 2, "bias");
    uint16_t *dout_b = (uint16_t *)malloc_check(n * 2, "dout"), *got_b = (uint16_t *)malloc_check(n * 2, "got");
    uint16_t *want_b = (uint16_t *)malloc_check(n * 2, "want"), *db_b = (uint16_t *)malloc_check(OC * 2, "dbias");
    uint16_t *db2_b = (uint16_t *)malloc_check(OC * 2, "dbias 2"), *acc_b = (uint16_t *)malloc_check(OC * 2, "acc");
    float *out = (float *)malloc_check(n * 4, "out f"), *bias = (float *)malloc_check(OC * 4, "bias f");
    float *dout = (float *)malloc_check(n * 4, "dout f"), *got = (float *)malloc_check(OC * 4, "got f");
    float *ref = (float *)malloc_check(OC * 4, "ref"), *bound = (float *)malloc_check(OC * 4, "bound");
    fill_bf16(out_b, out, n, 1.0f);
    fill_bf16(bias_b, bias, OC, 0.5f);
    fill_bf16(dout_b, dout, n, 1.0f);

    bf16 *d_out = (bf16 *)dev_upload(out_b, n * 2), *d_bias = (bf16 *)dev_upload(bias_b, OC * 2);
    bf16 *d_dout = (bf16 *)dev_upload(dout_b, n * 2), *d_db = (bf16 *)dev_alloc(OC * 2);
    float *d_scratch = (float *)dev_alloc(bias_backward_scratch_floats(N, OC) * 4);

    bias_forward(d_out, d_bias, N, OC, 0);
    download(got_b, d_out, n * 2);
    for (int64_t i = 0; i < n; i++)
        want_b[i] = bf16_bits(out[i] + bias[i % OC]);
    snprintf(what, sizeof(what), "bias_forward N=%d OC=%d", N, OC);
    check_identical(what, got_b, want_b, n * 2);

    /* the column sums in double; the bound: half a bf16 ulp of the sum's scale, and 1e-5 of the sum of |dout| */
    double rms = 0.0;
    for (int c = 0; c < OC; c++) {
        double sum = 0.0, mag = 0.0;
        for (int64_t r = 0; r < N; r++) {
            sum += dout[r * OC + c];
            mag += fabs(dout[r * OC + c]);
        }
        ref[c] = (float)sum;
        bound[c] = (float)(1e-5 * mag);
        rms += sum * sum;
    }
    rms = sqrt(rms / OC);
    for (int c = 0; c < OC; c++)
        bound[c] += (float)(BF16_ROUNDING * fmax(fabs(ref[c]), 0.01 * rms));
    poison(d_db, OC * 2);
    bias_backward(d_db, d_scratch, d_dout, N, OC, 0, 0);
    download(db_b, d_db, OC * 2);
    bf16_to_float(got, db_b, OC);
    snprintf(what, sizeof(what), "bias_backward N=%d OC=%d", N, OC);
    check_within(what, got, ref, bound, OC);
    bias_backward(d_db, d_scratch, d_dout, N, OC, 0, 0);
    download(db2_b, d_db, OC * 2);
    snprintf(what, sizeof(what), "bias_backward N=%d OC=%d again", N, OC);
    check_identical(what, db2_b, db_b, OC * 2);
    /* accumulate: the old value (this sum) plus the new (the same sum again), rounded once */
    bias_backward(d_db, d_scratch, d_dout, N, OC, 1, 0);
    download(acc_b, d_db, OC * 2);
    for (int c = 0; c < OC; c++)
        got[c] = bf16_float(acc_b[c]) - 2.0f * bf16_float(db_b[c]);
    int ok = 1;
    for (int c = 0; c < OC; c++)
        ok &= fabsf(got[c]) <= BF16_ROUNDING * 2.0f * fabsf(bf16_float(db_b[c]));
    snprintf(what, sizeof(what), "bias_backward accumulate N=%d OC=%d", N, OC);
    check(ok, "%-46s = 2 x the sum within a bf16 rounding", what);

    if (bench) {
        Bench b = {N, OC, d_out, d_bias, d_dout, d_db, d_scratch};
        snprintf(what, sizeof(what), "bias_forward N=%d OC=%d", N, OC);
        bench_report(what, run_forward, &b, 1, 4.0 * n);
        snprintf(what, sizeof(what), "bias_backward N=%d OC=%d", N, OC);
        bench_report(what, run_backward, &b, 1, 2.0 * n);
    }

    void *dev[] = {d_out, d_bias, d_dout, d_db, d_scratch};
    void *host[] = {out_b, bias_b, dout_b, got_b, want_b, db_b, db2_b, acc_b, out, bias, dout, got, ref, bound};
    FREE_BUFFERS(dev, host);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "bias_check");
    bench_copy_bandwidth();
    int sizes[][3] = {
        /* N, OC, bench */
        {1, 8, 0}, {37, 96, 0}, {65, 2056, 0}, {1000, 384, 0}, {16384, 2048, 1},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_size(sizes[i][0], sizes[i][1], sizes[i][2]);
    return check_summary();
}
