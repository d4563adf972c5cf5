/*
 * delta_codec_check: llmc/kernels/delta_codec.h's escape lists and decoding,
 * the way ZeRO's --update-gather delta uses them (zero.h), against the new
 * weights themselves:
 *   ranks' shares of old bf16 weights, each changed by random steps of a few
 *   ulps, some by many (escapes: across zero, and jumps of thousands of ulps),
 *   some not at all; the codes made on the host (delta_code, which AdamW's
 *   kernel calls; adamw_check checks AdamW's codes);
 *   delta_escapes: the count is the host's, the entries are the host's escapes
 *     as a set (their order is the atomics', free), and a list with too little
 *     room still counts all of them;
 *   delta_decode: every rank but self's share becomes its new weights bit for
 *     bit, self's share (AdamW's, new already) untouched, and with no escapes
 *     at all (stride 1) too.
 *   packed (delta_wide_offsets, delta_pack, delta_unpack): each rank's wide
 *     count is the host's, its message byte for byte the host's packing (the
 *     nibbles, the chunks' offsets, the wide codes), and the messages gathered
 *     side by side (as zero.h's in-place all-gather leaves them) unpack to the
 *     new weights bit for bit, self's share untouched; with changes mostly
 *     within [-7, 7] (as AdamW's are) and with the wide changes above.
 * Sizes: shares of 1,024 (under one chunk) to 4M weights (4,096 + 128: a last
 * chunk of 128), 2 to 8 ranks. Timed at 8 ranks x 16M weights: decode moves
 * 1 + 2 + 2 bytes a weight of the other ranks, unpack half a byte less and the
 * wide codes; pack reads a byte (twice: the count, then the packing) and writes
 * the message.
 *
 * Usage: delta_codec_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/delta_codec.h"

static int compare_u64(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return (x > y) - (x < y);
}

/* A new weight from an old one: mostly a few ulps either way or none (small: within 7 ulps but for 17% within
 * 127), now and then an escape. */
static uint16_t changed(uint16_t old, int small)
{
    int pick = rng_int(100);
    if (pick < 20)
        return old;
    if (small && pick < 80)
        return (uint16_t)(old + rng_int(15) - 7);
    if (pick < 97)
        return (uint16_t)(old + rng_int(255) - 127);
    if (pick < 98)
        return (uint16_t)(old ^ 0x8000); /* across zero: the sign bit */
    return bf16_bits(0.02f * rng_normal());
}

typedef struct {
    int64_t share, msg;
    int ranks;
    bf16 *full;
    int8_t *codes;
    unsigned long long *lists;
    uint8_t *msgs;
    uint32_t *offsets;
    unsigned long long *total;
} Bench;

static void run_decode(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    delta_decode(b->full, b->codes, b->lists, 1, b->share, b->ranks, 0, 0);
}

static void run_unpack(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    delta_unpack(b->full, b->msgs, b->msg, b->lists, 1, b->share, b->ranks, 0, 0);
}

static void run_pack(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    delta_wide_offsets(b->codes, b->share, b->offsets, b->total, 0);
    delta_pack(b->codes, b->share, b->offsets, b->msgs, 0);
}

/* The host's packed message of codes[n] (msg: delta_packed_bytes(n, wide) bytes, zeroed), and its wide count. */
static int64_t host_pack(const int8_t *codes, int64_t n, uint8_t *msg)
{
    uint32_t *offsets = (uint32_t *)(msg + n / 2);
    uint8_t *wide = msg + delta_packed_wide_at(n);
    int64_t w = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i % DELTA_CHUNK == 0)
            offsets[i / DELTA_CHUNK] = (uint32_t)w;
        int nibble = codes[i];
        if (codes[i] < -7 || codes[i] > 7) {
            wide[w++] = (uint8_t)codes[i];
            nibble = DELTA_WIDE;
        }
        msg[i / 2] |= (uint8_t)((nibble & 0xf) << (i % 2 * 4));
    }
    return w;
}

/* The packed form: ranks' messages side by side against the host's, then unpacked against the new weights. */
static void check_packed(const int8_t *codes, const uint16_t *old_w, const uint16_t *new_w, int64_t share, int ranks,
                         int self, const unsigned long long *d_lists, int64_t stride, int small, int bench)
{
    int64_t n = share * ranks, most = 0, *wide = (int64_t *)calloc(ranks, sizeof(int64_t));
    uint8_t *scratch = (uint8_t *)calloc(delta_packed_bytes(share, share), 1);
    for (int r = 0; r < ranks; r++) {
        memset(scratch, 0, delta_packed_bytes(share, share));
        wide[r] = host_pack(codes + r * share, share, scratch);
        most = wide[r] > most ? wide[r] : most;
    }
    int64_t msg = delta_packed_bytes(share, most);
    uint8_t *want = (uint8_t *)calloc(msg * ranks, 1), *got = (uint8_t *)malloc(msg * ranks);
    for (int r = 0; r < ranks; r++)
        host_pack(codes + r * share, share, want + r * msg);
    int8_t *d_codes = (int8_t *)dev_upload(codes, n);
    uint8_t *d_msgs = (uint8_t *)dev_alloc(msg * ranks);
    uint32_t *d_offsets = (uint32_t *)dev_alloc(delta_chunks(share) * 4);
    unsigned long long *d_total = (unsigned long long *)dev_alloc(8), total;
    CUDA_CHECK(cudaMemset(d_msgs, 0, msg * ranks)); /* the wide stream's tail past a rank's count is never written */
    int ok_total = 1;
    for (int r = 0; r < ranks; r++) {
        poison(d_offsets, delta_chunks(share) * 4);
        delta_wide_offsets(d_codes + r * share, share, d_offsets, d_total, 0);
        delta_pack(d_codes + r * share, share, d_offsets, d_msgs + r * msg, 0);
        download(&total, d_total, 8);
        ok_total &= (int64_t)total == wide[r];
    }
    download(got, d_msgs, msg * ranks);
    char what[96];
    snprintf(what, sizeof(what), "delta_pack share=%lld ranks=%d%s", (long long)share, ranks, small ? ", small" : "");
    check(ok_total && memcmp(got, want, msg * ranks) == 0,
          "%-46s counts and messages as the host's (%.3f bytes a weight)", what, (double)msg / share);
    uint16_t *start = (uint16_t *)malloc(n * 2), *out = (uint16_t *)malloc(n * 2);
    memcpy(start, old_w, n * 2);
    memcpy(start + self * share, new_w + self * share, share * 2);
    bf16 *d_full = (bf16 *)dev_upload(start, n * 2);
    delta_unpack(d_full, d_msgs, msg, d_lists, stride, share, ranks, self, 0);
    download(out, d_full, n * 2);
    snprintf(what, sizeof(what), "delta_unpack share=%lld ranks=%d%s", (long long)share, ranks, small ? ", small" : "");
    check(memcmp(out, new_w, n * 2) == 0, "%-46s the new weights bit for bit (self %d untouched)", what, self);
    if (bench) {
        Bench b = {share, msg, ranks, d_full, d_codes, NULL, d_msgs, d_offsets, d_total};
        float ms = bench_median_ms(run_unpack, &b, 1);
        double bytes = (double)(ranks - 1) * (msg + share * 4.0);
        printf("BENCH delta_unpack %d ranks x %lld  %9.4f ms %8.1f GB/s %5.1f%% of copy\n", ranks, (long long)share, ms,
               bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbps);
        ms = bench_median_ms(run_pack, &b, 1);
        bytes = 2.0 * share + (double)msg;
        printf("BENCH delta_pack 1 rank x %lld  %9.4f ms %8.1f GB/s %5.1f%% of copy (counting included)\n",
               (long long)share, ms, bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbps);
    }
    cuda_free(d_full);
    cuda_free(d_codes);
    cuda_free(d_msgs);
    cuda_free(d_offsets);
    cuda_free(d_total);
    free(wide);
    free(scratch);
    free(want);
    free(got);
    free(start);
    free(out);
}

static void check_case(int64_t share, int ranks, int small, int bench)
{
    int64_t n = share * ranks;
    int self = rng_int(ranks);
    uint16_t *old_w = (uint16_t *)malloc(n * 2), *new_w = (uint16_t *)malloc(n * 2), *got = (uint16_t *)malloc(n * 2);
    int8_t *codes = (int8_t *)malloc(n);
    int64_t *count = (int64_t *)calloc(ranks, sizeof(int64_t)), most = 0;
    fill_bf16(old_w, NULL, n, 0.02f);
    for (int64_t i = 0; i < n; i++) {
        new_w[i] = changed(old_w[i], small);
        codes[i] = delta_code(old_w[i], new_w[i]);
        count[i / share] += codes[i] == DELTA_ESCAPE;
    }
    for (int r = 0; r < ranks; r++)
        most = count[r] > most ? count[r] : most;
    /* each rank's list from its share, with room for all of them (stride 1 + most, as zero.h sizes the gather) */
    int64_t stride = 1 + most;
    unsigned long long *lists = (unsigned long long *)malloc(stride * ranks * 8);
    unsigned long long *d_lists = (unsigned long long *)dev_alloc(stride * ranks * 8);
    int8_t *d_codes = (int8_t *)dev_upload(codes, n);
    bf16 *d_new = (bf16 *)dev_upload(new_w, n * 2);
    poison(d_lists, stride * ranks * 8);
    for (int r = 0; r < ranks; r++)
        delta_escapes(d_codes + r * share, d_new + r * share, share, d_lists + r * stride, stride - 1, 0);
    download(lists, d_lists, stride * ranks * 8);
    char what[96];
    int ok_count = 1, ok_entries = 1;
    for (int r = 0; r < ranks; r++) {
        ok_count &= (int64_t)lists[r * stride] == count[r];
        unsigned long long *want = (unsigned long long *)malloc((count[r] + 1) * 8);
        int64_t k = 0;
        for (int64_t i = 0; i < share; i++)
            if (codes[r * share + i] == DELTA_ESCAPE)
                want[k++] = delta_escape_entry(i, new_w[r * share + i]);
        qsort(want, count[r], 8, compare_u64);
        qsort(lists + r * stride + 1, count[r], 8, compare_u64);
        ok_entries &= memcmp(want, lists + r * stride + 1, count[r] * 8) == 0;
        free(want);
    }
    snprintf(what, sizeof(what), "delta_escapes share=%lld ranks=%d", (long long)share, ranks);
    check(ok_count && ok_entries, "%-46s counts and entries as the host's (most %lld escapes a share)", what,
          (long long)most);
    /* too little room: the count is still every escape, so that zero.h gathers that bucket whole */
    if (most > 0) {
        delta_escapes(d_codes, d_new, share, d_lists, 0, 0);
        unsigned long long got_count;
        download(&got_count, d_lists, 8);
        snprintf(what, sizeof(what), "delta_escapes share=%lld room 0", (long long)share);
        check((int64_t)got_count == count[0], "%-46s counts all %lld escapes", what, (long long)count[0]);
    }
    check_packed(codes, old_w, new_w, share, ranks, self, d_lists, stride, small, bench);
    /* decode: the old weights everywhere but self's share, which AdamW updated in place */
    for (int pass = 0; pass < 2; pass++) { /* 0: with the escape lists; 1: a run with none (stride 1) */
        uint16_t *start = (uint16_t *)malloc(n * 2), *want = new_w;
        memcpy(start, old_w, n * 2);
        if (pass == 1) { /* no escapes: the codes of the escaped weights say 0 instead, the new weight is the old */
            want = (uint16_t *)malloc(n * 2);
            for (int64_t i = 0; i < n; i++) {
                if (codes[i] == DELTA_ESCAPE)
                    codes[i] = 0;
                want[i] = (uint16_t)(old_w[i] + codes[i]);
            }
            CUDA_CHECK(cudaMemcpy(d_codes, codes, n, cudaMemcpyHostToDevice));
        }
        memcpy(start + self * share, want + self * share, share * 2);
        bf16 *d_full = (bf16 *)dev_upload(start, n * 2);
        delta_decode(d_full, d_codes, d_lists, pass == 0 ? stride : 1, share, ranks, self, 0);
        download(got, d_full, n * 2);
        snprintf(what, sizeof(what), "delta_decode share=%lld ranks=%d%s", (long long)share, ranks,
                 pass ? ", no escapes" : "");
        check(memcmp(got, want, n * 2) == 0, "%-46s the new weights bit for bit (self %d untouched)", what, self);
        if (pass == 1)
            free(want);
        free(start);
        cuda_free(d_full);
    }
    if (bench) {
        Bench b = {share, 0, ranks, (bf16 *)dev_upload(old_w, n * 2), d_codes, d_lists, NULL, NULL, NULL};
        float ms = bench_median_ms(run_decode, &b, 1);
        double bytes = (double)(ranks - 1) * share * 5.0;
        printf("BENCH delta_decode %d ranks x %lld  %9.4f ms %8.1f GB/s %5.1f%% of copy\n", ranks, (long long)share, ms,
               bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbps);
        cuda_free(b.full);
    }
    cuda_free(d_codes);
    cuda_free(d_new);
    cuda_free(d_lists);
    free(old_w);
    free(new_w);
    free(got);
    free(codes);
    free(count);
    free(lists);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "delta_codec_check");
    bench_copy_bandwidth();
    check(delta_code(0x3c00, 0x3c7f) == 127 && delta_code(0x3c7f, 0x3c00) == -127 &&
              delta_code(0x3c00, 0x3c80) == DELTA_ESCAPE && delta_code(0x0001, 0x8001) == DELTA_ESCAPE &&
              delta_code(0xbc00, 0xbc01) == 1,
          "%-46s +-127 fit, 128 and a sign change escape", "delta_code");
    int64_t shares[] = {1024, 4096 + 128, (int64_t)1 << 22};
    int ranks[] = {2, 3, 8};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int small = 0; small < 2; small++)
                check_case(shares[i], ranks[j], small, 0);
    check_case((int64_t)1 << 24, 8, 1, 1);
    return check_summary();
}
