/*
 * rope_check: llmc/kernels/rope.h against a double-precision CPU reference of the same
 * rotation on the same bf16 inputs and the same fp32 cos/sin table; the table
 * itself; that v is left untouched; timing at Llama 3 sizes (N = B*T = 8192).
 *
 * RoPE works in place, so outputs cannot be poisoned; instead every q and k element
 * is compared (any position t > 0 changes every pair) and v must keep its bits.
 *
 * Tolerances: q and k are bf16 outputs: 4e-3 relative (half a bf16 ulp is at most
 * 2^-8 = 3.9e-3 relative; fp32 vs double adds ~1e-7), with the floor at 1% of the
 * rms since x1*cos - x2*sin can cancel. Table: cos^2 + sin^2 = 1 to 1e-6 (each is a
 * correctly rounded float).
 *
 * Usage: rope_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/rope.h"

static void ref_rope(float *out, const float *qkv, const float *table, const int *positions, int B, int T, int H,
                     int KV, int D, double sign)
{
    int half = D / 2, heads = H + 2 * KV;
    memcpy(out, qkv, (size_t)B * T * heads * D * sizeof(float));
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int t = positions != NULL ? positions[bt] : (int)(bt % T);
        for (int h = 0; h < H + KV; h++) {
            const float *x = qkv + (bt * heads + h) * D;
            float *o = out + (bt * heads + h) * D;
            for (int i = 0; i < half; i++) {
                double c = table[((int64_t)t * half + i) * 2], s = sign * table[((int64_t)t * half + i) * 2 + 1];
                o[i] = (float)(x[i] * c - x[i + half] * s);
                o[i + half] = (float)(x[i + half] * c + x[i] * s);
            }
        }
    }
}

typedef struct {
    int B, T, H, KV, D;
    bf16 **qkv;
    float *table;
} Bench;

static void run_forward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    rope_forward(b->qkv[s], b->table, NULL, b->B, b->T, b->H, b->KV, b->D, 0);
}
static void run_backward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    rope_backward(b->qkv[s], b->table, NULL, b->B, b->T, b->H, b->KV, b->D, 0);
}

static void check_size(int B, int T, int H, int KV, int D, int bench)
{
    LlamaConfig config;
    if (llama_preset("llama3.1-8b", &config) != 0)
        FAIL("no llama3.1-8b preset");
    config.head_dim = D;
    int half = D / 2, heads = H + 2 * KV;
    int64_t n = (int64_t)B * T * heads * D;
    size_t bf = (size_t)n * 2;
    char what[128];
    printf("-- B = %d, T = %d, H = %d, KV = %d, D = %d (%s path)\n", B, T, H, KV, D,
           half % 8 == 0 ? "16-byte" : "scalar");

    float *table = (float *)malloc_check((size_t)T * D * sizeof(float), "rope table");
    rope_table_host(table, &config, T);
    double worst = 0.0;
    int table_ok = 1;
    for (int i = 0; i < half; i++)
        table_ok &= table[2 * i] == 1.0f && table[2 * i + 1] == 0.0f;
    for (int64_t k = 0; k < (int64_t)T * half; k++) {
        double c = table[2 * k], s = table[2 * k + 1];
        double e = fabs(c * c + s * s - 1.0);
        if (!(e <= worst))
            worst = e;
    }
    snprintf(what, sizeof(what), "rope_table_host T=%d D=%d", T, D);
    check(table_ok && worst <= 1e-6, "%-46s pos 0 is (1, 0): %s, max |cos^2+sin^2-1| %.2e (tol 1e-6)", what,
          table_ok ? "yes" : "no", worst);

    uint16_t *in_b = (uint16_t *)malloc_check(bf, "qkv"), *got_b = (uint16_t *)malloc_check(bf, "got");
    float *in = (float *)malloc_check((size_t)n * 4, "qkv f"), *ref = (float *)malloc_check((size_t)n * 4, "ref");
    float *got = (float *)malloc_check((size_t)n * 4, "got f");
    fill_bf16(in_b, in, n, 1.0f);
    bf16 *d_qkv = (bf16 *)dev_alloc(bf);
    float *d_table = (float *)dev_upload(table, (size_t)T * D * sizeof(float));

    /* packed documents' positions (llmc/model/documents.h): restarting every 13 tokens, or wherever */
    int *positions = (int *)malloc_check((size_t)B * T * sizeof(int), "positions");
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++)
        positions[bt] = (int)(bt % T % 13);
    int *d_positions = (int *)dev_upload(positions, (size_t)B * T * sizeof(int));
    for (int run = 0; run < 4; run++) {
        int dir = run % 2, with_pos = run / 2;
        const char *name = dir == 0 ? "rope_forward" : "rope_backward";
        ref_rope(ref, in, table, with_pos ? positions : NULL, B, T, H, KV, D, dir == 0 ? 1.0 : -1.0);
        CUDA_CHECK(cudaMemcpy(d_qkv, in_b, bf, cudaMemcpyHostToDevice));
        if (dir == 0)
            rope_forward(d_qkv, d_table, with_pos ? d_positions : NULL, B, T, H, KV, D, 0);
        else
            rope_backward(d_qkv, d_table, with_pos ? d_positions : NULL, B, T, H, KV, D, 0);
        download(got_b, d_qkv, bf);
        bf16_to_float(got, got_b, n);
        snprintf(what, sizeof(what), "%s q,k B=%d T=%d D=%d%s", name, B, T, D, with_pos ? " positions" : "");
        check_close(what, got, ref, n, 4e-3, 1e-2);
        int v_same = 1;
        for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
            int64_t v0 = (bt * heads + H + KV) * D;
            v_same &= memcmp(got_b + v0, in_b + v0, (size_t)KV * D * 2) == 0;
        }
        snprintf(what, sizeof(what), "%s v untouched B=%d T=%d D=%d", name, B, T, D);
        check(v_same, "%-46s v heads keep their bits", what);
    }

    if (bench) {
        Bench b = {B, T, H, KV, D, NULL, d_table};
        int sets = bench_sets(bf);
        b.qkv = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        for (int s = 0; s < sets; s++)
            b.qkv[s] = (bf16 *)dev_upload(in_b, bf);
        /* q and k read and written once; the table stays in L2 */
        double bytes = 2.0 * B * T * (H + KV) * D * 2;
        snprintf(what, sizeof(what), "rope_forward B=%d T=%d H=%d KV=%d D=%d", B, T, H, KV, D);
        bench_report(what, run_forward, &b, sets, bytes);
        snprintf(what, sizeof(what), "rope_backward B=%d T=%d H=%d KV=%d D=%d", B, T, H, KV, D);
        bench_report(what, run_backward, &b, sets, bytes);
        for (int s = 0; s < sets; s++)
            cuda_free(b.qkv[s]);
        free(b.qkv);
    }

    cuda_free(d_qkv);
    cuda_free(d_table);
    cuda_free(d_positions);
    free(positions);
    free(table);
    free(in_b);
    free(got_b);
    free(in);
    free(ref);
    free(got);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "rope_check");
    bench_copy_bandwidth();
    int sizes[][6] = {
        /* B, T, H, KV, D, bench */
        {2, 37, 4, 2, 16, 0},    {2, 37, 6, 3, 24, 0},     {3, 11, 4, 1, 64, 0},     {1, 29, 8, 8, 128, 0},
        {4, 2048, 32, 8, 64, 1}, {4, 2048, 24, 8, 128, 0}, {4, 2048, 32, 8, 128, 1},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        int *s = sizes[i];
        check_size(s[0], s[1], s[2], s[3], s[4], s[5]);
    }
    return check_summary();
}
