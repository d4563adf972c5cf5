/*
 * attention.h: causal grouped-query scaled dot-product attention, bf16 in and
 * out, fp32 softmax statistics, through cuDNN's fused flash-attention kernels.
 * A plain C interface; the implementation (llmc/kernels/attention_cudnn.cu) is C++
 * because cudnn-frontend is, and is compiled once to its own object.
 *
 * Per batch b, query head h (sharing key/value head g = h / (H / KV)), token t:
 *   s[t, u]   = q[b,t,h] . k[b,u,g] / sqrt(D)         for u <= t (causal)
 *   lse[t]    = log sum_u exp(s[t, u])                  (stats, natural log)
 *   out[b,t,h] = sum_u exp(s[t, u] - lse[t]) v[b,u,g]
 *
 * Memory: qkv is the fused projection output [B, T, H + 2*KV, D] (per token H
 * query heads, then KV key heads, then KV value heads), read in place through
 * strides; K and V are never widened to H heads. out is [B, T, H, D] = [N, H*D]
 * row-major, ready for o_proj. stats is [B, H, T] fp32, written by forward,
 * read by backward. Backward reads qkv, out, dout, stats and writes dq, dk, dv
 * into dqkv in the same fused layout as qkv (every element of dqkv is written).
 *
 * Packed documents (--doc-mask, llmc/model/documents.h): with an AttentionDocs, each
 * document is a sequence of its own (cuDNN's ragged layout with a padding mask:
 * the same buffers, offsets per document), so a token attends causally within
 * its document only and no T x T mask is ever formed; stats is then [N, H]
 * (token-major). NULL: one causal sequence per row, as above.
 *
 * Needs D % 8 == 0 and D <= 256 (cuDNN's limits), 16-byte aligned pointers.
 * cuDNN graphs are built on the first call of each shape and cached; the
 * shared workspace grows to the largest one needed (attention_workspace_bytes).
 */
#ifndef LLMC_ATTENTION_H
#define LLMC_ATTENTION_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void attention_setup(void);
void attention_teardown(void);

/*
 * Deterministic backward (the default, 1): cuDNN's dP-workspace algorithm, whose
 * dQ is a plain GEMM instead of fp32 atomics, so a backward pass is bitwise
 * reproducible. It holds dP for the whole batch: a bf16 workspace of about
 * B * H * ceil64(T)^2 * 2 bytes (1 GiB at B=4, H=32, T=2048). 0 selects the
 * algorithm that sums dQ in fp32 with atomics (workspace about
 * B * H * T * (D + 1) * 4 bytes; the last bits of dq vary from run to run).
 * If cuDNN cannot build the deterministic graph for a shape, backward says so
 * once on stderr and falls back to the atomic one for that shape. Takes effect
 * from the next backward.
 */
void attention_set_deterministic(int deterministic);

/* Largest dP workspace the deterministic backward may take before a caller picks the
 * atomic one instead: 2 GiB, B=8 at T=2048 on the 1B shape (H=32). */
#define ATTENTION_DETERMINISTIC_MAX_BYTES (2.0 * 1073741824.0)

/* Whether the deterministic backward's workspace for B x H x T stays within that limit. */
static inline int attention_deterministic_fits(int B, int H, int T)
{
    double T64 = (double)(((long long)T + 63) / 64 * 64);
    return (double)B * H * T64 * T64 * 2.0 <= ATTENTION_DETERMINISTIC_MAX_BYTES;
}

/* A batch's documents as cuDNN's ragged sequences (documents_pack's, on the device; int32: the offsets in elements
 * must stay below 2^31, which attention_forward checks). */
typedef struct {
    int slots;          /* sequences, a power of two; those past the documents have length 0 */
    int max_len;        /* the longest sequence's length or more, at most T */
    int *seq_len;       /* [slots] */
    int *start;         /* [slots + 1] token index of each sequence's start in the batch */
    int *qkv_offsets;   /* [slots + 1] start * (H + 2 KV) * D, */
    int *out_offsets;   /* start * H * D and */
    int *stats_offsets; /* start * H: filled by attention_documents_offsets */
} AttentionDocs;

/* Fills docs' offsets from its starts for heads H and KV of size D, on stream. */
void attention_documents_offsets(AttentionDocs *docs, int H, int KV, int D, cudaStream_t stream);

void attention_forward(__nv_bfloat16 *out, float *stats, const __nv_bfloat16 *qkv, int B, int T, int H, int KV, int D,
                       const AttentionDocs *docs, cudaStream_t stream);
void attention_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                        const __nv_bfloat16 *out, const float *stats, int B, int T, int H, int KV, int D,
                        const AttentionDocs *docs, cudaStream_t stream);

/* The cuDNN version loaded at run time (e.g. 91400 for 9.14.0). */
int attention_library_version(void);

/* Bytes of GPU memory the attention workspace holds now (also in cuda_common.h's tally). */
size_t attention_workspace_bytes(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMC_ATTENTION_H */
