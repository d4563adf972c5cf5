/*
 * block_codec_check: llmc/kernels/block_codec.h's kernels against its host
 * functions, on the same bf16 inputs, for both codecs:
 *   encode: codes and scales bit-identical (IEEE division and rounding on both
 *     sides; the GPU's e4m3 conversion instruction against fp8.h's exact one);
 *   decode: bit-identical to the host's decoded floats rounded to bf16;
 *   3 pieces at once (the others' inputs this one's rotated, their messages
 *     side by side 16 bytes further apart than they need): encode and decode as
 *     above piece by piece, and decode_sum (written and added to bf16, rank 1's
 *     message apart from the others and its slot among them poisoned) bit-identical
 *     to the host's fp32 sums in rank order rounded once;
 *   a NaN matches any NaN (the payloads of the host's and the GPU's NaNs differ);
 *   block_codec_message_values: the most whole blocks whose message fits;
 *   the error of a value through the codec within the header's bound: int8 half
 *     a step (scale / 2), e4m3 2^-4 of |x| where x / scale is normal, else
 *     scale x 2^-10; each plus 2^-22 of |x| for the fp32 roundings of the scale,
 *     the quotient and the product (2^-24 each);
 *   a block of zeros decodes to zeros, a block holding a NaN or an infinity to
 *     NaNs (its scale NaN), and its neighbours are untouched.
 * Inputs: normal values whose blocks span 2^-40 to 2^40 in scale (a weight's or a
 * gradient's range), at sizes with and without a short last block. Timed at 64M
 * values: encode moves 2 + 1 + 4/128 bytes per value, decode 1 + 4/128 + 2.
 *
 * Usage: block_codec_check [--seed N]
 */
#include "check_common.h"
#include "llmc/kernels/block_codec.h"

static const char *const CODEC_NAMES[] = {"int8", "e4m3"};

typedef struct {
    int64_t n;
    BlockCodec codec;
    bf16 *x, *out;
    uint8_t *msg;
} Bench;

static void run_encode(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    block_encode(b->msg, block_codec_message_bytes(b->n), b->x, 0, b->n, 1, b->codec, 0);
}
static void run_decode(void *ctx, int s)
{
    Bench *b = (Bench *)ctx;
    (void)s;
    block_decode(b->out, 0, b->msg, block_codec_message_bytes(b->n), b->n, 1, b->codec, 0);
}

/* Bit-identical, except that a NaN equals any NaN: the host's NAN and the device's differ in sign and payload
 * (x86 makes 0xffc00000, the GPU 0x7fffffff), and a NaN block's values are NaNs by the codec's contract only. */
static int same_floats(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(&a[i], &b[i], 4) != 0)
            return 0;
    return 1;
}

static int same_bf16s(const uint16_t *a, const uint16_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(isnan(bf16_float(a[i])) && isnan(bf16_float(b[i]))) && a[i] != b[i])
            return 0;
    return 1;
}

/* 3 pieces (piece r: x rotated by 131 r values) encoded, decoded and summed at once, against the host; the
 * messages 16 bytes further apart than they need, and for the sum rank 1's message apart (its slot poisoned). */
static void check_pieces(const uint16_t *x, int64_t n, BlockCodec codec)
{
    const int ranks = 3, own = 1;
    const char *name = CODEC_NAMES[codec];
    int64_t nb = block_codec_blocks(n), m = block_codec_message_bytes(n) + 16, at = block_codec_scales_at(n);
    uint16_t *xs = (uint16_t *)malloc_check(ranks * n * 2, "x"), *start = (uint16_t *)malloc_check(n * 2, "start");
    uint16_t *want = (uint16_t *)malloc_check(ranks * n * 2, "want"),
             *got = (uint16_t *)malloc_check(ranks * n * 2, "got");
    uint8_t *codes = (uint8_t *)malloc_check(ranks * n, "codes"), *msgs = (uint8_t *)malloc_check(ranks * m, "msgs");
    float *scales = (float *)malloc_check(ranks * nb * 4, "scales"), *sum = (float *)calloc_check(n, 4, "sum");
    float *dec = (float *)malloc_check(n * 4, "decoded");
    for (int r = 0; r < ranks; r++) {
        for (int64_t i = 0; i < n; i++)
            xs[r * n + i] = x[(i + 131 * r) % n];
        block_encode_host(codes + r * n, scales + r * nb, xs + r * n, n, codec);
        block_decode_host(dec, codes + r * n, scales + r * nb, n, codec);
        for (int64_t i = 0; i < n; i++) {
            sum[i] += dec[i];
            want[r * n + i] = bf16_bits(dec[i]);
        }
    }
    bf16 *d_x = (bf16 *)dev_upload(xs, ranks * n * 2), *d_out = (bf16 *)dev_alloc(ranks * n * 2);
    uint8_t *d_msgs = (uint8_t *)dev_alloc(ranks * m), *d_own = (uint8_t *)dev_alloc(m);
    poison(d_msgs, ranks * m);
    block_encode(d_msgs, m, d_x, n, n, ranks, codec, 0);
    download(msgs, d_msgs, ranks * m);
    int codes_ok = 1, scales_ok = 1;
    for (int r = 0; r < ranks; r++) {
        codes_ok &= memcmp(msgs + r * m, codes + r * n, n) == 0;
        float *got_scales = (float *)(msgs + r * m + at);
        scales_ok &= same_floats(got_scales, scales + r * nb, nb);
    }
    check(codes_ok && scales_ok, "block_encode %-4s n=%-10lld 3 pieces: codes and scales the host's", name,
          (long long)n);
    poison(d_out, ranks * n * 2);
    block_decode(d_out, n, d_msgs, m, n, ranks, codec, 0);
    download(got, d_out, ranks * n * 2);
    check(same_bf16s(got, want, ranks * n), "block_decode %-4s n=%-10lld 3 pieces: the host's (NaN = NaN)", name,
          (long long)n);
    if (n % BLOCK_CODEC_SIZE == 0) {
        CUDA_CHECK(cudaMemcpy(d_own, d_msgs + own * m, (size_t)m, cudaMemcpyDeviceToDevice));
        poison(d_msgs + own * m, m);
        fill_bf16(start, NULL, n, 1.0f);
        for (int add = 0; add < 2; add++) {
            CUDA_CHECK(cudaMemcpy(d_out, start, (size_t)n * 2, cudaMemcpyHostToDevice));
            block_decode_sum(d_out, d_msgs, m, d_own, own, n, ranks, add, codec, 0);
            download(got, d_out, n * 2);
            for (int64_t i = 0; i < n; i++)
                want[i] = bf16_bits((add ? bf16_float(start[i]) : 0.0f) + sum[i]);
            check(same_bf16s(got, want, n), "block_decode_sum %-4s n=%-10lld %d ranks, %s: the host's (NaN = NaN)",
                  name, (long long)n, ranks, add ? "added" : "written");
        }
    }
    void *dev[] = {d_x, d_out, d_msgs, d_own};
    void *host[] = {xs, start, want, got, codes, msgs, scales, sum, dec};
    FREE_BUFFERS(dev, host);
}

/* For sizes of buffer around the messages of 1 to 3000 blocks: the most whole blocks that fit, and no more. */
static void check_message_values(void)
{
    int ok = 1;
    for (int64_t blocks = 1; blocks <= 3000; blocks++)
        for (int64_t d = -20; d <= 20; d++) {
            int64_t bytes = block_codec_message_bytes(blocks * BLOCK_CODEC_SIZE) + d;
            int64_t v = block_codec_message_values(bytes);
            ok &= v % BLOCK_CODEC_SIZE == 0 && (v == 0 || block_codec_message_bytes(v) <= bytes) &&
                  block_codec_message_bytes(v + BLOCK_CODEC_SIZE) > bytes;
        }
    check(ok, "block_codec_message_values: the most whole blocks whose message fits, for 1 to 3000 blocks +- 20 bytes");
}

static void check_size(int64_t n, BlockCodec codec, int specials, int bench)
{
    int64_t nb = block_codec_blocks(n);
    char what[128];
    const char *name = CODEC_NAMES[codec];
    printf("-- n = %lld, %s%s\n", (long long)n, name, specials ? ", with a zero block and non-finite values" : "");
    uint16_t *x = (uint16_t *)malloc_check(n * 2, "x");
    float *xf = (float *)malloc_check(n * 4, "x f");
    fill_bf16(x, xf, n, 1.0f);
    for (int64_t b = 0; b < nb; b++) { /* each block its own scale, 2^-40 .. 2^40 */
        float k = ldexpf(1.0f, rng_int(81) - 40);
        for (int64_t i = b * BLOCK_CODEC_SIZE; i < n && i < (b + 1) * BLOCK_CODEC_SIZE; i++)
            xf[i] = bf16_float(x[i] = bf16_bits(xf[i] * k));
    }
    int64_t zero_block = -1, nan_block = -1, inf_block = -1;
    if (specials && nb >= 4) {
        zero_block = 1, nan_block = 2, inf_block = nb - 1;
        for (int64_t i = zero_block * BLOCK_CODEC_SIZE; i < (zero_block + 1) * BLOCK_CODEC_SIZE; i++)
            xf[i] = bf16_float(x[i] = 0);
        x[nan_block * BLOCK_CODEC_SIZE + 5] = 0x7fc0; /* NaN */
        x[inf_block * BLOCK_CODEC_SIZE] = 0xff80;     /* -inf */
        xf[nan_block * BLOCK_CODEC_SIZE + 5] = NAN;
        xf[inf_block * BLOCK_CODEC_SIZE] = -INFINITY;
    }
    uint8_t *codes = (uint8_t *)malloc_check(n, "codes"), *got_codes = (uint8_t *)malloc_check(n, "got codes");
    float *scales = (float *)malloc_check(nb * 4, "scales"), *got_scales = (float *)malloc_check(nb * 4, "got");
    float *dec = (float *)malloc_check(n * 4, "decoded"), *bound = (float *)malloc_check(n * 4, "bound");
    uint16_t *want_b = (uint16_t *)malloc_check(n * 2, "want"), *got_b = (uint16_t *)malloc_check(n * 2, "got");

    block_encode_host(codes, scales, x, n, codec);
    block_decode_host(dec, codes, scales, n, codec);
    int64_t msg_bytes = block_codec_message_bytes(n);
    bf16 *d_x = (bf16 *)dev_upload(x, n * 2), *d_out = (bf16 *)dev_alloc(n * 2);
    uint8_t *d_msg = (uint8_t *)dev_alloc(msg_bytes);
    poison(d_msg, msg_bytes);
    block_encode(d_msg, msg_bytes, d_x, 0, n, 1, codec, 0);
    download(got_codes, d_msg, n);
    download(got_scales, d_msg + block_codec_scales_at(n), nb * 4);
    snprintf(what, sizeof(what), "block_encode %s n=%lld codes", name, (long long)n);
    check_identical(what, got_codes, codes, n);
    check(same_floats(got_scales, scales, nb), "block_encode %-4s n=%-10lld scales the host's (NaN = NaN)", name,
          (long long)n);

    poison(d_out, n * 2);
    block_decode(d_out, 0, d_msg, msg_bytes, n, 1, codec, 0);
    download(got_b, d_out, n * 2);
    for (int64_t i = 0; i < n; i++)
        want_b[i] = bf16_bits(dec[i]);
    check(same_bf16s(got_b, want_b, n), "block_decode %-4s n=%-10lld bit-identical (NaN = NaN)", name, (long long)n);
    if (!bench)
        check_pieces(x, n, codec);

    /* the codec's error, on the finite blocks (the header's bounds) */
    float *ref = (float *)malloc_check(n * 4, "ref");
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = i / BLOCK_CODEC_SIZE;
        if (b == nan_block || b == inf_block)
            continue;
        float scale = scales[b], q = scale > 0.0f ? fabsf(xf[i]) / scale : 0.0f;
        float bnd = codec == BLOCK_CODEC_INT8 ? 0.5f * scale : q >= 0x1p-6f ? 0x1p-4f * fabsf(xf[i]) : 0x1p-10f * scale;
        ref[m] = xf[i];
        dec[m] = dec[i];
        bound[m] = bnd + 0x1p-22f * fabsf(xf[i]) + 1e-45f;
        m++;
    }
    snprintf(what, sizeof(what), "block codec %s n=%lld error", name, (long long)n);
    check_within(what, dec, ref, bound, m);
    if (specials && nb >= 4) {
        int zeros = 1, nans = 1;
        for (int64_t i = zero_block * BLOCK_CODEC_SIZE; i < (zero_block + 1) * BLOCK_CODEC_SIZE; i++)
            zeros &= got_b[i] == 0;
        for (int64_t b2 = 0; b2 < 2; b2++) {
            int64_t b = b2 ? inf_block : nan_block;
            for (int64_t i = b * BLOCK_CODEC_SIZE; i < n && i < (b + 1) * BLOCK_CODEC_SIZE; i++)
                nans &= isnan(bf16_float(got_b[i]));
        }
        check(zeros && nans && isnan(got_scales[nan_block]) && isnan(got_scales[inf_block]) &&
                  got_scales[zero_block] == 0.0f,
              "block codec %-4s: a zero block decodes to zeros, a NaN's and an infinity's blocks to NaNs", name);
    }

    if (bench) {
        Bench b = {n, codec, d_x, d_out, d_msg};
        snprintf(what, sizeof(what), "block_encode %s n=%lld", name, (long long)n);
        bench_report(what, run_encode, &b, 1, 3.0 * n + 4.0 * nb);
        snprintf(what, sizeof(what), "block_decode %s n=%lld", name, (long long)n);
        bench_report(what, run_decode, &b, 1, 3.0 * n + 4.0 * nb);
    }

    void *dev[] = {d_x, d_out, d_msg};
    void *host[] = {x, xf, codes, got_codes, scales, got_scales, dec, bound, want_b, got_b, ref};
    FREE_BUFFERS(dev, host);
}

int main(int argc, char **argv)
{
    check_init(argc, argv, "block_codec_check");
    bench_copy_bandwidth();
    int64_t sizes[][3] = {
        /* n, specials, bench */
        {1, 0, 0},
        {127, 0, 0},
        {128, 0, 0},
        {129, 0, 0},
        {1000, 1, 0},
        {128 * 1000 + 5, 1, 0},
        {(int64_t)64 << 20, 0, 1},
    };
    check_message_values();
    for (int codec = 0; codec < 2; codec++)
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
            check_size(sizes[i][0], (BlockCodec)codec, (int)sizes[i][1], (int)sizes[i][2]);
    return check_summary();
}
