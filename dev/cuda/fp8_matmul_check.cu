/*
 * fp8_matmul_check.cu: checks llmc/kernels/fp8_quantize.h and matmul.h's matmul_fp8
 * (issue #15), and measures them. FP8 GEMMs (bf16 out) in the one operand
 * layout Hopper's FP8 kernels take, both operands contiguous along K:
 *     out[M, Nc] = X[M, K] @ Y[Nc, K]^T, dequantised     (row-major, as matmul.h's forward)
 * under each scaling recipe (fp8.h) and the scale layouts of matmul_fp8's
 * kinds: one scale per operand (X in E4M3 or E5M2, with and without fast
 * accumulation), one per row of X and of Y (OUTER_VEC_32F), one per 1 x 128
 * block of X and 128 x 128 of Y (VEC128_32F, BLK128x128_32F), and one per
 * 1 x 128 block of both (the weight gradient's form); and the quantisation a
 * step adds: a bf16 tensor's amax, column amax or 128 x 128 block amax, its
 * codes per tensor, row or 1 x 128 block, and its transposed codes (the
 * backward GEMMs need X^T and dY^T contiguous along the token axis) at each
 * recipe's scales.
 *
 * Checks (small shapes, fresh random inputs with outliers, so that blocks get
 * different scales): the GPU's codes and scales against fp8.h on the host bit
 * for bit, in the order fp8_quantize.h says cuBLASLt reads them; each GEMM
 * kind, plain and accumulating, on host-made codes against the double-precision
 * sum over the exact fp8 values: a wrong scale order fails there. Timing (the
 * Llama 3.2 1B's layer GEMMs at B=8, T=2048: forward, backward-input and
 * backward-weight shapes of qkv, o, gate/up and down, all in the K-contiguous
 * form): the bf16 GEMM of llmc/kernels/matmul.h against each FP8 kind, and the
 * quantisation kernels, each the median of BENCH_RUNS runs (check_common.h).
 * Prints one BENCH line per shape.
 *
 *   ./fp8_matmul_check [--seed N] [--no-bench]
 */
#include <cuda_fp8.h>

#include "check_common.h"
#include "llmc/kernels/fp8.h"
#include "llmc/kernels/fp8_quantize.h"
#include "llmc/kernels/matmul.h"

static const char *FORMAT_NAMES[2] = {"E4M3", "E5M2"};

/* How an operand's dequantisation scales map onto its [R, K] codes: element (r, k) takes
 * s[(r / rows) * row_stride + (k / k_block) * kb_stride] (strides 0: one scale for all). */
typedef struct {
    float *s;
    int rows, k_block;
    int64_t row_stride, kb_stride;
} ScaleMap;

static inline float scale_at(const ScaleMap *m, int r, int kb)
{
    return m->s[(int64_t)(r / m->rows) * m->row_stride + (int64_t)kb * m->kb_stride];
}

/* fp8_quantize.h's orders for operand [R, K] (the GEMM sums over K): one scale, per row, per 1 x 128 block (rows
 * adjacent), per 128 x 128 block (K blocks adjacent, their count padded to 4). */
enum { SCALE_TENSOR, SCALE_ROW, SCALE_1x128, SCALE_128x128 };
static ScaleMap scale_map(int kind, float *s, int R, int K)
{
    int64_t kb_n = fp8_k_blocks_padded(K);
    ScaleMap maps[4] = {{s, R, K, 0, 0}, {s, 1, K, 1, 0}, {s, 1, 128, 1, R}, {s, 128, 128, kb_n, 1}};
    return maps[kind];
}
static int64_t scale_count(const ScaleMap *m, int R, int K)
{
    return (int64_t)(ceil_div(R, m->rows) - 1) * m->row_stride + (int64_t)(ceil_div(K, m->k_block) - 1) * m->kb_stride +
           1;
}

/* fp8.h's codes[R, K] of x and each block's dequantisation scale where m says. */
static void quantize_host(uint8_t *codes, const float *x, int R, int K, const ScaleMap *m, Fp8Format f)
{
    for (int r0 = 0; r0 < R; r0 += m->rows)
        for (int k0 = 0; k0 < K; k0 += m->k_block) {
            float a = 0.0f;
            for (int r = r0; r < r0 + m->rows && r < R; r++)
                for (int k = k0; k < k0 + m->k_block && k < K; k++)
                    a = fmaxf(a, fabsf(x[(int64_t)r * K + k]));
            float scale = fp8_scale_from_amax(a, f);
            m->s[(int64_t)(r0 / m->rows) * m->row_stride + (int64_t)(k0 / m->k_block) * m->kb_stride] = 1.0f / scale;
            for (int r = r0; r < r0 + m->rows && r < R; r++)
                for (int k = k0; k < k0 + m->k_block && k < K; k++)
                    codes[(int64_t)r * K + k] = fp8_from_float(x[(int64_t)r * K + k] * scale, f);
        }
}

/* The GPU's codes [R, K] and scales (downloaded) against quantize_host's of x under map kind. */
static void check_codes(const char *what, const uint8_t *d_codes, const float *d_inv, const float *x, int R, int K,
                        int kind, Fp8Format f)
{
    int64_t n = (int64_t)R * K;
    float *want_inv = (float *)calloc_check((size_t)n + 1, 4, "inv"),
          *got_inv = (float *)malloc_check(4 * n + 4, "inv");
    ScaleMap m = scale_map(kind, want_inv, R, K);
    int64_t ns = scale_count(&m, R, K);
    uint8_t *want = (uint8_t *)malloc_check(n, "want"), *got = (uint8_t *)malloc_check(n, "got");
    quantize_host(want, x, R, K, &m, f);
    download(got, d_codes, n);
    download(got_inv, d_inv, 4 * ns);
    char line[160];
    snprintf(line, sizeof(line), "%s codes against fp8.h", what);
    check_identical(line, got, want, n);
    int64_t wrong = 0, blocks = 0; /* each block's scale (not the padding between rows of 128 x 128 blocks) */
    for (int r0 = 0; r0 < R; r0 += m.rows)
        for (int k0 = 0; k0 < K; k0 += m.k_block, blocks++) {
            int64_t i = (int64_t)(r0 / m.rows) * m.row_stride + (int64_t)(k0 / m.k_block) * m.kb_stride;
            wrong += memcmp(&got_inv[i], &want_inv[i], 4) != 0;
        }
    check(wrong == 0, "%s: %lld scales against fp8.h bit for bit (%lld wrong)", what, (long long)blocks,
          (long long)wrong);
    free(want_inv), free(got_inv), free(want), free(got);
}

/* Every quantisation kernel against fp8.h on x[R, C] (with outliers): the codes the GEMMs read as x [R, C] (summed
 * over C) and as x^T [C, R] (summed over R). */
static void check_quantize(int R, int C)
{
    int64_t n = (int64_t)R * C;
    uint16_t *xb = (uint16_t *)malloc_check(n * 2, "x");
    float *x = (float *)malloc_check(n * 4, "x f"), *xt = (float *)malloc_check(n * 4, "x^T");
    fill_bf16(xb, x, n, 3.0f);
    for (int64_t i = 0; i < n; i += 389) /* outliers: a few blocks get larger scales */
        xb[i] ^= 0x0200, x[i] = bf16_float(xb[i]);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            xt[(int64_t)c * R + r] = x[(int64_t)r * C + c];
    bf16 *dx = (bf16 *)dev_upload(xb, n * 2);
    uint8_t *dq = (uint8_t *)dev_alloc(n), *dq_t = (uint8_t *)dev_alloc(n);
    float *amax = (float *)dev_alloc(4 * (size_t)(n + 128)), *inv = (float *)dev_alloc(4 * (size_t)(n + 128)),
          *inv_t = (float *)dev_alloc(4 * (size_t)(n + 128));
    char what[96];
    for (int f = FP8_E4M3; f <= FP8_E5M2; f++) {
        Fp8Format fmt = (Fp8Format)f;
        fp8_amax(amax, dx, n, 0);
        fp8_quantize(dq, inv, dx, amax, n, fmt, 0);
        snprintf(what, sizeof(what), "%s per tensor [%d, %d]", FORMAT_NAMES[f], R, C);
        check_codes(what, dq, inv, x, R, C, SCALE_TENSOR, fmt);
        if (R % 16 == 0 && C % 16 == 0) { /* ZeRO 3's gathered codes: x^T's by moving bytes, the scale from amax */
            poison(dq_t, n);
            fp8_transpose_codes(dq_t, dq, R, C, 0);
            fp8_inv_scales(inv_t, 4, amax, 1, fmt, 0);
            snprintf(what, sizeof(what), "%s per tensor, the codes transposed as bytes [%d, %d]", FORMAT_NAMES[f], C,
                     R);
            check_codes(what, dq_t, inv_t, xt, C, R, SCALE_TENSOR, fmt);
        }
        poison(dq, n), poison(dq_t, n);
        fp8_quantize_transposed(dq_t, inv_t, dq, inv, dx, amax, R, C, FP8_T_TENSOR, fmt, 0);
        snprintf(what, sizeof(what), "%s per tensor, transposed [%d, %d]", FORMAT_NAMES[f], C, R);
        check_codes(what, dq_t, inv_t, xt, C, R, SCALE_TENSOR, fmt);
        snprintf(what, sizeof(what), "%s per tensor, plain beside the transposed [%d, %d]", FORMAT_NAMES[f], R, C);
        check_codes(what, dq, inv, x, R, C, SCALE_TENSOR, fmt);
        poison(dq_t, n); /* the transposed codes alone (linear.h's x^T for the weight gradient) */
        fp8_quantize_transposed(dq_t, inv_t, NULL, NULL, dx, amax, R, C, FP8_T_TENSOR, fmt, 0);
        snprintf(what, sizeof(what), "%s per tensor, transposed alone [%d, %d]", FORMAT_NAMES[f], C, R);
        check_codes(what, dq_t, inv_t, xt, C, R, SCALE_TENSOR, fmt);
    }
    Fp8Format e4 = FP8_E4M3;
    for (int per_128 = 0; per_128 < 2; per_128++) {
        poison(dq, n);
        fp8_quantize_rows(dq, inv, dx, R, C, per_128, e4, 0);
        snprintf(what, sizeof(what), "E4M3 per %s [%d, %d]", per_128 ? "1x128 block" : "row", R, C);
        check_codes(what, dq, inv, x, R, C, per_128 ? SCALE_1x128 : SCALE_ROW, e4);
    }
    poison(dq_t, n);
    fp8_amax_blocks(amax, dx, R, C, 0, 0);
    fp8_quantize_transposed(dq_t, inv_t, NULL, NULL, dx, amax, R, C, FP8_T_COLUMNS, e4, 0);
    snprintf(what, sizeof(what), "E4M3 per column, transposed [%d, %d]", C, R);
    check_codes(what, dq_t, inv_t, xt, C, R, SCALE_ROW, e4);
    poison(dq_t, n);
    fp8_quantize_transposed(dq_t, inv_t, NULL, NULL, dx, NULL, R, C, FP8_T_COLUMN_BLOCKS, e4, 0);
    snprintf(what, sizeof(what), "E4M3 per 128 x 1 block, transposed [%d, %d]", C, R);
    check_codes(what, dq_t, inv_t, xt, C, R, SCALE_1x128, e4);
    poison(dq, n), poison(dq_t, n);
    fp8_amax_blocks(amax, dx, R, C, 1, 0);
    fp8_quantize_transposed(dq_t, inv_t, dq, inv, dx, amax, R, C, FP8_T_BLOCKS, e4, 0);
    snprintf(what, sizeof(what), "E4M3 per 128 x 128 block, transposed [%d, %d]", C, R);
    check_codes(what, dq_t, inv_t, xt, C, R, SCALE_128x128, e4);
    snprintf(what, sizeof(what), "E4M3 per 128 x 128 block, plain [%d, %d]", R, C);
    check_codes(what, dq, inv, x, R, C, SCALE_128x128, e4);
    free(xb), free(x), free(xt);
    cuda_free(dx), cuda_free(dq), cuda_free(dq_t), cuda_free(amax), cuda_free(inv), cuda_free(inv_t);
}

/* ref[M, Nc] = sum over K-blocks of k_block (their scales' product times the block's sum over the exact fp8 values,
 * in double), plus before[] when not NULL (accumulate). Bound per element: half a bf16 ulp of the output, plus 2^-10
 * of sum |x y|: Hopper's FP8 tensor cores add a K-block of products with fewer bits than fp32 (cuBLASLt sums the
 * blocks in fp32), so the sum errs by a small fraction of the magnitudes summed, not of the (cancelling) result; with
 * accumulate, half a bf16 ulp more for the rounding of the product before the addition. With fast accumulation
 * (fast != 0) the whole sum over K stays in those fewer bits, never promoted: at K = 16384 it erred by 1.22 x 2^-10
 * of sum |x y| (seed 567316280222), so 2^-9 there: 1.6x that, and a wrong scale still errs by the result itself. */
static void reference_gemm(float *ref, float *bound, const uint8_t *qx, Fp8Format x_format, const ScaleMap *sx,
                           const uint8_t *qy, const ScaleMap *sy, int M, int K, int Nc, int k_block,
                           const float *before, int fast)
{
    const double mag_bound = fast ? 0x1p-9 : 0x1p-10;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < Nc; j++) {
            double sum = 0.0, mag = 0.0;
            for (int k0 = 0; k0 < K; k0 += k_block) {
                double s = 0.0, a = 0.0, scale = (double)scale_at(sx, i, k0 / k_block) * scale_at(sy, j, k0 / k_block);
                for (int k = k0; k < k0 + k_block && k < K; k++) {
                    double p = (double)fp8_to_float(qx[(int64_t)i * K + k], x_format) *
                               fp8_to_float(qy[(int64_t)j * K + k], FP8_E4M3);
                    s += p;
                    a += fabs(p);
                }
                sum += s * scale;
                mag += a * scale;
            }
            double want = sum + (before ? before[(int64_t)i * Nc + j] : 0.0);
            ref[(int64_t)i * Nc + j] = (float)want;
            bound[(int64_t)i * Nc + j] =
                (float)(BF16_ROUNDING * (fabs(want) + (before ? fabs(sum) : 0.0)) + mag_bound * mag) + 1e-30f;
        }
}

/* The scale orders of x and y under each FP8 kind of matmul_fp8, and the K-block the sums are scaled by. */
static void kind_maps(int kind, int *x_map, int *y_map, int *blocked)
{
    *x_map = kind == MATMUL_FP8_ROW ? SCALE_ROW : kind >= MATMUL_FP8_BLOCK ? SCALE_1x128 : SCALE_TENSOR;
    *y_map = kind == MATMUL_FP8_BLOCK ? SCALE_128x128 : *x_map;
    *blocked = kind >= MATMUL_FP8_BLOCK;
}

/* One kind's GEMM on host-made codes (x in x_format, y E4M3, with outliers; with accumulate, added to a random bf16
 * output) against reference_gemm. */
static void check_gemm(int kind, Fp8Format x_format, int accumulate, int M, int K, int Nc)
{
    int64_t nx = (int64_t)M * K, ny = (int64_t)Nc * K, nd = (int64_t)M * Nc;
    uint16_t *xb = (uint16_t *)malloc_check(nx * 2, "x"), *yb = (uint16_t *)malloc_check(ny * 2, "y"),
             *ob = (uint16_t *)malloc_check(nd * 2, "out");
    float *x = (float *)malloc_check(nx * 4, "xf"), *y = (float *)malloc_check(ny * 4, "yf"),
          *before = (float *)malloc_check(nd * 4, "before");
    fill_bf16(xb, x, nx, 1.0f);
    fill_bf16(yb, y, ny, 0.05f);
    fill_bf16(ob, before, nd, 1.0f);
    for (int64_t i = 0; i < nx; i += 389)
        x[i] *= 30.0f;
    for (int64_t i = 0; i < ny; i += 1013)
        y[i] *= 30.0f;
    int x_map, y_map, blocked;
    kind_maps(kind, &x_map, &y_map, &blocked);
    float *hsx = (float *)calloc_check((size_t)nx + 4, 4, "sx"), *hsy = (float *)calloc_check((size_t)ny + 4, 4, "sy");
    ScaleMap mx = scale_map(x_map, hsx, M, K), my = scale_map(y_map, hsy, Nc, K);
    uint8_t *hqx = (uint8_t *)malloc_check(nx, "qx"), *hqy = (uint8_t *)malloc_check(ny, "qy");
    quantize_host(hqx, x, M, K, &mx, x_format);
    quantize_host(hqy, y, Nc, K, &my, FP8_E4M3);
    uint8_t *qx = (uint8_t *)dev_upload(hqx, nx), *qy = (uint8_t *)dev_upload(hqy, ny);
    float *sx = (float *)dev_upload(hsx, 4 * (size_t)scale_count(&mx, M, K)),
          *sy = (float *)dev_upload(hsy, 4 * (size_t)scale_count(&my, Nc, K));
    bf16 *dout = (bf16 *)dev_upload(ob, nd * 2);
    if (!accumulate)
        poison(dout, nd * 2);
    matmul_fp8(dout, qx, x_format, qy, sx, sy, M, K, Nc, accumulate, kind, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    download(ob, dout, nd * 2);
    float *got = (float *)malloc_check(nd * 4, "got"), *ref = (float *)malloc_check(nd * 4, "ref"),
          *bound = (float *)malloc_check(nd * 4, "bound");
    bf16_to_float(got, ob, nd);
    reference_gemm(ref, bound, hqx, x_format, &mx, hqy, &my, M, K, Nc, blocked ? 128 : K, accumulate ? before : NULL,
                   kind == MATMUL_FP8_FAST);
    char what[128];
    snprintf(what, sizeof(what), "fp8 GEMM, %s, %s x E4M3%s, M %d K %d N %d", MATMUL_KIND_NAMES[kind],
             FORMAT_NAMES[x_format], accumulate ? ", +=" : "", M, K, Nc);
    check_within(what, got, ref, bound, nd);
    free(xb), free(yb), free(ob), free(x), free(y), free(before), free(hqx), free(hqy), free(hsx), free(hsy), free(got),
        free(ref), free(bound);
    cuda_free(qx), cuda_free(qy), cuda_free(sx), cuda_free(sy), cuda_free(dout);
}

/* ---- timing ---- */

typedef struct {
    int M, K, Nc, kind;
    bf16 *x, *y, *out;
    uint8_t *qx, *qy;
    float *sx, *sy, *amax;
} Bench;

static void run_bf16(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    matmul_forward(b->out, b->x, b->y, b->M, b->K, b->Nc, 0);
}
static void run_fp8(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    matmul_fp8(b->out, b->qx, FP8_E4M3, b->qy, b->sx, b->sy, b->M, b->K, b->Nc, 0, b->kind, 0);
}
static void run_quantize(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    fp8_amax(b->amax, b->x, (int64_t)b->M * b->K, 0);
    fp8_quantize(b->qx, b->sx, b->x, b->amax, (int64_t)b->M * b->K, FP8_E4M3, 0);
}
static void run_quantize_t(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    fp8_quantize_transposed(b->qx, b->sx, NULL, NULL, b->x, b->amax, b->M, b->K, FP8_T_TENSOR, FP8_E4M3, 0);
}
static void run_quantize_rows(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    fp8_quantize_rows(b->qx, b->sx, b->x, b->M, b->K, 1, FP8_E4M3, 0);
}
static void run_quantize_t_blocks(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    fp8_quantize_transposed(b->qx, b->sx, NULL, NULL, b->x, NULL, b->M, b->K, FP8_T_COLUMN_BLOCKS, FP8_E4M3, 0);
}

/* The FP8 kinds timed, and what they stand for. */
static const int BENCH_KINDS[] = {MATMUL_FP8, MATMUL_FP8_FAST, MATMUL_FP8_ROW, MATMUL_FP8_BLOCK, MATMUL_FP8_BLOCK_1D};
#define N_BENCH_KINDS ((int)(sizeof(BENCH_KINDS) / sizeof(BENCH_KINDS[0])))

static void bench_shape(const char *name, int M, int K, int Nc, double *sum_bf16, double *sum_fp8)
{
    Bench b;
    memset(&b, 0, sizeof(b));
    b.M = M, b.K = K, b.Nc = Nc;
    int64_t nx = (int64_t)M * K, ny = (int64_t)Nc * K, nd = (int64_t)M * Nc;
    uint16_t *h = (uint16_t *)malloc_check((nx > ny ? nx : ny) * 2, "fill");
    float *hf = (float *)malloc_check((nx > ny ? nx : ny) * 4, "fill f");
    fill_bf16(h, hf, nx, 1.0f);
    b.x = (bf16 *)dev_upload(h, nx * 2);
    fill_bf16(h, hf, ny, 0.05f);
    b.y = (bf16 *)dev_upload(h, ny * 2);
    b.out = (bf16 *)dev_alloc(nd * 2);
    b.qx = (uint8_t *)dev_alloc(nx), b.qy = (uint8_t *)dev_alloc(ny);
    /* room for any kind's scales; their values do not change the time */
    int64_t ns = (nx > ny ? nx : ny) / 128 + M + Nc;
    for (int64_t i = 0; i < ns; i++)
        hf[i] = 1.0f / 64.0f;
    b.sx = (float *)dev_upload(hf, ns * 4), b.sy = (float *)dev_upload(hf, ns * 4), b.amax = (float *)dev_alloc(4);
    double flops = 2.0 * M * K * Nc;
    float bf16_ms = bench_median_ms(run_bf16, &b, 1), ms[N_BENCH_KINDS];
    char line[512];
    int at = snprintf(line, sizeof(line), "BENCH %-18s M %6d K %6d N %6d  bf16 %7.3f ms (%4.0f TFLOP/s)", name, M, K,
                      Nc, bf16_ms, flops / bf16_ms / 1e9);
    for (int i = 0; i < N_BENCH_KINDS; i++) {
        b.kind = BENCH_KINDS[i];
        ms[i] = bench_median_ms(run_fp8, &b, 1);
        at += snprintf(line + at, sizeof(line) - at, " | %s %.3f ms (%.2fx)", MATMUL_KIND_NAMES[b.kind], ms[i],
                       bf16_ms / ms[i]);
    }
    fp8_amax(b.amax, b.x, nx, 0);
    float q_ms = bench_median_ms(run_quantize, &b, 1), qt_ms = bench_median_ms(run_quantize_t, &b, 1),
          qr_ms = bench_median_ms(run_quantize_rows, &b, 1), qtb_ms = bench_median_ms(run_quantize_t_blocks, &b, 1);
    printf("%s\n      quantise X (%.0f MB): amax+codes %.3f ms (%.2f TB/s), transposed %.3f ms (%.2f TB/s), 1x128 "
           "%.3f ms (%.2f TB/s), 128x1 transposed %.3f ms (%.2f TB/s)\n",
           line, nx * 2 / 1e6, q_ms, nx * 5 / q_ms / 1e9, qt_ms, nx * 3 / qt_ms / 1e9, qr_ms, nx * 3 / qr_ms / 1e9,
           qtb_ms, nx * 3 / qtb_ms / 1e9);
    sum_bf16[0] += bf16_ms;
    for (int i = 0; i < N_BENCH_KINDS; i++)
        sum_fp8[i] += ms[i];
    free(h), free(hf);
    cuda_free(b.x), cuda_free(b.y), cuda_free(b.out), cuda_free(b.qx), cuda_free(b.qy), cuda_free(b.sx),
        cuda_free(b.sy), cuda_free(b.amax);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "fp8_matmul_check");
    int bench = 1;
    for (int i = 1; i < argc; i++)
        bench &= strcmp(argv[i], "--no-bench") != 0;
    matmul_setup();
    check_quantize(256, 384);
    check_quantize(384, 160);
    check_quantize(132, 88); /* edge tiles: 4 rows and 24 columns past whole ones, part blocks (per tensor too: the
                                float tile's kernel, 132 not a multiple of 16) */
    check_quantize(208, 80); /* part tiles of 64 (the codes transpose, the per-tensor kernel): 16 rows, 16 columns */
    check_quantize(96, 48);  /* per tensor: one part tile of 64 in each direction, 32 rows and 48 columns of it */
    for (int kind = MATMUL_FP8; kind < MATMUL_KINDS; kind++) {
        check_gemm(kind, FP8_E4M3, 0, 256, 512, 384);
        check_gemm(kind, FP8_E4M3, 1, 128, 640, 256);
    }
    check_gemm(MATMUL_FP8, FP8_E4M3, 0, 128, 256, 192);
    check_gemm(MATMUL_FP8_ROW, FP8_E4M3, 0, 144, 96, 208);     /* edge tiles */
    check_gemm(MATMUL_FP8_BLOCK, FP8_E4M3, 0, 128, 384, 640);  /* 3 K-blocks: their scales padded to 4 */
    check_gemm(MATMUL_FP8_FAST, FP8_E4M3, 0, 128, 16384, 256); /* the longest sum of a forward GEMM here */
    check_gemm(MATMUL_FP8_ROW, FP8_E4M3, 0, 128, 16384, 256);
    /* per tensor the backward GEMMs take gradients in E5M2 against E4M3 codes, added to over micro-steps */
    check_gemm(MATMUL_FP8, FP8_E5M2, 0, 256, 2048, 384);
    check_gemm(MATMUL_FP8, FP8_E5M2, 1, 128, 512, 256);
    if (bench) {
        /* Llama 3.2 1B at B=8, T=2048: N tokens; each layer's Linear (in -> out) gives three GEMMs */
        int N = 16384;
        struct {
            const char *name;
            int in, out;
        } lin[4] = {{"qkv", 2048, 3072}, {"o", 2048, 2048}, {"gate_up", 2048, 16384}, {"down", 8192, 2048}};
        double t_bf16 = 0.0, t_fp8[N_BENCH_KINDS] = {0};
        for (int i = 0; i < 4; i++) {
            char name[40];
            snprintf(name, sizeof(name), "%s forward", lin[i].name);
            bench_shape(name, N, lin[i].in, lin[i].out, &t_bf16, t_fp8);
            snprintf(name, sizeof(name), "%s bwd input", lin[i].name);
            bench_shape(name, N, lin[i].out, lin[i].in, &t_bf16, t_fp8);
            snprintf(name, sizeof(name), "%s bwd weight", lin[i].name);
            bench_shape(name, lin[i].out, N, lin[i].in, &t_bf16, t_fp8);
        }
        printf("BENCH one layer's 12 GEMMs (quantisation not included): bf16 %.3f ms", t_bf16);
        for (int i = 0; i < N_BENCH_KINDS; i++)
            printf(" | %s %.3f ms (%.2fx)", MATMUL_KIND_NAMES[BENCH_KINDS[i]], t_fp8[i], t_bf16 / t_fp8[i]);
        printf("\n");
    }
    matmul_teardown();
    return check_summary();
}
