/*
 * dataloader.h: reads token shards (format: docs/shard_format.md) and yields
 * training batches as int32 inputs[B*T] and targets[B*T], targets being the
 * inputs shifted by one token. A version 2 shard carries a loss mask, one byte
 * per token after the tokens (1: predicting this token counts, 0: it does not,
 * e.g. a prompt's); a target whose token's mask is 0 becomes IGNORE_INDEX.
 *
 * Memory: reads the shard headers once, then B*T+1 tokens (and mask bytes) per
 * batch with fseeko/fread from one open shard at a time (never a whole shard). Writes only
 * what it allocates: inputs, targets, a raw read buffer of (B*T+1) tokens, the
 * shard table, and 8 bytes per window of the largest shard for the shuffled
 * window order. Offsets are 64-bit, so shards may exceed 2^31 tokens.
 *
 * Layout, as in llm.c: one step of all ranks reads a "window" of world*B*T+1
 * consecutive tokens; rank r takes the B*T+1 tokens from r*B*T, row b of its
 * batch being tokens b*T .. b*T+T-1 (targets one further). Windows follow each
 * other with stride world*B*T, so a shard of n tokens holds (n-1)/(world*B*T)
 * windows and its tail is unused. After the last window of a shard comes the
 * next shard; after the last shard, the first one again (epoch + 1).
 * With shuffle on, each epoch permutes the shard order and each shard's window
 * order, both derived from (seed, epoch) alone, so every rank sees the same.
 *
 * API. Functions returning int give 0 on success, or -1 with a message naming
 * the file, the problem and a hint in dl->error (nothing is printed, so tests
 * can check errors); the *_or_die wrappers print that message and exit(1).
 *   dataloader_init(dl, pattern, B, T, rank, world, shuffle, seed, vocab_size)
 *       glob(3) pattern, names sorted; validates every shard up front.
 *       vocab_size > 0 is the model's: a shard whose header vocab_size is
 *       larger is an error (0 skips that check). A token >= the header's
 *       vocab_size in a batch is always an error.
 *   dataloader_init_eval(dl, pattern, B, T, rank, world, vocab_size)
 *       the same without shuffling, for the val shards.
 *   dataloader_next_batch(dl)   fills dl->inputs and dl->targets.
 *   dataloader_reset(dl)        back to the first window of epoch 0.
 *   dataloader_get_state(dl, &state) / dataloader_set_state(dl, &state)
 *       the position of the next batch, a POD for checkpoints: restoring it
 *       in a loader opened on the same shards with the same window (world*B),
 *       T and shuffle gives the same batches as the uninterrupted run, also
 *       for another world size (each rank then takes its new slice).
 *   dataloader_free(dl)
 *   dl->windows_per_epoch: batches in one pass over all shards.
 *   dl->vocab_size, dl->bos_id, dl->eos_id: from the shard headers.
 *
 * Plain C99 (POSIX glob and fseeko); also compiles as CUDA/C++.
 */
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "llmc/common/utils.h"

#define DATALOADER_MAGIC 0x4C4C5453
#define DATALOADER_VERSION 1        /* tokens */
#define DATALOADER_VERSION_MASKED 2 /* tokens, then a loss mask of one byte per token */
#define DATALOADER_HEADER_INTS 256
#define DATALOADER_HEADER_BYTES 1024
#define DATALOADER_HINT "  hint: make shards with python3 data/prepare.py (docs/shard_format.md)"

typedef struct {
    uint64_t epoch;  /* passes over all shards completed */
    uint64_t shard;  /* position in this epoch's shard order */
    uint64_t window; /* position in the current shard's window order */
    uint64_t seed;
    uint64_t layout; /* hash of the shard sizes, the window B * world, T and shuffle that the position refers to */
} DataLoaderState;

typedef struct {
    char *path;
    uint64_t num_tokens;
    uint64_t num_windows;
    int bytes_per_token;
    int has_mask; /* version 2 */
} DataLoaderShard;

typedef struct {
    int B, T, rank, world, shuffle;
    int vocab_size, bos_id, eos_id;
    int num_shards;
    DataLoaderShard *shards;
    uint64_t windows_per_epoch;
    DataLoaderState state;
    uint64_t *shard_order;  /* num_shards entries */
    uint64_t *window_order; /* windows of the largest shard; used only when shuffling */
    FILE *file;
    int file_shard; /* index into shards of the open file, -1 if none */
    unsigned char *raw;
    int32_t *inputs;
    int32_t *targets;
    char error[1024];
} DataLoader;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline int
dataloader_error_(DataLoader *dl, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(dl->error, sizeof(dl->error), fmt, args);
    va_end(args);
    return -1;
}

/* A hash of x: derives the permutation keys from (seed, epoch, shard). */
static inline uint64_t dataloader_mix_(uint64_t x)
{
    return splitmix64(&x);
}

/* Fisher-Yates; rejection sampling keeps every permutation equally likely. */
static inline void dataloader_permute_(uint64_t *a, uint64_t n, uint64_t key)
{
    uint64_t s = key;
    for (uint64_t i = 0; i < n; i++) {
        a[i] = i;
    }
    for (uint64_t i = n; i > 1; i--) {
        uint64_t limit = UINT64_MAX - UINT64_MAX % i;
        uint64_t r;
        do {
            r = splitmix64(&s);
        } while (r >= limit);
        uint64_t j = r % i, t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static inline void dataloader_order_shards_(DataLoader *dl)
{
    if (dl->shuffle) {
        dataloader_permute_(dl->shard_order, (uint64_t)dl->num_shards,
                            dataloader_mix_(dl->state.seed ^ dataloader_mix_(dl->state.epoch)));
    } else {
        for (int i = 0; i < dl->num_shards; i++) {
            dl->shard_order[i] = (uint64_t)i;
        }
    }
}

static inline void dataloader_order_windows_(DataLoader *dl)
{
    if (dl->shuffle) {
        uint64_t shard = dl->shard_order[dl->state.shard];
        uint64_t key = dataloader_mix_(dl->state.seed ^ dataloader_mix_(dl->state.epoch ^ dataloader_mix_(shard + 1)));
        dataloader_permute_(dl->window_order, dl->shards[shard].num_windows, key);
    }
}

static inline uint64_t dataloader_current_windows_(const DataLoader *dl)
{
    return dl->shards[dl->shard_order[dl->state.shard]].num_windows;
}

static inline uint32_t dataloader_read_u32le_(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Checks one shard's header and size against the format and the batch shape. */
static inline int dataloader_check_shard_(DataLoader *dl, const char *path, DataLoaderShard *shard,
                                          int32_t header[DATALOADER_HEADER_INTS])
{
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) /* a FIFO would block fopen forever */
        return dataloader_error_(dl, "shard '%s' is not a regular file\n%s", path, DATALOADER_HINT);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return dataloader_error_(dl, "cannot open shard '%s': %s\n  hint: check the path and the permissions", path,
                                 strerror(errno));
    }
    unsigned char raw[DATALOADER_HEADER_BYTES];
    size_t got = fread(raw, 1, sizeof(raw), f);
    int64_t size = -1;
    if (fseeko(f, 0, SEEK_END) == 0) {
        size = (int64_t)ftello(f);
    }
    fclose(f);
    if (size < 0) {
        return dataloader_error_(dl, "cannot find the size of shard '%s': %s", path, strerror(errno));
    }
    if (got < sizeof(raw)) {
        return dataloader_error_(dl, "shard '%s' is truncated: %lld bytes, shorter than the %d-byte header\n%s", path,
                                 (long long)size, DATALOADER_HEADER_BYTES, DATALOADER_HINT);
    }
    for (int i = 0; i < DATALOADER_HEADER_INTS; i++) {
        header[i] = (int32_t)dataloader_read_u32le_(raw + 4 * i);
    }
    if ((uint32_t)header[0] != DATALOADER_MAGIC) {
        return dataloader_error_(dl, "shard '%s' has bad magic 0x%08x, expected 0x%08x: not a token shard\n%s", path,
                                 (unsigned)header[0], (unsigned)DATALOADER_MAGIC, DATALOADER_HINT);
    }
    if (header[1] != DATALOADER_VERSION && header[1] != DATALOADER_VERSION_MASKED) {
        return dataloader_error_(dl, "shard '%s' has unsupported version %d, this loader reads versions %d and %d\n%s",
                                 path, header[1], DATALOADER_VERSION, DATALOADER_VERSION_MASKED, DATALOADER_HINT);
    }
    int has_mask = header[1] == DATALOADER_VERSION_MASKED;
    int bpt = header[2];
    if (bpt != 2 && bpt != 4) {
        return dataloader_error_(dl, "shard '%s' has %d bytes per token, expected 2 (uint16) or 4 (uint32)\n%s", path,
                                 bpt, DATALOADER_HINT);
    }
    uint64_t count = (uint64_t)dataloader_read_u32le_(raw + 16) | ((uint64_t)dataloader_read_u32le_(raw + 20) << 32);
    if (count == 0) {
        return dataloader_error_(dl, "shard '%s' is empty: its header says 0 tokens\n%s", path, DATALOADER_HINT);
    }
    uint64_t bytes_each = (uint64_t)(bpt + has_mask); /* a token, and its mask byte in version 2 */
    if (count > (uint64_t)(INT64_MAX - DATALOADER_HEADER_BYTES) / bytes_each ||
        (int64_t)(DATALOADER_HEADER_BYTES + count * bytes_each) != size) {
        int64_t expected = count > (uint64_t)(INT64_MAX - DATALOADER_HEADER_BYTES) / bytes_each
                               ? -1
                               : (int64_t)(DATALOADER_HEADER_BYTES + count * bytes_each);
        return dataloader_error_(dl,
                                 "shard '%s' is %s: %lld bytes, but its header says %llu tokens of %d bytes%s "
                                 "(%lld bytes with the header)\n  hint: the file was cut short or appended to; "
                                 "make it again with python3 data/prepare.py",
                                 path, size < expected || expected < 0 ? "truncated" : "oversized", (long long)size,
                                 (unsigned long long)count, bpt, has_mask ? " and a loss mask of 1 byte each" : "",
                                 (long long)expected);
    }
    if (header[3] <= 0 || (bpt == 2 && header[3] > 65536)) {
        return dataloader_error_(dl, "shard '%s' has vocab_size %d, which does not fit %d-byte tokens\n%s", path,
                                 header[3], bpt, DATALOADER_HINT);
    }
    if (header[6] < 0 || header[6] >= header[3] || header[7] < -1 || header[7] >= header[3]) {
        return dataloader_error_(dl,
                                 "shard '%s' has BOS %d and EOS %d, outside its vocabulary of %d tokens (EOS may be "
                                 "-1)\n%s",
                                 path, header[6], header[7], header[3], DATALOADER_HINT);
    }
    for (int i = 8; i < DATALOADER_HEADER_INTS; i++) {
        if (header[i] != 0)
            return dataloader_error_(dl,
                                     "shard '%s': header word %d is %d, but words 8 to 255 are reserved and zero "
                                     "(corrupt, or a newer format)\n%s",
                                     path, i, header[i], DATALOADER_HINT);
    }
    uint64_t stride = (uint64_t)dl->world * (uint64_t)dl->B * (uint64_t)dl->T;
    if (count < stride + 1) {
        return dataloader_error_(dl,
                                 "shard '%s' has %llu tokens, too few for one window of world*B*T+1 = "
                                 "%d*%d*%d+1 = %llu tokens\n  hint: lower B or T, or put more text in each shard",
                                 path, (unsigned long long)count, dl->world, dl->B, dl->T,
                                 (unsigned long long)(stride + 1));
    }
    shard->num_tokens = count;
    shard->num_windows = (count - 1) / stride;
    shard->bytes_per_token = bpt;
    shard->has_mask = has_mask;
    return 0;
}

static inline int dataloader_compare_names_(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static inline uint64_t dataloader_layout_(const DataLoader *dl)
{
    uint64_t h = dataloader_mix_((uint64_t)dl->num_shards);
    for (int i = 0; i < dl->num_shards; i++) {
        h = dataloader_mix_(h ^ dl->shards[i].num_tokens);
    }
    /* the window (world * B rows), not B and world apart: a run resumed on another
     * number of GPUs with the same global batch reads the same windows */
    h = dataloader_mix_(h ^ (uint64_t)dl->B * (uint64_t)dl->world);
    h = dataloader_mix_(h ^ (uint64_t)dl->T);
    return dataloader_mix_(h ^ (uint64_t)dl->shuffle);
}

static inline void dataloader_free(DataLoader *dl)
{
    if (dl->file != NULL) {
        fclose(dl->file);
    }
    for (int i = 0; dl->shards != NULL && i < dl->num_shards; i++) {
        free(dl->shards[i].path);
    }
    free(dl->shards);
    free(dl->shard_order);
    free(dl->window_order);
    free(dl->raw);
    free(dl->inputs);
    free(dl->targets);
    dl->file = NULL;
    dl->shards = NULL;
    dl->shard_order = dl->window_order = NULL;
    dl->raw = NULL;
    dl->inputs = dl->targets = NULL;
    dl->num_shards = 0;
}

static inline void dataloader_reset(DataLoader *dl)
{
    dl->state.epoch = 0;
    dl->state.shard = 0;
    dl->state.window = 0;
    dataloader_order_shards_(dl);
    dataloader_order_windows_(dl);
}

static inline int dataloader_init(DataLoader *dl, const char *pattern, int B, int T, int rank, int world, int shuffle,
                                  uint64_t seed, int vocab_size)
{
    memset(dl, 0, sizeof(*dl));
    dl->file_shard = -1;
    if (B <= 0 || T <= 0 || world <= 0 || rank < 0 || rank >= world || vocab_size < 0 ||
        (uint64_t)world * (uint64_t)B * (uint64_t)T >= (uint64_t)INT_MAX) {
        return dataloader_error_(dl,
                                 "bad data loader arguments for '%s': B=%d T=%d rank=%d world=%d vocab_size=%d\n"
                                 "  hint: B, T, world > 0, 0 <= rank < world, world*B*T < 2^31",
                                 pattern, B, T, rank, world, vocab_size);
    }
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->world = world;
    dl->shuffle = shuffle != 0;

    glob_t found;
    /* Sorted by strcmp below, not by glob in the locale's collation: all ranks and runs agree on the order. */
    int rc = glob(pattern, GLOB_NOSORT, NULL, &found);
    if (rc != 0) {
        if (rc != GLOB_NOMATCH) {
            globfree(&found);
        }
        return dataloader_error_(dl, "no shard file matches '%s'%s\n%s", pattern,
                                 rc == GLOB_NOMATCH ? "" : " (glob failed)", DATALOADER_HINT);
    }
    qsort(found.gl_pathv, found.gl_pathc, sizeof(char *), dataloader_compare_names_);
    if (found.gl_pathc > (size_t)INT_MAX) {
        globfree(&found);
        return dataloader_error_(dl, "too many shards match '%s'", pattern);
    }
    dl->shards = (DataLoaderShard *)calloc_check(found.gl_pathc, sizeof(DataLoaderShard), "shard table");
    dl->num_shards = (int)found.gl_pathc;
    int32_t header[DATALOADER_HEADER_INTS];
    uint64_t max_windows = 0;
    for (int i = 0; i < dl->num_shards; i++) {
        const char *path = found.gl_pathv[i];
        dl->shards[i].path = (char *)malloc_check(strlen(path) + 1, "shard path");
        strcpy(dl->shards[i].path, path);
        if (dataloader_check_shard_(dl, path, &dl->shards[i], header) != 0) {
            globfree(&found);
            dataloader_free(dl);
            return -1;
        }
        if (i == 0) {
            dl->vocab_size = header[3];
            dl->bos_id = header[6];
            dl->eos_id = header[7];
        } else if (header[3] != dl->vocab_size || header[6] != dl->bos_id || header[7] != dl->eos_id) {
            dataloader_error_(dl,
                              "shards '%s' (vocab_size %d, bos %d, eos %d) and '%s' (vocab_size %d, bos %d, "
                              "eos %d) come from different tokenizers\n  hint: give a pattern that matches one set",
                              found.gl_pathv[0], dl->vocab_size, dl->bos_id, dl->eos_id, path, header[3], header[6],
                              header[7]);
            globfree(&found);
            dataloader_free(dl);
            return -1;
        }
        if (vocab_size > 0 && header[3] > vocab_size) {
            dataloader_error_(dl,
                              "shard '%s' was tokenized with vocab_size %d, larger than the model's %d\n"
                              "  hint: prepare the data with the model's tokenizer",
                              path, header[3], vocab_size);
            globfree(&found);
            dataloader_free(dl);
            return -1;
        }
        dl->windows_per_epoch += dl->shards[i].num_windows;
        if (dl->shards[i].num_windows > max_windows) {
            max_windows = dl->shards[i].num_windows;
        }
    }
    globfree(&found);

    size_t bt = (size_t)B * (size_t)T;
    dl->raw = (unsigned char *)malloc_check((bt + 1) * 5, "data loader read buffer"); /* tokens, then mask bytes */
    dl->inputs = (int32_t *)malloc_check(bt * sizeof(int32_t), "data loader inputs");
    dl->targets = (int32_t *)malloc_check(bt * sizeof(int32_t), "data loader targets");
    dl->shard_order = (uint64_t *)malloc_check((size_t)dl->num_shards * sizeof(uint64_t), "shard order");
    if (dl->shuffle) {
        dl->window_order = (uint64_t *)malloc_check((size_t)max_windows * sizeof(uint64_t), "window order");
    }
    dl->state.seed = seed;
    dl->state.layout = dataloader_layout_(dl);
    dataloader_reset(dl);
    return 0;
}

static inline int dataloader_init_eval(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                                       int vocab_size)
{
    return dataloader_init(dl, pattern, B, T, rank, world, 0, 0, vocab_size);
}

static inline int dataloader_next_batch(DataLoader *dl)
{
    int si = (int)dl->shard_order[dl->state.shard];
    const DataLoaderShard *shard = &dl->shards[si];
    uint64_t window = dl->shuffle ? dl->window_order[dl->state.window] : dl->state.window;
    uint64_t bt = (uint64_t)dl->B * (uint64_t)dl->T;
    uint64_t first_token = window * (uint64_t)dl->world * bt + (uint64_t)dl->rank * bt;
    int bpt = shard->bytes_per_token;

    if (dl->file_shard != si) {
        if (dl->file != NULL) {
            fclose(dl->file);
        }
        dl->file_shard = -1;
        dl->file = fopen(shard->path, "rb");
        if (dl->file == NULL) {
            return dataloader_error_(dl,
                                     "cannot open shard '%s': %s\n  hint: was it removed after the loader "
                                     "started?",
                                     shard->path, strerror(errno));
        }
        dl->file_shard = si;
    }
    int64_t offset = DATALOADER_HEADER_BYTES + (int64_t)(first_token * (uint64_t)bpt);
    size_t count = (size_t)bt + 1;
    if (fseeko(dl->file, (off_t)offset, SEEK_SET) != 0 || fread(dl->raw, (size_t)bpt, count, dl->file) != count) {
        return dataloader_error_(dl,
                                 "cannot read %zu tokens at token %llu of shard '%s': %s\n"
                                 "  hint: was it changed after the loader started?",
                                 count, (unsigned long long)first_token, shard->path,
                                 ferror(dl->file) ? strerror(errno) : "end of file");
    }
    const unsigned char *mask = dl->raw + count * 4; /* after the largest tokens */
    if (shard->has_mask) {
        int64_t mask_offset = DATALOADER_HEADER_BYTES + (int64_t)(shard->num_tokens * (uint64_t)bpt + first_token);
        if (fseeko(dl->file, (off_t)mask_offset, SEEK_SET) != 0 ||
            fread(dl->raw + count * 4, 1, count, dl->file) != count) {
            return dataloader_error_(dl,
                                     "cannot read the loss mask of %zu tokens at token %llu of shard '%s': %s\n"
                                     "  hint: was it changed after the loader started?",
                                     count, (unsigned long long)first_token, shard->path,
                                     ferror(dl->file) ? strerror(errno) : "end of file");
        }
    }
    for (size_t i = 0; i < count; i++) {
        const unsigned char *p = dl->raw + i * (size_t)bpt;
        uint32_t token = bpt == 2 ? (uint32_t)p[0] | ((uint32_t)p[1] << 8) : dataloader_read_u32le_(p);
        if (token >= (uint32_t)dl->vocab_size) {
            return dataloader_error_(dl,
                                     "shard '%s' has token %lu at position %llu, outside its vocabulary of "
                                     "%d tokens\n  hint: the shard is corrupt; make it again with "
                                     "python3 data/prepare.py",
                                     shard->path, (unsigned long)token, (unsigned long long)(first_token + i),
                                     dl->vocab_size);
        }
        if (shard->has_mask && mask[i] > 1) {
            return dataloader_error_(dl,
                                     "shard '%s' has loss mask byte %d at position %llu; mask bytes are 0 or 1\n"
                                     "  hint: the shard is corrupt; make it again with python3 data/prepare.py",
                                     shard->path, mask[i], (unsigned long long)(first_token + i));
        }
        if (i < (size_t)bt) {
            dl->inputs[i] = (int32_t)token;
        }
        if (i > 0) {
            dl->targets[i - 1] = shard->has_mask && mask[i] == 0 ? IGNORE_INDEX : (int32_t)token;
        }
    }
    /* Advance eagerly, so that the state always names the next window to read. */
    if (++dl->state.window == shard->num_windows) {
        dl->state.window = 0;
        if (++dl->state.shard == (uint64_t)dl->num_shards) {
            dl->state.shard = 0;
            dl->state.epoch++;
            dataloader_order_shards_(dl);
        }
        dataloader_order_windows_(dl);
    }
    return 0;
}

static inline void dataloader_get_state(const DataLoader *dl, DataLoaderState *state)
{
    *state = dl->state;
}

static inline int dataloader_set_state(DataLoader *dl, const DataLoaderState *state)
{
    if (state->layout != dl->state.layout) {
        return dataloader_error_(dl,
                                 "the saved data position does not fit the %d shards from '%s' on: it was "
                                 "made with other shards or another B, T, world size or shuffle setting\n"
                                 "  hint: resume with the same data and settings as the checkpoint",
                                 dl->num_shards, dl->shards[0].path);
    }
    if (state->shard >= (uint64_t)dl->num_shards) {
        return dataloader_error_(dl,
                                 "the saved data position names shard %llu, but only %d shards from '%s' "
                                 "on match",
                                 (unsigned long long)state->shard, dl->num_shards, dl->shards[0].path);
    }
    DataLoaderState previous = dl->state;
    dl->state = *state;
    dataloader_order_shards_(dl);
    uint64_t windows = dataloader_current_windows_(dl);
    if (state->window >= windows) {
        const char *path = dl->shards[dl->shard_order[state->shard]].path;
        dl->state = previous;
        dataloader_order_shards_(dl);
        return dataloader_error_(dl,
                                 "the saved data position names window %llu, but its shard '%s' has %llu "
                                 "windows",
                                 (unsigned long long)state->window, path, (unsigned long long)windows);
    }
    dataloader_order_windows_(dl);
    return 0;
}

static inline void dataloader_init_or_die(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                                          int shuffle, uint64_t seed, int vocab_size)
{
    if (dataloader_init(dl, pattern, B, T, rank, world, shuffle, seed, vocab_size) != 0) {
        FAIL("%s", dl->error);
    }
}

static inline void dataloader_init_eval_or_die(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                                               int vocab_size)
{
    if (dataloader_init_eval(dl, pattern, B, T, rank, world, vocab_size) != 0) {
        FAIL("%s", dl->error);
    }
}

static inline void dataloader_next_batch_or_die(DataLoader *dl)
{
    if (dataloader_next_batch(dl) != 0) {
        FAIL("%s", dl->error);
    }
}

static inline void dataloader_set_state_or_die(DataLoader *dl, const DataLoaderState *state)
{
    if (dataloader_set_state(dl, state) != 0) {
        FAIL("%s", dl->error);
    }
}

#endif /* LLMC_DATALOADER_H */
