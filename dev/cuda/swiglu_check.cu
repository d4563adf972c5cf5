/*
 * swiglu_check: llmc/kernels/swiglu.h against a double-precision CPU reference on the same
 * bf16 inputs; backward both out of place and in place (dgate_up == gate_up), which
 * must agree to the bit; the backward that also writes the forward's output again
 * (swiglu_backward_recompute, recompute levels 1 and 2), whose two outputs must
 * equal the forward's and the plain backward's to the bit, in place too; timing
 * at Llama 3 sizes (N = 8192, F = 8192 / 14336), the recomputing backward beside
 * the forward + backward it replaces. F = 20488 takes two blocks per row, the
 * second one partly idle. Where N and F are multiples of 16, the backward that writes
 * the down map's x^T FP8 codes instead of out (swiglu_backward_codes_t, per-tensor
 * --fp8 at recompute levels 1 and 2): dgate_up and its amax as the plain backward's,
 * the codes and their scale as fp8_quantize_transposed's of the forward's out at the
 * forward's amax, to the bit (that quantiser is checked against fp8.h's host codes by
 * fp8_matmul_check), in place; timed beside the recomputing backward + that quantiser,
 * the two passes it replaces.
 *
 * Tolerances: every output is bf16: 4e-3 relative (half a bf16 ulp is at most
 * 2^-8 = 3.9e-3 relative; fp32 math with expf adds ~1e-6), floor at 1% of the rms
 * since silu and its derivative pass through zero.
 *
 * Usage: swiglu_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/swiglu.h"

static void ref_swiglu(float *out, float *dgate_up, const float *gate_up, const float *dout, int N, int F)
{
    for (int64_t n = 0; n < N; n++) {
        for (int f = 0; f < F; f++) {
            double g = gate_up[n * 2 * F + f], u = gate_up[n * 2 * F + F + f], d = dout[n * F + f];
            double sig = 1.0 / (1.0 + exp(-g));
            out[n * F + f] = (float)(g * sig * u);
            dgate_up[n * 2 * F + f] = (float)(d * u * sig * (1.0 + g * (1.0 - sig)));
            dgate_up[n * 2 * F + F + f] = (float)(d * g * sig);
        }
    }
}

typedef struct {
    int N, F;
    bf16 **gate_up, **out, **dout, **dgate_up;
    uint8_t *codes_t; /* one for all sets: written, never read */
    float *inv_t, *out_amax;
} Bench;

static void run_forward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    swiglu_forward(b->out[s], b->gate_up[s], b->N, b->F, 0);
}
static void run_backward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    swiglu_backward(b->dgate_up[s], b->dout[s], b->gate_up[s], b->N, b->F, 0);
}
static void run_forward_then_backward(void *ctx, int s)
{
    run_forward(ctx, s);
    run_backward(ctx, s);
}
static void run_backward_recompute(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    swiglu_backward_recompute(b->dgate_up[s], b->out[s], b->dout[s], b->gate_up[s], b->N, b->F, NULL, NULL, 0);
}
static void run_backward_recompute_then_codes(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    run_backward_recompute(ctx, s);
    fp8_quantize_transposed(b->codes_t, b->inv_t, NULL, NULL, b->out[s], b->out_amax, b->N, b->F, FP8_T_TENSOR,
                            FP8_E4M3, 0);
}
static void run_backward_codes_t(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    swiglu_backward_codes_t(b->dgate_up[s], b->dout[s], b->gate_up[s], b->N, b->F, NULL, b->codes_t, b->inv_t,
                            b->out_amax, 0);
}

static void check_size(int N, int F, int bench)
{
    int64_t nf = (int64_t)N * F, n2f = 2 * nf;
    char what[128];
    printf("-- N = %d, F = %d\n", N, F);
    uint16_t *gu_b = (uint16_t *)malloc_check(n2f * 2, "gate_up"), *dout_b = (uint16_t *)malloc_check(nf * 2, "dout");
    uint16_t *got_b = (uint16_t *)malloc_check(n2f * 2, "got"), *got2_b = (uint16_t *)malloc_check(n2f * 2, "got2");
    float *gu = (float *)malloc_check(n2f * 4, "gate_up f"), *dout = (float *)malloc_check(nf * 4, "dout f");
    float *ref_out = (float *)malloc_check(nf * 4, "ref out"), *ref_dgu = (float *)malloc_check(n2f * 4, "ref dgu");
    float *got = (float *)malloc_check(n2f * 4, "got f");
    /* gates over [-8, 8] and beyond reach both tails of the sigmoid */
    fill_bf16(gu_b, gu, n2f, 2.5f);
    fill_bf16(dout_b, dout, nf, 1.0f);
    ref_swiglu(ref_out, ref_dgu, gu, dout, N, F);

    bf16 *d_gu = (bf16 *)dev_upload(gu_b, n2f * 2), *d_dout = (bf16 *)dev_upload(dout_b, nf * 2);
    bf16 *d_out = (bf16 *)dev_alloc(nf * 2), *d_dgu = (bf16 *)dev_alloc(n2f * 2);
    float *d_amax = (float *)dev_alloc(4);

    poison(d_out, nf * 2);
    poison_amax(d_amax);
    swiglu_forward_amax(d_out, d_gu, N, F, d_amax, 0);
    download(got_b, d_out, nf * 2);
    bf16_to_float(got, got_b, nf);
    snprintf(what, sizeof(what), "swiglu_forward N=%d F=%d", N, F);
    check_close(what, got, ref_out, nf, 4e-3, 1e-2);
    check_amax(what, d_amax, got_b, nf);

    poison(d_dgu, n2f * 2);
    poison_amax(d_amax);
    swiglu_backward_amax(d_dgu, d_dout, d_gu, N, F, d_amax, 0);
    download(got_b, d_dgu, n2f * 2);
    bf16_to_float(got, got_b, n2f);
    snprintf(what, sizeof(what), "swiglu_backward N=%d F=%d", N, F);
    check_close(what, got, ref_dgu, n2f, 4e-3, 1e-2);
    check_amax(what, d_amax, got_b, n2f);

    /* in place: d_dgu becomes a copy of gate_up, then is overwritten by its gradient */
    CUDA_CHECK(cudaMemcpy(d_dgu, d_gu, n2f * 2, cudaMemcpyDeviceToDevice));
    swiglu_backward(d_dgu, d_dout, d_dgu, N, F, 0);
    download(got2_b, d_dgu, n2f * 2);
    snprintf(what, sizeof(what), "swiglu_backward in place N=%d F=%d", N, F);
    check(memcmp(got_b, got2_b, n2f * 2) == 0, "%-46s bit-identical to out of place", what);

    /* the recomputing backward, in place as the layer runs it: dgate_up as the plain backward's, out as the
     * forward's, to the bit, and both amaxes */
    uint16_t *fwd_b = (uint16_t *)malloc_check(nf * 2, "forward out");
    swiglu_forward(d_out, d_gu, N, F, 0);
    download(fwd_b, d_out, nf * 2);
    float *d_out_amax = (float *)dev_alloc(4);
    CUDA_CHECK(cudaMemcpy(d_dgu, d_gu, n2f * 2, cudaMemcpyDeviceToDevice));
    poison(d_out, nf * 2);
    poison_amax(d_amax);
    poison_amax(d_out_amax);
    swiglu_backward_recompute(d_dgu, d_out, d_dout, d_dgu, N, F, d_amax, d_out_amax, 0);
    download(got2_b, d_dgu, n2f * 2);
    snprintf(what, sizeof(what), "swiglu_backward_recompute N=%d F=%d", N, F);
    check(memcmp(got_b, got2_b, n2f * 2) == 0, "%-46s dgate_up bit-identical to swiglu_backward's", what);
    check_amax(what, d_amax, got2_b, n2f);
    download(got2_b, d_out, nf * 2);
    check(memcmp(fwd_b, got2_b, nf * 2) == 0, "%-46s out bit-identical to swiglu_forward's", what);
    check_amax(what, d_out_amax, got2_b, nf);

    /* the x^T codes instead of out, in place: d_out holds the forward's out and d_out_amax its amax (just checked) */
    uint8_t *d_codes = NULL, *d_codes_ref = NULL;
    float *d_inv = NULL, *d_inv_ref = NULL;
    if (N % 16 == 0 && F % 16 == 0) {
        d_codes = (uint8_t *)dev_alloc(nf);
        d_codes_ref = (uint8_t *)dev_alloc(nf);
        d_inv = (float *)dev_alloc(4);
        d_inv_ref = (float *)dev_alloc(4);
        fp8_quantize_transposed(d_codes_ref, d_inv_ref, NULL, NULL, d_out, d_out_amax, N, F, FP8_T_TENSOR, FP8_E4M3, 0);
        CUDA_CHECK(cudaMemcpy(d_dgu, d_gu, n2f * 2, cudaMemcpyDeviceToDevice));
        poison(d_codes, nf);
        poison(d_inv, 4);
        poison_amax(d_amax);
        swiglu_backward_codes_t(d_dgu, d_dout, d_dgu, N, F, d_amax, d_codes, d_inv, d_out_amax, 0);
        snprintf(what, sizeof(what), "swiglu_backward_codes_t N=%d F=%d", N, F);
        download(got2_b, d_dgu, n2f * 2);
        check(memcmp(got_b, got2_b, n2f * 2) == 0, "%-46s dgate_up bit-identical to swiglu_backward's", what);
        check_amax(what, d_amax, got2_b, n2f);
        uint8_t *codes = (uint8_t *)malloc_check(nf, "codes"), *codes_ref = (uint8_t *)malloc_check(nf, "codes ref");
        download(codes, d_codes, nf);
        download(codes_ref, d_codes_ref, nf);
        check_identical("swiglu_backward_codes_t: x^T codes as fp8_quantize_transposed's", codes, codes_ref, nf);
        float inv, inv_ref;
        download(&inv, d_inv, 4);
        download(&inv_ref, d_inv_ref, 4);
        check(inv == inv_ref, "%-46s scale %g as the quantiser's %g", what, inv, inv_ref);
        free(codes);
        free(codes_ref);
    }

    if (bench) {
        Bench b = {N, F, NULL, NULL, NULL, NULL, d_codes, d_inv, d_out_amax};
        int sets = bench_sets(n2f * 2 * 2 + nf * 2 * 2);
        bf16 ***lists[4] = {&b.gate_up, &b.out, &b.dout, &b.dgate_up};
        for (int l = 0; l < 4; l++)
            *lists[l] = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        for (int s = 0; s < sets; s++) {
            b.gate_up[s] = (bf16 *)dev_clone(d_gu, n2f * 2);
            b.dout[s] = (bf16 *)dev_clone(d_dout, nf * 2);
            b.out[s] = (bf16 *)dev_alloc(nf * 2);
            b.dgate_up[s] = (bf16 *)dev_alloc(n2f * 2);
        }
        snprintf(what, sizeof(what), "swiglu_forward N=%d F=%d", N, F);
        bench_report(what, run_forward, &b, sets, 3.0 * nf * 2);
        snprintf(what, sizeof(what), "swiglu_backward N=%d F=%d", N, F);
        bench_report(what, run_backward, &b, sets, 5.0 * nf * 2);
        snprintf(what, sizeof(what), "swiglu_forward + backward N=%d F=%d", N, F);
        bench_report(what, run_forward_then_backward, &b, sets, 8.0 * nf * 2);
        snprintf(what, sizeof(what), "swiglu_backward_recompute N=%d F=%d", N, F);
        bench_report(what, run_backward_recompute, &b, sets, 6.0 * nf * 2);
        if (d_codes) { /* bytes that must move: gate_up, dout and dgate_up, 5 bf16 values an element of out; 1 byte of
                          codes, against out written, read again and its codes: 2 + 2 + 1 */
            snprintf(what, sizeof(what), "swiglu_backward_recompute + codes N=%d F=%d", N, F);
            bench_report(what, run_backward_recompute_then_codes, &b, sets, 5.0 * nf * 2 + 5.0 * nf);
            snprintf(what, sizeof(what), "swiglu_backward_codes_t N=%d F=%d", N, F);
            bench_report(what, run_backward_codes_t, &b, sets, 5.0 * nf * 2 + 1.0 * nf);
        }
        for (int s = 0; s < sets; s++) {
            for (int l = 0; l < 4; l++)
                cuda_free((*lists[l])[s]);
        }
        for (int l = 0; l < 4; l++)
            free(*lists[l]);
    }

    void *dev[] = {d_gu, d_dout, d_out, d_dgu, d_amax, d_out_amax, d_codes, d_codes_ref, d_inv, d_inv_ref};
    void *host[] = {gu_b, dout_b, got_b, got2_b, gu, dout, ref_out, ref_dgu, got, fwd_b};
    FREE_BUFFERS(dev, host);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "swiglu_check");
    bench_copy_bandwidth();
    int sizes[][3] = {
        /* N, F, bench */
        {37, 64, 0},   {37, 96, 0},     {5, 8, 0},        {3, 2056, 0},      {80, 48, 0},      {208, 8960, 0},
        {3, 20488, 0}, {8192, 8192, 1}, {8192, 14336, 1}, {16384, 14336, 1}, {16384, 8960, 1},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_size(sizes[i][0], sizes[i][1], sizes[i][2]);
    return check_summary();
}
