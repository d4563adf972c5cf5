/*
 * train_llama_ref.c: the plain-C, fp32, CPU reference trainer of Llama 3.
 *
 * Forward, backward and AdamW of HF transformers' LlamaForCausalLM (the model
 * of llmc/model/llama_config.h), written to be read top to bottom, in the style of
 * llm.c's train_gpt2.c. test_llama_ref.c checks it against PyTorch dumps. Its
 * command-line trainer supplies the model's operations to the run it shares
 * with train_llama (llmc/run/train_loop.h), so that the two cannot drift.
 *
 * Parameters and their gradients live in two flat float arrays with the layout
 * of llama_param_layout(); q/k/v and gate/up are adjacent there, so each pair
 * (triple) is one matmul. Every index that multiplies sizes is int64.
 *
 * Build: gcc -O3 -march=native -fopenmp -std=gnu11 -Wall -Wextra -I. train_llama_ref.c -o train_llama_ref -lm
 * (OpenMP is optional; without it everything runs on one core.)
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
/* Without OpenMP the omp pragmas are plain serial loops, not mistakes. */
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#endif

#include "llmc/kernels/adamw_cpu.h"
#include "llmc/run/batch_source.h"
#include "llmc/formats/checkpoint.h"
#include "llmc/formats/dataloader.h"
#include "llmc/model/documents.h"
#include "llmc/run/flags.h"
#include "llmc/kernels/fp8.h"
#include "llmc/model/llama_config.h"
#include "llmc/run/run_log.h"
#include "llmc/run/schedule.h"
#include "llmc/formats/tensorfile.h"
#include "llmc/run/train_flags.h"
#include "llmc/run/train_loop.h"
#include "llmc/run/train_outputs.h"
#include "llmc/common/utils.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/linear_shapes.h"
#include "llmc/model/rope_freqs.h"

/* ------------------------------------------------------------------------- */
/* matmuls: out = inp @ weight^T, weight row-major [OC, IC] as in nn.Linear    */

/* Eight partial sums, so the compiler can keep them in one vector register
 * without reassociating (which it may not do for floats). */
static inline float dot(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    }
    float sum = 0.0f;
    for (; i < n; i++)
        sum += a[i] * b[i];
    for (int j = 0; j < 8; j++)
        sum += acc[j];
    return sum;
}

static inline void axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/*
 * The matmuls are blocked so that the compiler keeps a small tile of results
 * in vector registers (16 of them suffice, the 128-bit x86 set) while it
 * streams the operands, and so that each operand block, once loaded, is
 * reused from cache: the weight matrix (up to the 128K-row lm_head) is read
 * from memory once per block of 64 rows, not once per row. Sums run in fp32
 * (the dot products in interleaved partial sums), so results differ from a
 * plain loop only in the last bits.
 */
#define ROW_BLOCK 64

/* out[0..2) x [0..4) (row stride ldo) = a[2 rows, K] . w[4 rows, K] */
static inline void dot_tile_2x4(float *out, int64_t ldo, const float *a, const float *w, int64_t K)
{
    float acc[2][4][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        for (int r = 0; r < 2; r++) {
            for (int c = 0; c < 4; c++) {
                for (int l = 0; l < 4; l++)
                    acc[r][c][l] += a[r * K + k + l] * w[c * K + k + l];
            }
        }
    }
    for (int r = 0; r < 2; r++) {
        for (int c = 0; c < 4; c++) {
            float sum = 0.0f;
            for (int64_t kk = k; kk < K; kk++)
                sum += a[r * K + kk] * w[c * K + kk];
            out[r * ldo + c] = sum + ((acc[r][c][0] + acc[r][c][1]) + (acc[r][c][2] + acc[r][c][3]));
        }
    }
}

/* out[N, OC] = inp[N, IC] @ weight[OC, IC]^T */
static void matmul_forward(float *out, const float *inp, const float *weight, int64_t N, int64_t IC, int64_t OC)
{
    int64_t row_blocks = (N + ROW_BLOCK - 1) / ROW_BLOCK, col_tiles = (OC + 3) / 4;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t nb = 0; nb < row_blocks; nb++) {
        for (int64_t ct = 0; ct < col_tiles; ct++) {
            int64_t o0 = ct * 4, n_end = nb * ROW_BLOCK + ROW_BLOCK < N ? nb * ROW_BLOCK + ROW_BLOCK : N;
            for (int64_t n0 = nb * ROW_BLOCK; n0 < n_end; n0 += 2) {
                if (n0 + 2 <= n_end && o0 + 4 <= OC) {
                    dot_tile_2x4(out + n0 * OC + o0, OC, inp + n0 * IC, weight + o0 * IC, IC);
                    continue;
                }
                for (int64_t n = n0; n < n0 + 2 && n < n_end; n++) {
                    for (int64_t o = o0; o < o0 + 4 && o < OC; o++)
                        out[n * OC + o] = dot(inp + n * IC, weight + o * IC, IC);
                }
            }
        }
    }
}

/* C[M, N] += A[M, K] @ B[K, N], B and C row-major, A's element (m, k) at
 * A[m * a_row + k * a_col], so that A may be a transpose. Threads own blocks
 * of ROW_BLOCK rows of C; within one, each block of K_BLOCK rows of B is
 * reused from cache by all its pairs of rows. One parallel region per call:
 * on a busy machine every extra barrier waits for a descheduled thread. */
#define K_BLOCK 256
static void matmul_accumulate(float *C, const float *A, int64_t a_row, int64_t a_col, const float *B, int64_t M,
                              int64_t N, int64_t K)
{
    int64_t row_blocks = (M + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t mb = 0; mb < row_blocks; mb++) {
        int64_t m_end = mb * ROW_BLOCK + ROW_BLOCK < M ? mb * ROW_BLOCK + ROW_BLOCK : M;
        for (int64_t k0 = 0; k0 < K; k0 += K_BLOCK) {
            int64_t k_end = k0 + K_BLOCK < K ? k0 + K_BLOCK : K;
            for (int64_t m0 = mb * ROW_BLOCK; m0 < m_end; m0 += 2) {
                int64_t j0 = 0;
                if (m0 + 2 <= m_end) {
                    for (; j0 + 16 <= N; j0 += 16) {
                        float acc[2][16];
                        for (int r = 0; r < 2; r++)
                            memcpy(acc[r], C + (m0 + r) * N + j0, sizeof(acc[r]));
                        for (int64_t k = k0; k < k_end; k++) {
                            const float *b = B + k * N + j0;
                            for (int r = 0; r < 2; r++) {
                                float a = A[(m0 + r) * a_row + k * a_col];
                                for (int l = 0; l < 16; l++)
                                    acc[r][l] += a * b[l];
                            }
                        }
                        for (int r = 0; r < 2; r++)
                            memcpy(C + (m0 + r) * N + j0, acc[r], sizeof(acc[r]));
                    }
                }
                /* what the tiles left: the last columns, or a last odd row */
                for (int64_t m = m0; m < m0 + 2 && m < m_end; m++) {
                    for (int64_t k = k0; k < k_end; k++) {
                        float a = A[m * a_row + k * a_col];
                        for (int64_t j = m0 + 2 <= m_end ? j0 : 0; j < N; j++)
                            C[m * N + j] += a * B[k * N + j];
                    }
                }
            }
        }
    }
}

/* dinp[N, IC] += dout[N, OC] @ weight[OC, IC];  dweight[OC, IC] += dout^T @ inp */
static void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                            int64_t N, int64_t IC, int64_t OC)
{
    matmul_accumulate(dinp, dout, OC, 1, weight, N, IC, OC);
    matmul_accumulate(dweight, dout, 1, OC, inp, OC, IC, N);
}

/* ------------------------------------------------------------------------- */
/* layers                                                                     */

/* HF's LlamaRMSNorm: out = weight * (x * rsqrt(mean(x^2) + eps)), all in fp32.
 * rstd is kept for the backward pass. */
static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t N, int64_t C,
                            float eps)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float ss = 0.0f;
        for (int64_t i = 0; i < C; i++)
            ss += x[i] * x[i];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        for (int64_t i = 0; i < C; i++)
            out[n * C + i] = weight[i] * (x[i] * r);
        rstd[n] = r;
    }
}

/* With g = weight * dout and xhat = x * r:  dx = r * (g - xhat * mean(g * xhat)),
 * dweight = sum over rows of dout * xhat. dinp is accumulated into, because it
 * is the residual stream's gradient, which also flows around the norm. */
static void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                             const float *rstd, int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        float r = rstd[n];
        float mean_gx = 0.0f;
        for (int64_t i = 0; i < C; i++)
            mean_gx += weight[i] * dy[i] * x[i] * r;
        mean_gx /= (float)C;
        for (int64_t i = 0; i < C; i++)
            dinp[n * C + i] += r * (weight[i] * dy[i] - x[i] * r * mean_gx);
    }
    /* Serial over rows per column: a parallel reduction into dweight would race. */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < C; i++) {
        float sum = 0.0f;
        for (int64_t n = 0; n < N; n++)
            sum += dout[n * C + i] * inp[n * C + i] * rstd[n];
        dweight[i] += sum;
    }
}

/* Qwen2's q, k, v biases: qkv rows [N, QKV] += bias [QKV] (q's, k's and v's back to back). */
static void bias_forward(float *out, const float *bias, int64_t N, int64_t OC)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < OC; j++)
            out[n * OC + j] += bias[j];
}

/* dbias [OC] += the column sums of dout [N, OC]; serial over rows per column (no race). */
static void bias_backward(float *dbias, const float *dout, int64_t N, int64_t OC)
{
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < OC; j++) {
        float sum = 0.0f;
        for (int64_t n = 0; n < N; n++)
            sum += dout[n * OC + j];
        dbias[j] += sum;
    }
}

/* Qwen3's RMSNorm of each head of q (weight wq [D]) and of k (wk [D]), in place in the
 * qkv rows [N, (H+2KV)D], before RoPE; raw keeps the heads before it [N, H+KV, D] and
 * rstd [N, H+KV] their statistics, for the backward pass. */
static void qk_norm_forward(float *qkv, float *raw, float *rstd, const float *wq, const float *wk, int64_t N, int H,
                            int KV, int D, float eps)
{
    int64_t QKV = (int64_t)(H + 2 * KV) * D, heads = H + KV;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t h = 0; h < heads; h++) {
            float *x = qkv + n * QKV + h * D, *r = raw + (n * heads + h) * D;
            const float *w = h < H ? wq : wk;
            memcpy(r, x, (size_t)D * sizeof(float));
            float ss = 0.0f;
            for (int i = 0; i < D; i++)
                ss += r[i] * r[i];
            float rs = 1.0f / sqrtf(ss / (float)D + eps);
            for (int i = 0; i < D; i++)
                x[i] = w[i] * (r[i] * rs);
            rstd[n * heads + h] = rs;
        }
    }
}

/* Its backward, in place: dqkv's q and k heads, the gradient of the normed heads,
 * become that of the raw ones (rmsnorm_backward's formula per head); dwq and dwk
 * accumulate. */
static void qk_norm_backward(float *dqkv, float *dwq, float *dwk, const float *raw, const float *rstd, const float *wq,
                             const float *wk, int64_t N, int H, int KV, int D)
{
    int64_t QKV = (int64_t)(H + 2 * KV) * D, heads = H + KV;
    /* the weights' gradients first, from dqkv as it still is: serial over rows per column */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < 2 * D; i++) {
        int of_k = i >= D, col = i % D;
        float sum = 0.0f;
        for (int64_t n = 0; n < N; n++)
            for (int64_t h = of_k ? H : 0; h < (of_k ? heads : H); h++)
                sum += dqkv[n * QKV + h * D + col] * raw[(n * heads + h) * D + col] * rstd[n * heads + h];
        (of_k ? dwk : dwq)[col] += sum;
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t h = 0; h < heads; h++) {
            float *dy = dqkv + n * QKV + h * D;
            const float *x = raw + (n * heads + h) * D, *w = h < H ? wq : wk;
            float r = rstd[n * heads + h], mean_gx = 0.0f;
            for (int i = 0; i < D; i++)
                mean_gx += w[i] * dy[i] * x[i] * r;
            mean_gx /= (float)D;
            for (int i = 0; i < D; i++)
                dy[i] = r * (w[i] * dy[i] - x[i] * r * mean_gx);
        }
    }
}

/* cos/sin tables [T, D/2] of the angle pos * inv_freq[i], the angle rounded to
 * fp32 as HF computes it; the second half of head_dim reuses the first's. */
static void rope_tables(float *cos_t, float *sin_t, const float *inv_freq, int T, int half)
{
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cos_t[t * half + i] = cosf(angle);
            sin_t[t * half + i] = sinf(angle);
        }
    }
}

/* HF's rotate-half RoPE in place on n_heads heads of size 2*half at each token:
 * x*cos + rotate_half(x)*sin, rotate_half(x) = cat(-x2, x1). With sign = -1 it
 * applies the transpose (the inverse rotation), which is the backward pass.
 * Token bt's position is pos[bt] (packed documents), or its place in the row when pos is NULL. */
static void rope_apply(float *x, int64_t stride, const float *cos_t, const float *sin_t, int B, int T, int n_heads,
                       int half, float sign, const int *pos)
{
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int t = pos ? pos[bt] : (int)(bt % T);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + bt * stride + (int64_t)h * 2 * half;
            for (int i = 0; i < half; i++) {
                float c = cos_t[t * half + i], s = sign * sin_t[t * half + i];
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

/* Causal softmax attention with grouped-query heads. qkv is [B, T, (H + 2 KV) D]
 * (q heads, then k heads, then v heads); query head h reads kv head h / (H / KV).
 * att [B, H, T, T] keeps the probabilities (zero above the diagonal), out is [B, T, H D].
 * Packed documents: token bt attends only to tokens first[bt]..t of its row (its own
 * document); first NULL: to the whole row before it. */
static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int H, int KV, int D,
                              const int *first)
{
    int64_t qkv_c = (int64_t)(H + 2 * KV) * D;
    int group = H / KV;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(static)
    for (int64_t bht = 0; bht < (int64_t)B * H * T; bht++) {
        int t = (int)(bht % T), h = (int)(bht / T % H);
        int64_t b = bht / T / H;
        int kvh = h / group;
        const float *q = qkv + (b * T + t) * qkv_c + (int64_t)h * D;
        float *p = att + bht * T;
        int t0 = first ? first[b * T + t] : 0;
        float maxval = -INFINITY;
        for (int t2 = 0; t2 < t0; t2++)
            p[t2] = 0.0f;
        for (int t2 = t0; t2 <= t; t2++) {
            const float *k = qkv + (b * T + t2) * qkv_c + (int64_t)(H + kvh) * D;
            p[t2] = dot(q, k, D) * scale;
            if (p[t2] > maxval)
                maxval = p[t2];
        }
        float sum = 0.0f;
        for (int t2 = t0; t2 <= t; t2++) {
            p[t2] = expf(p[t2] - maxval);
            sum += p[t2];
        }
        for (int t2 = t0; t2 <= t; t2++)
            p[t2] /= sum;
        for (int t2 = t + 1; t2 < T; t2++)
            p[t2] = 0.0f;
        float *o = out + (b * T + t) * (int64_t)H * D + (int64_t)h * D;
        for (int d = 0; d < D; d++)
            o[d] = 0.0f;
        for (int t2 = t0; t2 <= t; t2++) {
            axpy(o, p[t2], qkv + (b * T + t2) * qkv_c + (int64_t)(H + KV + kvh) * D, D);
        }
    }
}

/* dqkv must be zeroed; datt is scratch of att's size. Threads own a (batch,
 * kv head) pair and every query head of its group, since those all write the
 * same dk and dv rows. first: as in attention_forward. */
static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att, int B,
                               int T, int H, int KV, int D, const int *first)
{
    int64_t qkv_c = (int64_t)(H + 2 * KV) * D;
    int group = H / KV;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(static)
    for (int64_t bk = 0; bk < (int64_t)B * KV; bk++) {
        int64_t b = bk / KV;
        int kvh = (int)(bk % KV);
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            for (int t = 0; t < T; t++) {
                int64_t row = ((b * H + h) * T + t) * T;
                const float *p = att + row;
                float *dp = datt + row;
                const float *dy = dout + (b * T + t) * (int64_t)H * D + (int64_t)h * D;
                const float *q = qkv + (b * T + t) * qkv_c + (int64_t)h * D;
                float *dq = dqkv + (b * T + t) * qkv_c + (int64_t)h * D;
                int t0 = first ? first[b * T + t] : 0;
                float sum = 0.0f;
                for (int t2 = t0; t2 <= t; t2++) {
                    const float *v = qkv + (b * T + t2) * qkv_c + (int64_t)(H + KV + kvh) * D;
                    float *dv = dqkv + (b * T + t2) * qkv_c + (int64_t)(H + KV + kvh) * D;
                    dp[t2] = dot(dy, v, D);
                    axpy(dv, p[t2], dy, D);
                    sum += p[t2] * dp[t2];
                }
                /* softmax backward, then the scores' backward into q and k */
                for (int t2 = t0; t2 <= t; t2++) {
                    float ds = p[t2] * (dp[t2] - sum) * scale;
                    const float *k = qkv + (b * T + t2) * qkv_c + (int64_t)(H + kvh) * D;
                    float *dk = dqkv + (b * T + t2) * qkv_c + (int64_t)(H + kvh) * D;
                    axpy(dq, ds, k, D);
                    axpy(dk, ds, q, D);
                }
            }
        }
    }
}

/* SwiGLU: out = silu(gate) * up with gate_up [N, 2F] = (gate | up) per row. */
static void swiglu_forward(float *out, const float *gate_up, int64_t N, int64_t F)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = gate_up + n * 2 * F, *u = g + F;
        for (int64_t i = 0; i < F; i++)
            out[n * F + i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

static void swiglu_backward(float *dgate_up, const float *dout, const float *gate_up, int64_t N, int64_t F)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = gate_up + n * 2 * F, *u = g + F;
        float *dg = dgate_up + n * 2 * F, *du = dg + F;
        for (int64_t i = 0; i < F; i++) {
            float s = 1.0f / (1.0f + expf(-g[i]));
            float dy = dout[n * F + i];
            dg[i] = dy * u[i] * s * (1.0f + g[i] * (1.0f - s));
            du[i] = dy * g[i] * s;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* the model                                                                  */

/* Activations kept for the backward pass, per layer l (BT = B*T). */
typedef struct {
    float *resid;     /* (L+1) x BT x C: residual stream into layer l; resid[l+1] is layer l's output */
    float *resid_mid; /* L x BT x C: after layer l's attention half */
    float *ln1;       /* L x BT x C */
    float *ln1_rstd;  /* L x BT */
    float *qkv;       /* L x BT x (H+2KV)D, q and k after RoPE */
    float *qk_raw;    /* with qk_norm: L x BT x (H+KV)D, the q and k heads before their RMSNorm */
    float *qk_rstd;   /* with qk_norm: L x BT x (H+KV) */
    float *att;       /* L x B x H x T x T softmax probabilities */
    float *atty;      /* L x BT x HD: attention output before o_proj */
    float *ln2;       /* L x BT x C */
    float *ln2_rstd;  /* L x BT */
    float *gate_up;   /* L x BT x 2F */
    float *mlp_h;     /* L x BT x F: silu(gate) * up */
    float *lnf;       /* BT x C */
    float *lnf_rstd;  /* BT */
    float *logits;    /* BT x V; the backward pass overwrites it with d loss / d logits */
    float *lse;       /* BT: log-sum-exp of each logits row */
} Activations;

/* Gradient buffers of one layer's activations, reused by every layer. */
typedef struct {
    float *dresid;   /* BT x C: the residual stream's gradient, carried down the layers */
    float *dln;      /* BT x C */
    float *dqkv;     /* BT x (H+2KV)D */
    float *datt;     /* B x H x T x T */
    float *datty;    /* BT x HD */
    float *dgate_up; /* BT x 2F */
    float *dmlp_h;   /* BT x F */
} Scratch;

typedef struct {
    LlamaConfig config;
    ParamLayout layout;
    float *params; /* layout.total floats */
    float *grads;  /* layout.total floats, same layout */
    float *adam_m, *adam_v;
    int adam_step;
    float *inv_freq;  /* head_dim / 2 */
    int B, T;         /* the shape the activations were allocated for; 0 until the first forward */
    int fwd_B, fwd_T; /* the shape of the last forward: B*T and T at most the allocated ones */
    Activations acts;
    Scratch scratch;
    float *rope_cos, *rope_sin;  /* T x head_dim/2 */
    const int *inputs, *targets; /* of the last forward, for the backward pass */
    double loss_sum;             /* sum of the cross-entropy over the counted targets of the last forward */
    int64_t n_counted;           /* targets != IGNORE_INDEX in the last forward */
    float mean_loss;             /* loss_sum / n_counted, as F.cross_entropy reports it; NaN if none counted */
    int fp8;     /* Fp8Recipe: the layers' GEMMs on FP8 values (linear_forward), or 0; set before the first forward */
    int doc_bos; /* packed documents (llmc/model/documents.h): the token that starts one, or -1: none */
    int doc_positions;               /* with doc_bos: RoPE positions restart at 0 in each document */
    int *doc_first, *doc_pos;        /* BT each: where a token's document starts in its row, and the token's position */
    float *fp8_in, *fp8_out, *fp8_w; /* their quantised operands: BT x widest input, BT x widest output, largest W */
} Llama;

static inline float *param(const Llama *m, int index)
{
    return m->params + m->layout.tensors[index].offset;
}
static inline float *grad(const Llama *m, int index)
{
    return m->grads + m->layout.tensors[index].offset;
}

static void llama_build(Llama *m, const LlamaConfig *config)
{
    memset(m, 0, sizeof(*m));
    char err[512];
    if (llama_config_check(config, err, sizeof(err)) != 0)
        FAIL("bad model config: %s", err);
    m->config = *config;
    m->doc_bos = -1;
    m->layout = llama_param_layout(config);
    size_t bytes = (size_t)m->layout.total * sizeof(float);
    m->params = (float *)malloc_check(bytes, "parameters");
    m->grads = (float *)calloc_check((size_t)m->layout.total, sizeof(float), "gradients");
    m->inv_freq = (float *)malloc_check((size_t)config->head_dim / 2 * sizeof(float), "RoPE frequencies");
    llama_rope_inv_freq(config, m->inv_freq);
}

/* HF's init: normal(0, init_std) for every matrix, ones for the RMSNorm weights. */
static void llama_init_random(Llama *m, uint64_t seed)
{
    llama_init_weights_host(m->params, &m->config, &m->layout, seed);
}

#ifdef TESTING
/* Build the model a weights file (an HF directory or a .llmt file) describes and load its tensors, by HF name:
 * for the tests (the trainer builds from its flags' config, then train_loop.h loads the weights). */
static void llama_load(Llama *m, const char *path)
{
    HfTokenIds ids;
    LlamaConfig config = model_config_load(path, &ids); /* an HF model directory or a .llmt file */
    llama_build(m, &config);
    model_weights_load(path, &m->layout, m->params);
    checkpoint_init_from_verify(path, &m->layout, m->params); /* a checkpoint's files against its manifest */
}
#endif

static void llama_alloc_activations(Llama *m, int B, int T)
{
    const LlamaConfig *c = &m->config;
    int64_t L = c->n_layer, C = c->d_model, V = c->vocab_size, F = c->ffn_dim;
    int64_t BT = (int64_t)B * T, HD = (int64_t)c->n_head * c->head_dim;
    int64_t QKV = (int64_t)(c->n_head + 2 * c->n_kv_head) * c->head_dim;
    int64_t QK = (int64_t)(c->n_head + c->n_kv_head) * c->head_dim;
    int64_t ATT = (int64_t)B * c->n_head * T * T;
    Activations *a = &m->acts;
    Scratch *s = &m->scratch;
    int64_t half = c->head_dim / 2;
    struct {
        float **ptr;
        int64_t n;
        const char *what;
    } bufs[] = {
        {&a->resid, (L + 1) * BT * C, "activations: residual stream"},
        {&a->resid_mid, L * BT * C, "activations: residual stream"},
        {&a->ln1, L * BT * C, "activations: RMSNorm outputs"},
        {&a->ln1_rstd, L * BT, "activations: RMSNorm statistics"},
        {&a->qkv, L * BT * QKV, "activations: q, k, v"},
        {&a->qk_raw, c->qk_norm ? L * BT * QK : 1, "activations: q and k before their norm"},
        {&a->qk_rstd, c->qk_norm ? L * BT * (c->n_head + c->n_kv_head) : 1, "activations: q and k norm statistics"},
        {&a->att, L * ATT, "activations: attention probabilities (B x heads x T x T per layer; lower T or B)"},
        {&a->atty, L * BT * HD, "activations: attention outputs"},
        {&a->ln2, L * BT * C, "activations: RMSNorm outputs"},
        {&a->ln2_rstd, L * BT, "activations: RMSNorm statistics"},
        {&a->gate_up, L * BT * 2 * F, "activations: MLP gate and up"},
        {&a->mlp_h, L * BT * F, "activations: MLP hidden"},
        {&a->lnf, BT * C, "activations: final RMSNorm"},
        {&a->lnf_rstd, BT, "activations: final RMSNorm statistics"},
        {&a->logits, BT * V, "activations: logits (B x T x vocab)"},
        {&a->lse, BT, "activations: log-sum-exp"},
        {&s->dresid, BT * C, "backward scratch"},
        {&s->dln, BT * C, "backward scratch"},
        {&s->dqkv, BT * QKV, "backward scratch"},
        {&s->datt, ATT, "backward scratch: attention (B x heads x T x T)"},
        {&s->datty, BT * HD, "backward scratch"},
        {&s->dgate_up, BT * 2 * F, "backward scratch"},
        {&s->dmlp_h, BT * F, "backward scratch"},
        {&m->rope_cos, T * half, "RoPE table"},
        {&m->rope_sin, T * half, "RoPE table"},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        *bufs[i].ptr = (float *)malloc_check((size_t)bufs[i].n * sizeof(float), bufs[i].what);
    }
    if (m->fp8) {
        LinearExtents e = llama_linear_extents(&m->config);
        m->fp8_in = (float *)malloc_check((size_t)(BT * e.widest_in) * sizeof(float), "FP8 emulation: inputs");
        m->fp8_out = (float *)malloc_check((size_t)(BT * e.widest_out) * sizeof(float), "FP8 emulation: gradients");
        m->fp8_w = (float *)malloc_check((size_t)e.largest_w * sizeof(float), "FP8 emulation: weights");
    }
    m->doc_first = (int *)malloc_check((size_t)BT * sizeof(int), "document starts");
    m->doc_pos = (int *)malloc_check((size_t)BT * sizeof(int), "document positions");
    rope_tables(m->rope_cos, m->rope_sin, m->inv_freq, T, (int)half);
    m->B = B;
    m->T = T;
}

static void llama_free(Llama *m)
{
    Activations *a = &m->acts;
    Scratch *s = &m->scratch;
    float *bufs[] = {m->params, m->grads,     m->adam_m,  m->adam_v,   m->inv_freq, m->rope_cos, m->rope_sin,
                     a->resid,  a->resid_mid, a->ln1,     a->ln1_rstd, a->qkv,      a->att,      a->atty,
                     a->ln2,    a->ln2_rstd,  a->gate_up, a->mlp_h,    a->lnf,      a->lnf_rstd, a->logits,
                     a->lse,    s->dresid,    s->dln,     s->dqkv,     s->datt,     s->datty,    s->dgate_up,
                     s->dmlp_h, m->fp8_in,    m->fp8_out, m->fp8_w,    a->qk_raw,   a->qk_rstd};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    free(m->doc_first);
    free(m->doc_pos);
    llama_param_layout_free(&m->layout);
    memset(m, 0, sizeof(*m));
}

/* What attention and RoPE take of the last forward's documents: where each
 * token's document starts, and its position, or NULL (one document per row;
 * positions along the row). */
static void llama_document_views(const Llama *m, const int **first, const int **pos)
{
    *first = m->doc_bos >= 0 ? m->doc_first : NULL;
    *pos = m->doc_bos >= 0 && m->doc_positions ? m->doc_pos : NULL;
}

/* FP8 training's GEMMs (--fp8, issue 15), emulated: each operand is rounded
 * to FP8 in the blocks of m->fp8's recipe (llmc/kernels/fp8.h), each block at the
 * scale of its own amax (codes of x * 448 / amax, saturating, ties to even),
 * and used as the exact values those codes stand for; the products are then
 * summed in fp32 as everywhere here. Inputs and weights are E4M3; output
 * gradients E5M2 (wider range, one bit less) with one scale per tensor, E4M3
 * with the finer recipes' scales. A GEMM's blocks run along the dimension it
 * sums over, so the backward's GEMMs round the forward's operands afresh where
 * that dimension differs (the tokens for the weight gradient, the outputs for
 * the input gradient); per tensor they see the forward's rounding again.
 * out (which may be in) = in[R, C] rounded in blocks of block_rows x block_cols. */
static void fp8_round_blocks(float *out, const float *in, int64_t R, int64_t C, int64_t block_rows, int64_t block_cols,
                             Fp8Format f)
{
    int64_t row_blocks = (R + block_rows - 1) / block_rows, col_blocks = (C + block_cols - 1) / block_cols;
    if (row_blocks * col_blocks == 1) { /* one scale: the amax over the whole tensor, in parallel */
        float amax = 0.0f;
#pragma omp parallel for reduction(max : amax) schedule(static)
        for (int64_t i = 0; i < R * C; i++)
            amax = fmaxf(amax, fabsf(in[i]));
        float scale = fp8_scale_from_amax(amax, f);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < R * C; i++)
            out[i] = fp8_to_float(fp8_from_float(in[i] * scale, f), f) / scale;
        return;
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t rb = 0; rb < row_blocks; rb++)
        for (int64_t cb = 0; cb < col_blocks; cb++) {
            int64_t r0 = rb * block_rows, c0 = cb * block_cols;
            int64_t r1 = r0 + block_rows < R ? r0 + block_rows : R, c1 = c0 + block_cols < C ? c0 + block_cols : C;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    amax = fmaxf(amax, fabsf(in[r * C + c]));
            float scale = fp8_scale_from_amax(amax, f);
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    out[r * C + c] = fp8_to_float(fp8_from_float(in[r * C + c] * scale, f), f) / scale;
        }
}

/* x[R, C] rounded as a GEMM that sums over its columns (along_rows 0) or its rows (1) takes it under recipe: tensor:
 * all of it; row: each row (column); block: 1 x 128 (128 x 1), or for a weight 128 x 128 either way. */
static void fp8_round_operand(float *out, const float *x, int64_t R, int64_t C, int recipe, int weight, int along_rows,
                              Fp8Format f)
{
    if (recipe == FP8_TENSOR) {
        fp8_round_blocks(out, x, R, C, R, C, f);
        return;
    }
    /* the block's extent along the summed dimension, and across it */
    int64_t along = recipe == FP8_ROW ? (along_rows ? R : C) : 128, across = recipe == FP8_BLOCK && weight ? 128 : 1;
    if (along_rows)
        fp8_round_blocks(out, x, R, C, along, across, f);
    else
        fp8_round_blocks(out, x, R, C, across, along, f);
}

/* matmul_forward of a layer's Linear; on FP8 values when m->fp8. */
static void linear_forward(const Llama *m, float *out, const float *inp, const float *weight, int64_t N, int64_t IC,
                           int64_t OC)
{
    if (!m->fp8) {
        matmul_forward(out, inp, weight, N, IC, OC);
        return;
    }
    fp8_round_operand(m->fp8_in, inp, N, IC, m->fp8, 0, 0, FP8_E4M3);
    fp8_round_operand(m->fp8_w, weight, OC, IC, m->fp8, 1, 0, FP8_E4M3);
    matmul_forward(out, m->fp8_in, m->fp8_w, N, IC, OC);
}

/* matmul_backward of a layer's Linear; on FP8 values when m->fp8. */
static void linear_backward(const Llama *m, float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, int64_t N, int64_t IC, int64_t OC)
{
    if (!m->fp8) {
        matmul_backward(dinp, dweight, dout, inp, weight, N, IC, OC);
        return;
    }
    Fp8Format g = m->fp8 == FP8_TENSOR ? FP8_E5M2 : FP8_E4M3;
    /* dinp += dout @ W: sums over the outputs */
    fp8_round_operand(m->fp8_out, dout, N, OC, m->fp8, 0, 0, g);
    fp8_round_operand(m->fp8_w, weight, OC, IC, m->fp8, 1, 1, FP8_E4M3);
    matmul_accumulate(dinp, m->fp8_out, OC, 1, m->fp8_w, N, IC, OC);
    /* dweight += dout^T @ inp: sums over the tokens */
    fp8_round_operand(m->fp8_out, dout, N, OC, m->fp8, 0, 1, g);
    fp8_round_operand(m->fp8_in, inp, N, IC, m->fp8, 0, 1, FP8_E4M3);
    matmul_accumulate(dweight, m->fp8_out, 1, OC, m->fp8_in, OC, IC, N);
}

/* Forward pass on inputs [B, T]. With targets (IGNORE_INDEX where not counted)
 * it also computes the loss; inputs and targets must stay alive for llama_backward. */
static void llama_forward(Llama *m, const int *inputs, const int *targets, int B, int T)
{
    const LlamaConfig *c = &m->config;
    if (T > c->max_seq_len) {
        FAIL("sequence length T=%d exceeds the model's max_seq_len %d\n  hint: lower -T", T, c->max_seq_len);
    }
    if (m->B == 0)
        llama_alloc_activations(m, B, T);
    /* a smaller shape fits the same buffers (samples run one row of any length) */
    if ((int64_t)B * T > (int64_t)m->B * m->T || T > m->T) {
        FAIL("forward called with B=%d T=%d, but the activations were allocated for B=%d T=%d", B, T, m->B, m->T);
    }
    int64_t L = c->n_layer, C = c->d_model, V = c->vocab_size, F = c->ffn_dim;
    int H = c->n_head, KV = c->n_kv_head, D = c->head_dim;
    int64_t BT = (int64_t)B * T, HD = (int64_t)H * D, QKV = (int64_t)(H + 2 * KV) * D;
    Activations *a = &m->acts;

    for (int64_t i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V) {
            FAIL("input token %d at position %lld is outside the vocabulary [0, %lld)\n"
                 "  hint: the data was tokenized for a larger vocabulary; set --vocab or re-tokenize",
                 inputs[i], (long long)i, (long long)V);
        }
        if (targets && targets[i] != IGNORE_INDEX && (targets[i] < 0 || targets[i] >= V)) {
            FAIL("target %d at position %lld is outside the vocabulary [0, %lld) and not the ignore index %d",
                 targets[i], (long long)i, (long long)V, IGNORE_INDEX);
        }
    }

    const float *embed = param(m, 0);
    for (int64_t i = 0; i < BT; i++)
        memcpy(a->resid + i * C, embed + (int64_t)inputs[i] * C, C * sizeof(float));
    if (m->doc_bos >= 0)
        documents_find(m->doc_first, m->doc_pos, inputs, B, T, m->doc_bos);
    const int *first, *pos;
    llama_document_views(m, &first, &pos);

    for (int l = 0; l < L; l++) {
        float *x = a->resid + l * BT * C, *x_mid = a->resid_mid + l * BT * C, *x_out = a->resid + (l + 1) * BT * C;
        float *ln1 = a->ln1 + l * BT * C, *ln1_rstd = a->ln1_rstd + l * BT;
        float *qkv = a->qkv + l * BT * QKV, *att = a->att + l * (int64_t)B * H * T * T, *atty = a->atty + l * BT * HD;
        float *ln2 = a->ln2 + l * BT * C, *ln2_rstd = a->ln2_rstd + l * BT;
        float *gate_up = a->gate_up + l * BT * 2 * F, *mlp_h = a->mlp_h + l * BT * F;

        rmsnorm_forward(ln1, ln1_rstd, x, param(m, param_index_layer(&m->layout, l, LAYER_ATTN_NORM)), BT, C,
                        c->norm_eps);
        linear_forward(m, qkv, ln1, param(m, param_index_layer(&m->layout, l, LAYER_Q)), BT, C, QKV);
        if (c->qkv_bias)
            bias_forward(qkv, param(m, param_index_layer(&m->layout, l, LAYER_Q_BIAS)), BT, QKV);
        if (c->qk_norm)
            qk_norm_forward(qkv, a->qk_raw + l * BT * (H + KV) * D, a->qk_rstd + l * BT * (H + KV),
                            param(m, param_index_layer(&m->layout, l, LAYER_Q_NORM)),
                            param(m, param_index_layer(&m->layout, l, LAYER_K_NORM)), BT, H, KV, D, c->norm_eps);
        rope_apply(qkv, QKV, m->rope_cos, m->rope_sin, B, T, H + KV, D / 2, 1.0f, pos);
        attention_forward(atty, att, qkv, B, T, H, KV, D, first);
        linear_forward(m, x_mid, atty, param(m, param_index_layer(&m->layout, l, LAYER_O)), BT, HD, C);
        for (int64_t i = 0; i < BT * C; i++)
            x_mid[i] += x[i];

        rmsnorm_forward(ln2, ln2_rstd, x_mid, param(m, param_index_layer(&m->layout, l, LAYER_MLP_NORM)), BT, C,
                        c->norm_eps);
        linear_forward(m, gate_up, ln2, param(m, param_index_layer(&m->layout, l, LAYER_GATE)), BT, C, 2 * F);
        swiglu_forward(mlp_h, gate_up, BT, F);
        linear_forward(m, x_out, mlp_h, param(m, param_index_layer(&m->layout, l, LAYER_DOWN)), BT, F, C);
        for (int64_t i = 0; i < BT * C; i++)
            x_out[i] += x_mid[i];
    }

    rmsnorm_forward(a->lnf, a->lnf_rstd, a->resid + L * BT * C, param(m, param_index_final_norm(&m->layout)), BT, C,
                    c->norm_eps);
    matmul_forward(a->logits, a->lnf, param(m, param_index_lm_head(&m->layout)), BT, C, V);

    /* Cross-entropy = logsumexp(logits) - logits[target]. The exponentials are
     * summed in double: a vocabulary of 128K terms would lose digits in fp32. */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BT; i++) {
        const float *row = a->logits + i * V;
        float maxval = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            maxval = row[v] > maxval ? row[v] : maxval;
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++)
            sum += expf(row[v] - maxval);
        a->lse[i] = maxval + (float)log(sum);
    }
    m->inputs = inputs;
    m->targets = targets;
    m->fwd_B = B;
    m->fwd_T = T;
    m->loss_sum = 0.0;
    m->n_counted = 0;
    if (targets) {
        for (int64_t i = 0; i < BT; i++) {
            if (targets[i] == IGNORE_INDEX)
                continue;
            m->loss_sum += (double)a->lse[i] - a->logits[i * V + targets[i]];
            m->n_counted++;
        }
    }
    m->mean_loss = m->n_counted > 0 ? (float)(m->loss_sum / (double)m->n_counted) : NAN;
}

static void llama_zero_grad(Llama *m)
{
    memset(m->grads, 0, (size_t)m->layout.total * sizeof(float));
}

/* Accumulates into the gradients d(loss_scale * loss_sum)/d params for the last
 * forward: loss_scale = 1 / (targets counted in the whole optimizer step) gives
 * the mean loss of that step, also across gradient-accumulation micro-steps. */
static void llama_backward(Llama *m, float loss_scale)
{
    const LlamaConfig *c = &m->config;
    if (m->targets == NULL)
        FAIL("llama_backward needs a forward pass with targets first");
    int B = m->fwd_B, T = m->fwd_T;
    const int *first, *pos; /* the last forward's documents */
    llama_document_views(m, &first, &pos);
    int64_t L = c->n_layer, C = c->d_model, V = c->vocab_size, F = c->ffn_dim;
    int H = c->n_head, KV = c->n_kv_head, D = c->head_dim;
    int64_t BT = (int64_t)B * T, HD = (int64_t)H * D, QKV = (int64_t)(H + 2 * KV) * D;
    Activations *a = &m->acts;
    Scratch *s = &m->scratch;
    const int *targets = m->targets;

    /* d loss / d logits = (softmax - onehot) * loss_scale on counted rows, 0 on ignored ones. */
    float *dlogits = a->logits;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BT; i++) {
        float *row = dlogits + i * V;
        if (targets[i] == IGNORE_INDEX) {
            memset(row, 0, (size_t)V * sizeof(float));
            continue;
        }
        for (int64_t v = 0; v < V; v++)
            row[v] = expf(row[v] - a->lse[i]) * loss_scale;
        row[targets[i]] -= loss_scale;
    }

    /* lm_head (for tied embeddings its gradient lands in the embedding's) and the final norm */
    memset(s->dln, 0, (size_t)(BT * C) * sizeof(float));
    matmul_backward(s->dln, grad(m, param_index_lm_head(&m->layout)), dlogits, a->lnf,
                    param(m, param_index_lm_head(&m->layout)), BT, C, V);
    memset(s->dresid, 0, (size_t)(BT * C) * sizeof(float));
    rmsnorm_backward(s->dresid, grad(m, param_index_final_norm(&m->layout)), s->dln, a->resid + L * BT * C,
                     param(m, param_index_final_norm(&m->layout)), a->lnf_rstd, BT, C);

    for (int l = (int)L - 1; l >= 0; l--) {
        float *x = a->resid + l * BT * C, *x_mid = a->resid_mid + l * BT * C;
        float *ln1 = a->ln1 + l * BT * C, *ln1_rstd = a->ln1_rstd + l * BT;
        float *qkv = a->qkv + l * BT * QKV, *att = a->att + l * (int64_t)B * H * T * T, *atty = a->atty + l * BT * HD;
        float *ln2 = a->ln2 + l * BT * C, *ln2_rstd = a->ln2_rstd + l * BT;
        float *gate_up = a->gate_up + l * BT * 2 * F, *mlp_h = a->mlp_h + l * BT * F;

        /* MLP half: dresid holds d x_out and becomes d x_mid */
        memset(s->dmlp_h, 0, (size_t)(BT * F) * sizeof(float));
        linear_backward(m, s->dmlp_h, grad(m, param_index_layer(&m->layout, l, LAYER_DOWN)), s->dresid, mlp_h,
                        param(m, param_index_layer(&m->layout, l, LAYER_DOWN)), BT, F, C);
        swiglu_backward(s->dgate_up, s->dmlp_h, gate_up, BT, F);
        memset(s->dln, 0, (size_t)(BT * C) * sizeof(float));
        linear_backward(m, s->dln, grad(m, param_index_layer(&m->layout, l, LAYER_GATE)), s->dgate_up, ln2,
                        param(m, param_index_layer(&m->layout, l, LAYER_GATE)), BT, C, 2 * F);
        rmsnorm_backward(s->dresid, grad(m, param_index_layer(&m->layout, l, LAYER_MLP_NORM)), s->dln, x_mid,
                         param(m, param_index_layer(&m->layout, l, LAYER_MLP_NORM)), ln2_rstd, BT, C);

        /* attention half: dresid holds d x_mid and becomes d x */
        memset(s->datty, 0, (size_t)(BT * HD) * sizeof(float));
        linear_backward(m, s->datty, grad(m, param_index_layer(&m->layout, l, LAYER_O)), s->dresid, atty,
                        param(m, param_index_layer(&m->layout, l, LAYER_O)), BT, HD, C);
        memset(s->dqkv, 0, (size_t)(BT * QKV) * sizeof(float));
        attention_backward(s->dqkv, s->datt, s->datty, qkv, att, B, T, H, KV, D, first);
        rope_apply(s->dqkv, QKV, m->rope_cos, m->rope_sin, B, T, H + KV, D / 2, -1.0f, pos);
        if (c->qk_norm)
            qk_norm_backward(s->dqkv, grad(m, param_index_layer(&m->layout, l, LAYER_Q_NORM)),
                             grad(m, param_index_layer(&m->layout, l, LAYER_K_NORM)), a->qk_raw + l * BT * (H + KV) * D,
                             a->qk_rstd + l * BT * (H + KV), param(m, param_index_layer(&m->layout, l, LAYER_Q_NORM)),
                             param(m, param_index_layer(&m->layout, l, LAYER_K_NORM)), BT, H, KV, D);
        if (c->qkv_bias)
            bias_backward(grad(m, param_index_layer(&m->layout, l, LAYER_Q_BIAS)), s->dqkv, BT, QKV);
        memset(s->dln, 0, (size_t)(BT * C) * sizeof(float));
        linear_backward(m, s->dln, grad(m, param_index_layer(&m->layout, l, LAYER_Q)), s->dqkv, ln1,
                        param(m, param_index_layer(&m->layout, l, LAYER_Q)), BT, C, QKV);
        rmsnorm_backward(s->dresid, grad(m, param_index_layer(&m->layout, l, LAYER_ATTN_NORM)), s->dln, x,
                         param(m, param_index_layer(&m->layout, l, LAYER_ATTN_NORM)), ln1_rstd, BT, C);
    }

    /* Embedding lookup; serial because a token may occur more than once. */
    float *dembed = grad(m, 0);
    for (int64_t i = 0; i < BT; i++)
        axpy(dembed + (int64_t)m->inputs[i] * C, 1.0f, s->dresid + i * C, C);
}

/* ------------------------------------------------------------------------- */
/* optimizer                                                                  */

/* torch.nn.utils.clip_grad_norm_: scale every gradient by max_norm / (norm + 1e-6)
 * when that is below 1. Returns the global L2 norm before clipping. */
static float clip_grad_norm(float *grads, int64_t n, float max_norm)
{
    /* Fixed chunks summed in a fixed order: the same bits for any thread count
     * (an OpenMP reduction combines its threads' sums in no set order). */
    enum { CHUNK = 1 << 16 };
    int64_t n_chunks = (n + CHUNK - 1) / CHUNK;
    double *partial = (double *)malloc_check((size_t)n_chunks * sizeof(double), "grad norm partial sums");
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; c++) {
        double sum = 0.0;
        int64_t end = (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n;
        for (int64_t i = c * CHUNK; i < end; i++)
            sum += (double)grads[i] * grads[i];
        partial[c] = sum;
    }
    double ss = 0.0;
    for (int64_t c = 0; c < n_chunks; c++)
        ss += partial[c];
    free(partial);
    float norm = (float)sqrt(ss);
    float coef = max_norm / (norm + 1e-6f);
    if (coef < 1.0f) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            grads[i] *= coef;
    }
    return norm;
}

/* torch.optim.AdamW (foreach=False, fused=False): llmc/kernels/adamw_cpu.h, the GPU's
 * arithmetic (adamw_step.h: the scalars in double as Python computes them, then
 * one rounded float operation at a time in torch's order). The gradients are
 * clipped already (clip_grad_norm). Weight decay is decoupled and only on
 * matrices (ParamTensor.is_matrix). */
static void llama_adamw_step(Llama *m, const AdamWConfig *opt)
{
    if (m->adam_m == NULL) {
        m->adam_m = (float *)calloc_check((size_t)m->layout.total, sizeof(float), "AdamW first moments");
        m->adam_v = (float *)calloc_check((size_t)m->layout.total, sizeof(float), "AdamW second moments");
    }
    m->adam_step++;
    AdamWScalars s = adamw_scalars(opt, opt->lr, m->adam_step);
    for (int ti = 0; ti < m->layout.n_tensors; ti++) {
        const ParamTensor *t = &m->layout.tensors[ti];
        int64_t at = t->offset;
        adamw_cpu_update(m->params + at, m->adam_m + at, m->adam_v + at, m->grads + at, NULL, NULL, t->numel, 1.0f,
                         t->is_matrix ? s.decay : 1.0f, s);
    }
}

/* The logits after tokens[0..n) at its last position into logits[V], for
 * samples (a NextLogitsFn of sampler.h, ctx the model): a forward of that one
 * row, which must fit the activations (n at most their T). */
static void llama_last_logits(void *ctx, const int *tokens, int n, float *logits)
{
    Llama *m = (Llama *)ctx;
    llama_forward(m, tokens, NULL, 1, n);
    memcpy(logits, m->acts.logits + (int64_t)(n - 1) * m->config.vocab_size,
           sizeof(float) * (size_t)m->config.vocab_size);
}

/* One optimizer step over accum micro-batches (inputs and targets back to back, their
 * targets `counted`, > 0): the loss is the mean over them, as one big batch would give
 * (llmc/run/train_loop.h calls it). */
static void train_step(Llama *m, const int *inputs, const int *targets, int accum, double counted, int B, int T,
                       const AdamWConfig *cfg, float lr, StepLog *out)
{
    int64_t bt = (int64_t)B * T;
    llama_zero_grad(m);
    double loss_sum = 0.0;
    for (int k = 0; k < accum; k++) {
        llama_forward(m, inputs + k * bt, targets + k * bt, B, T);
        llama_backward(m, (float)(1.0 / counted));
        loss_sum += m->loss_sum;
    }
    float norm = clip_grad_norm(m->grads, m->layout.total, cfg->grad_clip > 0.0 ? (float)cfg->grad_clip : INFINITY);
    AdamWConfig opt = *cfg;
    opt.lr = lr;
    out->loss = (float)(loss_sum / counted);
    out->skipped = !isfinite(out->loss) || !isfinite(norm); /* --on-nan: a NaN never reaches the weights */
    if (!out->skipped)
        llama_adamw_step(m, &opt);
    out->grad_norm = norm;
}

#ifndef TESTING
/* ------------------------------------------------------------------------- */
/* the command-line trainer: the flags, the data and the log are the GPU      */
/* trainer's (llmc/run/train_flags.h, batch_source.h, run_log.h)                  */

typedef struct {
    TrainFlags t;
    int fp8;
    const char *fp8_recipe;
} Args;

static const Flag FLAGS[] = {
    TRAIN_FLAGS(Args, t),
    FLAG_SECTION("numerics (the CPU reference's own, for now)"),
    FLAG("--fp8", FLAG_SWITCH, Args, fp8,
         "the layers' GEMMs on FP8 values, as GPU FP8 training rounds them: inputs and weights E4M3, output "
         "gradients E5M2, one scale per tensor from its current amax (lm_head stays fp32)"),
    FLAG("--fp8-recipe", FLAG_STRING, Args, fp8_recipe,
         "the FP8 scales (implies --fp8), as train_llama's: tensor (the default), row (one per row of each operand as "
         "its GEMM sums over it, all E4M3) or block (1x128 blocks of activations and gradients, 128x128 of weights, "
         "all E4M3)"),
};
#define N_FLAGS ((int)(sizeof(FLAGS) / sizeof(FLAGS[0])))

static Args default_args(void)
{
    Args a;
    memset(&a, 0, sizeof(a));
    a.t = train_flags_defaults();
    a.t.run.log = "log/train_llama_ref.jsonl";
    return a;
}

static void usage(void)
{
    static Args defaults; /* static: gcc cannot see that flags_usage reads only the table's fields */
    defaults = default_args();
    train_usage("./train_llama_ref", "Trains a Llama 3 family model on the CPU in fp32 (the reference implementation).",
                FLAGS, N_FLAGS, &defaults);
}

static LlamaConfig parse_args(Args *a, int argc, char **argv, HfTokenIds *init_ids)
{
    *a = default_args();
    flags_parse(FLAGS, N_FLAGS, argc, argv, a, usage);
    train_flags_check(&a->t);
    train_export_check(&a->t.ckpt);
    LlamaConfig c = train_model_config(&a->t.model, init_ids);
    if (a->t.batch.T > c.max_seq_len)
        FAIL("-T %d exceeds the model's max_seq_len %d\n  hint: lower -T", a->t.batch.T, c.max_seq_len);
    return c;
}

/* The model's operations for the shared run (llmc/run/train_loop.h): one process. */
typedef struct {
    Llama *m;
    const TrainFlags *t;
} RefRun;

static void ref_init_weights(void *ctx, const char *init_from, uint64_t seed)
{
    Llama *m = ((RefRun *)ctx)->m;
    if (!init_from) {
        llama_init_random(m, seed);
        return;
    }
    model_weights_load(init_from, &m->layout, m->params);
    checkpoint_init_from_verify(init_from, &m->layout, m->params); /* a checkpoint's files against its manifest */
}

static void ref_load_checkpoint(void *ctx, const char *path, CheckpointState *st)
{
    Llama *m = ((RefRun *)ctx)->m;
    checkpoint_load(path, &m->config, &m->layout, m->params, m->adam_m, m->adam_v, st);
    m->adam_step = (int)(st->adam_step <= (uint64_t)INT_MAX ? st->adam_step : 0);
}

static void ref_step(void *ctx, const int *inputs, const int *targets, int accum, double count, int step, float lr,
                     StepLog *out)
{
    RefRun *r = (RefRun *)ctx;
    (void)step;
    train_step(r->m, inputs, targets, accum, count, r->t->batch.B, r->t->batch.T, &r->t->optim.adamw, lr, out);
}

static double ref_eval_batch(void *ctx, const int *inputs, const int *targets)
{
    RefRun *r = (RefRun *)ctx;
    llama_forward(r->m, inputs, targets, r->t->batch.B, r->t->batch.T);
    return r->m->loss_sum;
}

static uint64_t ref_adam_steps(void *ctx)
{
    return (uint64_t)((RefRun *)ctx)->m->adam_step;
}

static void ref_save(void *ctx, const CheckpointFlags *ck, const HfExtras *extras, CheckpointState st)
{
    Llama *m = ((RefRun *)ctx)->m;
    char saved[LLMC_PATH_MAX];
    checkpoint_save(ck->dir, &m->config, &m->layout, m->params, m->adam_m, m->adam_v, extras, &st, ck->keep, saved,
                    sizeof(saved));
    printf("saved checkpoint '%s'\n", saved);
}

static void ref_next_logits(void *ctx, const int *tokens, int n, float *logits)
{
    llama_last_logits(((RefRun *)ctx)->m, tokens, n, logits);
}

static float *ref_master_copy(void *ctx)
{
    Llama *m = ((RefRun *)ctx)->m;
    float *copy = (float *)malloc_check((size_t)m->layout.total * sizeof(float), "export weights");
    memcpy(copy, m->params, (size_t)m->layout.total * sizeof(float));
    return copy;
}

int main(int argc, char **argv)
{
    Args a;
    HfTokenIds init_ids;
    LlamaConfig config = parse_args(&a, argc, argv, &init_ids);
    const TrainFlags *t = &a.t;
    int accum = train_micro_steps(&t->batch, 1);
    Llama model;
    llama_build(&model, &config);
    /* the AdamW moments: zeros, or a checkpoint's */
    model.adam_m = (float *)calloc_check((size_t)model.layout.total, sizeof(float), "AdamW first moments");
    model.adam_v = (float *)calloc_check((size_t)model.layout.total, sizeof(float), "AdamW second moments");
    if (a.fp8_recipe) {
        a.fp8 = fp8_recipe_from_name(a.fp8_recipe);
        if (!a.fp8)
            FAIL("unknown --fp8-recipe '%s'; use tensor, row or block", a.fp8_recipe);
    }
    model.fp8 = a.fp8;
    llama_config_print(&model.config, stdout);
    printf("parameters: %lld (%.1f MiB each for weights, gradients and the two AdamW moments)%s%s\n",
           (long long)model.layout.total, (double)model.layout.total * 4.0 / 1048576.0,
           model.fp8 ? "; layer GEMMs on FP8 values (--fp8), scaled per " : "",
           model.fp8 ? FP8_RECIPE_NAMES[model.fp8] : "");
#ifdef _OPENMP
    printf("threads: %d\n", omp_get_max_threads());
#endif
    BatchSource src;
    batch_source_open(&src, t->data.train, t->data.random, t->batch.B, t->batch.T, 0, 1, (uint64_t)t->run.seed,
                      config.vocab_size);
    model.doc_bos = train_doc_bos(&t->data, src.random ? -1 : src.loader.bos_id);
    model.doc_positions = t->data.doc_positions;
    const char *val_shards = train_val_shards(t);
    DataLoader val;
    if (val_shards)
        dataloader_init_eval_or_die(&val, val_shards, t->batch.B, t->batch.T, 0, 1, config.vocab_size);
    TrainOutputs outputs;
    train_outputs_open(&outputs, t, src.random ? NULL : src.loader.shards[0].path, src.loader.bos_id, src.loader.eos_id,
                       &init_ids, config.vocab_size);
    printf("tokens per step %lld (B %d x T %d x %d micro-steps); data: %s\n",
           (long long)t->batch.B * t->batch.T * accum, t->batch.B, t->batch.T, accum,
           t->data.random ? "random tokens" : t->data.train);

    RefRun run = {&model, t};
    TrainOps ops;
    memset(&ops, 0, sizeof(ops));
    ops.ctx = &run;
    ops.init_weights = ref_init_weights;
    ops.load_checkpoint = ref_load_checkpoint;
    ops.step = ref_step;
    ops.eval_batch = ref_eval_batch;
    ops.adam_steps = ref_adam_steps;
    ops.save = ref_save;
    ops.next_logits = ref_next_logits;
    ops.master_copy = ref_master_copy;
    int64_t units = (int64_t)t->batch.B * t->batch.T;
    TrainLoop loop;
    train_loop_init(&loop, t, &config, &model.layout, &src, val_shards ? &val : NULL, val_shards, &outputs, accum,
                    units, (int *)malloc_check((size_t)2 * units * accum * sizeof(int), "step tokens"), 0);
    train_loop_start(&loop, &ops);
    RunLog log;
    run_log_open(&log, t->run.log, t->ckpt.resume, loop.run_id, loop.resumed_from, argc, argv, &config, FLAGS, N_FLAGS,
                 &a);
    loop.log = &log;
    train_loop_run(&loop, &ops);

    run_log_close(&log);
    train_outputs_close(&outputs);
    free(loop.inputs);
    batch_source_close(&src);
    if (val_shards)
        dataloader_free(&val);
    llama_free(&model);
    return 0;
}
#endif /* TESTING */
