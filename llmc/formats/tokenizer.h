/*
 * tokenizer.h: the BPE tokenizers of the shards (data/prepare.py), in C, to
 * show what a model writes: Llama 3's (128,000 ranks + 256 special tokens)
 * and GPT-2's (50,256 ranks + <|endoftext|>), read from the tiktoken file the
 * shards were made with: one line per token, its bytes in base64 and its rank,
 * ranks 0..n-1. The special tokens follow the ranks in the order of
 * llama_models/llama3/tokenizer.py (and of data/prepare.py).
 *
 * Decoding concatenates the tokens' bytes (a special token: its name).
 * Encoding cuts the text at special-token names, then splits it as tiktoken's
 * pattern does (Llama 3's or GPT-2's), then merges each piece's bytes by rank
 * (byte-pair encoding: the adjacent pair whose join has the lowest rank
 * first). The pattern is followed exactly for ASCII; a byte of a multi-byte
 * UTF-8 character counts as a letter, so that text in other scripts may split
 * differently from tiktoken, into tokens that still decode to the same text.
 *
 * Memory: the tokens' bytes (about 0.8 MB for Llama 3), an offset per token
 * and a hash table of twice the ranks. Reads only the tokenizer file. Plain C;
 * compiles as C++ too.
 */
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/fileutil.h"
#include "llmc/common/utils.h"

#define TOKENIZER_LLAMA3_RANKS 128000
#define TOKENIZER_GPT2_RANKS 50256
#define TOKENIZER_MAX_BYTES ((int64_t)1 << 28)

typedef enum { TOKENIZER_LLAMA3, TOKENIZER_GPT2 } TokenizerKind;

typedef struct {
    char path[LLMC_PATH_MAX]; /* the file it was read from */
    TokenizerKind kind;
    int n_ranks;    /* ids below are byte sequences */
    int vocab_size; /* n_ranks + the special tokens */
    int bos_id, eos_id;
    unsigned char *bytes; /* every token's bytes back to back; a special token's are its name */
    int64_t *offset;      /* [vocab_size + 1] */
    int *table;           /* open addressing: token bytes -> id, ranks only; -1 empty */
    int64_t table_size;   /* a power of two */
} Tokenizer;

static inline uint64_t tokenizer_hash_(const unsigned char *s, int64_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int64_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* The id of the byte string s[0..n) among the ranks, or -1. */
static inline int tokenizer_rank(const Tokenizer *t, const unsigned char *s, int64_t n)
{
    for (uint64_t h = tokenizer_hash_(s, n) & (uint64_t)(t->table_size - 1);;
         h = (h + 1) & (uint64_t)(t->table_size - 1)) {
        int id = t->table[h];
        if (id < 0)
            return -1;
        if (t->offset[id + 1] - t->offset[id] == n && memcmp(t->bytes + t->offset[id], s, (size_t)n) == 0)
            return id;
    }
}

static inline int base64_value_(unsigned char c)
{
    return c >= 'A' && c <= 'Z'   ? c - 'A'
           : c >= 'a' && c <= 'z' ? c - 'a' + 26
           : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+'             ? 62
           : c == '/'             ? 63
                                  : -1;
}

/* Decodes base64 s[0..n) into out (room for 3n/4 bytes); -1 on a bad character. */
static inline int64_t base64_decode_(const char *s, int64_t n, unsigned char *out)
{
    int64_t len = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (int64_t i = 0; i < n && s[i] != '='; i++) {
        int v = base64_value_((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(acc >> bits);
        }
    }
    return len;
}

/* The special tokens' names, in id order after the ranks. */
static inline int tokenizer_special_name_(TokenizerKind kind, int i, char *out, size_t n)
{
    static const char *llama3[] = {"<|begin_of_text|>",
                                   "<|end_of_text|>",
                                   "<|reserved_special_token_0|>",
                                   "<|reserved_special_token_1|>",
                                   "<|finetune_right_pad_id|>",
                                   "<|step_id|>",
                                   "<|start_header_id|>",
                                   "<|end_header_id|>",
                                   "<|eom_id|>",
                                   "<|eot_id|>",
                                   "<|python_tag|>",
                                   "<|image|>"};
    if (kind == TOKENIZER_GPT2)
        return snprintf(out, n, "<|endoftext|>");
    if (i < 12)
        return snprintf(out, n, "%s", llama3[i]);
    return snprintf(out, n, "<|reserved_special_token_%d|>", 2 + i - 12);
}

static inline void tokenizer_free(Tokenizer *t)
{
    free(t->bytes);
    free(t->offset);
    free(t->table);
    memset(t, 0, sizeof(*t));
}

/* Reads the ranks of one line "base64 rank" into t at id `expected`. */
static inline int tokenizer_line_(Tokenizer *t, const char *line, int64_t len, int expected, int64_t *used,
                                  const char *path, char *err, size_t errlen)
{
    const char *space = (const char *)memchr(line, ' ', (size_t)len);
    char number[24];
    if (!space || len - (space - line) - 1 <= 0 || len - (space - line) - 1 >= (int64_t)sizeof(number))
        return set_error(err, errlen, "'%s': line %d is not 'base64 rank'", path, expected + 1);
    memcpy(number, space + 1, (size_t)(len - (space - line) - 1));
    number[len - (space - line) - 1] = '\0';
    char *end;
    long rank = strtol(number, &end, 10);
    if (*end != '\0' || rank != expected)
        return set_error(err, errlen, "'%s': line %d has rank '%s', expected %d (the ranks must count up from 0)", path,
                         expected + 1, number, expected);
    int64_t n = base64_decode_(line, space - line, t->bytes + *used);
    if (n <= 0)
        return set_error(err, errlen, "'%s': line %d is not valid base64", path, expected + 1);
    t->offset[expected] = *used;
    *used += n;
    return 0;
}

/* The ranks of a tiktoken file's text[0..size), read from path (named in errors), into t. */
static inline int tokenizer_parse_try(Tokenizer *t, const char *path, const char *text, int64_t size, char *err,
                                      size_t errlen)
{
    memset(t, 0, sizeof(*t));
    if (path_format(t->path, sizeof(t->path), "%s", path) != 0)
        return set_error(err, errlen, "the path '%.100s...' is too long", path);
    if (size > TOKENIZER_MAX_BYTES)
        return set_error(err, errlen, "'%s' is %lld bytes, too large for a tokenizer file", path, (long long)size);
    int lines = 0;
    for (int64_t i = 0; i < size; i++)
        lines += text[i] == '\n' || (i == size - 1 && text[i] != '\n');
    int rc = 0;
    if (lines != TOKENIZER_LLAMA3_RANKS && lines != TOKENIZER_GPT2_RANKS)
        rc = set_error(err, errlen,
                       "'%s' holds %d tokens: neither Llama 3's %d nor GPT-2's %d (data/prepare.py's "
                       "tokenizers)",
                       path, lines, TOKENIZER_LLAMA3_RANKS, TOKENIZER_GPT2_RANKS);
    if (rc == 0) {
        t->kind = lines == TOKENIZER_LLAMA3_RANKS ? TOKENIZER_LLAMA3 : TOKENIZER_GPT2;
        t->n_ranks = lines;
        int specials = t->kind == TOKENIZER_LLAMA3 ? 256 : 1;
        t->vocab_size = lines + specials;
        t->bos_id = lines;
        t->eos_id = t->kind == TOKENIZER_LLAMA3 ? lines + 1 : lines;
        t->bytes = (unsigned char *)malloc_check((size_t)size + (size_t)specials * 40, "tokenizer bytes");
        t->offset = (int64_t *)malloc_check(sizeof(int64_t) * (size_t)(t->vocab_size + 1), "tokenizer offsets");
        int64_t used = 0, start = 0;
        for (int id = 0; id < lines && rc == 0; id++) {
            int64_t end = start;
            while (end < size && text[end] != '\n')
                end++;
            rc = tokenizer_line_(t, text + start, end - start, id, &used, path, err, errlen);
            start = end + 1;
        }
        for (int i = 0; i < specials && rc == 0; i++) {
            t->offset[lines + i] = used;
            used += tokenizer_special_name_(t->kind, i, (char *)t->bytes + used, 40);
        }
        t->offset[t->vocab_size] = used;
    }
    if (rc == 0) {
        t->table_size = 1;
        while (t->table_size < 2 * (int64_t)t->n_ranks)
            t->table_size *= 2;
        t->table = (int *)malloc_check(sizeof(int) * (size_t)t->table_size, "tokenizer table");
        memset(t->table, 0xff, sizeof(int) * (size_t)t->table_size);
        for (int id = 0; id < t->n_ranks && rc == 0; id++) {
            const unsigned char *s = t->bytes + t->offset[id];
            int64_t n = t->offset[id + 1] - t->offset[id];
            if (tokenizer_rank(t, s, n) >= 0) {
                rc = set_error(err, errlen, "'%s': token %d repeats the bytes of token %d", path, id,
                               tokenizer_rank(t, s, n));
                break;
            }
            uint64_t h = tokenizer_hash_(s, n) & (uint64_t)(t->table_size - 1);
            while (t->table[h] >= 0)
                h = (h + 1) & (uint64_t)(t->table_size - 1);
            t->table[h] = id;
        }
        for (int b = 0; b < 256 && rc == 0; b++) { /* byte-level BPE: every byte is a token */
            unsigned char byte = (unsigned char)b;
            if (tokenizer_rank(t, &byte, 1) < 0)
                rc = set_error(err, errlen, "'%s' has no token for the byte %d: not a byte-level BPE", path, b);
        }
    }
    if (rc != 0)
        tokenizer_free(t);
    return rc;
}

/* Loads a tiktoken file of Llama 3 (128,000 ranks) or GPT-2 (50,256 ranks) ranks. */
static inline int tokenizer_load_try(Tokenizer *t, const char *path, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    int64_t size;
    FILE *f = open_regular_file(path, &size, err, errlen);
    if (!f)
        return -1;
    if (size > TOKENIZER_MAX_BYTES) {
        fclose(f);
        return set_error(err, errlen, "'%s' is %lld bytes, too large for a tokenizer file", path, (long long)size);
    }
    char *text = (char *)malloc_check((size_t)size + 1, "tokenizer file");
    int ok = fread(text, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    int rc =
        ok ? tokenizer_parse_try(t, path, text, size, err, errlen) : set_error(err, errlen, "short read of '%s'", path);
    free(text);
    return rc;
}

/* The bytes of ids[0..n) back to back, NUL-terminated, in a buffer the caller frees. */
static inline char *tokenizer_decode(const Tokenizer *t, const int *ids, int n)
{
    int64_t len = 0;
    for (int i = 0; i < n; i++)
        len += ids[i] >= 0 && ids[i] < t->vocab_size ? t->offset[ids[i] + 1] - t->offset[ids[i]] : 0;
    char *out = (char *)malloc_check((size_t)len + 1, "decoded text"), *at = out;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            continue;
        int64_t k = t->offset[ids[i] + 1] - t->offset[ids[i]];
        memcpy(at, t->bytes + t->offset[ids[i]], (size_t)k);
        at += k;
    }
    *at = '\0';
    return out;
}

/* ---- the pre-split patterns, on one character at a time (a UTF-8 sequence is one) ---- */

static inline int tok_is_letter_(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
static inline int tok_is_digit_(unsigned char c)
{
    return c >= '0' && c <= '9';
}
static inline int tok_is_space_(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static inline int tok_is_newline_(unsigned char c)
{
    return c == '\n' || c == '\r';
}
static inline int tok_is_other_(unsigned char c) /* [^\s\p{L}\p{N}] */
{
    return !tok_is_space_(c) && !tok_is_letter_(c) && !tok_is_digit_(c);
}
/* Bytes of the character at s[i] (a UTF-8 sequence counts whole). */
static inline int64_t tok_char_len_(const unsigned char *s, int64_t n, int64_t i)
{
    int64_t k = 1;
    if (s[i] >= 0xC0)
        while (i + k < n && (s[i + k] & 0xC0) == 0x80)
            k++;
    return k;
}
/* Length of the run of characters of one class from s[i]. */
static inline int64_t tok_run_(const unsigned char *s, int64_t n, int64_t i, int (*is)(unsigned char))
{
    int64_t j = i;
    while (j < n && is(s[j]))
        j += tok_char_len_(s, n, j);
    return j - i;
}

/* A contraction at s: 's 't 're 've 'm 'll 'd (case-insensitive when ci). */
static inline int64_t tok_contraction_(const unsigned char *s, int64_t n, int ci)
{
    static const char *endings[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (n < 2 || s[0] != '\'')
        return 0;
    for (int e = 0; e < 7; e++) {
        int64_t k = (int64_t)strlen(endings[e]), i = 0;
        while (i < k && 1 + i < n && (s[1 + i] == endings[e][i] || (ci && (s[1 + i] | 0x20) == endings[e][i])))
            i++;
        if (i == k)
            return 1 + k;
    }
    return 0;
}

/* Whitespace at s (w bytes of it): \s*[\r\n]+ if newline_rule, then \s+(?!\S), then the rest. */
static inline int64_t tok_space_(const unsigned char *s, int64_t n, int newline_rule, int whole_if_last)
{
    int64_t w = tok_run_(s, n, 0, tok_is_space_);
    if (newline_rule) {
        for (int64_t j = w - 1; j >= 0; j--) {
            if (tok_is_newline_(s[j]))
                return j + 1;
        }
    }
    if (w == n && whole_if_last)
        return w; /* GPT-2's \s++$ */
    if (w == n || w > 1)
        return w == n ? w : w - 1; /* \s+(?!\S): leave the space before the next word to it */
    return 1;
}

/* The length of the piece that starts at s, by the tokenizer's pattern. */
static inline int64_t tokenizer_piece_(TokenizerKind kind, const unsigned char *s, int64_t n)
{
    unsigned char c = s[0], c1 = n > 1 ? s[1] : 0;
    int64_t k = tok_contraction_(s, n, kind == TOKENIZER_LLAMA3);
    if (k)
        return k;
    if (kind == TOKENIZER_LLAMA3) {
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!tok_is_newline_(c) && !tok_is_letter_(c) && !tok_is_digit_(c) && n > 1 && tok_is_letter_(c1))
            return 1 + tok_run_(s, n, 1, tok_is_letter_);
        if (tok_is_letter_(c))
            return tok_run_(s, n, 0, tok_is_letter_);
        if (tok_is_digit_(c)) { /* \p{N}{1,3} */
            k = tok_run_(s, n, 0, tok_is_digit_);
            return k < 3 ? k : 3;
        }
        /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
        int64_t lead = c == ' ' && n > 1 && tok_is_other_(c1);
        if (lead || tok_is_other_(c)) {
            k = lead + tok_run_(s, n, lead, tok_is_other_);
            return k + tok_run_(s, n, k, tok_is_newline_);
        }
        return tok_space_(s, n, 1, 0);
    }
    /* GPT-2: ' ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s' */
    int64_t lead = c == ' ' && n > 1;
    unsigned char d = lead ? c1 : c;
    if (tok_is_letter_(d) && (lead || c != ' '))
        return lead + tok_run_(s, n, lead, tok_is_letter_);
    if (tok_is_digit_(d) && (lead || c != ' '))
        return lead + tok_run_(s, n, lead, tok_is_digit_);
    if (tok_is_other_(d) && (lead || c != ' '))
        return lead + tok_run_(s, n, lead, tok_is_other_);
    return tok_space_(s, n, 0, 1);
}

/* Byte-pair merges of one piece into ids (room for n); the count. */
static inline int tokenizer_merge_(const Tokenizer *t, const unsigned char *s, int64_t n, int *ids)
{
    int whole = tokenizer_rank(t, s, n);
    if (whole >= 0) {
        ids[0] = whole;
        return 1;
    }
    int64_t *start = (int64_t *)malloc_check(sizeof(int64_t) * (size_t)(n + 1), "BPE parts");
    int parts = (int)n;
    for (int64_t i = 0; i <= n; i++)
        start[i] = i; /* part i is s[start[i], start[i + 1]) */
    for (;;) {
        int best = -1, best_rank = 0;
        for (int i = 0; i + 1 < parts; i++) {
            int r = tokenizer_rank(t, s + start[i], start[i + 2] - start[i]);
            if (r >= 0 && (best < 0 || r < best_rank)) {
                best = i;
                best_rank = r;
            }
        }
        if (best < 0)
            break;
        memmove(start + best + 1, start + best + 2, sizeof(int64_t) * (size_t)(parts - best - 1));
        parts--;
    }
    for (int i = 0; i < parts; i++)
        ids[i] = tokenizer_rank(t, s + start[i], start[i + 1] - start[i]);
    free(start);
    return parts;
}

/* The ids of text (special-token names become their ids) into ids (room for at
 * least strlen(text) of them); the count. */
static inline int tokenizer_encode(const Tokenizer *t, const char *text, int *ids)
{
    const unsigned char *s = (const unsigned char *)text;
    int64_t n = (int64_t)strlen(text), i = 0;
    int count = 0;
    while (i < n) {
        int special = -1;
        if (s[i] == '<') {
            for (int id = t->n_ranks; id < t->vocab_size && special < 0; id++) {
                int64_t k = t->offset[id + 1] - t->offset[id];
                if (i + k <= n && memcmp(s + i, t->bytes + t->offset[id], (size_t)k) == 0)
                    special = id;
            }
        }
        if (special >= 0) {
            ids[count++] = special;
            i += t->offset[special + 1] - t->offset[special];
            continue;
        }
        int64_t end = i; /* up to the next special token's name */
        while (end < n) {
            int found = 0;
            for (int id = t->n_ranks; id < t->vocab_size && !found && s[end] == '<'; id++) {
                int64_t k = t->offset[id + 1] - t->offset[id];
                found = end + k <= n && memcmp(s + end, t->bytes + t->offset[id], (size_t)k) == 0;
            }
            if (found)
                break;
            end++;
        }
        while (i < end) {
            int64_t k = tokenizer_piece_(t->kind, s + i, end - i);
            count += tokenizer_merge_(t, s + i, k, ids + count);
            i += k;
        }
    }
    return count;
}

#endif /* LLMC_TOKENIZER_H */
