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
 * Sizes: shares of 1,024 (one block) to 4M weights, 2 to 8 ranks. Timed at 8
 * ranks x 16M weights: decode moves 1 + 2 + 2 bytes a weight of the other ranks.
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

/* A new weight from an old one: mostly a few ulps either way or none, now and then an escape. */
static uint16_t changed(uint16_t old)
{
    int pick = rng_int(100);
    if (pick < 20)
        return old;
    if (pick < 97)
        return (uint16_t)(old + rng_int(255) - 127);
    if (pick < 98)
        return (uint16_t)(old ^ 0x8000); /* across zero: the sign bit */
    return bf16_bits(0.02f * rng_normal());
}

typedef struct {
    int64_t share;
    int ranks;
    bf16 *full;
    int8_t *codes;
    unsigned long long *lists;
} Bench;

static void run_decode(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    delta_decode(b->full, b->codes, b->lists, 1, b->share, b->ranks, 0, 0);
}

static void check_case(int64_t share, int ranks, int bench)
{
    int64_t n = share * ranks;
    int self = rng_int(ranks);
    uint16_t *old_w = (uint16_t *)malloc(n * 2), *new_w = (uint16_t *)malloc(n * 2), *got = (uint16_t *)malloc(n * 2);
    int8_t *codes = (int8_t *)malloc(n);
    int64_t *count = (int64_t *)calloc(ranks, sizeof(int64_t)), most = 0;
    fill_bf16(old_w, NULL, n, 0.02f);
    for (int64_t i = 0; i < n; i++) {
        new_w[i] = changed(old_w[i]);
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
        Bench b = {share, ranks, (bf16 *)dev_upload(old_w, n * 2), d_codes, d_lists};
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
            check_case(shares[i], ranks[j], 0);
    check_case((int64_t)1 << 24, 8, 1);
    return check_summary();
}
