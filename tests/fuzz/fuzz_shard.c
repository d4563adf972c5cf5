/*
 * fuzz_shard.c: libFuzzer target for llmc/formats/dataloader.h: a token shard (the
 * header, the size check, the tokens of each batch) and a data position as a
 * checkpoint restores it. The input is 3 bytes of settings (B, T, and bits:
 * shuffle, whether the position takes the loader's own layout hash so that its
 * other fields are reached, and whether the model's vocabulary is given), then
 * a DataLoaderState of 5 little-endian u64 (epoch, shard, window, seed, layout),
 * then the shard file. Any shard and position must be refused with a message
 * naming the shard, or give batches whose tokens lie in the vocabulary; never
 * a crash, a hang or a read outside a buffer.
 * Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "llmc/formats/dataloader.h"
#include "tests/fuzz/fuzz_file.h"

#define SETTINGS_BYTES 3
#define STATE_BYTES 40

static const char *path;

static uint64_t u64le(const uint8_t *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static void expect_named(const DataLoader *dl)
{
    if (strstr(dl->error, path) == NULL)
        abort(); /* every error names the shard */
}

/* every token in the vocabulary; a target may also be IGNORE_INDEX (a version 2 shard's loss mask) */
static void check_batch(const DataLoader *dl)
{
    for (int i = 0; i < dl->B * dl->T; i++) {
        if (dl->inputs[i] < 0 || dl->inputs[i] >= dl->vocab_size ||
            ((dl->targets[i] < 0 || dl->targets[i] >= dl->vocab_size) && dl->targets[i] != IGNORE_INDEX))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < SETTINGS_BYTES + STATE_BYTES)
        return 0;
    path = fuzz_file_path("shard_000000.bin");
    int B = 1 + data[0] % 4, T = 1 + data[1] % 32, shuffle = data[2] & 1, own_layout = data[2] & 2;
    int vocab = data[2] & 4 ? 300 : 0; /* a model's vocabulary, or none to check against */
    DataLoaderState state = {u64le(data + 3), u64le(data + 11), u64le(data + 19), u64le(data + 27), u64le(data + 35)};
    fuzz_write_file(path, data + SETTINGS_BYTES + STATE_BYTES, size - SETTINGS_BYTES - STATE_BYTES);
    DataLoader dl;
    if (dataloader_init(&dl, path, B, T, 0, 1, shuffle, 1234, vocab) != 0) {
        expect_named(&dl);
        dataloader_free(&dl);
        return 0;
    }
    if (dl.windows_per_epoch < 1 || (vocab > 0 && dl.vocab_size > vocab))
        abort();
    if (own_layout)
        state.layout = dl.state.layout;
    if (dataloader_set_state(&dl, &state) != 0)
        expect_named(&dl);
    for (int k = 0; k < 3; k++) {
        if (dataloader_next_batch(&dl) != 0) {
            expect_named(&dl);
            break;
        }
        check_batch(&dl);
    }
    dataloader_free(&dl);
    return 0;
}
