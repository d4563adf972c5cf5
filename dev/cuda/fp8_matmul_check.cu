/*
 * fp8_matmul_check.cu: checks llmc/fp8_quantize.h and matmul.h's matmul_fp8
 * (issue #15), and measures them. FP8 GEMMs (bf16 out) in the one operand
 * layout Hopper's FP8 kernels take, both operands contiguous along K:
 *     out[M, Nc] = sa * sb * X[M, K] @ Y[Nc, K]^T        (row-major, as matmul.h's forward)
 * with three scaling recipes:
 *     tensor  one fp32 dequantisation scale per operand: matmul_fp8, X in
 *             E4M3 or E5M2 (gradients), Y in E4M3; with and without fast
 *             accumulation
 *     row     one per row of X and one per row of Y (cuBLASLt's
 *             MATRIX_SCALE_OUTER_VEC_32F): an experiment of this file only
 *     block   one per 1 x 128 block of X and per 128 x 128 block of Y
 *             (VEC128_32F, BLK128x128_32F; quantised on the host): an
 *             experiment of this file only, timed where cuBLASLt runs it
 * and the quantisation a step adds: the amax of a bf16 tensor, then its codes
 * at scale fp8_max / amax (llmc/fp8.h's rule), straight and transposed (the
 * backward GEMMs need X^T and dY^T contiguous along the token axis).
 *
 * Checks (small shapes, fresh random inputs): the GPU's codes against fp8.h
 * bit for bit, both formats; each recipe's GEMM, and matmul_fp8 accumulating
 * into its output, against the CPU's sum over the exact fp8 values in double. Timing (the Llama 3.2 1B's layer GEMMs at
 * B=8, T=2048: forward, backward-input and backward-weight shapes of qkv, o, gate/up and down, all in the K-contiguous
 * form): the bf16 GEMM of llmc/matmul.h against each FP8 recipe, and the quantisation kernels, each the median of
 * BENCH_RUNS runs (check_common.h). Prints one BENCH line per shape.
 *
 *   ./fp8_matmul_check [--seed N] [--no-bench]
 */
#include <cuda_fp8.h>

#include "check_common.h"
#include "llmc/fp8.h"
#include "llmc/fp8_quantize.h"
#include "llmc/matmul.h"

/* ---- the per-row recipe (an experiment: the trainer quantises per tensor, llmc/fp8_quantize.h) ---- */

/* Per-row scales of x[R, C]: inv_scale[r] = amax_r / 448 and q[r, :] = e4m3(x[r, :] * 448 / amax_r); one warp a row. */
__global__ void quantize_rows_kernel(uint8_t *q, float *inv_scale, const bf16 *x, int R, int C)
{
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (r >= R)
        return;
    const bf16 *row = x + (int64_t)r * C;
    float m = 0.0f;
    for (int c = lane; c < C; c += 32)
        m = fmaxf(m, fabsf(__bfloat162float(row[c])));
    for (int off = 16; off > 0; off /= 2)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float scale = fp8_scale_from_amax(m, FP8_E4M3);
    if (lane == 0)
        inv_scale[r] = 1.0f / scale;
    for (int c = lane; c < C; c += 32)
        q[(int64_t)r * C + c] = fp8_code(__bfloat162float(row[c]) * scale, FP8_E4M3);
}

/* codes and inv_scale[0] of x[n] per tensor, E4M3 or E5M2 (llmc/fp8_quantize.h) */
static void quantize_tensor(uint8_t *q, float *inv_scale, float *amax, const bf16 *x, int64_t n, Fp8Format f)
{
    fp8_amax(amax, x, n, 0);
    fp8_quantize(q, inv_scale, x, amax, n, f, 0);
}

/* ---- the per-row and block recipes' GEMM: out[M, Nc] = X[M, K] @ Y[Nc, K]^T with scales per row of X and Y
 * (sx[m], sy[n]), or per 1 x 128 block of X and 128 x 128 block of Y ---- */

typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    int found; /* 0: cuBLASLt has no algorithm for it */
} RowGemm;

/* cuBLASLt's A is Y (op T), its B is X, so its row scales are Y's (Nc of them) and its column scales X's (M). */
static RowGemm scaled_gemm_plan(int M, int K, int Nc, const float *sx, const float *sy, int32_t x_mode, int32_t y_mode)
{
    RowGemm g;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &y_mode, sizeof(y_mode)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &x_mode, sizeof(x_mode)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sy, sizeof(sy)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof(sx)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_8F_E4M3, K, Nc, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_8F_E4M3, K, M, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_16BF, Nc, M, Nc));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = MATMUL_WORKSPACE_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t h;
    g.found = 0;
    /* a scale mode cuBLASLt does not take on this GPU comes back as NOT_SUPPORTED or no algorithm: say so, go on */
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(matmul_handle, g.desc, g.a, g.b, g.d, g.d, pref, 1, &h, &g.found);
    if (st != CUBLAS_STATUS_SUCCESS)
        g.found = 0;
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    g.algo = h.algo;
    return g;
}

static RowGemm row_gemm_plan(int M, int K, int Nc, const float *sx, const float *sy)
{
    RowGemm g = scaled_gemm_plan(M, K, Nc, sx, sy, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
                                 CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
    if (!g.found)
        FAIL("cuBLASLt has no per-row-scaled FP8 algorithm for M %d, K %d, N %d", M, K, Nc);
    return g;
}

/* out (= or += when accumulate) the scaled product; the status, for scale modes this GPU may not take */
static cublasStatus_t row_gemm_try(const RowGemm *g, bf16 *out, const uint8_t *x, const uint8_t *y, int accumulate)
{
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return cublasLtMatmul(matmul_handle, g->desc, &one, y, g->a, x, g->b, &beta, out, g->d, out, g->d, &g->algo,
                          matmul_workspace, MATMUL_WORKSPACE_BYTES, 0);
}

static void row_gemm_free(RowGemm *g)
{
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->d));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(g->desc));
}

static void quantize_rows(uint8_t *q, float *inv_scale, const bf16 *x, int R, int C)
{
    quantize_rows_kernel<<<ceil_div(R, 8), 256>>>(q, inv_scale, x, R, C);
    CUDA_CHECK_LAST();
}

/* ---- checks ---- */

static const char *FORMAT_NAMES[2] = {"E4M3", "E5M2"};

/* The GPU's codes against fp8.h's on the host: per tensor (both formats), transposed, and per row. */
static void check_quantize(int R, int C)
{
    int64_t n = (int64_t)R * C;
    uint16_t *xb = (uint16_t *)malloc_check(n * 2, "x");
    float *x = (float *)malloc_check(n * 4, "x f");
    fill_bf16(xb, x, n, 3.0f);
    bf16 *dx = (bf16 *)dev_upload(xb, n * 2);
    uint8_t *dq = (uint8_t *)dev_alloc(n), *dq2 = (uint8_t *)dev_alloc(n), *got = (uint8_t *)malloc_check(n, "got"),
            *want = (uint8_t *)malloc_check(n, "want");
    float *damax = (float *)dev_alloc(4), *dinv = (float *)dev_alloc(4 * (size_t)R), amax = 0.0f, inv;
    for (int64_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    for (int f = FP8_E4M3; f <= FP8_E5M2; f++) {
        Fp8Format fmt = (Fp8Format)f;
        quantize_tensor(dq, dinv, damax, dx, n, fmt);
        download(got, dq, n);
        download(&inv, dinv, 4);
        float scale = fp8_scale_from_amax(amax, fmt);
        for (int64_t i = 0; i < n; i++)
            want[i] = fp8_from_float(x[i] * scale, fmt);
        check(inv == 1.0f / scale, "%s per-tensor dequantisation scale %.8g (want %.8g)", FORMAT_NAMES[f], inv,
              1.0f / scale);
        char what[64];
        snprintf(what, sizeof(what), "%s per-tensor codes against fp8.h", FORMAT_NAMES[f]);
        check_identical(what, got, want, n);
        CUDA_CHECK(cudaMemset(dq, 0, (size_t)n));
        fp8_quantize_transposed(dq, NULL, NULL, dx, damax, R, C, fmt, 0);
        download(got, dq, n);
        int64_t wrong = 0;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                wrong += got[(int64_t)c * R + r] != want[(int64_t)r * C + c];
        check(wrong == 0, "%s transposed codes against fp8.h (%lld wrong)", FORMAT_NAMES[f], (long long)wrong);
        /* both layouts from one pass: the plain codes as fp8_quantize's */
        CUDA_CHECK(cudaMemset(dq, 0, (size_t)n));
        fp8_quantize_transposed(dq2, dq, NULL, dx, damax, R, C, fmt, 0);
        download(got, dq, n);
        snprintf(what, sizeof(what), "%s plain codes beside the transposed", FORMAT_NAMES[f]);
        check_identical(what, got, want, n);
    }
    quantize_rows(dq, dinv, dx, R, C);
    download(got, dq, n);
    float *got_inv = (float *)malloc_check(4 * (size_t)R, "inv");
    download(got_inv, dinv, 4 * (size_t)R);
    int64_t wrong = 0;
    for (int r = 0; r < R; r++) {
        float m = 0.0f;
        for (int c = 0; c < C; c++)
            m = fmaxf(m, fabsf(x[(int64_t)r * C + c]));
        float s = fp8_scale_from_amax(m, FP8_E4M3);
        wrong += got_inv[r] != 1.0f / s;
        for (int c = 0; c < C; c++)
            wrong += got[(int64_t)r * C + c] != fp8_from_float(x[(int64_t)r * C + c] * s, FP8_E4M3);
    }
    check(wrong == 0, "per-row E4M3 codes and scales against fp8.h (%lld wrong)", (long long)wrong);
    free(xb), free(x), free(got), free(want), free(got_inv);
    cuda_free(dx), cuda_free(dq), cuda_free(dq2), cuda_free(damax), cuda_free(dinv);
}

/* How an operand's dequantisation scales map onto its [R, K] codes: element (r, k) takes
 * s[(r / rows) * row_stride + (k / k_block) * kb_stride] (strides 0: one scale for all). */
typedef struct {
    const float *s;
    int rows, k_block;
    int64_t row_stride, kb_stride;
} ScaleMap;

static inline float scale_at(const ScaleMap *m, int r, int kb)
{
    return m->s[(int64_t)(r / m->rows) * m->row_stride + (int64_t)kb * m->kb_stride];
}

/* ref[M, Nc] = sum over K-blocks of k_block (their scales' product times the block's sum over the exact fp8 values,
 * in double), plus before[] when not NULL (accumulate). Bound per element: half a bf16 ulp of the output, plus 2^-10
 * of sum |x y|: Hopper's FP8 tensor cores add a K-block of products with fewer bits than fp32 (cuBLASLt sums the
 * blocks in fp32), so the sum errs by a small fraction of the magnitudes summed, not of the (cancelling) result; with
 * accumulate, half a bf16 ulp more for the rounding of the product before the addition. */
static void reference_gemm(float *ref, float *bound, const uint8_t *qx, Fp8Format x_format, const ScaleMap *sx,
                           const uint8_t *qy, const ScaleMap *sy, int M, int K, int Nc, int k_block,
                           const float *before)
{
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
                (float)(BF16_ROUNDING * (fabs(want) + (before ? fabs(sum) : 0.0)) + 0x1p-10 * mag) + 1e-30f;
        }
}

/* RECIPE_TENSOR_FAST: per-tensor scales with fast accumulation (linear.h's forward GEMMs) */
enum { RECIPE_TENSOR, RECIPE_TENSOR_FAST, RECIPE_ROW, RECIPES };
static const char *RECIPE_NAMES[RECIPES] = {"tensor", "tensor, fast accumulation,", "row"};

/* One recipe's GEMM against reference_gemm (x in x_format, y E4M3; with accumulate, added to a random bf16
 * output). */
static void check_gemm(int recipe, Fp8Format x_format, int accumulate, int M, int K, int Nc)
{
    int64_t nx = (int64_t)M * K, ny = (int64_t)Nc * K, nd = (int64_t)M * Nc;
    uint16_t *xb = (uint16_t *)malloc_check(nx * 2, "x"), *yb = (uint16_t *)malloc_check(ny * 2, "y"),
             *ob = (uint16_t *)malloc_check(nd * 2, "out");
    float *x = (float *)malloc_check(nx * 4, "xf"), *y = (float *)malloc_check(ny * 4, "yf"),
          *before = (float *)malloc_check(nd * 4, "before");
    fill_bf16(xb, x, nx, 1.0f);
    fill_bf16(yb, y, ny, 0.05f);
    fill_bf16(ob, before, nd, 1.0f);
    bf16 *dx = (bf16 *)dev_upload(xb, nx * 2), *dy = (bf16 *)dev_upload(yb, ny * 2),
         *dout = (bf16 *)dev_upload(ob, nd * 2);
    uint8_t *qx = (uint8_t *)dev_alloc(nx), *qy = (uint8_t *)dev_alloc(ny);
    float *sx = (float *)dev_alloc(4 * (size_t)M), *sy = (float *)dev_alloc(4 * (size_t)Nc),
          *amax = (float *)dev_alloc(4);
    if (!accumulate)
        poison(dout, nd * 2);
    if (recipe == RECIPE_ROW) {
        quantize_rows(qx, sx, dx, M, K);
        quantize_rows(qy, sy, dy, Nc, K);
        RowGemm g = row_gemm_plan(M, K, Nc, sx, sy);
        CUBLAS_CHECK(row_gemm_try(&g, dout, qx, qy, accumulate));
        row_gemm_free(&g);
    } else {
        quantize_tensor(qx, sx, amax, dx, nx, x_format);
        quantize_tensor(qy, sy, amax, dy, ny, FP8_E4M3);
        matmul_fp8(dout, qx, x_format, qy, sx, sy, M, K, Nc, accumulate, recipe == RECIPE_TENSOR_FAST, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    uint8_t *hqx = (uint8_t *)malloc_check(nx, "qx"), *hqy = (uint8_t *)malloc_check(ny, "qy");
    int per_row = recipe == RECIPE_ROW;
    float *hsx = (float *)malloc_check(4 * (size_t)M, "sx"), *hsy = (float *)malloc_check(4 * (size_t)Nc, "sy");
    download(hqx, qx, nx), download(hqy, qy, ny);
    download(hsx, sx, 4 * (size_t)(per_row ? M : 1)), download(hsy, sy, 4 * (size_t)(per_row ? Nc : 1));
    download(ob, dout, nd * 2);
    float *got = (float *)malloc_check(nd * 4, "got"), *ref = (float *)malloc_check(nd * 4, "ref"),
          *bound = (float *)malloc_check(nd * 4, "bound");
    bf16_to_float(got, ob, nd);
    ScaleMap mx = {hsx, 1, K, per_row, 0}, my = {hsy, 1, K, per_row, 0};
    reference_gemm(ref, bound, hqx, x_format, &mx, hqy, &my, M, K, Nc, K, accumulate ? before : NULL);
    char what[112];
    snprintf(what, sizeof(what), "fp8 GEMM, %s scales, %s x E4M3%s, M %d K %d N %d", RECIPE_NAMES[recipe],
             FORMAT_NAMES[x_format], accumulate ? ", +=" : "", M, K, Nc);
    check_within(what, got, ref, bound, nd);
    free(xb), free(yb), free(ob), free(x), free(y), free(before), free(hqx), free(hqy), free(hsx), free(hsy), free(got),
        free(ref), free(bound);
    cuda_free(dx), cuda_free(dy), cuda_free(dout), cuda_free(qx), cuda_free(qy), cuda_free(sx), cuda_free(sy),
        cuda_free(amax);
}

/* ---- the block recipe (DeepSeek-V3's: 1 x 128 blocks of activations, 128 x 128 of weights; cuBLASLt's
 * VEC128_32F and BLK128x128_32F; the weight gradient's GEMM takes 1 x 128 blocks of both): quantised on the host
 * here, for the GEMM's check and timing only ---- */

/* Scale tensors come in one of two orders per operand: 0 = the K blocks of a row (or row block) next to each other,
 * 1 = the rows (row blocks) next to each other. cublasLt.h does not say which cuBLASLt reads: check_block_gemm tries
 * the four pairs and says which one matched (the timing does not depend on it). */
static int block_gemm_checked = 0;

static ScaleMap block_scale_map(const float *s, int R, int K, int rows, int order)
{
    int64_t row_blocks = ceil_div(R, rows), kb_n = ceil_div(K, 128);
    ScaleMap m = {s, rows, 128, order ? 1 : kb_n, order ? row_blocks : 1};
    return m;
}

/* codes[R, K] and dequantisation scales of x in blocks of m->rows x 128, E4M3, the scales where m says. */
static void quantize_blocks_host(uint8_t *codes, float *inv, const float *x, int R, int K, const ScaleMap *m)
{
    for (int r0 = 0; r0 < R; r0 += m->rows)
        for (int k0 = 0; k0 < K; k0 += 128) {
            float a = 0.0f;
            for (int r = r0; r < r0 + m->rows && r < R; r++)
                for (int k = k0; k < k0 + 128 && k < K; k++)
                    a = fmaxf(a, fabsf(x[(int64_t)r * K + k]));
            float scale = fp8_scale_from_amax(a, FP8_E4M3);
            inv[(int64_t)(r0 / m->rows) * m->row_stride + (int64_t)(k0 / 128) * m->kb_stride] = 1.0f / scale;
            for (int r = r0; r < r0 + m->rows && r < R; r++)
                for (int k = k0; k < k0 + 128 && k < K; k++)
                    codes[(int64_t)r * K + k] = fp8_from_float(x[(int64_t)r * K + k] * scale, FP8_E4M3);
        }
}

/* The block recipe's GEMM (x in 1 x 128 blocks, y in 128 x 128, or with y_rows 1 in 1 x 128 too; with accumulate,
 * added to a random bf16 output) against reference_gemm, for each pair of scale orders; the first that holds is
 * the one cuBLASLt reads, kept for the timing. None holding fails. */
static void check_block_gemm(int y_rows, int accumulate, int M, int K, int Nc)
{
    int64_t nx = (int64_t)M * K, ny = (int64_t)Nc * K, nd = (int64_t)M * Nc;
    int64_t nsx = (int64_t)M * ceil_div(K, 128), nsy = (int64_t)ceil_div(Nc, y_rows) * ceil_div(K, 128);
    uint16_t *xb = (uint16_t *)malloc_check(nx * 2, "x"), *yb = (uint16_t *)malloc_check(ny * 2, "y"),
             *ob = (uint16_t *)malloc_check(nd * 2, "out");
    float *x = (float *)malloc_check(nx * 4, "xf"), *y = (float *)malloc_check(ny * 4, "yf"),
          *before = (float *)malloc_check(nd * 4, "before");
    fill_bf16(xb, x, nx, 1.0f);
    fill_bf16(yb, y, ny, 0.05f);
    fill_bf16(ob, before, nd, 1.0f);
    for (int64_t i = 0; i < nx; i += 389) /* outliers, so that blocks get different scales */
        x[i] *= 30.0f;
    for (int64_t i = 0; i < ny; i += 1013)
        y[i] *= 30.0f;
    uint8_t *hqx = (uint8_t *)malloc_check(nx, "qx"), *hqy = (uint8_t *)malloc_check(ny, "qy");
    float *hsx = (float *)malloc_check(nsx * 4, "sx"), *hsy = (float *)malloc_check(nsy * 4, "sy");
    float *got = (float *)malloc_check(nd * 4, "got"), *ref = (float *)malloc_check(nd * 4, "ref"),
          *bound = (float *)malloc_check(nd * 4, "bound");
    uint8_t *qx = (uint8_t *)dev_alloc(nx), *qy = (uint8_t *)dev_alloc(ny);
    float *sx = (float *)dev_alloc(nsx * 4), *sy = (float *)dev_alloc(nsy * 4);
    bf16 *dout = (bf16 *)dev_alloc(nd * 2);
    int32_t y_mode = y_rows == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    char what[128];
    snprintf(what, sizeof(what), "fp8 GEMM, 1x128 / %dx128 block scales%s, M %d K %d N %d", y_rows,
             accumulate ? ", +=" : "", M, K, Nc);
    int matched = 0;
    for (int order = 0; order < 4 && !matched; order++) {
        ScaleMap mx = block_scale_map(hsx, M, K, 1, order & 1), my = block_scale_map(hsy, Nc, K, y_rows, order >> 1);
        quantize_blocks_host(hqx, hsx, x, M, K, &mx);
        quantize_blocks_host(hqy, hsy, y, Nc, K, &my);
        CUDA_CHECK(cudaMemcpy(qx, hqx, nx, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(qy, hqy, ny, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(sx, hsx, nsx * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(sy, hsy, nsy * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dout, ob, nd * 2, cudaMemcpyHostToDevice));
        RowGemm g = scaled_gemm_plan(M, K, Nc, sx, sy, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, y_mode);
        cublasStatus_t st = g.found ? row_gemm_try(&g, dout, qx, qy, accumulate) : CUBLAS_STATUS_NOT_SUPPORTED;
        row_gemm_free(&g);
        if (st != CUBLAS_STATUS_SUCCESS) {
            printf("NOTE %s: not available here (%s): not checked, not timed\n", what, cublasLtGetStatusName(st));
            break;
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        uint16_t *hout = (uint16_t *)malloc_check(nd * 2, "out");
        download(hout, dout, nd * 2);
        bf16_to_float(got, hout, nd);
        free(hout);
        reference_gemm(ref, bound, hqx, FP8_E4M3, &mx, hqy, &my, M, K, Nc, 128, accumulate ? before : NULL);
        int64_t bad = 0;
        for (int64_t i = 0; i < nd; i++)
            bad += !(fabsf(got[i] - ref[i]) <= bound[i]);
        if (bad == 0 || order == 3) {
            matched = bad == 0;
            block_gemm_checked |= matched && y_rows == 128;
            char line[192];
            snprintf(line, sizeof(line), "%s (scale orders x %d, y %d%s)", what, order & 1, order >> 1,
                     matched ? "" : "; none of the four orders holds");
            check_within(line, got, ref, bound, nd);
        }
    }
    free(xb), free(yb), free(ob), free(x), free(y), free(before), free(hqx), free(hqy), free(hsx), free(hsy),
        free(got), free(ref), free(bound);
    cuda_free(qx), cuda_free(qy), cuda_free(sx), cuda_free(sy), cuda_free(dout);
}

/* ---- timing ---- */

typedef struct {
    int M, K, Nc;
    bf16 *x, *y, *out;
    uint8_t *qx, *qy;
    float *sx, *sy, *amax;
    RowGemm row;
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
    matmul_fp8(b->out, b->qx, FP8_E4M3, b->qy, b->sx, b->sy, b->M, b->K, b->Nc, 0, 0, 0);
}
static void run_fp8_fast(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    matmul_fp8(b->out, b->qx, FP8_E4M3, b->qy, b->sx, b->sy, b->M, b->K, b->Nc, 0, 1, 0);
}
static void run_fp8_rows(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    CUBLAS_CHECK(row_gemm_try(&b->row, b->out, b->qx, b->qy, 0));
}
static void run_quantize(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    quantize_tensor(b->qx, b->sx, b->amax, b->x, (int64_t)b->M * b->K, FP8_E4M3);
}
static void run_quantize_t(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    fp8_quantize_transposed(b->qx, NULL, NULL, b->x, b->amax, b->M, b->K, FP8_E4M3, 0);
}
static void run_quantize_rows(void *ctx, int set)
{
    Bench *b = (Bench *)ctx;
    (void)set;
    quantize_rows(b->qx, b->sx, b->x, b->M, b->K);
}

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
    b.sx = (float *)dev_alloc(4 * (size_t)M), b.sy = (float *)dev_alloc(4 * (size_t)Nc), b.amax = (float *)dev_alloc(4);
    double flops = 2.0 * M * K * Nc;
    float bf16_ms = bench_median_ms(run_bf16, &b, 1);
    quantize_tensor(b.qx, b.sx, b.amax, b.x, nx, FP8_E4M3);
    quantize_tensor(b.qy, b.sy, b.amax, b.y, ny, FP8_E4M3);
    float tensor_ms = bench_median_ms(run_fp8, &b, 1), fast_ms = bench_median_ms(run_fp8_fast, &b, 1);
    quantize_rows(b.qx, b.sx, b.x, M, K);
    quantize_rows(b.qy, b.sy, b.y, Nc, K);
    b.row = row_gemm_plan(M, K, Nc, b.sx, b.sy);
    float row_ms = bench_median_ms(run_fp8_rows, &b, 1);
    row_gemm_free(&b.row);
    float block_ms = 0.0f; /* the block recipe, where check_block_gemm passed; the scales' values do not matter here */
    if (block_gemm_checked) {
        int64_t nsx = (int64_t)M * (K / 128), nsy = (int64_t)ceil_div(Nc, 128) * (K / 128);
        float *ones = (float *)malloc_check((nsx > nsy ? nsx : nsy) * 4, "ones");
        for (int64_t i = 0; i < (nsx > nsy ? nsx : nsy); i++)
            ones[i] = 1.0f / 64.0f;
        float *bsx = (float *)dev_upload(ones, nsx * 4), *bsy = (float *)dev_upload(ones, nsy * 4);
        b.row = scaled_gemm_plan(M, K, Nc, bsx, bsy, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                                 CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
        if (b.row.found)
            block_ms = bench_median_ms(run_fp8_rows, &b, 1);
        row_gemm_free(&b.row);
        cuda_free(bsx), cuda_free(bsy), free(ones);
    }
    float q_ms = bench_median_ms(run_quantize, &b, 1), qt_ms = bench_median_ms(run_quantize_t, &b, 1),
          qr_ms = bench_median_ms(run_quantize_rows, &b, 1);
    printf("BENCH %-18s M %6d K %6d N %6d  bf16 %7.3f ms (%4.0f TFLOP/s)  fp8 tensor %7.3f ms (%4.0f, %.2fx)  "
           "fast acc. %7.3f ms (%4.0f, %.2fx)  row %7.3f ms (%4.0f, %.2fx)  block %7.3f ms (%.2fx)  | quantise X (%.0f "
           "MB): amax+codes %.3f ms (%.2f TB/s), transposed %.3f ms "
           "(%.2f TB/s), per row %.3f ms\n",
           name, M, K, Nc, bf16_ms, flops / bf16_ms / 1e9, tensor_ms, flops / tensor_ms / 1e9, bf16_ms / tensor_ms,
           fast_ms, flops / fast_ms / 1e9, bf16_ms / fast_ms, row_ms, flops / row_ms / 1e9, bf16_ms / row_ms, block_ms,
           block_ms > 0.0f ? bf16_ms / block_ms : 0.0, nx * 2 / 1e6, q_ms, nx * 5 / q_ms / 1e9, qt_ms,
           nx * 3 / qt_ms / 1e9, qr_ms);
    *sum_bf16 += bf16_ms;
    *sum_fp8 += tensor_ms;
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
    check_quantize(132, 88); /* edge tiles: 4 rows and 24 columns past whole ones */
    for (int r = 0; r < RECIPES; r++) {
        check_gemm(r, FP8_E4M3, 0, 128, 256, 192);
        check_gemm(r, FP8_E4M3, 0, 256, 2048, 384);
    }
    check_gemm(RECIPE_TENSOR_FAST, FP8_E4M3, 0, 128, 16384, 256); /* the longest sum of a forward GEMM here */
    check_block_gemm(128, 0, 256, 512, 512);
    check_block_gemm(128, 1, 256, 512, 384);
    check_block_gemm(1, 0, 384, 512, 256); /* the weight gradient's form: 1 x 128 blocks along the tokens of both */
    check_block_gemm(1, 1, 256, 640, 384);
    check_gemm(RECIPE_ROW, FP8_E4M3, 1, 128, 512, 256);
    /* the backward GEMMs: gradients in E5M2 against E4M3 codes; the weight gradient added to over micro-steps */
    check_gemm(RECIPE_TENSOR, FP8_E5M2, 0, 256, 2048, 384);
    check_gemm(RECIPE_TENSOR, FP8_E5M2, 1, 128, 512, 256);
    if (bench) {
        /* Llama 3.2 1B at B=8, T=2048: N tokens; each layer's Linear (in -> out) gives three GEMMs */
        int N = 16384;
        struct {
            const char *name;
            int in, out;
        } lin[4] = {{"qkv", 2048, 3072}, {"o", 2048, 2048}, {"gate_up", 2048, 16384}, {"down", 8192, 2048}};
        double t_bf16 = 0.0, t_fp8 = 0.0;
        for (int i = 0; i < 4; i++) {
            char name[40];
            snprintf(name, sizeof(name), "%s forward", lin[i].name);
            bench_shape(name, N, lin[i].in, lin[i].out, &t_bf16, &t_fp8);
            snprintf(name, sizeof(name), "%s bwd input", lin[i].name);
            bench_shape(name, N, lin[i].out, lin[i].in, &t_bf16, &t_fp8);
            snprintf(name, sizeof(name), "%s bwd weight", lin[i].name);
            bench_shape(name, lin[i].out, N, lin[i].in, &t_bf16, &t_fp8);
        }
        printf(
            "BENCH one layer's 12 GEMMs: bf16 %.3f ms, fp8 tensor-scaled %.3f ms (%.2fx), quantisation not included\n",
            t_bf16, t_fp8, t_bf16 / t_fp8);
    }
    matmul_teardown();
    return check_summary();
}
