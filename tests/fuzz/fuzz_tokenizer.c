/*
 * fuzz_tokenizer.c: libFuzzer target for llmc/formats/tokenizer.h's reader of tiktoken
 * files (--tokenizer, the tokenizer beside the shards or in an HF directory).
 * A file is only read when it has exactly GPT-2's or Llama 3's number of lines,
 * which random bytes never have: the input is the first lines of a GPT-2-sized
 * file (up to 64 of them), the rest valid lines ("base64 rank": every single
 * byte, then distinct 3-byte tokens) that keep its line count. Any content must
 * give a tokenizer whose every token decodes, or an error naming the file;
 * never a crash. Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmc/formats/tokenizer.h"

static size_t base64_encode(const unsigned char *in, size_t n, char *out)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = alphabet[v >> 18 & 63];
        out[o++] = alphabet[v >> 12 & 63];
        out[o++] = i + 1 < n ? alphabet[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? alphabet[v & 63] : '=';
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the input's first lines, as many as it has (at most 64), then the padding */
    size_t cut = 0;
    int lines = 0;
    while (cut < size && lines < 64) {
        const uint8_t *nl = (const uint8_t *)memchr(data + cut, '\n', size - cut);
        cut = nl ? (size_t)(nl - data) + 1 : size;
        lines++;
    }
    size_t cap = cut + 1 + (size_t)TOKENIZER_GPT2_RANKS * 16;
    char *text = (char *)malloc(cap);
    memcpy(text, data, cut);
    size_t at = cut;
    if (at > 0 && text[at - 1] != '\n')
        text[at++] = '\n';
    for (int id = lines; id < TOKENIZER_GPT2_RANKS; id++) {
        int k = id - lines;
        unsigned char token[3] = {(unsigned char)(id >> 16 | 0x80), (unsigned char)(id >> 8), (unsigned char)id};
        unsigned char byte = (unsigned char)k;
        at += base64_encode(k < 256 ? &byte : token, k < 256 ? 1 : 3, text + at);
        at += (size_t)snprintf(text + at, cap - at, " %d\n", id);
    }
    Tokenizer t;
    char err[512];
    if (tokenizer_parse_try(&t, "fuzz.tiktoken", text, (int64_t)at, err, sizeof(err)) != 0) {
        if (strstr(err, "fuzz.tiktoken") == NULL)
            abort(); /* every error names the file */
    } else {
        if (t.vocab_size != TOKENIZER_GPT2_RANKS + 1)
            abort();
        int ids[4] = {0, t.n_ranks / 2, t.n_ranks - 1, t.eos_id};
        char *decoded = tokenizer_decode(&t, ids, 4);
        free(decoded);
        tokenizer_free(&t);
    }
    free(text);
    return 0;
}
