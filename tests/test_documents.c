/* Tests of llmc/model/documents.h: packed documents cut at BOS tokens (a row's first token starts one too), their
 * positions, and their packing as cuDNN's ragged sequences: starts, lengths, power-of-two slots of length 0 past
 * the documents, the longest length rounded up to a power of two within [min(64, T), T]. */
#include "llmc/model/documents.h"
#include "tests/check.h"

#define BOS 7

static void test_rows(void)
{
    /* row 0 starts inside a document, then BOS at 3 and 4 (a document of one token); row 1 starts with BOS */
    enum { B = 2, T = 8, N = B * T };
    int tokens[N] = {1, 2, 3, BOS, BOS, 5, 6, 7 - 1, BOS, 1, 2, 3, 4, BOS, 5, 6};
    int first[N], pos[N], start[N + 1], seq_len[N + 1];
    documents_find(first, pos, tokens, B, T, BOS);
    const int want_first[N] = {0, 0, 0, 3, 4, 4, 4, 4, 0, 0, 0, 0, 0, 5, 5, 5};
    const int want_pos[N] = {0, 1, 2, 0, 0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2};
    check(memcmp(first, want_first, sizeof(first)) == 0 && memcmp(pos, want_pos, sizeof(pos)) == 0,
          "documents_find: starts and positions of a row begun mid-document, with a one-token document");
    DocumentsShape d = documents_pack(start, seq_len, first, B, T);
    const int want_start[] = {0, 3, 4, 8, 13, 16, 16, 16, 16}, want_len[] = {3, 1, 4, 5, 3, 0, 0, 0};
    check(d.n == 5 && d.slots == 8, "documents_pack: 5 documents in 8 slots (got %d in %d)", d.n, d.slots);
    check(memcmp(start, want_start, sizeof(want_start)) == 0 && memcmp(seq_len, want_len, sizeof(want_len)) == 0,
          "documents_pack: starts in the flattened batch, lengths, empty slots at the end");
    check(d.max_len == T, "documents_pack: longest 5 rounds to 8, capped at T = %d (got %d)", T, d.max_len);
}

static void test_shapes(void)
{
    enum { B = 4, T = 1024, N = B * T };
    static int tokens[N], first[N], pos[N], start[N + 1], seq_len[N + 1];
    for (int i = 0; i < N; i++) /* documents of 100 tokens, then one of 24 at each row's end */
        tokens[i] = i % T % 100 == 0 ? BOS : 1;
    documents_find(first, pos, tokens, B, T, BOS);
    DocumentsShape d = documents_pack(start, seq_len, first, B, T);
    check(d.n == 44 && d.slots == 64 && d.max_len == 128,
          "documents_pack: 44 documents in 64 slots, longest 128 (got "
          "%d, %d, %d)",
          d.n, d.slots, d.max_len);
    for (int i = 0; i < N; i++) /* one document over everything: a single slot */
        tokens[i] = 1;
    documents_find(first, pos, tokens, 1, N, BOS);
    d = documents_pack(start, seq_len, first, 1, N);
    check(d.n == 1 && d.slots == 1 && d.max_len == N && seq_len[0] == N && start[1] == N,
          "documents_pack: no BOS: one document of the whole row");
    documents_find(first, pos, tokens, N, 1, BOS); /* T = 1: every token a document, the floor of 64 is T */
    d = documents_pack(start, seq_len, first, N, 1);
    check(d.n == N && d.slots == N && d.max_len == 1, "documents_pack: T = 1 gives %d documents of length 1", N);
}

int main(void)
{
    test_rows();
    test_shapes();
    return check_summary();
}
