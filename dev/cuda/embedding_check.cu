/*
 * embedding_check: llmc/kernels/embedding.h. The backward plan against its invariants; the
 * forward gather to the bit; the backward against a double-precision CPU sum of the
 * same bf16 dout rows, added to a random bf16 dwte (embedding_backward always adds);
 * rows of tokens not in the batch left bit-identical; backward determinism over two
 * runs; timing at Llama 3 sizes (N = 8192, V = 128256, C = 2048 / 4096). Tokens mix
 * one hot token (5%), a hundred common ones (20%) and uniform draws, so buckets
 * range from one position to hundreds.
 *
 * Tolerances: forward is a copy: bit-identical. dwte is bf16: 4e-3 relative to
 * max(|ref|, rms). The kernel sums a bucket in fp32 (a few hundred bf16 values: ~1e-6
 * of the terms' scale; with the fp32 dwte of before, measured on an H100 at 1.5e-5 of
 * a tenth of the rms, i.e. 1.5e-6 of the rms), adds it to the old bf16 value in fp32
 * and rounds once to bf16: 2^-8 = 3.9e-3 at worst, and 3.9e-3 + 1.5e-6 < 4e-3.
 *
 * Usage: embedding_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/embedding.h"

typedef struct {
    int N, C, n_buckets;
    int *tokens, *bucket_token, *bucket_start, *positions;
    bf16 *wte, **out, **dout, *dwte;
} Bench;

static void run_forward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    embedding_forward(b->out[s], b->tokens, b->wte, b->N, b->C, 0);
}
static void run_backward(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    embedding_backward(b->dwte, b->dout[s], b->bucket_token, b->bucket_start, b->positions, b->n_buckets, b->C, 0);
}

/* Every position once, ascending within a bucket, under its own token; buckets distinct,
 * largest first, ties by token id. */
static int plan_ok(const int *tokens, int N, int V, const int *bucket_token, const int *bucket_start,
                   const int *positions, int n_buckets)
{
    char *seen_pos = (char *)calloc_check((size_t)N, 1, "seen positions");
    char *seen_tok = (char *)calloc_check((size_t)V, 1, "seen tokens");
    int ok = bucket_start[0] == 0 && bucket_start[n_buckets] == N;
    for (int b = 0; b < n_buckets && ok; b++) {
        int v = bucket_token[b], size = bucket_start[b + 1] - bucket_start[b];
        ok &= v >= 0 && v < V && !seen_tok[v] && size > 0;
        if (!ok)
            break;
        seen_tok[v] = 1;
        if (b > 0) {
            int prev = bucket_start[b] - bucket_start[b - 1];
            ok &= prev > size || (prev == size && bucket_token[b - 1] < v);
        }
        for (int k = bucket_start[b]; k < bucket_start[b + 1] && ok; k++) {
            int p = positions[k];
            ok &= p >= 0 && p < N && !seen_pos[p] && tokens[p] == v && (k == bucket_start[b] || positions[k - 1] < p);
            if (ok)
                seen_pos[p] = 1;
        }
    }
    free(seen_pos);
    free(seen_tok);
    return ok;
}

static void check_size(int N, int C, int V, int bench)
{
    int64_t NC = (int64_t)N * C, VC = (int64_t)V * C;
    char what[128];
    printf("-- N = %d, C = %d, V = %d\n", N, C, V);
    int *tokens = (int *)malloc_check((size_t)N * 4, "tokens");
    int common[100];
    for (int i = 0; i < 100; i++)
        common[i] = rng_int(V);
    int hot = rng_int(V);
    for (int n = 0; n < N; n++) {
        double u = rng_uniform();
        tokens[n] = u < 0.05 ? hot : u < 0.25 ? common[rng_int(100)] : rng_int(V);
    }

    /* plan */
    int *bucket_token = (int *)malloc_check((size_t)N * 4, "bucket_token");
    int *bucket_start = (int *)malloc_check(((size_t)N + 1) * 4, "bucket_start");
    int *positions = (int *)malloc_check((size_t)N * 4, "positions");
    int *workspace = (int *)malloc_check(embedding_backward_plan_workspace_ints(N, V) * 4, "plan workspace");
    int n_buckets = embedding_backward_plan_host(bucket_token, bucket_start, positions, tokens, N, V, workspace);
    snprintf(what, sizeof(what), "embedding_backward_plan_host N=%d V=%d", N, V);
    check(plan_ok(tokens, N, V, bucket_token, bucket_start, positions, n_buckets),
          "%-46s %d buckets, largest %d positions", what, n_buckets, bucket_start[1] - bucket_start[0]);

    uint16_t *wte_b = (uint16_t *)malloc_check(VC * 2, "wte"), *dout_b = (uint16_t *)malloc_check(NC * 2, "dout");
    uint16_t *out_b = (uint16_t *)malloc_check(NC * 2, "out"), *want_b = (uint16_t *)malloc_check(NC * 2, "want");
    uint16_t *dwte0_b = (uint16_t *)malloc_check(VC * 2, "dwte0"), *got_b = (uint16_t *)malloc_check(VC * 2, "got");
    uint16_t *got_b2 = (uint16_t *)malloc_check(VC * 2, "got2");
    float *dout = (float *)malloc_check(NC * 4, "dout f");
    float *dwte0 = (float *)malloc_check(VC * 4, "dwte0 f"), *ref = (float *)malloc_check(VC * 4, "ref dwte");
    float *got = (float *)malloc_check(VC * 4, "got dwte");
    for (int64_t i = 0; i < VC; i++) {
        wte_b[i] = (uint16_t)(rng_next() & 0x3fff) | 0x3c00; /* finite bf16 in [2^-7, 2); any bits would do */
        dwte0_b[i] = bf16_bits(rng_range(-1.0f, 1.0f));
        dwte0[i] = bf16_float(dwte0_b[i]);
    }
    fill_bf16(dout_b, dout, NC, 1.0f);
    for (int n = 0; n < N; n++)
        memcpy(want_b + (int64_t)n * C, wte_b + (int64_t)tokens[n] * C, (size_t)C * 2);

    int *d_tokens = (int *)dev_upload(tokens, (size_t)N * 4);
    int *d_bucket_token = (int *)dev_upload(bucket_token, (size_t)n_buckets * 4);
    int *d_bucket_start = (int *)dev_upload(bucket_start, ((size_t)n_buckets + 1) * 4);
    int *d_positions = (int *)dev_upload(positions, (size_t)N * 4);
    bf16 *d_wte = (bf16 *)dev_upload(wte_b, VC * 2), *d_dout = (bf16 *)dev_upload(dout_b, NC * 2);
    bf16 *d_out = (bf16 *)dev_alloc(NC * 2);
    bf16 *d_dwte = (bf16 *)dev_alloc(VC * 2);

    poison(d_out, NC * 2);
    embedding_forward(d_out, d_tokens, d_wte, N, C, 0);
    download(out_b, d_out, NC * 2);
    snprintf(what, sizeof(what), "embedding_forward N=%d C=%d", N, C);
    check_identical(what, out_b, want_b, NC * 2);

    memcpy(ref, dwte0, VC * 4);
    for (int b = 0; b < n_buckets; b++) {
        float *row = ref + (int64_t)bucket_token[b] * C;
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int k = bucket_start[b]; k < bucket_start[b + 1]; k++)
                s += dout[(int64_t)positions[k] * C + c];
            row[c] = (float)(row[c] + s);
        }
    }
    for (int rep = 0; rep < 2; rep++) {
        CUDA_CHECK(cudaMemcpy(d_dwte, dwte0_b, VC * 2, cudaMemcpyHostToDevice));
        embedding_backward(d_dwte, d_dout, d_bucket_token, d_bucket_start, d_positions, n_buckets, C, 0);
        download(rep ? got_b2 : got_b, d_dwte, VC * 2);
    }
    bf16_to_float(got, got_b, VC);
    snprintf(what, sizeof(what), "embedding_backward dwte (+=) N=%d C=%d", N, C);
    check_close(what, got, ref, VC, 4e-3, 1.0);
    snprintf(what, sizeof(what), "embedding_backward determinism N=%d C=%d", N, C);
    check_identical(what, got_b, got_b2, VC * 2);
    /* rows of tokens not in the batch: untouched, to the bit */
    char *in_batch = (char *)calloc_check((size_t)V, 1, "tokens in batch");
    for (int n = 0; n < N; n++)
        in_batch[tokens[n]] = 1;
    int64_t untouched = 0, changed = 0;
    for (int v = 0; v < V; v++) {
        if (in_batch[v])
            continue;
        untouched++;
        changed += memcmp(got_b + (int64_t)v * C, dwte0_b + (int64_t)v * C, (size_t)C * 2) != 0;
    }
    snprintf(what, sizeof(what), "embedding_backward other rows N=%d V=%d", N, V);
    check(changed == 0, "%-46s %lld of %lld rows of tokens not in the batch changed", what, (long long)changed,
          (long long)untouched);
    free(in_batch);

    if (bench) {
        Bench b = {N, C, n_buckets, d_tokens, d_bucket_token, d_bucket_start, d_positions, d_wte, NULL, NULL, d_dwte};
        int sets = bench_sets(NC * 2 * 2);
        b.out = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        b.dout = (bf16 **)malloc_check(sets * sizeof(bf16 *), "bench sets");
        for (int s = 0; s < sets; s++) {
            b.out[s] = (bf16 *)dev_alloc(NC * 2);
            b.dout[s] = (bf16 *)dev_clone(d_dout, NC * 2);
        }
        snprintf(what, sizeof(what), "embedding_forward N=%d C=%d", N, C);
        bench_report(what, run_forward, &b, sets, 2.0 * NC * 2);
        /* dout read once; each touched dwte row (bf16) read and written once */
        snprintf(what, sizeof(what), "embedding_backward N=%d C=%d", N, C);
        bench_report(what, run_backward, &b, sets, NC * 2.0 + 2.0 * n_buckets * C * 2);
        for (int s = 0; s < sets; s++) {
            cuda_free(b.out[s]);
            cuda_free(b.dout[s]);
        }
        free(b.out);
        free(b.dout);
    }

    void *dev[] = {d_tokens, d_bucket_token, d_bucket_start, d_positions, d_wte, d_dout, d_out, d_dwte};
    void *host[] = {tokens, bucket_token, bucket_start, positions, workspace, wte_b, dout_b, out_b,
                    want_b, dwte0_b,      got_b,        got_b2,    dout,      dwte0, ref,    got};
    FREE_BUFFERS(dev, host);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "embedding_check");
    bench_copy_bandwidth();
    int sizes[][4] = {
        /* N, C, V, bench */
        {37, 64, 11, 0}, {300, 96, 1000, 0}, {1000, 1032, 50, 0}, {8192, 2048, 128256, 1}, {8192, 4096, 128256, 1},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        check_size(sizes[i][0], sizes[i][1], sizes[i][2], sizes[i][3]);
    }
    return check_summary();
}
