/*
 * Tests of llmc/formats/dataloader.h on small shards written to a temp dir: window
 * contents, rank slicing, epochs, shuffling, save/restore, 64-bit offsets and
 * every bad-input error. Prints one line per check and "N passed, M failed".
 *
 *   gcc -O2 -std=gnu11 -Wall -Wextra -I. tests/test_dataloader.c -o tests/test_dataloader -lm
 *   ./tests/test_dataloader
 */
#include "llmc/formats/dataloader.h"
#include "tests/check.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static int check_init(int rc, const DataLoader *dl, const char *what)
{
    return check(rc == 0, "%s: init%s%s", what, rc == 0 ? "" : ": ", rc == 0 ? "" : dl->error);
}

/* An init that must fail, with a message that names `needle`. */
static void check_init_error(const char *what, const char *pattern, const char *needle, int B, int T, int world,
                             int vocab_size)
{
    DataLoader dl;
    int rc = dataloader_init(&dl, pattern, B, T, 0, world, 0, 0, vocab_size);
    int ok = rc != 0 && strstr(dl.error, needle) != NULL;
    check(ok, "%s: init fails naming %s%s%s", what, needle, ok ? "" : "; got: ", ok ? "" : dl.error);
    if (rc == 0) {
        dataloader_free(&dl);
    }
}

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

typedef struct {
    int32_t magic, version, bpt, vocab_size, bos, eos;
    uint64_t count;
} Header;

static Header header_for(int bpt, int vocab_size, uint64_t count)
{
    Header h = {DATALOADER_MAGIC, DATALOADER_VERSION, bpt, vocab_size, 0, -1, count};
    return h;
}

/* Writes the header, `n` tokens of width h.bpt (2 or 4; other widths write 4), then `extra` zero bytes. */
static void write_shard(const char *name, Header h, const uint32_t *tokens, uint64_t n, int extra)
{
    char path[512];
    path_of(path, sizeof(path), name);
    unsigned char header[DATALOADER_HEADER_BYTES] = {0};
    put_u32(header + 0, (uint32_t)h.magic);
    put_u32(header + 4, (uint32_t)h.version);
    put_u32(header + 8, (uint32_t)h.bpt);
    put_u32(header + 12, (uint32_t)h.vocab_size);
    put_u32(header + 16, (uint32_t)h.count);
    put_u32(header + 20, (uint32_t)(h.count >> 32));
    put_u32(header + 24, (uint32_t)h.bos);
    put_u32(header + 28, (uint32_t)h.eos);
    FILE *f = fopen_check(path, "wb");
    fwrite_check(header, 1, sizeof(header), f, "header");
    for (uint64_t i = 0; i < n; i++) {
        unsigned char b[4];
        put_u32(b, tokens[i]);
        fwrite_check(b, 1, h.bpt == 2 ? 2 : 4, f, "token");
    }
    for (int i = 0; i < extra; i++) {
        fputc(0, f);
    }
    fclose(f);
}

/* Token i of test shard s: distinct across shards, so a window is known by its first token. */
static uint32_t token_of(int s, uint64_t i)
{
    return (uint32_t)(s * 10000 + i);
}

static uint32_t *make_tokens(int s, uint64_t n)
{
    uint32_t *t = (uint32_t *)malloc_check(n * sizeof(uint32_t), "test tokens");
    for (uint64_t i = 0; i < n; i++) {
        t[i] = token_of(s, i);
    }
    return t;
}

static void write_good_shard(const char *name, int s, uint64_t n, int bpt, int vocab_size)
{
    uint32_t *t = make_tokens(s, n);
    write_shard(name, header_for(bpt, vocab_size, n), t, n, 0);
    free(t);
}

/* Does the batch hold tokens first .. first+B*T of shard s? */
static int batch_is(const DataLoader *dl, int s, uint64_t first)
{
    for (int i = 0; i < dl->B * dl->T; i++) {
        if ((uint32_t)dl->inputs[i] != token_of(s, first + i) ||
            (uint32_t)dl->targets[i] != token_of(s, first + i + 1)) {
            return 0;
        }
    }
    return 1;
}

static void test_sequential(void)
{
    /* Shard 0 is uint16, shard 1 uint32: widths may differ within one set. */
    write_good_shard("seq_000000.bin", 0, 1000, 2, 65536);
    write_good_shard("seq_000001.bin", 1, 300, 4, 65536);
    char pattern[512];
    path_of(pattern, sizeof(pattern), "seq_*.bin");
    DataLoader dl;
    int B = 2, T = 8, bt = 16;
    if (!check_init(dataloader_init(&dl, pattern, B, T, 0, 1, 0, 0, 65536), &dl, "sequential")) {
        return;
    }
    uint64_t w0 = 999 / bt, w1 = 299 / bt;
    check(dl.num_shards == 2 && dl.windows_per_epoch == w0 + w1, "sequential: 2 shards, %llu windows per epoch",
          (unsigned long long)dl.windows_per_epoch);
    check(dl.vocab_size == 65536 && dl.bos_id == 0 && dl.eos_id == -1, "sequential: header fields exposed");
    int ok = 1;
    for (int epoch = 0; epoch < 2 && ok; epoch++) {
        for (uint64_t w = 0; w < w0 + w1 && ok; w++) {
            int s = w < w0 ? 0 : 1;
            uint64_t first = (s == 0 ? w : w - w0) * bt;
            ok = dataloader_next_batch(&dl) == 0 && batch_is(&dl, s, first);
        }
    }
    check(ok, "sequential: two epochs of exact windows across a uint16 and a uint32 shard");
    DataLoaderState st;
    dataloader_get_state(&dl, &st);
    check(st.epoch == 2 && st.shard == 0 && st.window == 0, "sequential: wraps to shard 0, epoch 2 after two passes");
    dataloader_reset(&dl);
    check(dataloader_next_batch(&dl) == 0 && batch_is(&dl, 0, 0), "sequential: reset restarts at token 0");
    dataloader_free(&dl);
}

static void test_uint32_values(void)
{
    uint64_t n = 600;
    uint32_t *t = (uint32_t *)malloc_check(n * sizeof(uint32_t), "tokens");
    for (uint64_t i = 0; i < n; i++) {
        t[i] = 128255 - (uint32_t)i * 97;
    }
    write_shard("big_000000.bin", header_for(4, 128256, n), t, n, 0);
    char pattern[512];
    path_of(pattern, sizeof(pattern), "big_*.bin");
    DataLoader dl;
    if (!check_init(dataloader_init(&dl, pattern, 4, 16, 0, 1, 0, 0, 128256), &dl, "uint32")) {
        free(t);
        return;
    }
    int ok = dataloader_next_batch(&dl) == 0 && dataloader_next_batch(&dl) == 0;
    for (int i = 0; ok && i < 64; i++) {
        ok = (uint32_t)dl.inputs[i] == t[64 + i] && (uint32_t)dl.targets[i] == t[65 + i];
    }
    check(ok, "uint32: tokens above 65535 read exactly (second window)");
    dataloader_free(&dl);
    free(t);
}

static void test_ranks(int world)
{
    char pattern[512];
    path_of(pattern, sizeof(pattern), "seq_*.bin");
    int B = 2, T = 4, bt = 8;
    DataLoader dl[3];
    for (int r = 0; r < world; r++) {
        if (!check(dataloader_init(&dl[r], pattern, B, T, r, world, 0, 0, 0) == 0, "world %d: init rank %d", world,
                   r)) {
            return;
        }
    }
    uint64_t stride = (uint64_t)world * bt, w0 = 999 / stride, w1 = 299 / stride;
    int ok = dl[0].windows_per_epoch == w0 + w1;
    for (uint64_t w = 0; ok && w < w0 + w1 + 3; w++) {
        uint64_t ww = w % (w0 + w1);
        int s = ww < w0 ? 0 : 1;
        uint64_t first = (s == 0 ? ww : ww - w0) * stride;
        for (int r = 0; ok && r < world; r++) {
            ok = dataloader_next_batch(&dl[r]) == 0 && batch_is(&dl[r], s, first + (uint64_t)r * bt);
        }
    }
    check(ok, "world %d: rank r reads tokens w*%d*B*T + r*B*T.., ranks tile each window, through the wrap", world,
          world);
    for (int r = 0; r < world; r++) {
        dataloader_free(&dl[r]);
    }
}

/* First tokens of the next n batches: a window's identity. */
static void first_tokens(DataLoader *dl, uint64_t n, uint32_t *out, int *ok)
{
    for (uint64_t i = 0; i < n; i++) {
        *ok = *ok && dataloader_next_batch(dl) == 0;
        out[i] = (uint32_t)dl->inputs[0];
    }
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Over 8 epochs, does the order in which the 3 shards are visited change? */
static int shard_orders_vary(DataLoader *dl, uint64_t windows_per_epoch)
{
    int orders[8] = {0}, ok = 1;
    for (int e = 0; e < 8; e++) {
        int last = -1;
        for (uint64_t i = 0; ok && i < windows_per_epoch; i++) {
            ok = dataloader_next_batch(dl) == 0;
            int s = dl->inputs[0] / 10000;
            if (s != last) {
                orders[e] = orders[e] * 10 + s;
                last = s;
            }
        }
    }
    for (int e = 1; ok && e < 8; e++) {
        if (orders[e] != orders[0]) {
            return 1;
        }
    }
    return 0;
}

static void test_shuffle(void)
{
    write_good_shard("shuf_000000.bin", 0, 801, 4, 65536);
    write_good_shard("shuf_000001.bin", 1, 417, 2, 65536);
    write_good_shard("shuf_000002.bin", 2, 1500, 4, 65536);
    char pattern[512];
    path_of(pattern, sizeof(pattern), "shuf_*.bin");
    int B = 2, T = 4;
    DataLoader plain, a, b, c;
    int ok = dataloader_init(&plain, pattern, B, T, 0, 1, 0, 0, 0) == 0 &&
             dataloader_init(&a, pattern, B, T, 0, 1, 1, 42, 0) == 0 &&
             dataloader_init(&b, pattern, B, T, 0, 1, 1, 42, 0) == 0 &&
             dataloader_init(&c, pattern, B, T, 0, 1, 1, 43, 0) == 0;
    if (!check(ok, "shuffle: init four loaders")) {
        return;
    }
    uint64_t n = plain.windows_per_epoch;
    uint32_t *p = (uint32_t *)malloc_check(n * sizeof(uint32_t), "p");
    uint32_t *a0 = (uint32_t *)malloc_check(n * sizeof(uint32_t), "a0");
    uint32_t *a1 = (uint32_t *)malloc_check(n * sizeof(uint32_t), "a1");
    uint32_t *b0 = (uint32_t *)malloc_check(2 * n * sizeof(uint32_t), "b0");
    uint32_t *c0 = (uint32_t *)malloc_check(n * sizeof(uint32_t), "c0");
    first_tokens(&plain, n, p, &ok);
    first_tokens(&a, n, a0, &ok);
    int contents_ok = 1;
    for (uint64_t i = 0; i < 2 * n && ok; i++) {
        ok = dataloader_next_batch(&a) == 0;
        uint32_t t = (uint32_t)a.inputs[0];
        if (i < n) {
            a1[i] = t;
        }
        contents_ok = contents_ok && batch_is(&a, (int)(t / 10000), t % 10000);
    }
    first_tokens(&b, 2 * n, b0, &ok);
    first_tokens(&c, n, c0, &ok);
    check(ok, "shuffle: %llu windows per epoch read without error", (unsigned long long)n);
    check(contents_ok, "shuffle: each shuffled batch holds a real window's tokens");
    check(memcmp(a0, b0, n * sizeof(uint32_t)) == 0 && memcmp(a1, b0 + n, n * sizeof(uint32_t)) == 0,
          "shuffle: same seed, same order over two epochs");
    check(memcmp(a0, c0, n * sizeof(uint32_t)) != 0, "shuffle: another seed, another order");
    check(memcmp(a0, p, n * sizeof(uint32_t)) != 0, "shuffle: order differs from the unshuffled one");
    check(memcmp(a0, a1, n * sizeof(uint32_t)) != 0, "shuffle: epoch 1 is ordered differently from epoch 0");
    check(shard_orders_vary(&c, n), "shuffle: the shard order changes between epochs");
    qsort(p, n, sizeof(uint32_t), compare_u32);
    qsort(a0, n, sizeof(uint32_t), compare_u32);
    qsort(a1, n, sizeof(uint32_t), compare_u32);
    qsort(c0, n, sizeof(uint32_t), compare_u32);
    check(memcmp(a0, p, n * sizeof(uint32_t)) == 0 && memcmp(a1, p, n * sizeof(uint32_t)) == 0 &&
              memcmp(c0, p, n * sizeof(uint32_t)) == 0,
          "shuffle: every window exactly once per epoch");
    free(p);
    free(a0);
    free(a1);
    free(b0);
    free(c0);
    dataloader_free(&plain);
    dataloader_free(&a);
    dataloader_free(&b);
    dataloader_free(&c);

    DataLoader r0, r1;
    ok = dataloader_init(&r0, pattern, B, T, 0, 2, 1, 7, 0) == 0 &&
         dataloader_init(&r1, pattern, B, T, 1, 2, 1, 7, 0) == 0;
    for (uint64_t i = 0; ok && i < 2 * r0.windows_per_epoch; i++) {
        ok = dataloader_next_batch(&r0) == 0 && dataloader_next_batch(&r1) == 0 &&
             (uint32_t)r1.inputs[0] == (uint32_t)r0.inputs[0] + (uint32_t)(B * T);
    }
    check(ok, "shuffle: ranks 0 and 1 of world 2 read the two halves of the same window");
    dataloader_free(&r0);
    dataloader_free(&r1);
}

static void test_save_restore(void)
{
    char pattern[512];
    path_of(pattern, sizeof(pattern), "shuf_*.bin");
    int B = 2, T = 4;
    DataLoader a, b;
    int ok = dataloader_init(&a, pattern, B, T, 0, 1, 1, 99, 0) == 0;
    for (int i = 0; ok && i < 117; i++) {
        ok = dataloader_next_batch(&a) == 0;
    }
    DataLoaderState st;
    dataloader_get_state(&a, &st);
    uint64_t n = 3 * a.windows_per_epoch;
    uint32_t *want = (uint32_t *)malloc_check(n * B * T * sizeof(uint32_t), "want");
    for (uint64_t i = 0; ok && i < n; i++) {
        ok = dataloader_next_batch(&a) == 0;
        for (int j = 0; j < B * T; j++) {
            want[i * B * T + j] = (uint32_t)a.inputs[j];
        }
    }
    /* A different seed at init: the restored state must bring back the saved one. */
    ok = ok && dataloader_init(&b, pattern, B, T, 0, 1, 1, 12345, 0) == 0;
    ok = ok && dataloader_next_batch(&b) == 0 && dataloader_set_state(&b, &st) == 0;
    int same = ok;
    for (uint64_t i = 0; same && i < n; i++) {
        same = dataloader_next_batch(&b) == 0;
        for (int j = 0; same && j < B * T; j++) {
            same = want[i * B * T + j] == (uint32_t)b.inputs[j];
        }
    }
    check(same, "save/restore: mid-shard state restored in a new loader gives the same %llu batches (3 epochs)",
          (unsigned long long)n);

    DataLoaderState bad = st;
    bad.shard = (uint64_t)b.num_shards;
    check(dataloader_set_state(&b, &bad) != 0 && strstr(b.error, "shard") != NULL,
          "save/restore: shard index out of range is an error");
    bad = st;
    bad.window = 1000000;
    check(dataloader_set_state(&b, &bad) != 0 && strstr(b.error, "shuf_") != NULL,
          "save/restore: window out of range is an error naming the shard");
    dataloader_free(&b);
    /* the same window on 2 ranks (B/2 rows each): rank 1 continues with the second half of each batch */
    if (B % 2 == 0) {
        ok = dataloader_init(&b, pattern, B / 2, T, 1, 2, 1, 99, 0) == 0 && dataloader_set_state(&b, &st) == 0;
        same = ok;
        for (uint64_t i = 0; same && i < n; i++) {
            same = dataloader_next_batch(&b) == 0;
            for (int j = 0; same && j < B / 2 * T; j++) {
                same = want[i * B * T + B / 2 * T + j] == (uint32_t)b.inputs[j];
            }
        }
        check(same,
              "save/restore: a state of 1 rank restored on rank 1 of 2 (same global batch) continues with "
              "its half of the same %llu batches",
              (unsigned long long)n);
        dataloader_free(&b);
    }
    free(want);
    ok = dataloader_init(&b, pattern, B, 2 * T, 0, 1, 1, 99, 0) == 0;
    check(ok && dataloader_set_state(&b, &st) != 0 && strstr(b.error, "shuf_") != NULL,
          "save/restore: a state from another T is an error naming the shards");
    dataloader_free(&a);
    dataloader_free(&b);
}

static void test_vocab(void)
{
    uint64_t n = 300;
    uint32_t *t = make_tokens(0, n);
    for (uint64_t i = 0; i < n; i++) {
        t[i] %= 500;
    }
    t[123] = 777;
    write_shard("vocab_000000.bin", header_for(2, 500, n), t, n, 0);
    free(t);
    char pattern[512], path[512];
    path_of(pattern, sizeof(pattern), "vocab_*.bin");
    path_of(path, sizeof(path), "vocab_000000.bin");
    DataLoader dl;
    int B = 2, T = 8;
    int ok = dataloader_init(&dl, pattern, B, T, 0, 1, 0, 0, 1000) == 0;
    for (int i = 0; ok && i < 7; i++) {
        ok = dataloader_next_batch(&dl) == 0; /* windows 0-6 end at token 112 */
    }
    check(ok, "vocab: batches before the bad token load");
    int rc = ok ? dataloader_next_batch(&dl) : 0;
    check(rc != 0 && strstr(dl.error, path) && strstr(dl.error, "position 123") && strstr(dl.error, "777"),
          "vocab: token 777 >= vocab_size 500 is an error naming the shard and position 123 (%s)", dl.error);
    if (ok) {
        dataloader_free(&dl);
    }
    check_init_error("vocab", pattern, path, B, T, 1, 400);
}

static void test_large_offsets(void)
{
    /* A sparse shard of 4.4e9 uint16 tokens (8.8 GB, mostly holes): its token count needs the header's high word,
     * and its last window lies past 2^32 tokens and bytes. */
    uint64_t n = 4400000000ull;
    char path[512], pattern[512];
    path_of(path, sizeof(path), "huge_000000.bin");
    path_of(pattern, sizeof(pattern), "huge_*.bin");
    write_shard("huge_000000.bin", header_for(2, 65536, n), NULL, 0, 0);
    uint64_t tail = n - 64;
    int ok = truncate(path, (off_t)(DATALOADER_HEADER_BYTES + 2 * n)) == 0;
    FILE *f = ok ? fopen(path, "r+b") : NULL;
    ok = f != NULL && fseeko(f, (off_t)(DATALOADER_HEADER_BYTES + 2 * tail), SEEK_SET) == 0;
    for (uint64_t i = 0; ok && i < 64; i++) {
        unsigned char b[2] = {(unsigned char)(i + 1), (unsigned char)(i >> 8)};
        ok = fwrite(b, 1, 2, f) == 2;
    }
    if (f != NULL) {
        fclose(f);
    }
    if (!check(ok, "64-bit: wrote a sparse 8.8 GB shard")) {
        unlink(path);
        return;
    }
    DataLoader dl;
    int B = 2, T = 8;
    ok = dataloader_init(&dl, pattern, B, T, 0, 1, 0, 0, 0) == 0;
    check(ok && dl.windows_per_epoch == (n - 1) / 16, "64-bit: %llu windows in a shard of 4.4e9 tokens",
          (unsigned long long)dl.windows_per_epoch);
    DataLoaderState st;
    dataloader_get_state(&dl, &st);
    st.window = dl.windows_per_epoch - 1;
    uint64_t first = st.window * 16;
    ok = ok && dataloader_set_state(&dl, &st) == 0 && dataloader_next_batch(&dl) == 0;
    for (int i = 0; ok && i < 16; i++) {
        uint64_t pos = first + (uint64_t)i;
        int32_t want = pos >= tail ? (int32_t)(pos - tail + 1) : 0;
        ok = dl.inputs[i] == want && dl.targets[i] == (pos + 1 >= tail ? (int32_t)(pos + 1 - tail + 1) : 0);
    }
    check(ok, "64-bit: the last window, past byte 2^32, holds the tokens written there");
    dataloader_get_state(&dl, &st);
    check(st.epoch == 1 && st.window == 0, "64-bit: reading the last window wraps to epoch 1");
    dataloader_free(&dl);
    unlink(path);
}

static void test_eval(void)
{
    write_good_shard("ev_val_000000.bin", 3, 200, 4, 65536);
    write_good_shard("ev_val_000001.bin", 4, 100, 4, 65536);
    char pattern[512];
    path_of(pattern, sizeof(pattern), "ev_val_*.bin");
    DataLoader dl;
    if (!check(dataloader_init_eval(&dl, pattern, 1, 16, 0, 1, 65536) == 0, "eval: init")) {
        return;
    }
    int ok = dl.windows_per_epoch == 199 / 16 + 99 / 16;
    for (int pass = 0; ok && pass < 2; pass++) {
        for (uint64_t w = 0; ok && w < dl.windows_per_epoch; w++) {
            int s = w < 199 / 16 ? 3 : 4;
            ok = dataloader_next_batch(&dl) == 0 && batch_is(&dl, s, (s == 3 ? w : w - 199 / 16) * 16);
        }
        dataloader_reset(&dl);
    }
    check(ok, "eval: reads both val shards in order, and again after reset");
    dataloader_free(&dl);
}

static void test_bad_inputs(void)
{
    char pattern[512], path[512];
    uint32_t *t = make_tokens(0, 100);
    struct {
        const char *name;
        const char *what;
        Header h;
        uint64_t tokens;
        int extra;
        const char *needle;
    } cases[] = {
        {"bad_magic.bin", "bad magic", {20240520, 1, 2, 50257, 0, -1, 100}, 100, 0, "magic"},
        {"bad_version.bin", "bad version", {DATALOADER_MAGIC, 2, 2, 50257, 0, -1, 100}, 100, 0, "version"},
        {"bad_dtype.bin",
         "bad bytes per token",
         {DATALOADER_MAGIC, 1, 3, 50257, 0, -1, 100},
         100,
         0,
         "bytes per token"},
        {"bad_truncated.bin", "truncated", {DATALOADER_MAGIC, 1, 2, 50257, 0, -1, 100}, 99, 0, "truncated"},
        {"bad_extra.bin", "extra bytes", {DATALOADER_MAGIC, 1, 4, 50257, 0, -1, 100}, 100, 1, "oversized"},
        {"bad_empty.bin", "empty shard", {DATALOADER_MAGIC, 1, 2, 50257, 0, -1, 0}, 0, 0, "empty"},
        {"bad_small.bin", "smaller than one window", {DATALOADER_MAGIC, 1, 2, 50257, 0, -1, 16}, 16, 0, "too few"},
        {"bad_vocab16.bin",
         "uint16 with vocab > 65536",
         {DATALOADER_MAGIC, 1, 2, 128256, 0, -1, 100},
         100,
         0,
         "vocab_size"},
        /* the audit of be39022 found these accepted */
        {"bad_bos.bin", "BOS outside the vocabulary", {DATALOADER_MAGIC, 1, 2, 500, 500, -1, 100}, 100, 0, "BOS 500"},
        {"bad_eos.bin", "EOS outside the vocabulary", {DATALOADER_MAGIC, 1, 2, 500, 0, -7, 100}, 100, 0, "EOS -7"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_shard(cases[i].name, cases[i].h, t, cases[i].tokens, cases[i].extra);
        path_of(path, sizeof(path), cases[i].name);
        check_init_error(cases[i].what, path, path, 2, 8, 1, 0);
        DataLoader dl;
        check(dataloader_init(&dl, path, 2, 8, 0, 1, 0, 0, 0) != 0 && strstr(dl.error, cases[i].needle),
              "%s: message says '%s'", cases[i].what, cases[i].needle);
    }

    /* a reserved header word that is not zero: written by hand, write_shard leaves them zero */
    write_good_shard("bad_reserved.bin", 0, 100, 2, 65536);
    path_of(path, sizeof(path), "bad_reserved.bin");
    FILE *f = fopen_check(path, "r+b");
    fseek_check(f, 4 * 200, SEEK_SET);
    fputc(1, f);
    fclose(f);
    check_init_error("a reserved header word not zero", path, path, 2, 8, 1, 0);
    DataLoader reserved;
    check(dataloader_init(&reserved, path, 2, 8, 0, 1, 0, 0, 0) != 0 && strstr(reserved.error, "header word 200"),
          "reserved header word: message names word 200");

    /* a FIFO matching the glob: refused at once (the audit: fopen blocked forever) */
    path_of(path, sizeof(path), "fifo_000000.bin");
    if (mkfifo(path, 0600) != 0)
        FAIL("mkfifo '%s': %s", path, strerror(errno));
    check_init_error("a FIFO matching the glob", path, "not a regular file", 2, 8, 1, 0);
    unlink(path);

    path_of(path, sizeof(path), "bad_header.bin");
    f = fopen_check(path, "wb");
    fwrite_check(t, 1, 100, f, "short header");
    fclose(f);
    check_init_error("header shorter than 1024 bytes", path, path, 2, 8, 1, 0);

    path_of(pattern, sizeof(pattern), "nothing_*.bin");
    check_init_error("no file matches", pattern, pattern, 2, 8, 1, 0);
    path_of(path, sizeof(path), "missing.bin");
    check_init_error("missing file", path, path, 2, 8, 1, 0);

    /* 17 tokens are one window for world 1 but not for world 2. */
    write_good_shard("w2_000000.bin", 0, 17, 2, 65536);
    path_of(path, sizeof(path), "w2_000000.bin");
    DataLoader dl;
    check(dataloader_init(&dl, path, 2, 8, 0, 1, 0, 0, 0) == 0, "17 tokens: one window for B=2 T=8 world=1");
    dataloader_free(&dl);
    check_init_error("17 tokens with world 2", path, path, 2, 8, 2, 0);

    /* Validation covers every shard, not only the first. */
    write_good_shard("mixed_000000.bin", 0, 100, 2, 65536);
    write_shard("mixed_000001.bin", header_for(2, 65536, 100), t, 50, 0);
    path_of(pattern, sizeof(pattern), "mixed_*.bin");
    path_of(path, sizeof(path), "mixed_000001.bin");
    check_init_error("a bad second shard", pattern, path, 2, 8, 1, 0);

    write_good_shard("tok_000000.bin", 0, 100, 2, 65536);
    write_good_shard("tok_000001.bin", 0, 100, 2, 50257);
    path_of(pattern, sizeof(pattern), "tok_*.bin");
    path_of(path, sizeof(path), "tok_000001.bin");
    check_init_error("shards of two tokenizers", pattern, path, 2, 8, 1, 0);

    path_of(path, sizeof(path), "seq_*.bin");
    check_init_error("rank >= world", path, "rank=0 world=0", 2, 8, 0, 0);
    free(t);
}

/* Version 2: the loss mask after the tokens. Targets whose token's mask byte is 0 become IGNORE_INDEX, the inputs
 * stay; a mask byte other than 0 or 1, and a mask cut short, are errors naming the shard. */
static void write_masked_shard(const char *name, int s, uint64_t n, const unsigned char *mask, uint64_t mask_bytes)
{
    char path[512];
    uint32_t *t = make_tokens(s, n);
    Header h = header_for(2, 65536, n);
    h.version = DATALOADER_VERSION_MASKED;
    write_shard(name, h, t, n, 0);
    path_of(path, sizeof(path), name);
    FILE *f = fopen_check(path, "ab");
    fwrite_check(mask, 1, mask_bytes, f, "mask");
    fclose(f);
    free(t);
}

static void test_loss_mask(void)
{
    enum { N = 101, B = 2, T = 8 };
    unsigned char mask[N];
    for (int i = 0; i < N; i++)
        mask[i] = (unsigned char)(i % 3 != 0); /* every third token's prediction does not count */
    write_masked_shard("masked_000000.bin", 3, N, mask, N);
    char pattern[512];
    path_of(pattern, sizeof(pattern), "masked_*.bin");
    DataLoader dl;
    if (check_init(dataloader_init(&dl, pattern, B, T, 0, 1, 0, 0, 0), &dl, "masked shard")) {
        int ok = 1;
        for (int w = 0; w < 3 && ok; w++) {
            ok = dataloader_next_batch(&dl) == 0;
            for (int i = 0; i < B * T && ok; i++) {
                uint64_t at = (uint64_t)w * B * T + i;
                int want = mask[at + 1] ? (int)token_of(3, at + 1) : IGNORE_INDEX;
                ok = dl.inputs[i] == (int)token_of(3, at) && dl.targets[i] == want;
            }
        }
        check(ok, "masked shard: targets of mask-0 tokens are IGNORE_INDEX, the rest and every input as stored");
        dataloader_free(&dl);
    }
    mask[20] = 2;
    write_masked_shard("badmask_000000.bin", 3, N, mask, N);
    path_of(pattern, sizeof(pattern), "badmask_*.bin");
    if (check_init(dataloader_init(&dl, pattern, B, T, 0, 1, 0, 0, 0), &dl, "mask byte 2")) {
        int rc = dataloader_next_batch(&dl);
        rc = rc != 0 ? rc : dataloader_next_batch(&dl);
        check(rc != 0 && strstr(dl.error, "loss mask byte 2") && strstr(dl.error, "badmask_000000.bin"),
              "a mask byte of 2 is an error naming the shard: %s", dl.error);
        dataloader_free(&dl);
    }
    write_masked_shard("cutmask_000000.bin", 3, N, mask, N - 1);
    path_of(pattern, sizeof(pattern), "cutmask_*.bin");
    check_init_error("a loss mask cut short", pattern, "truncated", B, T, 1, 0);
}

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    char path[1024];
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(path, sizeof(path), "%s/%s", tmpdir, e->d_name);
            unlink(path);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    rmdir(tmpdir);
}

int main(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof(tmpdir), "%s/test_dataloader_XXXXXX", base);
    if (mkdtemp(tmpdir) == NULL) {
        FAIL("mkdtemp(%s): %s", tmpdir, strerror(errno));
    }
    test_sequential();
    test_uint32_values();
    test_ranks(2);
    test_ranks(3);
    test_shuffle();
    test_save_restore();
    test_vocab();
    test_large_offsets();
    test_eval();
    test_bad_inputs();
    test_loss_mask();
    remove_tmpdir();
    return check_summary();
}
