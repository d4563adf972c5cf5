/*
 * sampler.h: text from a model, a token at a time, for the samples both
 * trainers print while they train.
 *
 * sampler_next picks the next token from the last position's logits z[V]:
 * temperature 0 takes the largest (the first of equals: greedy); otherwise
 * p = softmax(z / temperature), cut to the smallest set of the most likely
 * tokens whose probabilities reach top_p (nucleus sampling; 1 keeps all),
 * renormalised, and one token drawn with a seeded splitmix64, so that a seed
 * gives the same text every time. sample_text runs the model (a callback that
 * gives the logits after a sequence) from a prompt until max_new tokens or an
 * EOS id. No KV cache: each token costs one forward of the sequence so far,
 * which at these lengths is cheap next to a training step.
 *
 * Memory: V floats and V ints of scratch per call. Plain C; compiles as C++ too.
 */
#ifndef LLMC_SAMPLER_H
#define LLMC_SAMPLER_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/utils.h"

typedef struct {
    float temperature; /* 0: greedy */
    float top_p;       /* in (0, 1] */
    uint64_t rng;
} Sampler;

/* The logits after tokens[0..n): logits[V] of the last position. */
typedef void (*NextLogitsFn)(void *ctx, const int *tokens, int n, float *logits);

typedef struct {
    const float *p;
    int id;
} SamplerCandidate_;

static inline int sampler_by_probability_(const void *a, const void *b)
{
    const SamplerCandidate_ *x = (const SamplerCandidate_ *)a, *y = (const SamplerCandidate_ *)b;
    return *x->p > *y->p ? -1 : *x->p < *y->p ? 1 : x->id - y->id;
}

static inline int sampler_next(Sampler *s, const float *logits, int V)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        best = logits[v] > logits[best] ? v : best;
    if (s->temperature <= 0.0f)
        return best;
    float *p = (float *)malloc_check(sizeof(float) * (size_t)V, "sampler");
    double sum = 0.0;
    for (int v = 0; v < V; v++) {
        p[v] = expf((logits[v] - logits[best]) / s->temperature);
        sum += p[v];
    }
    /* only tokens that can be in the nucleus: below (1 - top_p) / V none can */
    float cutoff = (float)((1.0 - s->top_p) / V * sum);
    SamplerCandidate_ *c = (SamplerCandidate_ *)malloc_check(sizeof(SamplerCandidate_) * (size_t)V, "sampler");
    int n = 0;
    for (int v = 0; v < V; v++) {
        if (p[v] >= cutoff) {
            c[n].p = &p[v];
            c[n++].id = v;
        }
    }
    qsort(c, (size_t)n, sizeof(*c), sampler_by_probability_);
    double kept = 0.0;
    int k = 0;
    while (k < n && kept < s->top_p * sum)
        kept += *c[k++].p;
    double r = random_uniform(&s->rng) * kept, acc = 0.0;
    int pick = c[k - 1].id;
    for (int i = 0; i < k; i++) {
        acc += *c[i].p;
        if (r < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(p);
    free(c);
    return pick;
}

/* Appends up to max_new tokens to tokens[0..n) (room for n + max_new), stopping
 * after an id of stop[0..n_stop); the new length. */
static inline int sample_text(NextLogitsFn next_logits, void *ctx, int V, Sampler *s, int *tokens, int n, int max_new,
                              const int *stop, int n_stop)
{
    float *logits = (float *)malloc_check(sizeof(float) * (size_t)V, "sample logits");
    for (int k = 0; k < max_new; k++) {
        next_logits(ctx, tokens, n, logits);
        int id = sampler_next(s, logits, V);
        tokens[n++] = id;
        int done = 0;
        for (int i = 0; i < n_stop; i++)
            done |= id == stop[i];
        if (done)
            break;
    }
    free(logits);
    return n;
}

#endif /* LLMC_SAMPLER_H */
