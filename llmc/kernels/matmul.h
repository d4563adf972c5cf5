/*
 * matmul.h: the three GEMMs of a Linear layer y = x W^T through cuBLASLt, bf16
 * operands, fp32 accumulation. Row-major throughout; W is [out, in] (HF layout).
 *   forward          out[N, out]  = inp[N, in] @ W[out, in]^T           (bf16 out)
 *                    (+ bias[out] before the rounding, matmul_forward_bias: cuBLASLt's bias epilogue, as torch's
 *                    addmm does for a Linear with bias; one pass less over out than a separate bias kernel)
 *   backward input   dinp[N, in] (= or +=) dout[N, out] @ W[out, in]    (bf16 out)
 *   backward weight  dW[out, in] (= or +=) dout[N, out]^T @ inp[N, in]  (bf16 out)
 * Each reads its two operands (and its output when accumulating) and writes only its output.
 * Accumulating into a bf16 output rounds twice (cuBLASLt rounds the product to
 * bf16 before adding C): half a bf16 ulp of the product plus half of the sum.
 *
 * cuBLASLt is column-major: a row-major [r, c] matrix is a column-major [c, r]
 * one with leading dimension c, so each product is computed transposed
 * (out^T = W inp^T and so on) and no operand is ever copied.
 *
 * FP8 (issue #15): matmul_fp8 computes the forward form on fp8 codes with
 * dequantisation scales per operand (one, one per row, or per 1 x 128 or
 * 128 x 128 block: llmc/kernels/fp8_quantize.h), fp32 sums and a bf16 output; Hopper's
 * FP8 kernels take only that form (both operands contiguous along the summed
 * dimension), so the backward GEMMs run on transposed copies of their operands.
 *
 * A step issues the same few shapes over and over, so each (GEMM, shape,
 * operand types, pointer alignment) gets its layouts and algorithm once and
 * keeps them in a small table. The algorithm is cuBLASLt's heuristic first pick
 * unless autotuning is on (matmul_set_autotune; the trainer's --gemm-autotune):
 * then each GEMM of at least MATMUL_TUNE_MIN_FLOP times the heuristic's first
 * MATMUL_TUNE_CANDIDATES algorithms on its own operands at first use, with
 * beta 0 and, for the weight gradient, beta 1 (later micro-steps add into it),
 * and keeps the fastest where it beats the first pick by MATMUL_TUNE_MARGIN.
 * On an H100 the first pick left 5-13% on the table at Qwen2.5-1.5B's larger
 * shapes (dev/cuda/matmul_algos). The choice follows timings, so two runs may
 * take different algorithms, whose sums round differently: runs that must
 * match to the bit tune off. Tuning happens only where a plan is made with
 * beta 0, when the output is about to be overwritten, so the trials may write
 * it. All calls share one 32 MiB workspace (what cuBLAS recommends for Hopper):
 * GEMMs must not run concurrently on two streams.
 */
#ifndef LLMC_MATMUL_H
#define LLMC_MATMUL_H

#include <cublasLt.h>

#include "llmc/common/cuda_common.h"
#include "llmc/kernels/fp8.h"
#include "llmc/common/profile.h"

static inline void cublas_check_at(cublasStatus_t status, const char *what, const char *file, int line)
{
    if (status != CUBLAS_STATUS_SUCCESS) {
        fail_at(file, line, "cuBLAS error in %s: %s (%s)\n  hint: %s", what, cublasLtGetStatusName(status),
                cublasLtGetStatusString(status),
                status == CUBLAS_STATUS_NOT_INITIALIZED ? "call matmul_setup() first"
                : status == CUBLAS_STATUS_ALLOC_FAILED  ? "out of GPU memory; reduce the batch size (-B)"
                : status == CUBLAS_STATUS_NOT_SUPPORTED
                    ? "no cuBLASLt kernel for these types/shape/alignment; rerun with CUBLASLT_LOG_LEVEL=5"
                    : "rerun with CUBLASLT_LOG_LEVEL=5 to see what cuBLASLt rejected");
    }
}
#define CUBLAS_CHECK(call) cublas_check_at((call), #call, __FILE__, __LINE__)

/* MATMUL_FP8...: the forward form on fp8 codes (matmul_fp8), by the scales of x and w: one each (_FAST: with fast
 * accumulation), one per row (OUTER_VEC_32F; with fast accumulation its sums over K = 16384 erred by 1.5x
 * fp8_matmul_check's bound, so none), 1 x 128 blocks of x and 128 x 128 of w (VEC128_32F, BLK128x128_32F), 1 x 128
 * blocks of both (the weight gradient's form). */
enum {
    MATMUL_FORWARD,
    MATMUL_BACKWARD_INPUT,
    MATMUL_BACKWARD_WEIGHT,
    MATMUL_FORWARD_BIAS,
    MATMUL_FP8,
    MATMUL_FP8_FAST,
    MATMUL_FP8_ROW,
    MATMUL_FP8_BLOCK,
    MATMUL_FP8_BLOCK_1D,
    MATMUL_KINDS
};
static const char *const MATMUL_KIND_NAMES[MATMUL_KINDS] = {
    "forward",     "backward input",           "backward weight", "forward with bias", "FP8", "FP8 (fast accumulation)",
    "FP8 per-row", "FP8 1x128/128x128 blocks", "FP8 1x128 blocks"};

#define MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)
/* Enough for every shape of a training step (7 Linear layers x 3 GEMMs, plus the
 * classifier's full and ragged chunks); a full table recycles its oldest entry. */
#define MATMUL_CACHE_SIZE 64

typedef struct {
    int in_use;
    int kind, N, in_dim, out_dim;
    cudaDataType_t a_type, b_type; /* bf16, or fp8 for MATMUL_FP8 */
    int align_bytes[4];            /* A, B, C, D: the heuristic may only pick kernels these pointers satisfy */
    cublasLtMatrixLayout_t layout[4];
    cublasLtMatmulAlgo_t algo;            /* for beta 0 */
    cublasLtMatmulAlgo_t algo_accumulate; /* for beta 1 */
    float tuned_ms[2];                    /* autotuning's saving per launch over the first pick, beta 0 and 1 */
    int64_t launches[2];                  /* the launches at beta 0 and 1 */
} MatmulPlan;

/* Autotuning (see the top): off unless matmul_set_autotune(1). */
#define MATMUL_TUNE_CANDIDATES 8
#define MATMUL_TUNE_MIN_FLOP 1e10 /* about 15 us at the GEMM rate: tiny GEMMs gain nothing worth the noise */
#define MATMUL_TUNE_MARGIN 0.02   /* the fastest must be 2% ahead of the first pick, more than the timing noise */
#define MATMUL_TUNE_RUNS 5        /* timed runs per candidate, taking turns; the median counts */
#define MATMUL_TUNE_WARM_MS 25.0f /* the first candidate alone first: the clocks rise from idle */

static cublasLtHandle_t matmul_handle = NULL;
static void *matmul_workspace = NULL;
static cublasLtMatmulDesc_t matmul_desc[MATMUL_KINDS];
static MatmulPlan matmul_cache[MATMUL_CACHE_SIZE];
static int matmul_cache_next = 0;
static int matmul_autotune = 0;
/* What autotuning did (matmul_tune_summary): choices timed, and those that left the first pick. */
static struct {
    int timed, switched;
} matmul_tune_stats;

static inline void matmul_set_autotune(int on)
{
    matmul_autotune = on;
}

static inline void matmul_setup(void)
{
    /* (transpose A, transpose B) of each GEMM in cuBLASLt's column-major terms; see matmul_plan. */
    static const cublasOperation_t ops[3][2] = {
        {CUBLAS_OP_T, CUBLAS_OP_N}, {CUBLAS_OP_N, CUBLAS_OP_N}, {CUBLAS_OP_N, CUBLAS_OP_T}}; /* then all forward */
    const cublasLtEpilogue_t bias_epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    /* the FP8 kinds' scale modes: of A (w) and of B (x), and fast accumulation */
    static const struct {
        int32_t w_mode, x_mode;
        int8_t fast;
    } fp8[MATMUL_KINDS - MATMUL_FP8] = {
        {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, 0},
        {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, 1},
        {CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, 0},
        {CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, 0},
        {CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, 0}};
    CUBLAS_CHECK(cublasLtCreate(&matmul_handle));
    matmul_workspace = cuda_malloc_named(MATMUL_WORKSPACE_BYTES, "cuBLASLt workspace");
    for (int kind = 0; kind < MATMUL_KINDS; kind++) {
        cublasLtMatmulDesc_t d;
        const cublasOperation_t *op = ops[kind <= MATMUL_BACKWARD_WEIGHT ? kind : MATMUL_FORWARD];
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &op[0], sizeof(op[0])));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &op[1], sizeof(op[1])));
        if (kind == MATMUL_FORWARD_BIAS) { /* the bias pointer is set per call (matmul_forward_bias) */
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &bias_epilogue,
                                                        sizeof(bias_epilogue)));
            CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
        }
        if (kind >= MATMUL_FP8) {
            int i = kind - MATMUL_FP8;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &fp8[i].w_mode,
                                                        sizeof(fp8[i].w_mode)));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &fp8[i].x_mode,
                                                        sizeof(fp8[i].x_mode)));
            CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fp8[i].fast, sizeof(fp8[i].fast)));
        }
        matmul_desc[kind] = d;
    }
    memset(matmul_cache, 0, sizeof(matmul_cache));
    matmul_cache_next = 0;
}

static inline void matmul_plan_release(MatmulPlan *plan)
{
    if (!plan->in_use)
        return;
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan->layout[i]));
    plan->in_use = 0;
}

static inline void matmul_teardown(void)
{
    for (int i = 0; i < MATMUL_CACHE_SIZE; i++)
        matmul_plan_release(&matmul_cache[i]);
    for (int kind = 0; kind < MATMUL_KINDS; kind++)
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(matmul_desc[kind]));
    cuda_free(matmul_workspace);
    matmul_workspace = NULL;
    CUBLAS_CHECK(cublasLtDestroy(matmul_handle));
    matmul_handle = NULL;
}

/* Largest power of two up to 256 (cuBLASLt's strictest requirement) dividing the address. */
static inline int matmul_alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int align = 256;
    while (align > 1 && a % (uintptr_t)align != 0)
        align /= 2;
    return align;
}

/* One GEMM of a plan, D = alpha A B + beta D (C is D, read only when beta != 0), with the given algorithm. */
static inline cublasStatus_t matmul_launch(const MatmulPlan *plan, const cublasLtMatmulAlgo_t *algo, const void *a,
                                           const void *b, void *d, float beta, cudaStream_t stream)
{
    const float alpha = 1.0f;
    return cublasLtMatmul(matmul_handle, matmul_desc[plan->kind], &alpha, a, plan->layout[0], b, plan->layout[1], &beta,
                          d, plan->layout[2], d, plan->layout[3], algo, matmul_workspace, MATMUL_WORKSPACE_BYTES,
                          stream);
}

/* The fastest of the heuristic's candidates at this beta, if MATMUL_TUNE_MARGIN ahead of its first pick (a
 * candidate cuBLASLt refuses at launch is left out). The first plans are made as the step starts, while the clocks
 * still rise from idle: the first candidate runs for MATMUL_TUNE_WARM_MS first, and the candidates' timed runs
 * take turns (each round times every candidate once; the median of MATMUL_TUNE_RUNS rounds counts), so a drift
 * of the clocks falls on all of them alike instead of favouring the ones timed last. */
static inline cublasLtMatmulAlgo_t matmul_pick_algo(const MatmulPlan *plan, const cublasLtMatmulHeuristicResult_t *cand,
                                                    int n_cand, const void *a, const void *b, void *d, float beta,
                                                    cudaStream_t stream, float *saved_ms)
{
    int ok[MATMUL_TUNE_CANDIDATES] = {0}, n_ok = 0;
    for (int i = 0; i < n_cand; i++) {
        ok[i] = cand[i].state == CUBLAS_STATUS_SUCCESS &&
                matmul_launch(plan, &cand[i].algo, a, b, d, beta, stream) == CUBLAS_STATUS_SUCCESS;
        n_ok += ok[i];
    }
    if (!ok[0] || n_ok < 2)
        return cand[0].algo;
    cudaEvent_t ev[MATMUL_TUNE_CANDIDATES * MATMUL_TUNE_RUNS + 1];
    int n_ev = n_ok * MATMUL_TUNE_RUNS + 1;
    for (int e = 0; e < n_ev; e++)
        CUDA_CHECK(cudaEventCreate(&ev[e]));
    float warm_ms = 0.0f;
    for (int round = 0; warm_ms < MATMUL_TUNE_WARM_MS && round < 100; round++) {
        CUDA_CHECK(cudaEventRecord(ev[0], stream));
        for (int r = 0; r < 4; r++)
            CUBLAS_CHECK(matmul_launch(plan, &cand[0].algo, a, b, d, beta, stream));
        CUDA_CHECK(cudaEventRecord(ev[1], stream));
        CUDA_CHECK(cudaEventSynchronize(ev[1]));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        warm_ms += ms;
    }
    /* back to back, an event between launches: launch k runs from ev[k] to ev[k + 1] */
    CUDA_CHECK(cudaEventRecord(ev[0], stream));
    int e = 0;
    for (int r = 0; r < MATMUL_TUNE_RUNS; r++)
        for (int i = 0; i < n_cand; i++)
            if (ok[i]) {
                CUBLAS_CHECK(matmul_launch(plan, &cand[i].algo, a, b, d, beta, stream));
                CUDA_CHECK(cudaEventRecord(ev[++e], stream));
            }
    CUDA_CHECK(cudaEventSynchronize(ev[n_ev - 1]));
    float ms[MATMUL_TUNE_CANDIDATES][MATMUL_TUNE_RUNS];
    e = 0;
    for (int r = 0; r < MATMUL_TUNE_RUNS; r++)
        for (int i = 0; i < n_cand; i++)
            if (ok[i]) {
                CUDA_CHECK(cudaEventElapsedTime(&ms[i][r], ev[e], ev[e + 1]));
                e++;
            }
    for (int k = 0; k < n_ev; k++)
        CUDA_CHECK(cudaEventDestroy(ev[k]));
    float first = 0.0f, best = 0.0f;
    int pick = 0;
    for (int i = 0; i < n_cand; i++) {
        if (!ok[i])
            continue;
        float *m = ms[i];
        for (int x = 1; x < MATMUL_TUNE_RUNS; x++) /* insertion sort of a handful */
            for (int y = x; y > 0 && m[y] < m[y - 1]; y--) {
                float t = m[y];
                m[y] = m[y - 1];
                m[y - 1] = t;
            }
        float median = m[MATMUL_TUNE_RUNS / 2];
        if (i == 0)
            first = best = median;
        else if (median < best) {
            best = median;
            pick = i;
        }
    }
    matmul_tune_stats.timed++;
    if (best >= first * (1.0f - (float)MATMUL_TUNE_MARGIN))
        return cand[0].algo;
    matmul_tune_stats.switched++;
    *saved_ms = first - best;
    return cand[pick].algo;
}

/* One line on what autotuning did, for the run's output: the choices, and the GPU time the tuned picks saved over
 * the first ones by the trials' timings, per step of `steps` (the launches so far over that many steps). Inside a
 * step they save less: a fifth to a half of that at Qwen2.5-1.5B and the 1B on an H100 (docs/performance.md,
 * issue 33 round 5), for reasons not known. */
static inline void matmul_tune_summary(char *line, size_t size, int steps)
{
    double saved = 0.0;
    for (int i = 0; i < MATMUL_CACHE_SIZE; i++)
        if (matmul_cache[i].in_use)
            for (int k = 0; k < 2; k++)
                saved += (double)matmul_cache[i].tuned_ms[k] * (double)matmul_cache[i].launches[k];
    snprintf(line, size,
             "GEMM autotuning: %d choices timed, %d left cuBLASLt's first pick (%.1f ms a step faster timed alone; "
             "less inside a step)",
             matmul_tune_stats.timed, matmul_tune_stats.switched, steps > 0 ? saved / steps : 0.0);
}

/* cuBLASLt's heuristic list for a plan's GEMM, best first by its estimate: up to n algorithms that fit the workspace
 * and the plan's pointer alignments, into cand; returns how many. */
static inline int matmul_heuristics(const MatmulPlan *plan, cublasLtMatmulHeuristicResult_t *cand, int n)
{
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = MATMUL_WORKSPACE_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t v = (uint32_t)plan->align_bytes[i];
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &v, sizeof(v)));
    }
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(matmul_handle, matmul_desc[plan->kind], plan->layout[0],
                                                plan->layout[1], plan->layout[2], plan->layout[3], pref, n, cand,
                                                &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

/*
 * The cached plan of one GEMM, made on first use. Column-major view (m, n, k):
 *   forward          D[out, N] = op_T(A = W as [in, out]) @ (B = inp as [in, N]),         k = in
 *   backward input   D[in, N]  = (A = W as [in, out]) @ (B = dout as [out, N]),           k = out
 *   backward weight  D[in, out] = (A = inp as [in, N]) @ op_T(B = dout as [out, N]),      k = N
 * C is D. a, b, d and beta are those of the call that makes the plan: with autotuning on and beta 0, the trials
 * run on them (writing d, which that call overwrites next) on the call's stream.
 */
static inline MatmulPlan *matmul_plan(int kind, int N, int in_dim, int out_dim, cudaDataType_t a_type,
                                      cudaDataType_t b_type, const void *a, const void *b, void *d, float beta,
                                      cudaStream_t stream)
{
    int align[4] = {matmul_alignment(a), matmul_alignment(b), matmul_alignment(d), matmul_alignment(d)};
    for (int i = 0; i < MATMUL_CACHE_SIZE; i++) {
        MatmulPlan *p = &matmul_cache[i];
        if (p->in_use && p->kind == kind && p->N == N && p->in_dim == in_dim && p->out_dim == out_dim &&
            p->a_type == a_type && p->b_type == b_type && memcmp(p->align_bytes, align, sizeof(align)) == 0) {
            return p;
        }
    }
    if (matmul_handle == NULL)
        FAIL("matmul called before matmul_setup()");
    if (N <= 0 || in_dim <= 0 || out_dim <= 0) {
        FAIL("matmul with an empty shape: N %d, in %d, out %d", N, in_dim, out_dim);
    }
    MatmulPlan *plan = &matmul_cache[matmul_cache_next];
    matmul_cache_next = (matmul_cache_next + 1) % MATMUL_CACHE_SIZE;
    matmul_plan_release(plan);
    memset(plan, 0, sizeof(*plan));

    uint64_t n_tok = (uint64_t)N, in = (uint64_t)in_dim, out = (uint64_t)out_dim;
    /* rows, cols, leading dimension of A, B, C (= D) as stored, column-major */
    uint64_t dims[3][3];
    if (kind == MATMUL_FORWARD || kind >= MATMUL_FORWARD_BIAS) {
        uint64_t d3[3][3] = {{in, out, in}, {in, n_tok, in}, {out, n_tok, out}};
        memcpy(dims, d3, sizeof(dims));
    } else if (kind == MATMUL_BACKWARD_INPUT) {
        uint64_t d3[3][3] = {{in, out, in}, {out, n_tok, out}, {in, n_tok, in}};
        memcpy(dims, d3, sizeof(dims));
    } else {
        uint64_t d3[3][3] = {{in, n_tok, in}, {out, n_tok, out}, {in, out, in}};
        memcpy(dims, d3, sizeof(dims));
    }
    cudaDataType_t types[4] = {a_type, b_type, CUDA_R_16BF, CUDA_R_16BF};
    for (int i = 0; i < 4; i++) {
        const uint64_t *dm = dims[i < 3 ? i : 2];
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout[i], types[i], dm[0], dm[1], (int64_t)dm[2]));
    }
    plan->in_use = 1;
    plan->kind = kind;
    plan->a_type = a_type;
    plan->b_type = b_type;
    plan->N = N;
    plan->in_dim = in_dim;
    plan->out_dim = out_dim;
    memcpy(plan->align_bytes, align, sizeof(align));

    cublasLtMatmulHeuristicResult_t cand[MATMUL_TUNE_CANDIDATES];
    int found = matmul_heuristics(plan, cand, matmul_autotune ? MATMUL_TUNE_CANDIDATES : 1);
    if (found == 0) {
        FAIL("cuBLASLt has no algorithm for the %s GEMM with N %d, in %d, out %d "
             "(pointer alignments %d/%d/%d/%d bytes)\n"
             "  hint: keep activation and weight pointers 16-byte aligned; rerun with CUBLASLT_LOG_LEVEL=5",
             MATMUL_KIND_NAMES[kind], N, in_dim, out_dim, align[0], align[1], align[2], align[3]);
    }
    plan->algo = plan->algo_accumulate = cand[0].algo;
    if (matmul_autotune && beta == 0.0f && found > 1 && 2.0 * n_tok * in * out >= MATMUL_TUNE_MIN_FLOP) {
        plan->algo = matmul_pick_algo(plan, cand, found, a, b, d, 0.0f, stream, &plan->tuned_ms[0]);
        if (kind == MATMUL_BACKWARD_WEIGHT || kind >= MATMUL_FP8) /* the kinds that accumulate */
            plan->algo_accumulate = matmul_pick_algo(plan, cand, found, a, b, d, 1.0f, stream, &plan->tuned_ms[1]);
    }
    return plan;
}

/* One GEMM of any kind and operand types through its cached plan: beta 0 writes d, beta 1 adds to it (each with
 * its own algorithm when autotuned); counted for matmul_tune_summary. */
static inline void matmul_run_typed(int kind, void *d, const void *a, const void *b, cudaDataType_t a_type,
                                    cudaDataType_t b_type, int N, int in_dim, int out_dim, float beta,
                                    cudaStream_t stream)
{
    MatmulPlan *plan = matmul_plan(kind, N, in_dim, out_dim, a_type, b_type, a, b, d, beta, stream);
    plan->launches[beta != 0.0f]++;
    profile_push(PROF_GEMM, stream);
    CUBLAS_CHECK(matmul_launch(plan, beta != 0.0f ? &plan->algo_accumulate : &plan->algo, a, b, d, beta, stream));
    profile_pop(stream);
}

static inline void matmul_run(int kind, void *d, const void *a, const void *b, int N, int in_dim, int out_dim,
                              float beta, cudaStream_t stream)
{
    matmul_run_typed(kind, d, a, b, CUDA_R_16BF, CUDA_R_16BF, N, in_dim, out_dim, beta, stream);
}

/* out[N, out_dim] = inp[N, in_dim] @ weight[out_dim, in_dim]^T */
static inline void matmul_forward(bf16 *out, const bf16 *inp, const bf16 *weight, int N, int in_dim, int out_dim,
                                  cudaStream_t stream)
{
    matmul_run(MATMUL_FORWARD, out, weight, inp, N, in_dim, out_dim, 0.0f, stream);
}

/* out[N, out_dim] = inp[N, in_dim] @ weight[out_dim, in_dim]^T + bias[out_dim], the bias added to the fp32 sums
 * before the one rounding to bf16. bias must be 16-byte aligned (cuBLASLt's epilogue reads it in vectors). */
static inline void matmul_forward_bias(bf16 *out, const bf16 *inp, const bf16 *weight, const bf16 *bias, int N,
                                       int in_dim, int out_dim, cudaStream_t stream)
{
    if (matmul_alignment(bias) < 16)
        FAIL("matmul_forward_bias: the bias %p must be 16-byte aligned (cuBLASLt's epilogue rejects others)",
             (const void *)bias);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul_desc[MATMUL_FORWARD_BIAS], CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &bias, sizeof(bias)));
    matmul_run(MATMUL_FORWARD_BIAS, out, weight, inp, N, in_dim, out_dim, 0.0f, stream);
}

/* dinp[N, in_dim] = dout[N, out_dim] @ weight[out_dim, in_dim]. Never accumulated:
 * the residual-stream gradient is summed by the norm kernels in fp32 instead. */
static inline void matmul_backward_input(bf16 *dinp, const bf16 *dout, const bf16 *weight, int N, int in_dim,
                                         int out_dim, cudaStream_t stream)
{
    matmul_run(MATMUL_BACKWARD_INPUT, dinp, weight, dout, N, in_dim, out_dim, 0.0f, stream);
}

/* dweight[out_dim, in_dim] = dout[N, out_dim]^T @ inp[N, in_dim], or += when
 * accumulate (later micro-steps, later logits chunks); fp32 sums, bf16 result. */
static inline void matmul_backward_weight(bf16 *dweight, const bf16 *dout, const bf16 *inp, int N, int in_dim,
                                          int out_dim, int accumulate, cudaStream_t stream)
{
    matmul_run(MATMUL_BACKWARD_WEIGHT, dweight, inp, dout, N, in_dim, out_dim, accumulate ? 1.0f : 0.0f, stream);
}

/* out[N, out_dim] (= or += when accumulate) = (x[N, in_dim] @ w[out_dim, in_dim]^T) dequantised by x_inv_scale and
 * w_inv_scale, on fp8 codes (fp8_quantize.h), both row-major and contiguous along in_dim; fp32 sums, bf16 out. kind
 * (MATMUL_FP8...) says how the scales are laid out: one each, one per row of x and of w, per 1 x 128 block of x
 * and 128 x 128 of w, or per 1 x 128 block of both (fp8_quantize.h's FP8_SCALE_* give the orders). cuBLASLt takes
 * E4M3 x E4M3 and E5M2 x E4M3 here (never E5M2 x E5M2): x in either format, w in E4M3. Each operand needs 16-byte
 * aligned rows: in_dim a multiple of 16; so must the scale pointers be.
 * Fast accumulation (the _FAST kinds): Hopper's FP8 tensor cores keep their running sums with fewer bits than fp32;
 * cuBLASLt adds them into fp32 every few K-blocks unless fast accumulation is on, which skips that for speed
 * (Transformer Engine and torchao do so for the forward GEMM only: the gradients' sums stay promoted). */
static inline void matmul_fp8(bf16 *out, const uint8_t *x, Fp8Format x_format, const uint8_t *w,
                              const float *x_inv_scale, const float *w_inv_scale, int N, int in_dim, int out_dim,
                              int accumulate, int kind, cudaStream_t stream)
{
    if (kind < MATMUL_FP8 || kind >= MATMUL_KINDS)
        FAIL("matmul_fp8: kind %d is not one of the FP8 GEMMs", kind);
    if (in_dim % 16 != 0)
        FAIL("matmul_fp8: in_dim %d must be a multiple of 16 (16-byte rows of fp8 codes)", in_dim);
    if (matmul_alignment(x_inv_scale) < 16 || matmul_alignment(w_inv_scale) < 16)
        FAIL("matmul_fp8: the scale pointers %p and %p must be 16-byte aligned (cuBLASLt rejects others)",
             (const void *)x_inv_scale, (const void *)w_inv_scale);
    cudaDataType_t x_type = x_format == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    /* column-major: A = w as [in, out] (op T), B = x as [in, N]: the forward form */
    /* the scale pointers before the plan: cuBLASLt's heuristic refuses per-row scales without them (INVALID_VALUE) */
    cublasLtMatmulDesc_t desc = matmul_desc[kind];
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_inv_scale, sizeof(w_inv_scale)));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_inv_scale, sizeof(x_inv_scale)));
    matmul_run_typed(kind, out, w, x, CUDA_R_8F_E4M3, x_type, N, in_dim, out_dim, accumulate ? 1.0f : 0.0f, stream);
}

#endif /* LLMC_MATMUL_H */
