/*
 * rope.h: rotary position embedding, in place, on the fused QKV activation
 * qkv [B, T, H + 2*KV, D]: per token H query heads, then KV key heads, then KV
 * value heads. Only the first H + KV heads (q and k) are rotated.
 *
 * HF rotate-half convention: for i < D/2, x1 = x[i], x2 = x[i + D/2], with
 * angle = t * inv_freq[i] (t = position within the sequence),
 *   out[i]       = x1 * cos(angle) - x2 * sin(angle)
 *   out[i + D/2] = x2 * cos(angle) + x1 * sin(angle)
 * Backward is the rotation by -angle, applied in place to dq and dk of dqkv.
 *
 * cos and sin come from freqs_cis [T_max, D/2, 2] (fp32 pairs cos, sin), built once
 * on the host by rope_table_host: angle in float32 as HF computes it, cos/sin in
 * double rounded to float. Memory: each q/k element read once and written once; the
 * table (at most a few MB) is re-read from L2. v is not touched. Pointers 16-byte
 * aligned when D is a multiple of 16 (the vector path).
 */
#ifndef LLMC_ROPE_H
#define LLMC_ROPE_H

#include <math.h>

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"
#include "llmc/model/llama_config.h"
#include "llmc/model/rope_freqs.h"

/* table: T_max * head_dim floats, [pos][i][cos, sin] for i < head_dim/2. */
static inline void rope_table_host(float *table, const LlamaConfig *config, int T_max)
{
    int half = config->head_dim / 2;
    float *inv_freq = (float *)malloc_check((size_t)half * sizeof(float), "rope inverse frequencies");
    llama_rope_inv_freq(config, inv_freq);
    for (int pos = 0; pos < T_max; pos++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)pos * inv_freq[i];
            float *entry = table + ((int64_t)pos * half + i) * 2;
            entry[0] = (float)cos((double)angle);
            entry[1] = (float)sin((double)angle);
        }
    }
    free(inv_freq);
}

/* One block per token; each thread rotates W consecutive pairs (i, i + D/2) of one
 * head: W = 8 (16-byte loads) when D/2 is a multiple of 8, else W = 1.
 * sin_sign = 1 rotates by +angle (forward), -1 by -angle (backward); negating is exact. */
template <int W>
__global__ void rope_kernel(bf16 *qkv, const float *__restrict__ freqs_cis, const int *__restrict__ positions, int T,
                            int n_rotated, int n_heads, int D, float sin_sign)
{
    int half = D / 2;
    int groups = half / W;
    int t = positions != NULL ? positions[blockIdx.x] : blockIdx.x % T;
    bf16 *token = qkv + (int64_t)blockIdx.x * n_heads * D;
    for (int item = threadIdx.x; item < n_rotated * groups; item += blockDim.x) {
        int head = item / groups;
        int i0 = (item % groups) * W;
        bf16 *x = token + head * D + i0;
        const float *cs = freqs_cis + ((int64_t)t * half + i0) * 2;
        float c[W], s[W];
        bf16 a[W], b[W];
        if constexpr (W == 8) {
            bf16x8 va = load16(x), vb = load16(x + half);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                floatx4 f = load16(cs + 4 * q);
                c[2 * q] = f.v[0];
                s[2 * q] = f.v[1];
                c[2 * q + 1] = f.v[2];
                s[2 * q + 1] = f.v[3];
            }
#pragma unroll
            for (int i = 0; i < W; i++) {
                a[i] = va.v[i];
                b[i] = vb.v[i];
            }
        } else {
            a[0] = x[0];
            b[0] = x[half];
            c[0] = cs[0];
            s[0] = cs[1];
        }
#pragma unroll
        for (int i = 0; i < W; i++) {
            float x1 = __bfloat162float(a[i]), x2 = __bfloat162float(b[i]);
            float sn = sin_sign * s[i];
            a[i] = __float2bfloat16_rn(x1 * c[i] - x2 * sn);
            b[i] = __float2bfloat16_rn(x2 * c[i] + x1 * sn);
        }
        if constexpr (W == 8) {
            bf16x8 va, vb;
#pragma unroll
            for (int i = 0; i < W; i++) {
                va.v[i] = a[i];
                vb.v[i] = b[i];
            }
            store16(x, va);
            store16(x + half, vb);
        } else {
            x[0] = a[0];
            x[half] = b[0];
        }
    }
}

static inline void rope_launch(bf16 *qkv, const float *freqs_cis, const int *positions, int B, int T, int H, int KV,
                               int D, float sin_sign, cudaStream_t stream)
{
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || D <= 0 || D % 2 != 0) {
        FAIL("rope: B = %d, T = %d, H = %d, KV = %d, D = %d unsupported: sizes must be positive and D even "
             "(rotate-half pairs dimension i with i + D/2)",
             B, T, H, KV, D);
    }
    profile_push(PROF_ROPE, stream);
    int half = D / 2;
    int W = half % 8 == 0 ? 8 : 1;
    int items = (H + KV) * (half / W);
    int threads = min(1024, ceil_div(items, WARP_SIZE) * WARP_SIZE);
    if (W == 8) {
        rope_kernel<8><<<B * T, threads, 0, stream>>>(qkv, freqs_cis, positions, T, H + KV, H + 2 * KV, D, sin_sign);
    } else {
        rope_kernel<1><<<B * T, threads, 0, stream>>>(qkv, freqs_cis, positions, T, H + KV, H + 2 * KV, D, sin_sign);
    }
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* freqs_cis must cover T positions. positions: NULL (token t of a row is at position t), or each token's
 * position [B * T], each below T (packed documents: llmc/model/documents.h). */
static inline void rope_forward(bf16 *qkv, const float *freqs_cis, const int *positions, int B, int T, int H, int KV,
                                int D, cudaStream_t stream)
{
    rope_launch(qkv, freqs_cis, positions, B, T, H, KV, D, 1.0f, stream);
}

static inline void rope_backward(bf16 *dqkv, const float *freqs_cis, const int *positions, int B, int T, int H, int KV,
                                 int D, cudaStream_t stream)
{
    rope_launch(dqkv, freqs_cis, positions, B, T, H, KV, D, -1.0f, stream);
}

#endif /* LLMC_ROPE_H */
