/*
 * batch_source.h: where a trainer's micro-batches come from: the token shards
 * through the data loader (llmc/formats/dataloader.h), or random tokens for
 * benchmarks. Each call gives this rank's B*T inputs and targets of the next
 * global batch. Random tokens are drawn for the whole global batch on every
 * rank (splitmix64 from the seed), so any world size sees the same batches;
 * targets are then independent random tokens, all counted.
 *
 * The position (the loader's state and the RNG) goes into checkpoints, so a
 * resumed run continues with the batches it would have seen. Memory: the
 * loader's, or two int arrays of B*T for random tokens. Plain C; compiles as
 * C++ too.
 */
#ifndef LLMC_BATCH_SOURCE_H
#define LLMC_BATCH_SOURCE_H

#include <stdint.h>
#include <string.h>

#include "llmc/formats/dataloader.h"
#include "llmc/common/utils.h"

typedef struct {
    int random;
    DataLoader loader; /* shards, when not random */
    uint64_t rng;      /* random tokens' generator; the seed otherwise */
    int vocab, rank, world;
    int64_t N;             /* tokens per micro-batch of this rank */
    int *inputs, *targets; /* the random batch */
} BatchSource;

/* Shards from the glob train (shuffled by seed), or random tokens below vocab;
 * exits with the loader's message on bad shards. */
static inline void batch_source_open(BatchSource *src, const char *train, int random, int B, int T, int rank, int world,
                                     uint64_t seed, int vocab)
{
    memset(src, 0, sizeof(*src));
    src->random = random;
    src->rng = seed;
    src->vocab = vocab;
    src->rank = rank;
    src->world = world;
    src->N = (int64_t)B * T;
    if (random) {
        src->inputs = (int *)malloc_check((size_t)src->N * sizeof(int), "random batch");
        src->targets = (int *)malloc_check((size_t)src->N * sizeof(int), "random batch");
    } else {
        dataloader_init_or_die(&src->loader, train, B, T, rank, world, 1, seed, vocab);
    }
}

static inline void batch_source_next(BatchSource *src, const int **inputs, const int **targets)
{
    if (!src->random) {
        dataloader_next_batch_or_die(&src->loader);
        *inputs = src->loader.inputs;
        *targets = src->loader.targets;
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        int *out = pass == 0 ? src->inputs : src->targets;
        for (int r = 0; r < src->world; r++) {
            for (int64_t i = 0; i < src->N; i++) {
                int token = (int)(splitmix64(&src->rng) % (uint64_t)src->vocab);
                if (r == src->rank)
                    out[i] = token;
            }
        }
    }
    *inputs = src->inputs;
    *targets = src->targets;
}

/* The position of the next batch, for a checkpoint. */
static inline void batch_source_get_state(const BatchSource *src, uint64_t *rng, DataLoaderState *data)
{
    *rng = src->rng;
    memset(data, 0, sizeof(*data));
    if (!src->random)
        dataloader_get_state(&src->loader, data);
}

/* Continues from a checkpoint's position; a position that does not fit these
 * shards ends the run with the checkpoint's name (from) and the loader's reason. */
static inline void batch_source_set_state(BatchSource *src, uint64_t rng, const DataLoaderState *data, const char *from)
{
    src->rng = rng;
    if (!src->random && dataloader_set_state(&src->loader, data) != 0)
        FAIL("resuming from '%s': its data position does not fit: %s", from, src->loader.error);
}

static inline void batch_source_close(BatchSource *src)
{
    if (src->random) {
        free(src->inputs);
        free(src->targets);
    } else {
        dataloader_free(&src->loader);
    }
    memset(src, 0, sizeof(*src));
}

#endif /* LLMC_BATCH_SOURCE_H */
