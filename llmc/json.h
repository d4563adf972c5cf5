/*
 * json.h: a JSON reader just big enough for safetensors headers and HF's
 * config.json: a cursor over the text (CkptJson) and functions that read one
 * token or value at it (whitespace, a character, a string, a number, an array
 * of non-negative integers, an object's next key) or skip a value. Reads only
 * the text; writes only the caller's buffers. Plain C; compiles as C++ too.
 */
#ifndef LLMC_JSON_H
#define LLMC_JSON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t pos, len;
} CkptJson;

static inline void ckj_ws(CkptJson *j)
{
    while (j->pos < j->len &&
           (j->s[j->pos] == ' ' || j->s[j->pos] == '\t' || j->s[j->pos] == '\n' || j->s[j->pos] == '\r'))
        j->pos++;
}

static inline int ckj_expect(CkptJson *j, char ch)
{
    ckj_ws(j);
    if (j->pos >= j->len || j->s[j->pos] != ch)
        return -1;
    j->pos++;
    return 0;
}

/* A string into out (escapes other than \uXXXX decoded; \u kept verbatim). */
static inline int ckj_string(CkptJson *j, char *out, size_t outlen)
{
    if (ckj_expect(j, '"'))
        return -1;
    size_t n = 0;
    while (j->pos < j->len && j->s[j->pos] != '"') {
        char ch = j->s[j->pos++];
        if (ch == '\\') {
            if (j->pos >= j->len)
                return -1;
            ch = j->s[j->pos++];
            if (ch == 'n')
                ch = '\n';
            else if (ch == 't')
                ch = '\t';
        }
        if (out) {
            if (n + 1 >= outlen)
                return -1;
            out[n++] = ch;
        }
    }
    if (j->pos >= j->len)
        return -1;
    j->pos++;
    if (out)
        out[n] = '\0';
    return 0;
}

static inline int ckj_number(CkptJson *j, double *out)
{
    ckj_ws(j);
    char buf[64];
    size_t n = 0;
    while (j->pos < j->len && n + 1 < sizeof(buf) && strchr("+-0123456789.eE", j->s[j->pos]))
        buf[n++] = j->s[j->pos++];
    buf[n] = '\0';
    if (n == 0)
        return -1;
    char *end;
    *out = strtod(buf, &end);
    return *end == '\0' ? 0 : -1;
}

static inline int ckj_skip(CkptJson *j, int depth)
{
    if (depth > 32)
        return -1;
    ckj_ws(j);
    if (j->pos >= j->len)
        return -1;
    char ch = j->s[j->pos];
    if (ch == '"')
        return ckj_string(j, NULL, 0);
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        j->pos++;
        ckj_ws(j);
        if (j->pos < j->len && j->s[j->pos] == close) {
            j->pos++;
            return 0;
        }
        for (;;) {
            if (ch == '{') {
                if (ckj_string(j, NULL, 0) || ckj_expect(j, ':'))
                    return -1;
            }
            if (ckj_skip(j, depth + 1))
                return -1;
            ckj_ws(j);
            if (j->pos < j->len && j->s[j->pos] == ',') {
                j->pos++;
                continue;
            }
            return ckj_expect(j, close);
        }
    }
    const char *words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if (j->len - j->pos >= n && memcmp(j->s + j->pos, words[i], n) == 0) {
            j->pos += n;
            return 0;
        }
    }
    double v;
    return ckj_number(j, &v);
}

/* Object iteration: call ckj_expect(j, '{') first; then each call gives 1 with
 * the next key (the cursor at its value), 0 at the closing brace, -1 on junk. */
static inline int ckj_next_key(CkptJson *j, int *first, char *key, size_t keylen)
{
    ckj_ws(j);
    if (j->pos < j->len && j->s[j->pos] == '}') {
        j->pos++;
        return 0;
    }
    if (!*first && ckj_expect(j, ','))
        return -1;
    *first = 0;
    if (ckj_string(j, key, keylen) || ckj_expect(j, ':'))
        return -1;
    return 1;
}

static inline int ckj_int_array(CkptJson *j, int64_t *out, int max, int *n)
{
    *n = 0;
    if (ckj_expect(j, '['))
        return -1;
    ckj_ws(j);
    if (j->pos < j->len && j->s[j->pos] == ']') {
        j->pos++;
        return 0;
    }
    for (;;) {
        double v;
        if (*n >= max || ckj_number(j, &v) || v < 0 || v != (double)(int64_t)v)
            return -1;
        out[(*n)++] = (int64_t)v;
        ckj_ws(j);
        if (j->pos < j->len && j->s[j->pos] == ',') {
            j->pos++;
            continue;
        }
        return ckj_expect(j, ']');
    }
}

#endif /* LLMC_JSON_H */
