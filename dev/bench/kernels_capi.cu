/*
 * kernels_capi.cu: the project's kernels (the llmc headers) behind a plain C ABI, built
 * into dev/bench/libllmc_kernels.so for dev/bench/bench_kernels.py (ctypes).
 *
 * Every pointer argument is a raw device pointer (Python passes
 * torch.Tensor.data_ptr()), except llmc_rope_table's output and
 * llmc_adamw_runs_create's arrays, which are host memory. `stream` is a cudaStream_t
 * (torch.cuda.current_stream().cuda_stream); NULL is the legacy default stream. The
 * calls only enqueue work: nothing here synchronises, allocates or copies, except
 * the setup calls llmc_init (the cuBLASLt workspace) and llmc_adamw_runs_create /
 * llmc_adamw_runs_free (the decay-run table, copied to the device).
 * Layouts, dtypes and alignment are those of the headers (bf16 activations and
 * gradients, fp32 statistics and AdamW moments, the fp32 master weights as bf16
 * param + int16 master_lo, 16-byte aligned pointers). A bad size makes the header's
 * FAIL print the reason and exit the process.
 *
 * Build (from the repository root):
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC,-fopenmp -shared -I. \
 *        dev/bench/kernels_capi.cu -o dev/bench/libllmc_kernels.so -lcublasLt -lcublas
 */
#include "llmc/kernels/adamw.h"
#include "llmc/common/cuda_common.h"
#include "llmc/kernels/fused_classifier.h"
#include "llmc/model/llama_config.h"
#include "llmc/kernels/matmul.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/rope.h"
#include "llmc/kernels/swiglu.h"

#define LLMC_API extern "C" __attribute__((visibility("default")))

static inline cudaStream_t as_stream(void *stream)
{
    return (cudaStream_t)stream;
}

/* ---- setup and information ---- */

/* Version of this ABI: bench_kernels.py refuses a library of another version. */
LLMC_API int llmc_capi_version(void)
{
    return 2;
}

/* cudaRuntimeGetVersion of the runtime this library was built against and runs with. */
LLMC_API int llmc_cuda_runtime_version(void)
{
    int v = 0;
    CUDA_CHECK(cudaRuntimeGetVersion(&v));
    return v;
}

/* cuBLASLt handle and its 32 MiB workspace (cudaMalloc, outside torch's allocator),
 * needed by the fused classifier. Idempotent. */
LLMC_API void llmc_init(void)
{
    if (matmul_handle == NULL)
        matmul_setup();
}

LLMC_API size_t llmc_matmul_workspace_bytes(void)
{
    return MATMUL_WORKSPACE_BYTES;
}

/* ---- RMSNorm: x [N, C] bf16, weight [C] bf16, rstd [N] fp32 ---- */

LLMC_API void llmc_rmsnorm_forward(void *out, void *rstd, const void *inp, const void *weight, int N, int C, float eps,
                                   void *stream)
{
    rmsnorm_forward((bf16 *)out, (float *)rstd, (const bf16 *)inp, (const bf16 *)weight, N, C, eps, as_stream(stream));
}

/* residual_out = bf16(residual_in + branch); out = rmsnorm(residual_out) * weight. */
LLMC_API void llmc_fused_residual_rmsnorm_forward(void *residual_out, void *out, void *rstd, const void *residual_in,
                                                  const void *branch, const void *weight, int N, int C, float eps,
                                                  void *stream)
{
    fused_residual_rmsnorm_forward((bf16 *)residual_out, (bf16 *)out, (float *)rstd, (const bf16 *)residual_in,
                                   (const bf16 *)branch, (const bf16 *)weight, N, C, eps, as_stream(stream));
}

/* Floats of scratch that llmc_rmsnorm_backward needs. */
LLMC_API size_t llmc_rmsnorm_backward_scratch_floats(int N, int C)
{
    return rmsnorm_backward_scratch_floats(N, C);
}

/* dinp [N, C] bf16 += dx (accumulated: the residual-stream gradient; zero it for a plain
 * RMSNorm gradient); dweight [C] bf16 = sum_n dout * xhat, or += when accumulate. inp is
 * the normalised input (residual_out for the fused variant), rstd the forward's. */
LLMC_API void llmc_rmsnorm_backward(void *dinp, void *dweight, void *scratch, const void *dout, const void *inp,
                                    const void *weight, const void *rstd, int N, int C, int accumulate, void *stream)
{
    rmsnorm_backward((bf16 *)dinp, (bf16 *)dweight, (float *)scratch, (const bf16 *)dout, (const bf16 *)inp,
                     (const bf16 *)weight, (const float *)rstd, N, C, accumulate, as_stream(stream));
}

/* ---- RoPE on the fused qkv [B, T, H + 2*KV, D] bf16, in place ---- */

/* Host table [T, head_dim/2, 2] fp32 (cos, sin), as train_llama builds it (HF's float32
 * inverse frequencies, Llama 3.1 scaling when llama3_scaling != 0). table: T * head_dim
 * floats of host memory. */
LLMC_API void llmc_rope_table(float *table, int T, int head_dim, float theta, int llama3_scaling, float factor,
                              float low_freq_factor, float high_freq_factor, int original_max_pos)
{
    if (T <= 0 || head_dim <= 0 || head_dim % 2 != 0) {
        FAIL("llmc_rope_table: T = %d, head_dim = %d: both positive, head_dim even", T, head_dim);
    }
    LlamaConfig c;
    memset(&c, 0, sizeof(c));
    c.head_dim = head_dim;
    c.rope_theta = theta;
    c.rope_scaling_llama3 = llama3_scaling != 0;
    c.rope_factor = factor;
    c.rope_low_freq_factor = low_freq_factor;
    c.rope_high_freq_factor = high_freq_factor;
    c.rope_original_max_pos = original_max_pos;
    rope_table_host(table, &c, T);
}

/* freqs_cis: the table above, copied to the device; it must cover T positions. */
LLMC_API void llmc_rope_forward(void *qkv, const void *freqs_cis, int B, int T, int H, int KV, int D, void *stream)
{
    rope_forward((bf16 *)qkv, (const float *)freqs_cis, NULL, B, T, H, KV, D, as_stream(stream));
}

LLMC_API void llmc_rope_backward(void *dqkv, const void *freqs_cis, int B, int T, int H, int KV, int D, void *stream)
{
    rope_backward((bf16 *)dqkv, (const float *)freqs_cis, NULL, B, T, H, KV, D, as_stream(stream));
}

/* ---- SwiGLU on the fused gate_up [N, 2F] bf16 (gate first) -> out [N, F] ---- */

LLMC_API void llmc_swiglu_forward(void *out, const void *gate_up, int N, int F, void *stream)
{
    swiglu_forward((bf16 *)out, (const bf16 *)gate_up, N, F, as_stream(stream));
}

/* dgate_up [N, 2F] (overwritten; may be gate_up itself) from dout [N, F]. */
LLMC_API void llmc_swiglu_backward(void *dgate_up, const void *dout, const void *gate_up, int N, int F, void *stream)
{
    swiglu_backward((bf16 *)dgate_up, (const bf16 *)dout, (const bf16 *)gate_up, N, F, as_stream(stream));
}

/* ---- fused linear cross-entropy: x [N, C] bf16, W [V, C] bf16, targets [N] int32 ---- */

/* Rows per chunk for a logits scratch of budget_bytes; the scratch is chunk * V bf16. */
LLMC_API int llmc_fused_classifier_chunk_rows(int N, int V, size_t budget_bytes)
{
    return fused_classifier_chunk_rows(N, V, budget_bytes);
}

/* losses [N] fp32 (per row, unscaled), dx [N, C] bf16 (overwritten), dW [V, C] bf16
 * (overwritten by the first chunk unless accumulate, added to by later chunks),
 * gradients of inv_count * sum(losses). Needs llmc_init(). */
LLMC_API void llmc_fused_classifier_forward_backward(void *losses, void *dx, void *dW, void *logits_scratch,
                                                     const void *x, const void *W, const void *targets, int N, int C,
                                                     int V, int chunk, float inv_count, int accumulate, void *stream)
{
    fused_classifier_forward_backward((float *)losses, (bf16 *)dx, (bf16 *)dW, (bf16 *)logits_scratch, (const bf16 *)x,
                                      (const bf16 *)W, (const int *)targets, N, C, V, chunk, inv_count, accumulate,
                                      as_stream(stream));
}

/* Losses only (evaluation). Needs llmc_init(). */
LLMC_API void llmc_fused_classifier_forward(void *losses, void *logits_scratch, const void *x, const void *W,
                                            const void *targets, int N, int C, int V, int chunk, void *stream)
{
    fused_classifier_forward((float *)losses, (bf16 *)logits_scratch, (const bf16 *)x, (const bf16 *)W,
                             (const int *)targets, N, C, V, chunk, as_stream(stream));
}

/* out[0] = sum of losses[0..N), fixed order. */
LLMC_API void llmc_loss_sum(void *out, const void *losses, int N, void *stream)
{
    loss_sum((float *)out, (const float *)losses, N, as_stream(stream));
}

/* ---- AdamW on flat buffers: the fp32 master as param [n] bf16 + master_lo [n] int16
 * (llmc/kernels/master_weights.h), grad [n] bf16, m, v [n] fp32; weight decay per run ---- */

/* Floats of scratch that llmc_global_norm_squared needs. */
LLMC_API int llmc_norm_scratch_floats(void)
{
    return NORM_BLOCKS;
}

/* out[0] = sum of grad[i]^2 over n bf16 gradients (16-byte aligned). */
LLMC_API void llmc_global_norm_squared(void *out, void *scratch, const void *grad, int64_t n, void *stream)
{
    global_norm_squared((float *)out, (float *)scratch, (const bf16 *)grad, n, as_stream(stream));
}

/* master [n] fp32 -> (param [n] bf16, master_lo [n] int16), exactly; and back. For
 * setting up and reading the optimizer state; not part of a step. */
__global__ void capi_master_split_kernel(uint16_t *param, int16_t *master_lo, const float *master, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        master_split(master[i], &param[i], &master_lo[i]);
}
__global__ void capi_master_join_kernel(float *master, const uint16_t *param, const int16_t *master_lo, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        master[i] = master_join(param[i], master_lo[i]);
}
static inline int capi_blocks(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (int)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}
LLMC_API void llmc_master_split(void *param, void *master_lo, const void *master, int64_t n, void *stream)
{
    capi_master_split_kernel<<<capi_blocks(n), 256, 0, as_stream(stream)>>>((uint16_t *)param, (int16_t *)master_lo,
                                                                            (const float *)master, n);
    CUDA_CHECK_LAST();
}
LLMC_API void llmc_master_join(void *master, const void *param, const void *master_lo, int64_t n, void *stream)
{
    capi_master_join_kernel<<<capi_blocks(n), 256, 0, as_stream(stream)>>>((float *)master, (const uint16_t *)param,
                                                                           (const int16_t *)master_lo, n);
    CUDA_CHECK_LAST();
}

/* The weight-decay table (adamw.h's AdamWRuns) on the device, from host arrays:
 * start[n_runs] int64 (ascending multiples of 4, start[0] = 0), decay[n_runs] uint8.
 * Setup: allocates and copies synchronously; returns a handle for llmc_adamw_update /
 * llmc_adamw_step, freed with llmc_adamw_runs_free. */
LLMC_API void *llmc_adamw_runs_create(const int64_t *start, const unsigned char *decay, int n_runs)
{
    AdamWRuns *runs = (AdamWRuns *)malloc_check(sizeof(AdamWRuns), "AdamW runs handle");
    *runs = adamw_runs_create(start, decay, n_runs);
    return runs;
}

LLMC_API void llmc_adamw_runs_free(void *runs)
{
    if (runs == NULL)
        return;
    adamw_runs_free((AdamWRuns *)runs);
    free(runs);
}

LLMC_API void llmc_clip_coefficient(void *coef, const void *norm_squared, float max_norm, void *stream)
{
    clip_coefficient((float *)coef, (const float *)norm_squared, max_norm, as_stream(stream));
}

/* adamw.h's scalars of step `step` from the C API's floats. */
static AdamWScalars capi_adamw_scalars(float lr, float beta1, float beta2, float eps, float weight_decay, int step)
{
    AdamWConfig c = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay};
    return adamw_scalars(&c, lr, step);
}

/* Elements [first, first + n) of the flat buffers; every pointer points at element first
 * of its buffer, runs (llmc_adamw_runs_create) is indexed by first + i. grad_scale: one
 * device float multiplying grad (e.g. llmc_clip_coefficient's output). */
LLMC_API void llmc_adamw_update(void *param, void *master_lo, const void *grad, void *m, void *v, int64_t first,
                                int64_t n, const void *runs, float lr, float beta1, float beta2, float eps,
                                float weight_decay, const void *grad_scale, int step, void *stream)
{
    adamw_update((bf16 *)param, (int16_t *)master_lo, (const bf16 *)grad, (float *)m, (float *)v, first, n,
                 (const AdamWRuns *)runs, capi_adamw_scalars(lr, beta1, beta2, eps, weight_decay, step),
                 (const float *)grad_scale, as_stream(stream));
}

/* One optimizer step over whole flat buffers of n elements, as train_llama does it: norm
 * of grad, clip coefficient, one AdamW launch with the clip folded into the gradient
 * scale. work: 2 + NORM_BLOCKS floats of device memory (norm squared, coefficient, norm
 * partials). */
LLMC_API void llmc_adamw_step(void *param, void *master_lo, const void *grad, void *m, void *v, int64_t n,
                              const void *runs, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float max_norm, int step, void *work, void *stream)
{
    float *w = (float *)work;
    cudaStream_t s = as_stream(stream);
    global_norm_squared(w, w + 2, (const bf16 *)grad, n, s);
    clip_coefficient(w + 1, w, max_norm, s);
    adamw_update((bf16 *)param, (int16_t *)master_lo, (const bf16 *)grad, (float *)m, (float *)v, 0, n,
                 (const AdamWRuns *)runs, capi_adamw_scalars(lr, beta1, beta2, eps, weight_decay, step), w + 1, s);
}
