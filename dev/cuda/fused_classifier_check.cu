/*
 * fused_classifier_check: llmc/kernels/fused_classifier.h (chunked lm_head + cross-entropy
 * + backward) against a double-precision CPU reference, with ignored (-100) rows,
 * ragged last chunks, and vocabularies whose rows are not 16-byte aligned
 * (V = 1000, 777; the general kernel) and Qwen's V = 151936 (the cluster kernel, 7
 * blocks a row); the forward-only variant and loss_sum; then at Llama 3 sizes (N = 8192,
 * C = 2048, V = 128256) the cluster kernel against the general one on the same logits,
 * and timing for three chunk sizes and of each kernel.
 *
 * The kernel computes softmax from bf16 logits (the GEMM's output) and rounds
 * dlogits to bf16 before the two backward GEMMs. The reference does the same
 * math in double from the logits the kernel's GEMM produced (read back through
 * fused_classifier_logits), rounding dlogits to bf16 like the kernel, so that the
 * comparison isolates the kernel and the GEMM wiring. Tolerances:
 *   losses (fp32) vs the same bf16 logits: 1e-4 relative (fp32 sums of exp over
 *     V terms and __expf: ~1e-6).
 *   losses vs fp64 logits z never rounded to bf16 (what fusing in bf16 costs), a
 *     bound per row: |got - ref| <= 2^-8 (max_v |z_v| + |z_t|) + 1e-4 (|ref| + max_v |z_v|).
 *     Rounding to bf16 moves each logit by at most half an ulp, 2^-8 of itself, so
 *     the log-sum-exp by at most the largest such move and the target's logit z_t
 *     by its own; 1e-4 covers the fp32 parts (the GEMM's sums, the kernel's exp and
 *     sums: the bf16-logits check's tolerance). A relative tolerance (5e-3 before)
 *     failed now and then: 2^-8 |z_t| alone exceeds 5e-3 of a loss below 0.8 |z_t|.
 *   dx (bf16), a bound per element dx[n, c] = sum_v d[n, v] w[v, c]:
 *       |got - ref| <= 2^-8 |ref| + 4 * 2^-7 max_v |d w| + 1e-5 sum_v |d w|
 *     2^-8: the output's rounding to bf16; 2^-7 max_v |d w|: a dlogit d that the
 *     kernel (fp32, __expf) and the reference (double) round to neighbouring bf16
 *     values, one ulp (2^-7 of it at most) apart, up to 4 of them in a row (about
 *     1 in 4000 dlogits straddles a rounding boundary; 1e-2 relative, as before,
 *     failed now and then on an element that cancels to 1% of the rms);
 *     1e-5 sum |d w|: the GEMM's fp32 sums.
 *   dx of the V=128256 rows vs fp64 logits: 3e-2 relative to max(|ref|, rms):
 *     each of the 128256 softmax terms carries the bf16 rounding of its logit.
 *   dW (bf16), twice: accumulate = 0 over random garbage (100x the gradient's
 *     scale: it must be overwritten) and accumulate = 1 onto random bf16
 *     values of the gradient's scale. The first chunk writes (or adds to) dW, each
 *     later chunk adds its product P_k, which cuBLASLt rounds to bf16 before adding
 *     and rounding the sum S_k (matmul.h): a bound per element,
 *       |got - ref| <= 2^-8 sum_k (|P_k| + |S_k|) + 1e-3 rms(ref)
 *     (without the |P_1| term for accumulate = 0's first chunk, a single rounding);
 *     2^-8: half a bf16 ulp, relative; 1e-3 rms: the fp32 sums of exact products and
 *     a dlogit whose bf16 rounding differs by one ulp, the fp32 dW of before's bound.
 *   dx and losses do not depend on accumulate: bit-identical between the two runs.
 *   Other floors under |ref|: 1% of the reference's rms (gradients cross zero).
 *   Ignored rows: loss exactly 0; forward-only losses bit-identical to the
 *   forward+backward ones; loss_sum within 1e-5 of a double sum, and reproducible.
 *
 * Usage: fused_classifier_check [--seed N]
 */
#include <float.h>

#include "check_common.h"
#include "llmc/kernels/fused_classifier.h"

/* targets: about 1 in 6 ignored; the rest uniform over the vocabulary. Returns the count kept. */
static int make_targets(int *targets, int N, int V)
{
    int kept = 0;
    for (int i = 0; i < N; i++) {
        targets[i] = rng_int(6) == 0 ? IGNORE_INDEX : rng_int(V);
        kept += targets[i] != IGNORE_INDEX;
    }
    targets[0] = IGNORE_INDEX; /* at least one ignored row, at a chunk start */
    if (N > 1 && targets[N - 1] == IGNORE_INDEX)
        targets[N - 1] = V - 1; /* the last class */
    kept = 0;
    for (int i = 0; i < N; i++)
        kept += targets[i] != IGNORE_INDEX;
    return kept;
}

/* Loss and bf16-rounded dlogits of one row of logits, in double. */
static double ref_row(float *dlogits, const float *logits, int target, int V, double inv_count)
{
    if (target == IGNORE_INDEX) {
        if (dlogits)
            for (int v = 0; v < V; v++)
                dlogits[v] = 0.0f;
        return 0.0;
    }
    double mx = -1e300, sum = 0.0;
    for (int v = 0; v < V; v++)
        mx = logits[v] > mx ? logits[v] : mx;
    for (int v = 0; v < V; v++)
        sum += exp((double)logits[v] - mx);
    double lse = mx + log(sum);
    if (dlogits) {
        for (int v = 0; v < V; v++) {
            dlogits[v] = bf16_round((float)((exp((double)logits[v] - lse) - (v == target ? 1.0 : 0.0)) * inv_count));
        }
    }
    return lse - logits[target];
}

/* The bound on |loss from bf16 logits - loss from the exact logits z| (see the top). */
static float loss_bound(const float *z, int target, int V, double loss)
{
    if (target == IGNORE_INDEX)
        return 1e-30f; /* loss exactly 0 */
    double mx = 0.0;
    for (int v = 0; v < V; v++)
        mx = fabs((double)z[v]) > mx ? fabs((double)z[v]) : mx;
    return (float)(BF16_ROUNDING * (mx + fabs((double)z[target])) + 1e-4 * (fabs(loss) + mx));
}

static void check_small(int N, int C, int V, int chunk)
{
    char what[160], tag[96];
    snprintf(tag, sizeof(tag), "N=%d C=%d V=%d chunk=%d", N, C, V, chunk);
    printf("-- %s\n", tag);
    int64_t nx = (int64_t)N * C, nw = (int64_t)V * C, nl = (int64_t)N * V;
    uint16_t *x_b = (uint16_t *)malloc_check(nx * 2, "x"), *w_b = (uint16_t *)malloc_check(nw * 2, "w");
    uint16_t *logits_b = (uint16_t *)malloc_check(nl * 2, "logits"), *dx_b = (uint16_t *)malloc_check(nx * 2, "dx");
    float *x = (float *)malloc_check(nx * 4, "x f"), *w = (float *)malloc_check(nw * 4, "w f");
    float *logits = (float *)malloc_check(nl * 4, "logits f"), *dlogits = (float *)malloc_check(nl * 4, "dlogits");
    float *exact = (float *)malloc_check((size_t)V * 4, "fp64 logits row");
    int n_chunks = (N + chunk - 1) / chunk;
    double *chunk_dw = (double *)malloc_check((size_t)n_chunks * nw * 8, "per-chunk dW");
    uint16_t *dw0_b = (uint16_t *)malloc_check(nw * 2, "dw0"), *dw_b = (uint16_t *)malloc_check(nw * 2, "dw bits");
    uint16_t *dx_b2 = (uint16_t *)malloc_check(nx * 2, "dx2");
    float *dw0 = (float *)malloc_check(nw * 4, "dw0 f"), *ref_dw = (float *)malloc_check(nw * 4, "ref dw");
    float *got_dw = (float *)malloc_check(nw * 4, "got dw"), *bound = (float *)malloc_check(nw * 4, "dw bound");
    float *got_loss3 = (float *)malloc_check(N * 4, "got loss3");
    float *ref_dx = (float *)malloc_check(nx * 4, "ref dx"), *got_dx = (float *)malloc_check(nx * 4, "got dx");
    float *dx_bound = (float *)malloc_check(nx * 4, "dx bound");
    float *ref_loss = (float *)malloc_check(N * 4, "ref loss");
    float *ref_loss_exact = (float *)malloc_check(N * 4, "ref loss64");
    float *loss_bounds = (float *)malloc_check(N * 4, "loss bounds");
    float *got_loss = (float *)malloc_check(N * 4, "got loss"), *got_loss2 = (float *)malloc_check(N * 4, "got loss2");
    int *targets = (int *)malloc_check(N * sizeof(int), "targets");
    fill_bf16(x_b, x, nx, 1.0f);
    fill_bf16(w_b, w, nw, 0.2f);
    int kept = make_targets(targets, N, V);
    float inv_count = 1.0f / (float)kept;

    bf16 *d_x = (bf16 *)dev_upload(x_b, nx * 2), *d_w = (bf16 *)dev_upload(w_b, nw * 2);
    int *d_targets = (int *)dev_upload(targets, N * sizeof(int));
    bf16 *d_logits = (bf16 *)dev_alloc(nl * 2), *d_scratch = (bf16 *)dev_alloc((int64_t)chunk * V * 2);
    bf16 *d_dx = (bf16 *)dev_alloc(nx * 2);
    bf16 *d_dw = (bf16 *)dev_alloc(nw * 2);
    float *d_loss = (float *)dev_alloc(N * 4), *d_sum = (float *)dev_alloc(4);

    /* the logits the fused path's GEMM makes, for the reference to start from */
    poison(d_logits, nl * 2);
    fused_classifier_logits(d_logits, d_x, d_w, N, C, V, 0);
    download(logits_b, d_logits, nl * 2);
    bf16_to_float(logits, logits_b, nl);

    for (int n = 0; n < N; n++) {
        ref_loss[n] = (float)ref_row(dlogits + (int64_t)n * V, logits + (int64_t)n * V, targets[n], V, inv_count);
        for (int v = 0; v < V; v++) {
            double s = 0.0;
            for (int c = 0; c < C; c++)
                s += (double)x[(int64_t)n * C + c] * w[(int64_t)v * C + c];
            exact[v] = (float)s;
        }
        ref_loss_exact[n] = (float)ref_row(NULL, exact, targets[n], V, inv_count);
        loss_bounds[n] = loss_bound(exact, targets[n], V, ref_loss_exact[n]);
        for (int c = 0; c < C; c++) {
            double s = 0.0, largest = 0.0, magnitude = 0.0;
            for (int v = 0; v < V; v++) {
                double term = (double)dlogits[(int64_t)n * V + v] * w[(int64_t)v * C + c];
                s += term;
                largest = fmax(largest, fabs(term));
                magnitude += fabs(term);
            }
            ref_dx[(int64_t)n * C + c] = (float)s;
            /* at least FLT_MIN: an ignored row's dx must be exactly 0 */
            dx_bound[(int64_t)n * C + c] =
                fmaxf((float)(BF16_ROUNDING * fabs(s) + 4 * 2 * BF16_ROUNDING * largest + 1e-5 * magnitude), FLT_MIN);
        }
    }
    /* dW per chunk of rows: chunk_dw[k, v, c] = sum over the chunk's rows n of dlogits[n, v] x[n, c] */
    for (int k = 0; k < n_chunks; k++) {
        int end = (k + 1) * chunk < N ? (k + 1) * chunk : N;
        for (int v = 0; v < V; v++) {
            for (int c = 0; c < C; c++) {
                double s = 0.0;
                for (int n = k * chunk; n < end; n++)
                    s += (double)dlogits[(int64_t)n * V + v] * x[(int64_t)n * C + c];
                chunk_dw[(int64_t)k * nw + (int64_t)v * C + c] = s;
            }
        }
    }
    /* ref_dw: the overwrite result, for the scale of dW */
    for (int64_t i = 0; i < nw; i++) {
        double s = 0.0;
        for (int k = 0; k < n_chunks; k++)
            s += chunk_dw[(int64_t)k * nw + i];
        ref_dw[i] = (float)s;
    }
    double dw_rms = rms_of(ref_dw, nw);
    fill_bf16(dw0_b, dw0, nw, (float)dw_rms);

    /* accumulate = 0 then 1; the first run's losses and dx are checked, the second's compared to them */
    for (int acc = 0; acc < 2; acc++) {
        if (acc) {
            CUDA_CHECK(cudaMemcpy(d_dw, dw0_b, nw * 2, cudaMemcpyHostToDevice));
        } else {
            fill_bf16(dw_b, NULL, nw, (float)(100.0 * dw_rms)); /* garbage that an add would keep */
            CUDA_CHECK(cudaMemcpy(d_dw, dw_b, nw * 2, cudaMemcpyHostToDevice));
        }
        poison(d_loss, N * 4);
        poison(d_dx, nx * 2);
        poison(d_scratch, (int64_t)chunk * V * 2);
        fused_classifier_forward_backward(d_loss, d_dx, d_dw, d_scratch, d_x, d_w, d_targets, N, C, V, chunk, inv_count,
                                          acc, 0);
        download(acc ? got_loss3 : got_loss, d_loss, N * 4);
        download(acc ? dx_b2 : dx_b, d_dx, nx * 2);
        download(dw_b, d_dw, nw * 2);
        bf16_to_float(got_dw, dw_b, nw);
        for (int64_t i = 0; i < nw; i++) {
            double s = acc ? dw0[i] : 0.0, b = 0.0;
            for (int k = 0; k < n_chunks; k++) {
                double p = chunk_dw[(int64_t)k * nw + i];
                s += p;
                b += (k == 0 && !acc ? 0.0 : fabs(p)) + fabs(s);
            }
            ref_dw[i] = (float)s;
            bound[i] = (float)(BF16_ROUNDING * b + 1e-3 * dw_rms);
        }
        snprintf(what, sizeof(what), "dW (%s) %s", acc ? "+=" : "=", tag);
        check_within(what, got_dw, ref_dw, bound, nw);
    }
    bf16_to_float(got_dx, dx_b, nx);
    snprintf(what, sizeof(what), "dx, losses same with accumulate=1 %s", tag);
    check(memcmp(dx_b, dx_b2, nx * 2) == 0 && memcmp(got_loss, got_loss3, (size_t)N * 4) == 0, "%-46s bit-identical",
          what);

    int ignored_ok = 1;
    for (int n = 0; n < N; n++) {
        if (targets[n] == IGNORE_INDEX && got_loss[n] != 0.0f)
            ignored_ok = 0;
    }
    snprintf(what, sizeof(what), "ignored rows have loss 0 %s", tag);
    check(ignored_ok, "%s", what);
    snprintf(what, sizeof(what), "losses vs bf16 logits %s", tag);
    check_close(what, got_loss, ref_loss, N, 1e-4, 1e-2);
    snprintf(what, sizeof(what), "losses vs fp64 logits %s", tag);
    check_within(what, got_loss, ref_loss_exact, loss_bounds, N);
    snprintf(what, sizeof(what), "dx %s", tag);
    check_within(what, got_dx, ref_dx, dx_bound, nx);

    poison(d_loss, N * 4);
    fused_classifier_forward(d_loss, d_scratch, d_x, d_w, d_targets, N, C, V, chunk, 0);
    download(got_loss2, d_loss, N * 4);
    snprintf(what, sizeof(what), "forward-only losses %s", tag);
    check_identical(what, got_loss, got_loss2, (size_t)N * 4);

    double sum = 0.0;
    for (int n = 0; n < N; n++)
        sum += got_loss[n];
    float got_sum, got_sum2, want = (float)sum;
    poison(d_sum, 4);
    loss_sum(d_sum, d_loss, N, 0);
    download(&got_sum, d_sum, 4);
    snprintf(what, sizeof(what), "loss_sum %s", tag);
    check_close(what, &got_sum, &want, 1, 1e-5, 0.0);
    poison(d_sum, 4);
    loss_sum(d_sum, d_loss, N, 0);
    download(&got_sum2, d_sum, 4);
    snprintf(what, sizeof(what), "loss_sum rerun %s", tag);
    check_identical(what, &got_sum, &got_sum2, 4);

    cuda_free(d_x);
    cuda_free(d_w);
    cuda_free(d_targets);
    cuda_free(d_logits);
    cuda_free(d_scratch);
    cuda_free(d_dx);
    cuda_free(d_dw);
    cuda_free(d_loss);
    cuda_free(d_sum);
    free(x_b);
    free(w_b);
    free(logits_b);
    free(dx_b);
    free(x);
    free(w);
    free(logits);
    free(dlogits);
    free(exact);
    free(dw0);
    free(ref_dw);
    free(got_dw);
    free(ref_dx);
    free(got_dx);
    free(dx_bound);
    free(ref_loss);
    free(ref_loss_exact);
    free(got_loss);
    free(got_loss2);
    free(targets);
    void *host[] = {chunk_dw, dw0_b, dw_b, dx_b2, bound, got_loss3, loss_bounds};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
}

typedef struct {
    int N, C, V, chunk;
    float inv_count;
    bf16 *x, *w, *dx, *scratch, *dw;
    float *loss;
    int *targets;
} Bench;

static void run_fused(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    fused_classifier_forward_backward(b->loss, b->dx, b->dw, b->scratch, b->x, b->w, b->targets, b->N, b->C, b->V,
                                      b->chunk, b->inv_count, 0, 0);
}
static void run_forward_only(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    fused_classifier_forward(b->loss, b->scratch, b->x, b->w, b->targets, b->N, b->C, b->V, b->chunk, 0);
}
static void run_rows_cluster(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    cross_entropy_rows(b->loss, b->scratch, b->targets, b->chunk, b->V, b->inv_count, 1, 0, 0);
}
static void run_rows_general(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    cross_entropy_rows(b->loss, b->scratch, b->targets, b->chunk, b->V, b->inv_count, 1, 1, 0);
}

/* The cluster kernel (one read of each row) against the general one (two) on the same logits: the same math
 * merged in another order, so losses within 1e-5 relative (fp32 sums of 128,256 terms in two groupings) and
 * gradients within one bf16 ulp (2^-7 relative; a value near a rounding boundary may round either way) plus
 * 1e-9 (exp of very negative logits: both near 0). */
static void check_cluster_vs_general(Bench *b, int rows)
{
    int64_t n = (int64_t)rows * b->V;
    bf16 *copy = (bf16 *)dev_alloc(n * 2);
    float *loss2 = (float *)dev_alloc((int64_t)rows * 4);
    fused_classifier_logits(b->scratch, b->x, b->w, rows, b->C, b->V, 0);
    CUDA_CHECK(cudaMemcpy(copy, b->scratch, n * 2, cudaMemcpyDeviceToDevice));
    cross_entropy_rows(b->loss, b->scratch, b->targets, rows, b->V, b->inv_count, 1, 0, 0);
    cross_entropy_rows(loss2, copy, b->targets, rows, b->V, b->inv_count, 1, 1, 0);
    float *l1 = (float *)malloc_check((size_t)rows * 4, "losses"), *l2 = (float *)malloc_check((size_t)rows * 4, "l2");
    uint16_t *g1 = (uint16_t *)malloc_check(n * 2, "grads"), *g2 = (uint16_t *)malloc_check(n * 2, "grads");
    download(l1, b->loss, (int64_t)rows * 4);
    download(l2, loss2, (int64_t)rows * 4);
    download(g1, b->scratch, n * 2);
    download(g2, copy, n * 2);
    check_close("cluster vs general kernel: losses (V=128256)", l1, l2, rows, 1e-5, 0.0);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = bf16_float(g1[i]), c = bf16_float(g2[i]);
        bad += fabsf(a - c) > 0x1p-7f * fabsf(c) + 1e-9f;
    }
    check(bad == 0, "cluster vs general kernel: gradients within one bf16 ulp (V=128256): %lld of %lld off",
          (long long)bad, (long long)n);
    cuda_free(copy);
    cuda_free(loss2);
    free(l1);
    free(l2);
    free(g1);
    free(g2);
}

/* Llama 3 classifier: correctness of a few rows end to end, then timing per chunk size. */
static void check_large(int N, int C, int V)
{
    size_t budget = (size_t)1 << 30;
    int chunks[3] = {fused_classifier_chunk_rows(N, V, budget), 1024, N};
    int max_chunk = N;
    printf("-- N=%d C=%d V=%d: 1 GiB budget gives chunk %d\n", N, C, V, chunks[0]);
    int64_t nx = (int64_t)N * C, nw = (int64_t)V * C;
    uint16_t *x_b = (uint16_t *)malloc_check(nx * 2, "x"), *w_b = (uint16_t *)malloc_check(nw * 2, "w");
    float *x = (float *)malloc_check(nx * 4, "x f"), *w = (float *)malloc_check(nw * 4, "w f");
    int *targets = (int *)malloc_check(N * sizeof(int), "targets");
    fill_bf16(x_b, x, nx, 1.0f);
    fill_bf16(w_b, w, nw, 0.05f);
    int kept = make_targets(targets, N, V);
    Bench b;
    b.N = N;
    b.C = C;
    b.V = V;
    b.chunk = chunks[0];
    b.inv_count = 1.0f / (float)kept;
    b.x = (bf16 *)dev_upload(x_b, nx * 2);
    b.w = (bf16 *)dev_upload(w_b, nw * 2);
    b.targets = (int *)dev_upload(targets, N * sizeof(int));
    b.dx = (bf16 *)dev_alloc(nx * 2);
    b.scratch = (bf16 *)dev_alloc((size_t)max_chunk * V * 2);
    b.dw = (bf16 *)dev_alloc(nw * 2); /* overwritten: accumulate = 0 */
    b.loss = (float *)dev_alloc(N * 4);

    /* 8 rows (one ignored) against fp64 logits never rounded to bf16: loss and dx */
    poison(b.loss, N * 4);
    poison(b.dx, nx * 2);
    run_fused(&b, 0);
    float *got_loss = (float *)malloc_check(N * 4, "got loss");
    uint16_t *dx_b = (uint16_t *)malloc_check(nx * 2, "dx");
    download(got_loss, b.loss, N * 4);
    download(dx_b, b.dx, nx * 2);
    float *row = (float *)malloc_check((size_t)V * 4, "row"), *p = (float *)malloc_check((size_t)V * 4, "p");
    float ref_l[8], got_l[8], bound_l[8], *ref_dx = (float *)malloc_check(8 * (size_t)C * 4, "ref dx");
    float *got_dx = (float *)malloc_check(8 * (size_t)C * 4, "got dx");
    for (int k = 0; k < 8; k++) {
        int n = k == 0 ? 0 : rng_int(N);
        for (int v = 0; v < V; v++) {
            double s = 0.0;
            for (int c = 0; c < C; c++)
                s += (double)x[(int64_t)n * C + c] * w[(int64_t)v * C + c];
            row[v] = (float)s;
        }
        ref_l[k] = (float)ref_row(p, row, targets[n], V, b.inv_count);
        bound_l[k] = loss_bound(row, targets[n], V, ref_l[k]);
        got_l[k] = got_loss[n];
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int v = 0; v < V; v++)
                s += (double)p[v] * w[(int64_t)v * C + c];
            ref_dx[k * C + c] = (float)s;
            got_dx[k * C + c] = bf16_float(dx_b[(int64_t)n * C + c]);
        }
    }
    check_within("losses of 8 rows vs fp64 logits (V=128256)", got_l, ref_l, bound_l, 8);
    check_close("dx of 8 rows vs fp64 logits (V=128256)", got_dx, ref_dx, 8 * (int64_t)C, 3e-2, 1.0);

    double flops = 3.0 * 2.0 * N * (double)C * V;
    for (int i = 0; i < 3; i++) {
        b.chunk = chunks[i];
        float ms = bench_median_ms(run_fused, &b, 1);
        char what[96];
        snprintf(what, sizeof(what), "fused fwd+bwd chunk %d (%.2f GiB logits)", b.chunk,
                 (double)b.chunk * V * 2 / 1073741824.0);
        printf("BENCH %-48s %9.3f ms %7.1f TFLOP/s (3 GEMMs)\n", what, ms, flops / (ms * 1e-3) / 1e12);
    }
    b.chunk = chunks[0];
    float ms = bench_median_ms(run_forward_only, &b, 1);
    printf("BENCH %-48s %9.3f ms %7.1f TFLOP/s (1 GEMM)\n", "fused forward only (eval)", ms,
           flops / 3.0 / (ms * 1e-3) / 1e12);
    check_cluster_vs_general(&b, 512);
    /* the bytes each must move: the cluster kernel reads a row once and writes it, the general one reads it twice */
    bench_report("cross-entropy rows, cluster kernel, one chunk", run_rows_cluster, &b, 1,
                 2.0 * b.chunk * (double)V * 2);
    bench_report("cross-entropy rows, general kernel, one chunk", run_rows_general, &b, 1,
                 3.0 * b.chunk * (double)V * 2);

    cuda_free(b.x);
    cuda_free(b.w);
    cuda_free(b.targets);
    cuda_free(b.dx);
    cuda_free(b.scratch);
    cuda_free(b.dw);
    cuda_free(b.loss);
    free(x_b);
    free(w_b);
    free(x);
    free(w);
    free(targets);
    free(got_loss);
    free(dx_b);
    free(row);
    free(p);
    free(ref_dx);
    free(got_dx);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "fused_classifier_check");
    matmul_setup();
    bench_copy_bandwidth();
    int c1 = fused_classifier_chunk_rows(8192, 128256, (size_t)1 << 30);
    int c2 = fused_classifier_chunk_rows(100, 1000, (size_t)1 << 30);
    int c3 = fused_classifier_chunk_rows(8192, 128256, (size_t)1 << 20);
    check(c1 == 4096 && c2 == 100 && c3 == 4,
          "fused_classifier_chunk_rows: 1 GiB at V=128256 -> %d rows "
          "(want 4096), capped at N=100 -> %d, 1 MiB -> %d (want 4)",
          c1, c2, c3);
    check_small(300, 64, 1000, 128); /* ragged last chunk of 44 */
    check_small(257, 96, 777, 100);  /* rows start off 16-byte boundaries; chunk not a multiple of 128 */
    check_small(64, 32, 777, 64);    /* one chunk */
    check_small(40, 16, 151936, 32); /* Qwen's vocabulary: clusters of 7 blocks, the target in any of them */
    check_large(8192, 2048, 128256);
    matmul_teardown();
    return check_summary();
}
