/*
 * fuzz_json.c: libFuzzer target for llmc/formats/json.h. Any input must either parse
 * or fail with a message, never crash, leak or read out of bounds (ASan and
 * UBSan watch). A parsed tree must be well formed (every container's count
 * matches its linked children, only object members have keys), json_get must
 * give the last member of a key given twice (as Python's json does), and it
 * must survive a round trip: written back as JSON and parsed again it gives
 * the same tree. Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/formats/json.h"

static void fuzz_assert(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_json: %s\n", what);
        abort();
    }
}

static void write_value(FILE *f, const JsonDoc *doc, const JsonNode *n)
{
    switch (n->type) {
    case JSON_NULL:
        fputs("null", f);
        break;
    case JSON_FALSE:
        fputs("false", f);
        break;
    case JSON_TRUE:
        fputs("true", f);
        break;
    case JSON_NUMBER:
        if (n->is_integer)
            fprintf(f, "%lld", (long long)n->integer);
        else
            fprintf(f, "%.17g", n->number);
        break;
    case JSON_STRING:
        json_write_string_n(f, json_string(doc, n), (size_t)n->len);
        break;
    case JSON_ARRAY:
    case JSON_OBJECT:
        fputc(n->type == JSON_ARRAY ? '[' : '{', f);
        for (const JsonNode *c = json_first(doc, n); c; c = json_next(doc, c)) {
            if (c != json_first(doc, n))
                fputc(',', f);
            if (n->type == JSON_OBJECT) {
                json_write_string(f, json_key(doc, c));
                fputc(':', f);
            }
            write_value(f, doc, c);
        }
        fputc(n->type == JSON_ARRAY ? ']' : '}', f);
        break;
    }
}

/* The trees under a and b are the same (b may know more integers: 1e2 reads back as 100). */
static void same_tree(const JsonDoc *da, const JsonNode *a, const JsonDoc *db, const JsonNode *b)
{
    fuzz_assert(a->type == b->type && a->count == b->count, "round trip changed a value's type or size");
    if (a->type == JSON_NUMBER) {
        fuzz_assert(a->number == b->number, "round trip changed a number");
        fuzz_assert(!a->is_integer || (b->is_integer && a->integer == b->integer), "round trip changed an integer");
    }
    if (a->type == JSON_STRING)
        fuzz_assert(a->len == b->len && memcmp(json_string(da, a), json_string(db, b), (size_t)a->len) == 0,
                    "round trip changed a string");
    const JsonNode *ca = json_first(da, a), *cb = json_first(db, b);
    int children = 0;
    for (; ca && cb; ca = json_next(da, ca), cb = json_next(db, cb), children++) {
        fuzz_assert((a->type == JSON_OBJECT) == (ca->key >= 0), "a key on a non-member or a member without one");
        fuzz_assert(strcmp(json_key(da, ca), json_key(db, cb)) == 0, "round trip changed a key");
        same_tree(da, ca, db, cb);
    }
    fuzz_assert(!ca && !cb && children == a->count, "a container's count differs from its children");
}

/* In every object under n, json_get(key) is the last member with that key. */
static void last_key_wins(const JsonDoc *doc, const JsonNode *n)
{
    for (const JsonNode *c = json_first(doc, n); c; c = json_next(doc, c)) {
        if (n->type == JSON_OBJECT) {
            const JsonNode *got = json_get(doc, n, json_key(doc, c));
            fuzz_assert(got != NULL && strcmp(json_key(doc, got), json_key(doc, c)) == 0, "json_get misses a key");
            for (const JsonNode *later = json_next(doc, got); later; later = json_next(doc, later))
                fuzz_assert(strcmp(json_key(doc, later), json_key(doc, c)) != 0,
                            "json_get gives a key's earlier value");
            fuzz_assert(got >= c, "json_get gives a member before this one of the same key");
        }
        last_key_wins(doc, c);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    JsonDoc doc, again;
    char err[256];
    if (json_parse(&doc, (const char *)data, size, err, sizeof(err)) != 0) {
        fuzz_assert(strncmp(err, "line ", 5) == 0, "an error without its place");
        return 0;
    }
    const JsonNode *root = json_root(&doc);
    fuzz_assert(root != NULL && root->key < 0, "no root, or a root with a key");
    json_duplicate_key(&doc, root);
    last_key_wins(&doc, root);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    write_value(f, &doc, root);
    fclose(f);
    fuzz_assert(json_parse(&again, text, len, err, sizeof(err)) == 0, "the written-back tree does not parse");
    same_tree(&doc, root, &again, json_root(&again));
    json_free(&again);
    json_free(&doc);
    free(text);
    return 0;
}
