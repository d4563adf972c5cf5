/*
 * matmul_algos: an experiment, not a check. For the GEMMs of a training step of
 * Qwen2.5-1.5B (16 x 1024 tokens) and Llama 3.2 1B (8 x 2048), each kind of
 * llmc/kernels/matmul.h (forward, backward input, backward weight with beta 0
 * and with beta 1, the later micro-steps' accumulation), times every algorithm
 * of cuBLASLt's heuristic list (up to ALGOS, best first by cuBLASLt's estimate)
 * and prints the first one's time, the fastest one's and the gain. matmul.h
 * takes the first for beta 0 and 1 alike; this says what that leaves.
 * Timing: check_common.h's median of back-to-back runs over two input sets of
 * fresh random bf16 values (uniform, made on the GPU).
 *   dev/cuda/matmul_algos [--seed N] [--algos K]
 */
#include "dev/cuda/check_common.h"
#include "llmc/kernels/matmul.h"

#define ALGOS_MAX 16
#define SETS 2

typedef struct {
    const char *name;
    int N, in, out;
} Shape;

typedef struct {
    int kind;
    float beta;
    const MatmulPlan *plan;
    const cublasLtMatmulAlgo_t *algo;
    void *a[SETS], *b[SETS], *d[SETS];
} AlgoRun;

static void run_algo(void *ctx, int set)
{
    AlgoRun *r = (AlgoRun *)ctx;
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(matmul_handle, matmul_desc[r->kind], &alpha, r->a[set], r->plan->layout[0], r->b[set],
                                r->plan->layout[1], &r->beta, r->d[set], r->plan->layout[2], r->d[set],
                                r->plan->layout[3], r->algo, matmul_workspace, MATMUL_WORKSPACE_BYTES, 0));
}

/* Fresh random bf16 values, uniform in [-scale, scale), made on the GPU (a hash of the index and a seed from the
 * run's RNG): the host's normal draws took minutes for the lm_head's 370M values. */
__global__ void fill_uniform_bf16(bf16 *p, int64_t n, uint64_t seed, float scale)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = __float2bfloat16(((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
    }
}

static bf16 *random_bf16(size_t n, float scale)
{
    bf16 *d = (bf16 *)dev_alloc(n * sizeof(bf16));
    fill_uniform_bf16<<<1024, 256>>>(d, (int64_t)n, rng_next(), scale);
    CUDA_CHECK_LAST();
    return d;
}

static void time_kind(const Shape *s, int kind, float beta, bf16 *x[SETS], bf16 *w[SETS], bf16 *y[SETS], bf16 *dw[SETS],
                      int algos)
{
    AlgoRun r;
    memset(&r, 0, sizeof(r));
    r.kind = kind;
    r.beta = beta;
    for (int i = 0; i < SETS; i++) { /* the operands as matmul.h passes them (matmul_forward and so on) */
        r.a[i] = kind == MATMUL_BACKWARD_WEIGHT ? (void *)x[i] : (void *)w[i];
        r.b[i] = kind == MATMUL_FORWARD ? (void *)x[i] : (void *)y[i];
        r.d[i] = kind == MATMUL_FORWARD ? (void *)y[i] : kind == MATMUL_BACKWARD_INPUT ? (void *)x[i] : (void *)dw[i];
    }
    r.plan = matmul_plan(kind, s->N, s->in, s->out, CUDA_R_16BF, CUDA_R_16BF, r.a[0], r.b[0], r.d[0], 0.0f, 0);

    cublasLtMatmulHeuristicResult_t found_algos[ALGOS_MAX];
    int found = matmul_heuristics(r.plan, found_algos, algos); /* the list matmul.h's plans choose from */

    double flops = 2.0 * s->N * (double)s->in * s->out;
    float first = 0.0f, best = 1e30f;
    int best_i = -1;
    for (int i = 0; i < found; i++) {
        if (found_algos[i].state != CUBLAS_STATUS_SUCCESS)
            continue;
        r.algo = &found_algos[i].algo;
        float ms = bench_median_ms(run_algo, &r, SETS);
        if (i == 0)
            first = ms;
        if (ms < best) {
            best = ms;
            best_i = i;
        }
    }
    char what[96];
    snprintf(what, sizeof(what), "%s %s%s", s->name, MATMUL_KIND_NAMES[kind],
             kind == MATMUL_BACKWARD_WEIGHT ? (beta != 0.0f ? " (+=)" : " (=)") : "");
    printf("BENCH %-44s first %8.4f ms %6.1f TFLOP/s | best of %2d: #%d %8.4f ms %6.1f TFLOP/s | %+5.1f%%\n", what,
           first, flops / (first * 1e-3) / 1e12, found, best_i, best, flops / (best * 1e-3) / 1e12,
           100.0 * (first / best - 1.0));
}

int main(int argc, char **argv)
{
    int algos = 8;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--algos") == 0 && i + 1 < argc)
            algos = atoi(argv[++i]);
    check_init(argc, argv, "matmul_algos");
    if (algos < 1 || algos > ALGOS_MAX)
        FAIL("--algos %d: give 1 to %d", algos, ALGOS_MAX);
    matmul_setup();
    static const Shape shapes[] = {
        /* Qwen2.5-1.5B: C 1536, q 1536 + k, v 2 x 256, FFN 8960 (gate and up in one), V 151,936, 2,432-row chunks */
        {"qwen qkv", 16384, 1536, 2048},
        {"qwen o", 16384, 1536, 1536},
        {"qwen gate_up", 16384, 1536, 17920},
        {"qwen down", 16384, 8960, 1536},
        {"qwen lm_head chunk", 2432, 1536, 151936},
        /* Llama 3.2 1B: C 2048, q 2048 + k, v 2 x 512, FFN 8192, V 128,256, 3,328-row chunks */
        {"llama1b qkv", 16384, 2048, 3072},
        {"llama1b o", 16384, 2048, 2048},
        {"llama1b gate_up", 16384, 2048, 16384},
        {"llama1b down", 16384, 8192, 2048},
        {"llama1b lm_head chunk", 3328, 2048, 128256},
    };
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const Shape *s = &shapes[si];
        bf16 *x[SETS], *w[SETS], *y[SETS], *dw[SETS];
        for (int i = 0; i < SETS; i++) {
            x[i] = random_bf16((size_t)s->N * s->in, 1.0f);
            w[i] = random_bf16((size_t)s->out * s->in, 0.02f);
            y[i] = random_bf16((size_t)s->N * s->out, 1.0f);
            dw[i] = random_bf16((size_t)s->out * s->in, 1.0f);
        }
        time_kind(s, MATMUL_FORWARD, 0.0f, x, w, y, dw, algos);
        time_kind(s, MATMUL_BACKWARD_INPUT, 0.0f, x, w, y, dw, algos);
        time_kind(s, MATMUL_BACKWARD_WEIGHT, 0.0f, x, w, y, dw, algos);
        time_kind(s, MATMUL_BACKWARD_WEIGHT, 1.0f, x, w, y, dw, algos);
        for (int i = 0; i < SETS; i++) {
            cuda_free(x[i]);
            cuda_free(w[i]);
            cuda_free(y[i]);
            cuda_free(dw[i]);
        }
    }
    matmul_teardown();
    return 0;
}
