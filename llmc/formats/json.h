/*
 * json.h: JSON (RFC 8259) in and out, for the files that come from outside:
 * safetensors headers, HF config.json and model.safetensors.index.json; and
 * for the strings the run log writes.
 *
 * json_parse reads a whole text into a tree: one array of JsonNode in document
 * order (a container's children follow it, linked by `next`) and one buffer of
 * the decoded strings, each NUL-terminated. It is strict: RFC 8259's grammar
 * and nothing more (no comments, trailing commas, NaN, leading zeros or
 * unescaped control characters); escapes are decoded, \uXXXX with surrogate
 * pairs to UTF-8 (a lone surrogate is an error); a number that overflows a
 * double is an error, and one that is an integer literal within int64 is also
 * kept exactly (JsonNode.integer); nesting is limited to JSON_MAX_DEPTH. An
 * error returns -1 with "line L, column C: what" in err; nothing is kept. An
 * object may hold a key twice: every member is kept, and json_get gives the
 * last, as Python's json does (json_duplicate_key finds them, for readers that
 * refuse them: safetensors headers).
 *
 * Memory: nodes and strings grow as the text is read: at most one node per
 * byte of text and a string buffer no longer than the text. Reads only the
 * text; the tree is freed by json_free. Lookups (json_get) are linear in the
 * object's size, which is small for the files read here.
 *
 * Why its own reader: the project depends on the CUDA toolkit, cuDNN, NCCL,
 * MPI and Make alone, and the GPU machines install nothing; this reader is a
 * few hundred lines, and tests/fuzz/fuzz_json.c fuzzes it (libFuzzer with
 * ASan and UBSan) on every CI run. Plain C; compiles as C++ too.
 */
#ifndef LLMC_JSON_H
#define LLMC_JSON_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/fileutil.h"
#include "llmc/common/utils.h"

#define JSON_MAX_DEPTH 64
/* texts at most this long: node and string offsets are int32 */
#define JSON_MAX_BYTES ((size_t)1 << 30)

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct {
    JsonType type;
    int32_t next;    /* index of the next element or member of the same container, -1 after the last */
    int32_t first;   /* index of an array's or object's first child, -1 if empty */
    int32_t count;   /* children of an array or object */
    int32_t key;     /* an object member's key: offset into JsonDoc.strings, -1 otherwise */
    int32_t str;     /* a string's value: offset into JsonDoc.strings */
    int32_t len;     /* its length in bytes (it may hold NUL characters) */
    int is_integer;  /* a number written without fraction or exponent that fits an int64 */
    int64_t integer; /* that integer */
    double number;   /* every number, as strtod reads it */
} JsonNode;

typedef struct {
    JsonNode *nodes; /* nodes[0] is the root */
    int32_t n_nodes, cap_nodes;
    char *strings;
    int32_t n_strings, cap_strings;
} JsonDoc;

typedef struct {
    const char *s;
    size_t pos, len;
    JsonDoc *doc;
    char *err;
    size_t errlen;
} JsonParser;

static inline int json_fail_(JsonParser *p, const char *what)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    snprintf(p->err, p->errlen, "line %zu, column %zu: %s", line, col, what);
    return -1;
}

static inline void json_skip_space_(JsonParser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

/* A new node (fields zeroed, no links); -1 if the document cannot grow. */
static inline int32_t json_new_node_(JsonParser *p, JsonType type)
{
    JsonDoc *d = p->doc;
    if (d->n_nodes == d->cap_nodes) {
        int32_t cap = d->cap_nodes ? 2 * d->cap_nodes : 64;
        JsonNode *grown = (JsonNode *)realloc(d->nodes, (size_t)cap * sizeof(JsonNode));
        if (!grown)
            return json_fail_(p, "out of host memory");
        d->nodes = grown;
        d->cap_nodes = cap;
    }
    JsonNode *n = &d->nodes[d->n_nodes];
    memset(n, 0, sizeof(*n));
    n->type = type;
    n->next = n->first = n->key = -1;
    return d->n_nodes++;
}

static inline int json_put_byte_(JsonParser *p, char c)
{
    JsonDoc *d = p->doc;
    if (d->n_strings == d->cap_strings) {
        int32_t cap = d->cap_strings ? 2 * d->cap_strings : 256;
        char *grown = (char *)realloc(d->strings, (size_t)cap);
        if (!grown)
            return json_fail_(p, "out of host memory");
        d->strings = grown;
        d->cap_strings = cap;
    }
    d->strings[d->n_strings++] = c;
    return 0;
}

static inline int json_hex4_(JsonParser *p, uint32_t *out)
{
    if (p->len - p->pos < 4)
        return json_fail_(p, "\\u needs four hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        int digit = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
        if (digit < 0)
            return json_fail_(p, "\\u needs four hex digits");
        v = v << 4 | (uint32_t)digit;
    }
    *out = v;
    return 0;
}

static inline int json_put_utf8_(JsonParser *p, uint32_t cp)
{
    char b[4];
    int n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | cp >> 6);
        b[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12);
        b[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (char)(0xF0 | cp >> 18);
        b[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        b[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    for (int i = 0; i < n; i++) {
        if (json_put_byte_(p, b[i]) != 0)
            return -1;
    }
    return 0;
}

/* The string at the cursor (on its opening quote), decoded into doc->strings;
 * its offset and length go to *at and *len. */
static inline int json_string_(JsonParser *p, int32_t *at, int32_t *len)
{
    p->pos++; /* the opening quote */
    *at = p->doc->n_strings;
    for (;;) {
        if (p->pos >= p->len)
            return json_fail_(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"')
            break;
        if (c < 0x20)
            return json_fail_(p, "control character in a string (it must be escaped)");
        p->pos++;
        if (c != '\\') {
            if (json_put_byte_(p, (char)c) != 0)
                return -1;
            continue;
        }
        if (p->pos >= p->len)
            return json_fail_(p, "unterminated string");
        char e = p->s[p->pos++];
        const char *plain = "\"\\/bfnrt", *decoded = "\"\\/\b\f\n\r\t";
        const char *hit = e ? strchr(plain, e) : NULL;
        if (hit) {
            if (json_put_byte_(p, decoded[hit - plain]) != 0)
                return -1;
            continue;
        }
        if (e != 'u')
            return json_fail_(p, "unknown escape in a string");
        uint32_t cp = 0;
        if (json_hex4_(p, &cp) != 0)
            return -1;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return json_fail_(p, "a low surrogate \\u escape without a high one before it");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                return json_fail_(p, "a high surrogate \\u escape without a low one after it");
            p->pos += 2;
            if (json_hex4_(p, &low) != 0)
                return -1;
            if (low < 0xDC00 || low > 0xDFFF)
                return json_fail_(p, "a high surrogate \\u escape without a low one after it");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        if (json_put_utf8_(p, cp) != 0)
            return -1;
    }
    p->pos++; /* the closing quote */
    *len = p->doc->n_strings - *at;
    return json_put_byte_(p, '\0');
}

/* A number at the cursor, by RFC 8259's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static inline int json_number_(JsonParser *p, JsonNode *n)
{
    size_t start = p->pos, i = p->pos;
    int integral = 1;
    if (i < p->len && p->s[i] == '-')
        i++;
    if (i < p->len && p->s[i] == '0') {
        i++;
    } else if (i < p->len && p->s[i] >= '1' && p->s[i] <= '9') {
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    } else {
        p->pos = i;
        return json_fail_(p, "not a JSON value");
    }
    if (i < p->len && p->s[i] == '.') {
        integral = 0;
        i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
            p->pos = i;
            return json_fail_(p, "a digit must follow the decimal point");
        }
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integral = 0;
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
            i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
            p->pos = i;
            return json_fail_(p, "a digit must follow the exponent");
        }
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    }
    /* strtod and strtoll need a terminated copy; a longer number is not one anybody writes */
    char buf[128];
    if (i - start >= sizeof(buf))
        return json_fail_(p, "number of more than 127 characters");
    memcpy(buf, p->s + start, i - start);
    buf[i - start] = '\0';
    errno = 0;
    n->number = strtod(buf, NULL);
    if (!isfinite(n->number))
        return json_fail_(p, "number too large for a double");
    if (integral) {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        n->is_integer = errno == 0;
        n->integer = n->is_integer ? (int64_t)v : 0;
    }
    p->pos = i;
    return 0;
}

static inline int json_literal_(JsonParser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return json_fail_(p, "not a JSON value");
    p->pos += n;
    return 0;
}

/* The value at the cursor as a new node; its index, or -1. */
static inline int32_t json_value_(JsonParser *p, int depth)
{
    json_skip_space_(p);
    if (p->pos >= p->len)
        return json_fail_(p, "a value is missing (the text ends)");
    char c = p->s[p->pos];
    if (c == '{' || c == '[') {
        if (depth >= JSON_MAX_DEPTH)
            return json_fail_(p, "nested deeper than JSON_MAX_DEPTH");
        int object = c == '{';
        char close = object ? '}' : ']';
        int32_t self = json_new_node_(p, object ? JSON_OBJECT : JSON_ARRAY), last = -1;
        if (self < 0)
            return -1;
        p->pos++;
        json_skip_space_(p);
        if (p->pos < p->len && p->s[p->pos] == close) {
            p->pos++;
            return self;
        }
        for (;;) {
            int32_t key = -1, key_len;
            if (object) {
                json_skip_space_(p);
                if (p->pos >= p->len || p->s[p->pos] != '"')
                    return json_fail_(p, "an object member must start with a string key");
                if (json_string_(p, &key, &key_len) != 0)
                    return -1;
                json_skip_space_(p);
                if (p->pos >= p->len || p->s[p->pos] != ':')
                    return json_fail_(p, "':' must follow an object key");
                p->pos++;
            }
            int32_t child = json_value_(p, depth + 1);
            if (child < 0)
                return -1;
            JsonNode *nodes = p->doc->nodes; /* may have moved while the child grew them */
            nodes[child].key = key;
            if (last < 0)
                nodes[self].first = child;
            else
                nodes[last].next = child;
            last = child;
            nodes[self].count++;
            json_skip_space_(p);
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->len && p->s[p->pos] == close) {
                p->pos++;
                return self;
            }
            return json_fail_(p, object ? "',' or '}' expected in an object" : "',' or ']' expected in an array");
        }
    }
    if (c == '"') {
        int32_t self = json_new_node_(p, JSON_STRING), at, len;
        if (self < 0 || json_string_(p, &at, &len) != 0)
            return -1;
        p->doc->nodes[self].str = at;
        p->doc->nodes[self].len = len;
        return self;
    }
    if (c == 't' || c == 'f' || c == 'n') {
        JsonType type = c == 't' ? JSON_TRUE : c == 'f' ? JSON_FALSE : JSON_NULL;
        int32_t self = json_new_node_(p, type);
        if (self < 0 || json_literal_(p, c == 't' ? "true" : c == 'f' ? "false" : "null") != 0)
            return -1;
        return self;
    }
    int32_t self = json_new_node_(p, JSON_NUMBER);
    if (self < 0 || json_number_(p, &p->doc->nodes[self]) != 0)
        return -1;
    return self;
}

static inline void json_free(JsonDoc *doc)
{
    free(doc->nodes);
    free(doc->strings);
    memset(doc, 0, sizeof(*doc));
}

/* 0 and the tree of text[0..len), or -1 with the place and the reason in err. */
static inline int json_parse(JsonDoc *doc, const char *text, size_t len, char *err, size_t errlen)
{
    JsonParser p = {text, 0, len, doc, err, errlen};
    memset(doc, 0, sizeof(*doc));
    if (len > JSON_MAX_BYTES) {
        snprintf(err, errlen, "%zu bytes of JSON, more than the %zu this reader takes", len, JSON_MAX_BYTES);
        return -1;
    }
    int rc = json_value_(&p, 0) < 0 ? -1 : 0;
    if (rc == 0) {
        json_skip_space_(&p);
        if (p.pos != len)
            rc = json_fail_(&p, "text after the JSON value");
    }
    if (rc != 0)
        json_free(doc);
    return rc;
}

/* 0 and the tree of the regular file at path (at most max_bytes), or -1 with a
 * message naming the file in err. */
static inline int json_parse_file(JsonDoc *doc, const char *path, size_t max_bytes, char *err, size_t errlen)
{
    memset(doc, 0, sizeof(*doc));
    char *text = NULL;
    size_t size = 0;
    if (read_file_hashed_try(path, max_bytes, &text, &size, NULL, err, errlen) != 0)
        return -1;
    char why[512];
    int rc = json_parse(doc, text, size, why, sizeof(why));
    free(text);
    if (rc != 0)
        return set_error(err, errlen, "'%s' is not valid JSON: %s", path, why);
    return 0;
}

/* ---- reading the tree ---- */

static inline const JsonNode *json_root(const JsonDoc *doc)
{
    return doc->n_nodes > 0 ? &doc->nodes[0] : NULL;
}
/* The first element or member of a container, then the next one; NULL at the end. */
static inline const JsonNode *json_first(const JsonDoc *doc, const JsonNode *n)
{
    return n && (n->type == JSON_ARRAY || n->type == JSON_OBJECT) && n->first >= 0 ? &doc->nodes[n->first] : NULL;
}
static inline const JsonNode *json_next(const JsonDoc *doc, const JsonNode *n)
{
    return n && n->next >= 0 ? &doc->nodes[n->next] : NULL;
}
/* An object member's key, "" for anything else. */
static inline const char *json_key(const JsonDoc *doc, const JsonNode *n)
{
    return n && n->key >= 0 ? doc->strings + n->key : "";
}
/* A string's value (n->len bytes and a NUL), NULL for anything else. */
static inline const char *json_string(const JsonDoc *doc, const JsonNode *n)
{
    return n && n->type == JSON_STRING ? doc->strings + n->str : NULL;
}
/* The member of object named key; NULL if there is none or it is no object.
 * A key given twice (JSON allows it) gives its last member, as Python's json
 * reads it (a dict keeps the last value): transformers, which writes and reads
 * the HF files read here, sees that value too. */
static inline const JsonNode *json_get(const JsonDoc *doc, const JsonNode *object, const char *key)
{
    const JsonNode *found = NULL;
    if (!object || object->type != JSON_OBJECT)
        return NULL;
    for (const JsonNode *m = json_first(doc, object); m; m = json_next(doc, m)) {
        if (strcmp(doc->strings + m->key, key) == 0)
            found = m;
    }
    return found;
}

static inline int json_compare_keys_(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key that object holds twice (JSON allows it; safetensors headers must not), or NULL. */
static inline const char *json_duplicate_key(const JsonDoc *doc, const JsonNode *object)
{
    if (!object || object->type != JSON_OBJECT || object->count < 2)
        return NULL;
    const char **keys = (const char **)malloc_check(sizeof(char *) * (size_t)object->count, "JSON keys");
    int n = 0;
    for (const JsonNode *m = json_first(doc, object); m; m = json_next(doc, m))
        keys[n++] = doc->strings + m->key;
    qsort(keys, (size_t)n, sizeof(char *), json_compare_keys_);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0)
            dup = keys[i];
    }
    free(keys);
    return dup;
}

static inline const char *json_type_name(JsonType t)
{
    static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return names[t];
}

/* ---- writing ---- */

/* s[0..len) as a JSON string, quotes and escapes included. */
static inline void json_write_string_n(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static inline void json_write_string(FILE *f, const char *s)
{
    json_write_string_n(f, s, strlen(s));
}

/* x with printf's fmt, or null when it is not finite (JSON has no NaN or infinity). */
static inline void json_write_number(FILE *f, const char *fmt, double x)
{
    if (isfinite(x))
        fprintf(f, fmt, x);
    else
        fputs("null", f);
}

#endif /* LLMC_JSON_H */
