/*
 * documents.h: packed documents (--doc-mask, issue 16). The shards put
 * documents back to back, each starting with the BOS token; a row of T tokens
 * of a batch [B, T] is cut into documents at every BOS, and the row's first
 * token starts one too (a row may begin inside a document). Attention stays
 * inside a token's document and RoPE positions restart at each document's
 * start, as HF computes with position_ids and a block-causal mask:
 *   first[bt] = where token bt's document starts in its row
 *   pos[bt]   = t - first[bt], its position in its document
 * (documents_find; the CPU reference takes these), and for cuDNN's ragged
 * attention (attention.h) the documents as sequences of one packed batch
 * (documents_pack): sequence i starts at token start[i] of the flattened
 * batch and is seq_len[i] long. The sequence count is rounded up to a power of
 * two (slots; the rest have length 0) and the longest document's length too
 * (max_len, at least 64, at most T), so that a training run meets only a few
 * shapes and cuDNN builds a graph for each once.
 *
 * Host-only plain C; reads and writes only its arguments.
 */
#ifndef LLMC_DOCUMENTS_H
#define LLMC_DOCUMENTS_H

#include <stdint.h>

/* first[bt] and pos[bt] of tokens [B, T] cut at every bos (see above). */
static inline void documents_find(int *first, int *pos, const int *tokens, int B, int T, int bos)
{
    for (int b = 0; b < B; b++) {
        int start = 0;
        for (int t = 0; t < T; t++) {
            int64_t bt = (int64_t)b * T + t;
            if (tokens[bt] == bos)
                start = t;
            first[bt] = start;
            pos[bt] = t - start;
        }
    }
}

typedef struct {
    int n;       /* documents in the batch */
    int slots;   /* n rounded up to a power of two: the sequences cuDNN sees */
    int max_len; /* the longest document's length rounded up to a power of two, in [min(64, T), T] */
} DocumentsShape;

static inline int documents_pow2_at_least(int x)
{
    int p = 1;
    while (p < x)
        p *= 2;
    return p;
}

/* The documents of first[B * T] (documents_find's) as packed sequences: start[slots + 1] (token indices; the slots
 * past the last document start at B * T) and seq_len[slots]. start and seq_len hold B * T + 1 ints each (every token
 * may start a document). */
static inline DocumentsShape documents_pack(int *start, int *seq_len, const int *first, int B, int T)
{
    DocumentsShape d = {0, 0, 0};
    int64_t N = (int64_t)B * T;
    int longest = 0;
    for (int64_t bt = 0; bt < N; bt++) {
        int t = (int)(bt % T);
        if (first[bt] == t) { /* a document starts here */
            if (d.n > 0) {
                seq_len[d.n - 1] = (int)(bt - start[d.n - 1]);
                longest = seq_len[d.n - 1] > longest ? seq_len[d.n - 1] : longest;
            }
            start[d.n++] = (int)bt;
        }
    }
    seq_len[d.n - 1] = (int)(N - start[d.n - 1]);
    longest = seq_len[d.n - 1] > longest ? seq_len[d.n - 1] : longest;
    d.slots = documents_pow2_at_least(d.n);
    for (int i = d.n; i < d.slots; i++)
        seq_len[i] = 0;
    for (int i = d.n; i <= d.slots; i++)
        start[i] = (int)N;
    int floor = T < 64 ? T : 64;
    d.max_len = documents_pow2_at_least(longest < floor ? floor : longest);
    d.max_len = d.max_len > T ? T : d.max_len;
    return d;
}

#endif /* LLMC_DOCUMENTS_H */
