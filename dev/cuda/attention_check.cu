/*
 * attention_check: llmc/kernels/attention.h (cuDNN SDPA, causal, grouped-query, reading
 * the fused qkv layout in place) against a double-precision CPU reference on the
 * same bf16 inputs: forward out and logsumexp stats, backward dq, dk, dv, in both
 * the deterministic and the atomic-dQ backward; bitwise reproducibility of the
 * deterministic backward; timing at Llama 3 sizes.
 *
 * Tolerances, relative to max(|ref|, rms(ref)) for out and dqkv: they are sums
 * of terms of either sign, whose rounding errors scale with the terms (the rms)
 * while single elements can cancel to near zero. Stats: floor 1% of the rms.
 *   out (bf16): 2e-2. Like every flash attention, cuDNN rounds the probabilities
 *     to bf16 before P @ V (2^-9 relative each) and rounds out to bf16 (2^-9);
 *     measured up to 1.04e-2 at D=128 on an H100 (PyTorch's flash: 1.13e-2).
 *   stats (fp32): 1e-3. Scores are fp32 sums of exact bf16 products; only exp/log
 *     approximations (~1e-6) separate lse from the reference. Floor 1% of rms.
 *   dq, dk, dv (bf16): 1e-1. Besides P, the kernel rounds dS to bf16 before the
 *     dQ and dK GEMMs and computes D = rowsum(dO * O) from the bf16 O. The
 *     largest errors sit at the first positions, whose few keys get large
 *     probabilities: PyTorch's own flash and cuDNN kernels err by up to 3.9e-2
 *     on these shapes and inputs (dev/cuda/attention_precision.py, H100), this
 *     kernel by up to 6.0e-2 over three seeds. A wrong layout, head mapping or
 *     mask gives errors of order 1.
 *
 * Packed documents (AttentionDocs, --doc-mask): a batch cut into documents of
 * lengths 1 to 70, one starting mid-row, against the reference run on each
 * document as a sequence of its own; same tolerances.
 *
 * Usage: attention_check [--seed N] [--sweep]  (--sweep: timings only, see sweep())
 */
#include "check_common.h"
#include "llmc/kernels/attention.h"
#include "llmc/model/documents.h"

typedef struct {
    int B, T, H, KV, D;
} Shape;

static inline int64_t qkv_at(Shape s, int b, int t, int head, int d)
{
    return (((int64_t)b * s.T + t) * (s.H + 2 * s.KV) + head) * s.D + d;
}

/* out, lse from qkv; then dqkv from dout (fused layout, like the kernel's). */
static void ref_attention(float *out, float *lse, float *dqkv, const float *qkv, const float *dout, Shape s)
{
    int T = s.T, D = s.D, group = s.H / s.KV, NH = s.H + 2 * s.KV;
    double scale = 1.0 / sqrt((double)D);
    double *p = (double *)malloc_check((size_t)T * sizeof(double), "probabilities");
    double *dp = (double *)malloc_check((size_t)T * sizeof(double), "dp");
    double *dacc = (double *)calloc_check((size_t)s.B * T * NH * D, sizeof(double), "dqkv accumulators");
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            int kh = s.H + h / group, vh = s.H + s.KV + h / group;
            for (int t = 0; t < T; t++) {
                double mx = -1e300;
                for (int u = 0; u <= t; u++) {
                    double dotp = 0.0;
                    for (int d = 0; d < D; d++) {
                        dotp += (double)qkv[qkv_at(s, b, t, h, d)] * qkv[qkv_at(s, b, u, kh, d)];
                    }
                    p[u] = dotp * scale;
                    mx = p[u] > mx ? p[u] : mx;
                }
                double sum = 0.0;
                for (int u = 0; u <= t; u++)
                    sum += exp(p[u] - mx);
                double l = mx + log(sum);
                lse[((int64_t)b * s.H + h) * T + t] = (float)l;
                for (int u = 0; u <= t; u++)
                    p[u] = exp(p[u] - l);
                const float *dO = dout + (((int64_t)b * T + t) * s.H + h) * D;
                double Dt = 0.0;
                for (int u = 0; u <= t; u++) {
                    double dpu = 0.0;
                    for (int d = 0; d < D; d++)
                        dpu += (double)dO[d] * qkv[qkv_at(s, b, u, vh, d)];
                    dp[u] = dpu;
                    Dt += p[u] * dpu;
                }
                for (int d = 0; d < D; d++) {
                    double o = 0.0;
                    for (int u = 0; u <= t; u++)
                        o += p[u] * qkv[qkv_at(s, b, u, vh, d)];
                    out[(((int64_t)b * T + t) * s.H + h) * D + d] = (float)o;
                }
                for (int u = 0; u <= t; u++) {
                    double ds = p[u] * (dp[u] - Dt) * scale;
                    for (int d = 0; d < D; d++) {
                        dacc[qkv_at(s, b, t, h, d)] += ds * qkv[qkv_at(s, b, u, kh, d)];
                        dacc[qkv_at(s, b, u, kh, d)] += ds * qkv[qkv_at(s, b, t, h, d)];
                        dacc[qkv_at(s, b, u, vh, d)] += p[u] * dO[d];
                    }
                }
            }
        }
    }
    for (int64_t i = 0; i < (int64_t)s.B * T * NH * D; i++)
        dqkv[i] = (float)dacc[i];
    free(p);
    free(dp);
    free(dacc);
}

typedef struct {
    Shape s;
    bf16 *qkv, *out, *dout, *dqkv;
    float *stats;
} Bench;

static void run_forward(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    attention_forward(b->out, b->stats, b->qkv, b->s.B, b->s.T, b->s.H, b->s.KV, b->s.D, NULL, 0);
}
static void run_backward(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    attention_backward(b->dqkv, b->dout, b->qkv, b->out, b->stats, b->s.B, b->s.T, b->s.H, b->s.KV, b->s.D, NULL, 0);
}

/* dq, dk and dv compared separately: their scales differ, and a failure then
 * names the part; the worst element's position is printed too. */
static void check_gradient_parts(const float *got, const float *ref, Shape s, const char *mode, const char *tag)
{
    static const char *names[3] = {"dq", "dk", "dv"};
    int heads[3] = {s.H, s.KV, s.KV}, first[3] = {0, s.H, s.H + s.KV};
    int64_t per_part_max = (int64_t)s.B * s.T * s.H * s.D;
    float *g = (float *)malloc_check(per_part_max * 4, "part"), *r = (float *)malloc_check(per_part_max * 4, "part");
    for (int part = 0; part < 3; part++) {
        int64_t n = 0;
        for (int b = 0; b < s.B; b++)
            for (int t = 0; t < s.T; t++)
                for (int h = 0; h < heads[part]; h++)
                    for (int d = 0; d < s.D; d++, n++) {
                        g[n] = got[qkv_at(s, b, t, first[part] + h, d)];
                        r[n] = ref[qkv_at(s, b, t, first[part] + h, d)];
                    }
        char what[160];
        snprintf(what, sizeof(what), "attention_backward %s (%s) %s", names[part], mode, tag);
        check_close(what, g, r, n, 1e-1, 1.0);
        int64_t worst = 0;
        for (int64_t i = 0; i < n; i++)
            if (fabsf(g[i] - r[i]) > fabsf(g[worst] - r[worst]))
                worst = i;
        int64_t row = worst / ((int64_t)heads[part] * s.D);
        printf("     worst %s element: b %lld, t %lld, head %lld, d %lld\n", names[part], (long long)(row / s.T),
               (long long)(row % s.T), (long long)(worst / s.D % heads[part]), (long long)(worst % s.D));
    }
    free(g);
    free(r);
}

/* Checks one shape: against the CPU reference (small shapes), or times it. The
 * deterministic backward runs where the trainer would take it (attention.h's rule). */
static void check_shape(Shape s, int reference)
{
    int det_first = attention_deterministic_fits(s.B, s.H, s.T);
    int64_t NH = s.H + 2 * s.KV;
    int64_t n_qkv = (int64_t)s.B * s.T * NH * s.D, n_out = (int64_t)s.B * s.T * s.H * s.D;
    int64_t n_stats = (int64_t)s.B * s.H * s.T;
    char what[160], tag[96];
    snprintf(tag, sizeof(tag), "B=%d T=%d H=%d KV=%d D=%d", s.B, s.T, s.H, s.KV, s.D);
    printf("-- %s\n", tag);
    uint16_t *qkv_b = (uint16_t *)malloc_check(n_qkv * 2, "qkv"), *dout_b = (uint16_t *)malloc_check(n_out * 2, "dout");
    uint16_t *got_b = (uint16_t *)malloc_check(n_qkv * 2, "got"), *got2_b = (uint16_t *)malloc_check(n_qkv * 2, "got2");
    float *qkv = (float *)malloc_check(n_qkv * 4, "qkv f"), *dout = (float *)malloc_check(n_out * 4, "dout f");
    float *got = (float *)malloc_check(n_qkv * 4, "got f"), *got_stats = (float *)malloc_check(n_stats * 4, "stats");
    fill_bf16(qkv_b, qkv, n_qkv, 1.0f);
    fill_bf16(dout_b, dout, n_out, 1.0f);

    Bench b;
    b.s = s;
    b.qkv = (bf16 *)dev_upload(qkv_b, n_qkv * 2);
    b.dout = (bf16 *)dev_upload(dout_b, n_out * 2);
    b.out = (bf16 *)dev_alloc(n_out * 2);
    b.dqkv = (bf16 *)dev_alloc(n_qkv * 2);
    b.stats = (float *)dev_alloc(n_stats * 4);

    float *ref_out = NULL, *ref_lse = NULL, *ref_dqkv = NULL;
    if (reference) {
        ref_out = (float *)malloc_check(n_out * 4, "ref out");
        ref_lse = (float *)malloc_check(n_stats * 4, "ref lse");
        ref_dqkv = (float *)malloc_check(n_qkv * 4, "ref dqkv");
        ref_attention(ref_out, ref_lse, ref_dqkv, qkv, dout, s);
    }

    poison(b.out, n_out * 2);
    poison(b.stats, n_stats * 4);
    run_forward(&b, 0);
    if (reference) {
        download(got_b, b.out, n_out * 2);
        bf16_to_float(got, got_b, n_out);
        snprintf(what, sizeof(what), "attention_forward out %s", tag);
        check_close(what, got, ref_out, n_out, 2e-2, 1.0);
        download(got_stats, b.stats, n_stats * 4);
        snprintf(what, sizeof(what), "attention_forward stats %s", tag);
        check_close(what, got_stats, ref_lse, n_stats, 1e-3, 1e-2);
    }

    for (int deterministic = det_first; deterministic >= 0; deterministic--) {
        const char *mode = deterministic ? "deterministic" : "atomic dQ";
        attention_set_deterministic(deterministic);
        poison(b.dqkv, n_qkv * 2);
        run_backward(&b, 0);
        download(got_b, b.dqkv, n_qkv * 2);
        if (reference) {
            bf16_to_float(got, got_b, n_qkv);
            check_gradient_parts(got, ref_dqkv, s, mode, tag);
        }
        if (deterministic) {
            poison(b.dqkv, n_qkv * 2);
            run_backward(&b, 0);
            download(got2_b, b.dqkv, n_qkv * 2);
            snprintf(what, sizeof(what), "attention_backward rerun %s", tag);
            check_identical(what, got_b, got2_b, n_qkv * 2);
        }
    }

    if (!reference) {
        double fwd_flops = 2.0 * 2.0 * s.B * s.H * (double)s.T * s.T * s.D / 2.0;
        float ms = bench_median_ms(run_forward, &b, 1);
        snprintf(what, sizeof(what), "attention_forward %s", tag);
        printf("BENCH %-52s %9.4f ms %7.1f TFLOP/s\n", what, ms, fwd_flops / (ms * 1e-3) / 1e12);
        for (int deterministic = det_first; deterministic >= 0; deterministic--) {
            attention_set_deterministic(deterministic);
            ms = bench_median_ms(run_backward, &b, 1);
            snprintf(what, sizeof(what), "attention_backward (%s) %s", deterministic ? "det" : "atomic", tag);
            printf("BENCH %-52s %9.4f ms %7.1f TFLOP/s (2.5x forward FLOPs)\n", what, ms,
                   2.5 * fwd_flops / (ms * 1e-3) / 1e12);
        }
        printf("     attention workspace now %.1f MiB\n", attention_workspace_bytes() / 1048576.0);
    }
    attention_set_deterministic(1);

    cuda_free(b.qkv);
    cuda_free(b.dout);
    cuda_free(b.out);
    cuda_free(b.dqkv);
    cuda_free(b.stats);
    free(qkv_b);
    free(dout_b);
    free(got_b);
    free(got2_b);
    free(qkv);
    free(dout);
    free(got);
    free(got_stats);
    free(ref_out);
    free(ref_lse);
    free(ref_dqkv);
}

/* Packed documents: the rows of a [2, 96] batch cut at "BOS" tokens (row 0 starts inside a document and holds one of
 * length 1), the GPU's ragged attention against the reference on each document alone. */
static void check_documents(void)
{
    Shape s = {2, 96, 4, 2, 64};
    const int bos = 1, starts[] = {10, 11, 50, 96 + 0, 96 + 70};
    int64_t N = (int64_t)s.B * s.T, NH = s.H + 2 * s.KV, n_qkv = N * NH * s.D, n_out = N * s.H * s.D;
    int *tokens = (int *)calloc_check((size_t)N, sizeof(int), "tokens"), *first = (int *)malloc_check(N * 4, "first");
    int *pos = (int *)malloc_check(N * 4, "pos"), *start = (int *)malloc_check((N + 1) * 4, "start"),
        *seq_len = (int *)malloc_check((N + 1) * 4, "seq_len");
    for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++)
        tokens[starts[i]] = bos;
    documents_find(first, pos, tokens, s.B, s.T, bos);
    DocumentsShape d = documents_pack(start, seq_len, first, s.B, s.T);
    check(d.n == 6 && d.slots == 8 && d.max_len == 96, "%-46s %d documents in %d slots, longest %d", "documents_pack",
          d.n, d.slots, d.max_len);

    uint16_t *qkv_b = (uint16_t *)malloc_check(n_qkv * 2, "qkv"), *dout_b = (uint16_t *)malloc_check(n_out * 2, "dout");
    float *qkv = (float *)malloc_check(n_qkv * 4, "qkv f"), *dout = (float *)malloc_check(n_out * 4, "dout f");
    fill_bf16(qkv_b, qkv, n_qkv, 1.0f);
    fill_bf16(dout_b, dout, n_out, 1.0f);
    float *ref_out = (float *)malloc_check(n_out * 4, "ref out"),
          *ref_stats = (float *)malloc_check(N * s.H * 4, "lse");
    float *ref_dqkv = (float *)malloc_check(n_qkv * 4, "ref dqkv"), *lse = (float *)malloc_check(N * s.H * 4, "lse");
    for (int i = 0; i < d.n; i++) { /* each document as a batch of one: its tokens are contiguous in every layout */
        Shape one = {1, seq_len[i], s.H, s.KV, s.D};
        ref_attention(ref_out + (int64_t)start[i] * s.H * s.D, lse, ref_dqkv + (int64_t)start[i] * NH * s.D,
                      qkv + (int64_t)start[i] * NH * s.D, dout + (int64_t)start[i] * s.H * s.D, one);
        for (int h = 0; h < s.H; h++)
            for (int t = 0; t < seq_len[i]; t++)
                ref_stats[((int64_t)start[i] + t) * s.H + h] = lse[(int64_t)h * seq_len[i] + t];
    }

    AttentionDocs docs;
    docs.slots = d.slots;
    docs.max_len = d.max_len;
    docs.seq_len = (int *)dev_upload(seq_len, (size_t)d.slots * 4);
    docs.start = (int *)dev_upload(start, (size_t)(d.slots + 1) * 4);
    docs.qkv_offsets = (int *)dev_alloc((size_t)(d.slots + 1) * 4);
    docs.out_offsets = (int *)dev_alloc((size_t)(d.slots + 1) * 4);
    docs.stats_offsets = (int *)dev_alloc((size_t)(d.slots + 1) * 4);
    attention_documents_offsets(&docs, s.H, s.KV, s.D, 0);
    bf16 *d_qkv = (bf16 *)dev_upload(qkv_b, n_qkv * 2), *d_dout = (bf16 *)dev_upload(dout_b, n_out * 2);
    bf16 *d_out = (bf16 *)dev_alloc(n_out * 2), *d_dqkv = (bf16 *)dev_alloc(n_qkv * 2);
    float *d_stats = (float *)dev_alloc(N * s.H * 4);
    poison(d_out, n_out * 2);
    poison(d_stats, N * s.H * 4);
    attention_forward(d_out, d_stats, d_qkv, s.B, s.T, s.H, s.KV, s.D, &docs, 0);
    uint16_t *got_b = (uint16_t *)malloc_check(n_qkv * 2, "got");
    float *got = (float *)malloc_check(n_qkv * 4, "got f");
    download(got_b, d_out, n_out * 2);
    bf16_to_float(got, got_b, n_out);
    check_close("attention_forward out, packed documents", got, ref_out, n_out, 2e-2, 1.0);
    download(got, d_stats, N * s.H * 4);
    check_close("attention_forward stats, packed documents", got, ref_stats, N * s.H, 1e-3, 1e-2);
    for (int deterministic = 1; deterministic >= 0; deterministic--) {
        attention_set_deterministic(deterministic);
        poison(d_dqkv, n_qkv * 2);
        attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_stats, s.B, s.T, s.H, s.KV, s.D, &docs, 0);
        download(got_b, d_dqkv, n_qkv * 2);
        bf16_to_float(got, got_b, n_qkv);
        check_gradient_parts(got, ref_dqkv, s, deterministic ? "deterministic" : "atomic dQ", "packed documents");
    }
    attention_set_deterministic(1);
    void *dev[] = {(void *)docs.seq_len,
                   (void *)docs.start,
                   docs.qkv_offsets,
                   docs.out_offsets,
                   docs.stats_offsets,
                   d_qkv,
                   d_dout,
                   d_out,
                   d_dqkv,
                   d_stats};
    void *host[] = {tokens, first,   pos,       start,    seq_len, qkv_b, dout_b, qkv,
                    dout,   ref_out, ref_stats, ref_dqkv, lse,     got_b, got};
    FREE_BUFFERS(dev, host);
}

/* --sweep: the timings of issue 14's comparison: T = 2048, 8192, 32768 at 16384
 * tokens per call, head sizes 64 (Llama 3.2 1B: 32 query, 8 key/value heads)
 * and 128 (Llama 3.1 8B: 32 and 8); the deterministic backward where it fits in
 * 2 GiB. Run it with each cuDNN (LD_LIBRARY_PATH) to compare versions. */
static void sweep(void)
{
    int Ts[] = {2048, 8192, 32768}, Ds[] = {64, 128};
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 3; t++) {
            Shape s = {16384 / Ts[t] > 0 ? 16384 / Ts[t] : 1, Ts[t], 32, 8, Ds[d]};
            check_shape(s, 0);
        }
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "attention_check");
    attention_setup();
    int v = attention_library_version();
    printf("cuDNN %d.%d.%d loaded\n", v / 10000, v / 100 % 100, v % 100);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--sweep") == 0) {
            sweep();
            attention_teardown();
            return check_summary();
        }
    Shape small[] = {{2, 37, 4, 2, 16}, {2, 37, 4, 2, 24}, {2, 37, 4, 2, 64}, {1, 130, 8, 2, 128}, {2, 64, 4, 4, 32}};
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++)
        check_shape(small[i], 1);
    check_documents();
    /* Llama 3.2 1B (D = 64) and 3B / 8B-like (D = 128) heads at T = 2048 */
    Shape big[] = {{4, 2048, 32, 8, 64}, {2, 2048, 32, 8, 128}};
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++)
        check_shape(big[i], 0);
    attention_teardown();
    return check_summary();
}
