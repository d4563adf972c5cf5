/* Tests of llmc/formats/checkpoint.h's sharded optimizer state: train_state files
 * written by W ranks, each holding a list of ranges of the flat moments (ZeRO 1:
 * one contiguous shard per rank, the last cut at the end of the parameters;
 * per-bucket sharding: one slice of every bucket per rank, interleaved with the
 * other ranks'), must give back any list of wanted ranges bit for bit for a
 * resume on any other number of ranks and either sharding, with the padding past
 * the end zero. Adjacent ranges are merged when written; version 1 files (one
 * range, no table) still load; overlapping or missing ranges, a missing or
 * foreign rank file and a corrupt range table are errors that name what is
 * wrong. Checksums (issue 32): XXH64 against the reference implementation's
 * values; the manifest in COMPLETE written by a commit that gathers each rank's
 * .xxh64 line, read back, and refused when edited; a resume by any world size
 * checks every file once (whole reads as they happen, the rest by the rank they
 * fall to) and names a changed one. The JSON reader takes a duplicate key's last
 * value, as Python's json does (config.json). Runs in a temporary directory, no
 * GPU. */
#include <stdlib.h>
#include <unistd.h>

#include "llmc/formats/checkpoint.h"
#include "tests/check.h"

#define MAX_RANGES 8

/* The shard of rank r of `world` as train_llama's ZeRO 1 cuts it: multiples of 8,
 * the last one short. */
static void shard_of(int64_t total, int world, int r, int64_t *first, int64_t *count)
{
    int64_t shard = ((total + world - 1) / world + 7) / 8 * 8;
    *first = (int64_t)r * shard;
    *count = total - *first < shard ? total - *first : shard;
    if (*count < 0)
        *count = 0;
    if (*count == 0)
        *first = total;
}

/* Four buckets of the flat buffer, the third a small one (37 elements) that some
 * ranks own none of. */
static int64_t bucket_bound(int64_t total, int b)
{
    const int64_t bounds[5] = {0, total / 10, total / 2, total / 2 + 37, total};
    return bounds[b];
}

enum { CONTIGUOUS, BUCKETED };
static const char *kind_name[2] = {"contiguous", "bucketed"};

/* The ranges rank r of `world` owns. CONTIGUOUS: its ZeRO 1 shard; when loading
 * (padded) the whole padded shard, past the end of the parameters for the last
 * rank, else cut at the end (an empty shard is one empty range at the end, which
 * the writer drops). BUCKETED: as llmc/parallel/zero_plan.h cuts them, each bucket padded
 * to a multiple of world * 8 and every rank owning one slice of each (empty when
 * its slice is all padding). */
static int ranges_of(int kind, int64_t total, int world, int r, int padded, CkptRange *out)
{
    if (kind == CONTIGUOUS) {
        int64_t shard = ((total + world - 1) / world + 7) / 8 * 8;
        if (padded) {
            out[0].offset = (int64_t)r * shard;
            out[0].count = shard;
        } else {
            shard_of(total, world, r, &out[0].offset, &out[0].count);
        }
        return 1;
    }
    for (int b = 0; b < 4; b++) {
        int64_t offset = bucket_bound(total, b), numel = bucket_bound(total, b + 1) - offset;
        int64_t unit = (int64_t)world * 8, shard = (numel + unit - 1) / unit * unit / world;
        int64_t lo = (int64_t)r * shard, hi = lo + shard;
        lo = lo < numel ? lo : numel;
        hi = hi < numel ? hi : numel;
        out[b].offset = offset + lo;
        out[b].count = hi - lo;
    }
    return 4;
}

static float moment(int which, int64_t i)
{
    return (which ? -1.0f : 1.0f) * (float)(i % 1000) * 0.5f + (float)which;
}

/* Writes rank r of world's state file into dir, with the moments of ranges;
 * *sum (NULL: none): its checksum. */
static int write_rank_sum(const char *dir, int64_t total, int world, int r, uint64_t step, const CkptRange *ranges,
                          int n, FileSum *sum, char *err, size_t errlen)
{
    CheckpointState st = checkpoint_state(0x5eed, step, step, 99);
    int64_t count = 0;
    st.rank = r;
    st.world = world;
    for (int i = 0; i < n; i++)
        count += ranges[i].count > 0 ? ranges[i].count : 0;
    float *m = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "m");
    float *v = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "v");
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        for (int64_t k = 0; k < ranges[i].count; k++, at++) {
            m[at] = moment(0, ranges[i].offset + k);
            v[at] = moment(1, ranges[i].offset + k);
        }
    }
    int rc = checkpoint_write_state_try(dir, &st, total, ranges, n, m, v, sum, err, errlen);
    free(m);
    free(v);
    return rc;
}

static int write_rank(const char *dir, int64_t total, int world, int r, uint64_t step, const CkptRange *ranges, int n,
                      char *err, size_t errlen)
{
    return write_rank_sum(dir, total, world, r, step, ranges, n, NULL, err, errlen);
}

/* Writes the state files of `world` ranks into dir (as each rank would). */
static int write_world(const char *dir, int64_t total, int world, int kind)
{
    char err[1024];
    for (int r = 0; r < world; r++) {
        CkptRange ranges[MAX_RANGES];
        int n = ranges_of(kind, total, world, r, 0, ranges);
        if (write_rank(dir, total, world, r, 7, ranges, n, err, sizeof(err)) != 0) {
            printf("  %s\n", err);
            return -1;
        }
    }
    return 0;
}

/* Loads wanted[n] from dir; 1 when every value is bit-identical to what was
 * saved (zero past the end) and the state is rank 0's, of run run_id. */
static int load_ranges_of_run(const char *dir, int64_t total, const CkptRange *wanted, int n, uint64_t run_id)
{
    int64_t count = 0;
    char err[1024];
    for (int i = 0; i < n; i++)
        count += wanted[i].count;
    float *m = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "m");
    float *v = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "v");
    CheckpointState st;
    memset(&st, 0, sizeof(st));
    int ok = checkpoint_load_moments_try(dir, total, wanted, n, m, v, &st, err, sizeof(err)) == 0;
    if (!ok)
        printf("  %s\n", err);
    int64_t at = 0;
    for (int i = 0; ok && i < n; i++) {
        for (int64_t k = 0; ok && k < wanted[i].count; k++, at++) {
            int64_t e = wanted[i].offset + k;
            float want_m = e < total ? moment(0, e) : 0.0f, want_v = e < total ? moment(1, e) : 0.0f;
            ok = memcmp(&m[at], &want_m, 4) == 0 && memcmp(&v[at], &want_v, 4) == 0;
            if (!ok)
                printf("  element %lld: m %g v %g, expected %g %g\n", (long long)e, m[at], v[at], want_m, want_v);
        }
    }
    ok = ok && st.step == 7 && st.adam_step == 7 && st.rng_state == 99 && st.rank == 0 && st.run_id == run_id;
    free(m);
    free(v);
    return ok;
}

/* load_ranges_of_run for the files write_rank writes */
static int load_ranges(const char *dir, int64_t total, const CkptRange *wanted, int n)
{
    return load_ranges_of_run(dir, total, wanted, n, 0x5eed);
}

/* Every rank of `world` loads its ranges of `kind`; 1 when all values are right. */
static int load_world(const char *dir, int64_t total, int world, int kind)
{
    int ok = 1;
    for (int r = 0; r < world && ok; r++) {
        CkptRange wanted[MAX_RANGES];
        int n = ranges_of(kind, total, world, r, 1, wanted);
        ok = load_ranges(dir, total, wanted, n);
    }
    return ok;
}

/* A file's bytes (NULL if it cannot be read), its size in *size. */
static unsigned char *read_all(const char *path, int64_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseeko(f, 0, SEEK_END);
    *size = (int64_t)ftello(f);
    fseeko(f, 0, SEEK_SET);
    unsigned char *buf = (unsigned char *)malloc_check((size_t)*size + 1, "file");
    if (fread(buf, 1, (size_t)*size, f) != (size_t)*size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Whether the file at path is a version 2 train_state with exactly the table
 * want[n] and the matching size. */
static int has_table(const char *path, const CkptRange *want, int n)
{
    int64_t size = 0, count = 0;
    unsigned char *b = read_all(path, &size);
    if (!b)
        return 0;
    int ok = size >= CKPT_STATE_HEADER_BYTES && get_u32le(b + 8) == 2 && (int64_t)get_u64le(b + 56) == n;
    for (int i = 0; ok && i < n; i++) {
        ok = (int64_t)get_u64le(b + 128 + 16 * i) == want[i].offset &&
             (int64_t)get_u64le(b + 136 + 16 * i) == want[i].count;
        count += want[i].count;
    }
    ok = ok && (int64_t)get_u64le(b + 64) == count && size == 128 + 16 * n + 8 * count;
    free(b);
    return ok;
}

/* A version 1 file (one range, no table), as checkpoint.h wrote it before format 2. */
static void write_v1(const char *dir, int64_t total, int world, int r, int64_t first, int64_t count)
{
    char path[LLMC_PATH_MAX + 64];
    unsigned char h[CKPT_STATE_HEADER_BYTES];
    memset(h, 0, sizeof(h));
    memcpy(h, CKPT_STATE_MAGIC, 8);
    put_u32le(h + 8, 1);
    put_u32le(h + 12, CKPT_STATE_HEADER_BYTES);
    put_u64le(h + 16, 7);
    put_u64le(h + 24, 7);
    put_u64le(h + 32, 99);
    put_u32le(h + 40, (uint32_t)r);
    put_u32le(h + 44, (uint32_t)world);
    put_u64le(h + 48, (uint64_t)total);
    put_u64le(h + 56, (uint64_t)first);
    put_u64le(h + 64, (uint64_t)count);
    checkpoint_state_file(path, sizeof(path), dir, r, world);
    FILE *f = fopen(path, "wb");
    if (!f)
        FAIL("cannot create '%s'", path);
    fwrite(h, 1, sizeof(h), f);
    for (int which = 0; which < 2; which++) {
        for (int64_t i = 0; i < count; i++) {
            float x = moment(which, first + i);
            fwrite(&x, 4, 1, f);
        }
    }
    fclose(f);
}

/* Overwrites the 8 bytes at `at` of the file at path with value. */
static void patch_u64(const char *path, int64_t at, int64_t value)
{
    unsigned char b[8];
    put_u64le(b, (uint64_t)value);
    FILE *f = fopen(path, "r+b");
    if (!f || fseeko(f, (off_t)at, SEEK_SET) != 0 || fwrite(b, 1, 8, f) != 8)
        FAIL("cannot patch '%s'", path);
    fclose(f);
}

/* The loader's answer for the whole buffer of dir: 0, or -1 with the message in err. */
static int load_all(const char *dir, int64_t total, char *err, size_t errlen)
{
    CkptRange all = {0, total};
    CheckpointState st;
    float *m = (float *)malloc_check((size_t)(total + 1) * sizeof(float), "m");
    float *v = (float *)malloc_check((size_t)(total + 1) * sizeof(float), "v");
    int rc = checkpoint_load_moments_try(dir, total, &all, 1, m, v, &st, err, errlen);
    free(m);
    free(v);
    return rc;
}

static void fresh_dir(char *dir, size_t n, const char *root, const char *name)
{
    snprintf(dir, n, "%s/%s", root, name);
    mkdir(dir, 0755);
}

/* XXH64 against the values of the reference implementation (libxxhash 0.8's
 * XXH64, seed 0) for a pattern of n bytes, in one call and split in pieces of
 * every size from 1 to 96. */
static void test_xxh64(void)
{
    static const struct {
        size_t n;
        uint64_t want;
    } cases[] = {{1, 0xa96c7f0ce858bbb7ull},   {4, 0xfa212ae44b3bb23dull},    {8, 0x994b676b71ce94ddull},
                 {31, 0x6711d55e306b5d8full},  {32, 0x07f7b8e3bc5d6e25ull},   {33, 0x2c31b24a7e2c2975ull},
                 {100, 0xe7e1c9bea5461a46ull}, {1000, 0xb7d233d29e4d1d5eull}, {100003, 0xfce180ea552b63e2ull}};
    unsigned char *b = (unsigned char *)malloc_check(100003, "pattern");
    for (size_t i = 0; i < 100003; i++)
        b[i] = (unsigned char)(i * 131 + 7 + (i >> 5));
    check(xxh64("", 0) == 0xef46db3751d8e999ull && xxh64("abc", 3) == 0x44bc2cf5ad770999ull,
          "xxh64 of \"\" and \"abc\" are the reference's");
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int split_ok = 1;
        for (size_t piece = 1; piece <= 96 && split_ok; piece++) {
            Xxh64 h;
            xxh64_init(&h);
            for (size_t at = 0; at < cases[c].n; at += piece)
                xxh64_update(&h, b + at, cases[c].n - at < piece ? cases[c].n - at : piece);
            split_ok = xxh64_digest(&h) == cases[c].want;
        }
        check(xxh64(b, cases[c].n) == cases[c].want && split_ok,
              "xxh64 of %zu bytes is the reference's, in one piece and split any way", cases[c].n);
    }
    free(b);
}

/* The JSON reader on duplicate keys: the last value wins, as in Python's json
 * (json.loads('{"a": 1, "a": 2}') == {"a": 2}), which transformers reads config.json with. */
static void test_json_duplicates(const char *root)
{
    const char *text = "{\"a\": 1, \"b\": {\"c\": true, \"c\": false}, \"a\": 2, \"d\": [], \"a\": 3}";
    JsonDoc doc;
    char err[1024];
    int ok = json_parse(&doc, text, strlen(text), err, sizeof(err)) == 0;
    const JsonNode *a = ok ? json_get(&doc, json_root(&doc), "a") : NULL;
    const JsonNode *c = ok ? json_get(&doc, json_get(&doc, json_root(&doc), "b"), "c") : NULL;
    check(a && a->type == JSON_NUMBER && a->number == 3.0, "a key given three times reads as its last value, 3");
    check(c && c->type == JSON_FALSE, "... in a nested object too: false");
    check(ok && json_root(&doc)->count == 5 && json_duplicate_key(&doc, json_root(&doc)) != NULL &&
              strcmp(json_duplicate_key(&doc, json_root(&doc)), "a") == 0,
          "every member is kept, and json_duplicate_key still finds the duplicate");
    if (ok)
        json_free(&doc);
    /* config.json as HF reads it: the last rope_theta and num_hidden_layers */
    const char *config = "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 512, "
                         "\"hidden_size\": 64, \"intermediate_size\": 176, \"num_hidden_layers\": 3, "
                         "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 1024, "
                         "\"rope_theta\": 10000.0, \"num_hidden_layers\": 2, \"rope_theta\": 500000.0}";
    LlamaConfig cfg;
    HfTokenIds ids;
    ok = hf_config_parse_try(config, strlen(config), "config.json", &cfg, &ids, err, sizeof(err)) == 0;
    check(ok && cfg.n_layer == 2 && cfg.rope_theta == 500000.0f,
          "config.json with num_hidden_layers and rope_theta twice: the last values, 2 and 500000 (got %d, %g)",
          ok ? cfg.n_layer : -1, ok ? (double)cfg.rope_theta : -1.0);
    char path[512];
    snprintf(path, sizeof(path), "%s/dup_config.json", root);
    FILE *f = fopen(path, "wb");
    fputs(config, f);
    fclose(f);
    LlamaConfig want = cfg;
    want.rope_theta = 10000.0f;
    int rc = ok ? hf_config_check_try(path, &want, err, sizeof(err)) : 0;
    check(rc != 0 && strstr(err, "rope_theta = 500000 but this run's model has 10000"),
          "a resume compares the last rope_theta of config.json with the run's: %s", err);
}

/* The manifest as COMPLETE holds it: written, read back the same, an older
 * build's "step N" read as one without checksums, any edit refused. */
static void test_manifest(const char *root)
{
    CkptManifest man, back;
    char err[1024], path[600];
    FileSum a = {"model.safetensors", 503072, 0xa030efead917ffb0ull}, b = {"train_state.00001.bin", 0, 1};
    ckpt_manifest_init(&man, 6, 0x8f90a36c22084d38ull);
    ckpt_manifest_add(&man, &b);
    ckpt_manifest_add(&man, &a);
    size_t len;
    char *text = ckpt_manifest_text(&man, &len);
    check(strncmp(text,
                  "step 6\nrun 8f90a36c22084d38\nxxh64 a030efead917ffb0 503072 model.safetensors\n"
                  "xxh64 0000000000000001 0 train_state.00001.bin\nend xxh64 ",
                  90) == 0 &&
              text[len - 1] == '\n',
          "the manifest's text: step, run, a line per file by name, end");
    int rc = ckpt_manifest_parse_try("COMPLETE", text, len, &back, err, sizeof(err));
    check(rc == 0 && back.has_sums && back.step == 6 && back.run_id == 0x8f90a36c22084d38ull && back.n == 2 &&
              ckpt_manifest_find(&back, "model.safetensors") == 0 && back.files[0].size == 503072 &&
              back.files[0].xxh64 == a.xxh64 && back.files[1].size == 0 && back.files[1].xxh64 == 1,
          "the manifest reads back as written");
    if (rc == 0)
        checkpoint_manifest_free(&back);
    rc = ckpt_manifest_parse_try("COMPLETE", "step 12\n", 8, &back, err, sizeof(err));
    check(rc == 0 && !back.has_sums && back.step == 12, "\"step 12\" (an older build's COMPLETE) has no checksums");
    rc = ckpt_manifest_parse_try("COMPLETE", "", 0, &back, err, sizeof(err));
    check(rc == 0 && !back.has_sums, "an empty COMPLETE has no checksums");
    /* edits: every one refused, naming the file */
    struct {
        const char *what, *from, *to;
    } edits[] = {
        {"a changed hash", "a030efead917ffb0", "a030efead917ffb1"},
        {"a changed size", "503072", "503073"},
        {"a changed run id", "run 8f90", "run 8f91"},
        {"a changed step", "step 6", "step 7"},
        {"a file name that leaves the directory", "0 train_state.00001.bin", "0 ../train_state.00001.bin"},
        {"a file named twice", "0 train_state.00001.bin", "503072 model.safetensors"},
        {"a missing end line", "\nend xxh64 ", "\n"},
        {"uppercase hex", "a030efead917ffb0", "A030EFEAD917FFB0"},
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        char edited[1024];
        const char *at = strstr(text, edits[i].from);
        size_t head = (size_t)(at - text), n_from = strlen(edits[i].from);
        snprintf(edited, sizeof(edited), "%.*s%s%s", (int)head, text, edits[i].to, at + n_from);
        if (strcmp(edits[i].what, "a missing end line") == 0) /* the end line's hash, cut */
            edited[head + 1] = '\0';
        rc = ckpt_manifest_parse_try("d/COMPLETE", edited, strlen(edited), &back, err, sizeof(err));
        check(rc != 0 && strstr(err, "'d/COMPLETE' is corrupt"), "a manifest with %s is refused: %s", edits[i].what,
              err);
    }
    char junk[1100];
    snprintf(junk, sizeof(junk), "%sxxh64 0000000000000001 1 late\n", text);
    rc = ckpt_manifest_parse_try("d/COMPLETE", junk, strlen(junk), &back, err, sizeof(err));
    check(rc != 0 && strstr(err, "more after"), "a manifest with lines after its end is refused: %s", err);
    /* a file against it: size, hash, unknown name */
    FileSum got = a;
    got.size++;
    rc = checkpoint_check_sum_try("d", &man, &got, err, sizeof(err));
    check(rc != 0 && strstr(err, "'d/model.safetensors' does not match the checkpoint's manifest 'd/COMPLETE'") &&
              strstr(err, "expected 503072 bytes") && strstr(err, "found 503073 bytes") &&
              strstr(err, "hint: the file changed since it was saved"),
          "a file of another size: expected and found sizes, and a hint: %s", err);
    got = a;
    got.xxh64 ^= 1;
    rc = checkpoint_check_sum_try("d", &man, &got, err, sizeof(err));
    check(rc != 0 && strstr(err, "expected xxh64 a030efead917ffb0, found xxh64 a030efead917ffb1"),
          "a file of another hash: both hashes: %s", err);
    snprintf(got.name, sizeof(got.name), "tokenizer.model");
    rc = checkpoint_check_sum_try("d", &man, &got, err, sizeof(err));
    check(rc != 0 && strstr(err, "'d/tokenizer.model' is not in the checkpoint's manifest"),
          "a file the manifest does not list: %s", err);
    free(text);
    checkpoint_manifest_free(&man);
    /* read from a directory */
    snprintf(path, sizeof(path), "%s/manifest_dir", root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/manifest_dir/COMPLETE", root);
    FILE *f = fopen(path, "wb");
    fputs("step 3\nrun zz\n", f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/manifest_dir", root);
    rc = checkpoint_manifest_read_try(path, &back, err, sizeof(err));
    check(rc != 0 && strstr(err, "manifest_dir/COMPLETE' is corrupt (line 2"),
          "a COMPLETE read from disk is checked: %s", err);
}

/* Rank r of `load_world` resumes ckpt (saved by another world or sharding):
 * loads its ranges and checks the files it falls to; 0, or -1 with err. */
static int resume_rank(const char *ckpt, int64_t total, int kind, int load_world, int r, int *whole_own, char *err,
                       size_t errlen)
{
    CkptRange wanted[MAX_RANGES];
    int n = ranges_of(kind, total, load_world, r, 1, wanted);
    int64_t count = 0;
    for (int i = 0; i < n; i++)
        count += wanted[i].count;
    float *m = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "m");
    float *v = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "v");
    CheckpointState st;
    CkptManifest man;
    CkptStateRead *reads = NULL;
    int n_reads = 0;
    int rc = checkpoint_manifest_read_try(ckpt, &man, err, errlen);
    if (rc == 0) {
        rc = checkpoint_load_moments_read_try(ckpt, total, wanted, n, m, v, &st, &reads, &n_reads, err, errlen);
        if (rc == 0)
            rc = checkpoint_verify_try(ckpt, &man, &st, reads, n_reads, r, load_world, err, errlen);
        if (whole_own)
            *whole_own = rc == 0 && r < n_reads && reads[r].whole;
        checkpoint_manifest_free(&man);
    }
    free(reads);
    free(m);
    free(v);
    return rc;
}

/* A save of `world` ranks as train_llama makes it: the staging directory, each
 * rank's file and its .xxh64 line, a small file without one, rank 0's commit;
 * then resumes by other worlds, and changed files. */
static void test_multi_rank_sums(const char *root)
{
    const int64_t total = 4099;
    char ck[256], staging[LLMC_PATH_MAX], saved[LLMC_PATH_MAX], err[2048], path[LLMC_PATH_MAX + 64];
    snprintf(ck, sizeof(ck), "%s/sums", root);
    int rc = checkpoint_stage_try(ck, 7, staging, sizeof(staging), err, sizeof(err));
    for (int r = 0; r < 3 && rc == 0; r++) {
        CkptRange ranges[MAX_RANGES];
        FileSum sum;
        int n = ranges_of(BUCKETED, total, 3, r, 0, ranges);
        rc = write_rank_sum(staging, total, 3, r, 7, ranges, n, &sum, err, sizeof(err));
        if (rc == 0)
            rc = checkpoint_write_sum_try(staging, &sum, err, sizeof(err));
    }
    snprintf(path, sizeof(path), "%s/generation_config.json", staging);
    if (rc == 0)
        rc = write_file_synced(path, "{}\n", 3, err, sizeof(err));
    if (rc == 0)
        rc = checkpoint_commit_try(ck, 7, 0x5eed, 0, NULL, 0, saved, sizeof(saved), err, sizeof(err));
    check(rc == 0, "3 ranks' files and .xxh64 lines committed: %s", rc == 0 ? saved : err);
    CkptManifest man;
    rc = checkpoint_manifest_read_try(saved, &man, err, sizeof(err));
    int listed = rc == 0 && man.has_sums && man.n == 4 && man.run_id == 0x5eed && man.step == 7;
    for (int r = 0; r < 3 && listed; r++) {
        FileSum on_disk;
        checkpoint_state_file(path, sizeof(path), saved, r, 3);
        int at = ckpt_manifest_find(&man, strrchr(path, '/') + 1);
        listed = at >= 0 && file_xxh64_try(path, &on_disk, err, sizeof(err)) == 0 &&
                 on_disk.xxh64 == man.files[at].xxh64 && on_disk.size == man.files[at].size;
        snprintf(path + strlen(path), sizeof(path) - strlen(path), CKPT_SUM_SUFFIX);
        listed = listed && !path_exists(path);
    }
    check(listed && ckpt_manifest_find(&man, "generation_config.json") >= 0,
          "the manifest lists every rank's file with its hash as written and the file hashed at the commit; no "
          ".xxh64 is left");
    if (rc == 0)
        checkpoint_manifest_free(&man);
    /* resumes: the same world reads each file whole; others check the rest by the rank they fall to */
    int all_whole = 1;
    for (int r = 0; r < 3; r++) {
        int whole = 0;
        rc = resume_rank(saved, total, BUCKETED, 3, r, &whole, err, sizeof(err));
        all_whole = all_whole && rc == 0 && whole;
    }
    check(all_whole, "a resume by the same 3 ranks: each reads its own file whole, hashed as read, and it matches");
    const int worlds[] = {1, 2, 4, 5};
    for (int w = 0; w < 4; w++) {
        for (int kind = 0; kind < 2; kind++) {
            int ok = 1;
            for (int r = 0; r < worlds[w] && ok; r++)
                ok = resume_rank(saved, total, kind, worlds[w], r, NULL, err, sizeof(err)) == 0;
            check(ok, "a resume by %d rank(s), %s, checks the files: %s", worlds[w], kind_name[kind], ok ? "ok" : err);
        }
    }
    /* a flipped bit in rank 2's moments: refused by whichever rank checks it, for every world */
    char bad[256], cmd[600];
    snprintf(bad, sizeof(bad), "%s/sums_bad", root);
    snprintf(cmd, sizeof(cmd), "cp -r %s %s", ck, bad);
    if (system(cmd) != 0)
        FAIL("cannot copy '%s'", ck);
    char bad_ckpt[300];
    snprintf(bad_ckpt, sizeof(bad_ckpt), "%s/step_00000007", bad);
    checkpoint_state_file(path, sizeof(path), bad_ckpt, 2, 3);
    FILE *f = fopen(path, "r+b");
    if (!f || fseeko(f, -5, SEEK_END) != 0)
        FAIL("cannot open '%s'", path);
    int c = fgetc(f);
    fseeko(f, -5, SEEK_END);
    fputc(c ^ 1, f);
    fclose(f);
    const int all_worlds[] = {1, 2, 3, 4, 5};
    for (int w = 0; w < 5; w++) {
        for (int kind = 0; kind < 2; kind++) {
            int refusals = 0, named = 1;
            for (int r = 0; r < all_worlds[w]; r++) {
                if (resume_rank(bad_ckpt, total, kind, all_worlds[w], r, NULL, err, sizeof(err)) != 0) {
                    refusals++;
                    named = named && strstr(err, "train_state.00002.bin' does not match the checkpoint's manifest");
                }
            }
            check(refusals >= 1 && named, "rank 2's changed file is refused by %d of %d %s resuming rank(s), naming it",
                  refusals, all_worlds[w], kind_name[kind]);
        }
    }
    /* a missing rank file that another world would not read whole, a .xxh64 line that is not its file's */
    unlink(path);
    rc = resume_rank(bad_ckpt, total, BUCKETED, 3, 0, NULL, err, sizeof(err));
    check(rc != 0 && strstr(err, "train_state.00002.bin"), "a missing rank file is refused, naming it: %s", err);
    rc = checkpoint_stage_try(ck, 8, staging, sizeof(staging), err, sizeof(err));
    snprintf(path, sizeof(path), "%s/train_state.00001.bin" CKPT_SUM_SUFFIX, staging);
    if (rc == 0)
        rc = write_file_synced(path, "xxh64 0000000000000001 3 train_state.00002.bin\n", 47, err, sizeof(err));
    rc = rc == 0 ? checkpoint_commit_try(ck, 8, 0x5eed, 0, NULL, 0, saved, sizeof(saved), err, sizeof(err)) : 0;
    check(rc != 0 && strstr(err, "is not the checksum line of 'train_state.00001.bin'"),
          "a .xxh64 line of another file is refused at the commit: %s", err);
}

int main(void)
{
    char root[] = "/tmp/test_checkpoint_shards_XXXXXX";
    if (!mkdtemp(root))
        FAIL("mkdtemp failed");
    const int64_t totals[] = {1000, 4099};
    const int worlds[] = {1, 2, 3, 4, 8};
    char dir[256], cmd[1024], err[1024], file[LLMC_PATH_MAX + 64];
    /* every sharding and world size, resumed by every other */
    for (int t = 0; t < 2; t++) {
        for (int wk = 0; wk < 2; wk++) {
            for (int w = 0; w < 5; w++) {
                snprintf(dir, sizeof(dir), "%s/t%d_%s_w%d", root, t, kind_name[wk], worlds[w]);
                mkdir(dir, 0755);
                int ok = write_world(dir, totals[t], worlds[w], wk) == 0;
                check(ok, "%lld parameters saved by %d rank(s), %s", (long long)totals[t], worlds[w], kind_name[wk]);
                for (int lk = 0; ok && lk < 2; lk++) {
                    for (int l = 0; l < 5; l++) {
                        check(load_world(dir, totals[t], worlds[l], lk),
                              "%lld parameters saved by %d rank(s) %s, resumed by %d %s", (long long)totals[t],
                              worlds[w], kind_name[wk], worlds[l], kind_name[lk]);
                    }
                }
            }
        }
    }
    /* the file format as documented: rank 1 of 3's four bucket slices, in order */
    {
        CkptRange want[MAX_RANGES];
        int n = ranges_of(BUCKETED, 4099, 3, 1, 0, want);
        snprintf(file, sizeof(file), "%s/t1_bucketed_w3/train_state.00001.bin", root);
        check(n == 4 && has_table(file, want, n),
              "a bucketed rank's file is version 2 with its 4 ranges in the table, then m and v");
    }
    /* wanted ranges in any order, overlapping each other, past the end */
    {
        CkptRange wanted[] = {{2500, 100}, {0, 50}, {2520, 10}, {4090, 20}, {1000, 0}, {409, 1}};
        snprintf(dir, sizeof(dir), "%s/t1_bucketed_w3", root);
        check(load_ranges(dir, 4099, wanted, 6), "wanted ranges out of order, overlapping and past the end");
    }
    /* the writer merges adjacent ranges and drops empty ones */
    {
        CkptRange ranges[] = {{0, 100}, {100, 50}, {150, 0}, {150, 850}};
        CkptRange merged[] = {{0, 1000}};
        fresh_dir(dir, sizeof(dir), root, "merge");
        int rc = write_rank(dir, 1000, 1, 0, 7, ranges, 4, err, sizeof(err));
        snprintf(file, sizeof(file), "%s/train_state.bin", dir);
        check(rc == 0 && has_table(file, merged, 1), "adjacent ranges are merged into one [0, 1000)");
        check(rc == 0 && load_ranges(dir, 1000, merged, 1), "the merged file loads bit-identical");
        CkptRange apart[] = {{0, 10}, {20, 10}, {30, 5}, {30, 0}, {100, 900}};
        CkptRange apart_merged[] = {{0, 10}, {20, 15}, {100, 900}};
        fresh_dir(dir, sizeof(dir), root, "merge2");
        rc = write_rank(dir, 1000, 2, 0, 7, apart, 5, err, sizeof(err));
        snprintf(file, sizeof(file), "%s/train_state.00000.bin", dir);
        check(rc == 0 && has_table(file, apart_merged, 3), "only adjacent ranges are merged: 5 ranges become 3");
    }
    /* the writer refuses ranges it cannot write */
    {
        struct {
            CkptRange r[2];
            const char *what, *says;
        } bad[] = {
            {{{0, 100}, {50, 100}}, "overlapping ranges", "ascend without overlap"},
            {{{500, 100}, {0, 100}}, "descending ranges", "ascend without overlap"},
            {{{0, 100}, {900, 101}}, "a range past the end", "outside the 1000 parameters"},
            {{{-1, 10}, {10, 10}}, "a negative offset", "outside the 1000 parameters"},
            {{{0, -5}, {10, 10}}, "a negative count", "outside the 1000 parameters"},
        };
        fresh_dir(dir, sizeof(dir), root, "bad_write");
        for (int i = 0; i < 5; i++) {
            int rc = write_rank(dir, 1000, 1, 0, 7, bad[i].r, 2, err, sizeof(err));
            check(rc != 0 && strstr(err, bad[i].says) && strstr(err, "train_state.bin"), "the writer refuses %s: %s",
                  bad[i].what, err);
        }
    }
    /* version 1 files still load: ZeRO 1 shards of 3 ranks, and a single process's file */
    {
        fresh_dir(dir, sizeof(dir), root, "v1_w3");
        for (int r = 0; r < 3; r++) {
            int64_t first, count;
            shard_of(1000, 3, r, &first, &count);
            write_v1(dir, 1000, 3, r, first, count);
        }
        int ok = 1;
        for (int r = 0; r < 4 && ok; r++) {
            CkptRange wanted[MAX_RANGES];
            int n = ranges_of(BUCKETED, 1000, 4, r, 1, wanted);
            ok = load_ranges_of_run(dir, 1000, wanted, n, 0);
        }
        check(ok, "version 1 files of 3 ranks load into 4 ranks' bucket slices");
        fresh_dir(dir, sizeof(dir), root, "v1_w1");
        write_v1(dir, 1000, 1, 0, 0, 1000);
        CkptRange all = {0, 1000};
        check(load_ranges_of_run(dir, 1000, &all, 1, 0), "a single process's version 1 file loads, without a run id");
        check(checkpoint_run_id(dir) == 0, "a version 1 file has no run id");
    }
    /* overlaps and gaps between the files' ranges */
    {
        struct {
            const char *name;
            CkptRange r0[2], r1[2];
            int n0, n1;
            const char *what, *says;
        } cases[] = {
            {"overlap", {{0, 600}}, {{500, 500}}, 1, 1, "two ranks' ranges overlap", "overlap"},
            {"overlap2",
             {{0, 100}, {200, 100}},
             {{100, 150}, {300, 700}},
             2,
             2,
             "interleaved ranges overlap",
             "overlap"},
            {"gap", {{0, 400}}, {{500, 500}}, 1, 1, "a gap between two ranks", "gap at element 400"},
            {"gap2",
             {{0, 100}, {200, 100}},
             {{100, 50}, {300, 700}},
             2,
             2,
             "a gap between interleaved ranges",
             "gap at element 150"},
            {"gap_end", {{0, 400}}, {{400, 500}}, 1, 1, "a gap at the end", "gap at element 900"},
        };
        for (int i = 0; i < 5; i++) {
            fresh_dir(dir, sizeof(dir), root, cases[i].name);
            int rc = write_rank(dir, 1000, 2, 0, 7, cases[i].r0, cases[i].n0, err, sizeof(err)) |
                     write_rank(dir, 1000, 2, 1, 7, cases[i].r1, cases[i].n1, err, sizeof(err));
            rc = rc == 0 ? load_all(dir, 1000, err, sizeof(err)) : 0;
            check(rc != 0 && strstr(err, cases[i].says) && strstr(err, dir), "%s is an error naming the checkpoint: %s",
                  cases[i].what, err);
        }
        check(strstr(err, "missing") != NULL, "a gap's error hints at a missing file");
        snprintf(dir, sizeof(dir), "%s/overlap", root);
        load_all(dir, 1000, err, sizeof(err));
        check(strstr(err, "train_state.00000.bin") && strstr(err, "train_state.00001.bin"),
              "an overlap's error names both files");
    }
    /* a rank's file of another step */
    {
        CkptRange r0 = {0, 500}, r1 = {500, 500};
        fresh_dir(dir, sizeof(dir), root, "steps");
        write_rank(dir, 1000, 2, 0, 7, &r0, 1, err, sizeof(err));
        write_rank(dir, 1000, 2, 1, 8, &r1, 1, err, sizeof(err));
        int rc = load_all(dir, 1000, err, sizeof(err));
        check(rc != 0 && strstr(err, "train_state.00001.bin") && strstr(err, "step 8"),
              "a rank file of another step is an error naming it: %s", err);
        /* ... and of the same step of another run */
        fresh_dir(dir, sizeof(dir), root, "runs");
        write_rank(dir, 1000, 2, 0, 7, &r0, 1, err, sizeof(err));
        write_rank(dir, 1000, 2, 1, 7, &r1, 1, err, sizeof(err));
        check(checkpoint_run_id(dir) == 0x5eed, "checkpoint_run_id reads rank 0's run id");
        snprintf(file, sizeof(file), "%s/train_state.00001.bin", dir);
        patch_u64(file, 112, 0xbad);
        rc = load_all(dir, 1000, err, sizeof(err));
        check(rc != 0 && strstr(err, "train_state.00001.bin") && strstr(err, "run 0000000000000bad"),
              "a rank file of a run of another world size is an error naming it: %s", err);
    }
    /* corrupt range tables: clear errors, no crash, no huge allocation */
    {
        struct {
            const char *what;
            int64_t at, value; /* at < 0: cut the file's last 4 bytes */
            const char *says;
        } cases[] = {
            {"a negative number of ranges", 56, -1, "claims -1 ranges"},
            {"an absurd number of ranges", 56, (int64_t)1 << 60, "ranges of the 1000 parameters (corrupt)"},
            {"a table past the end of the file", 56, 1000, "too short for its table of 1000 ranges"},
            {"a range count that does not sum to the header's", 128 + 8, 40, "hold 484 moments, its header says 488"},
            {"a header count that the ranges do not sum to", 64, 3, "more than the 3 moments"},
            {"a range count past the end", 128 + 16 + 8, 5000, "impossible (corrupt)"},
            {"a negative range offset", 128, -8, "impossible (corrupt)"},
            {"an absurd header count", 64, (int64_t)1 << 62, "moments of the 1000 parameters (corrupt)"},
            {"a truncated file", -1, 0, "truncated or corrupt"},
        };
        const int n_cases = (int)(sizeof(cases) / sizeof(cases[0]));
        for (int i = 0; i < n_cases; i++) {
            snprintf(dir, sizeof(dir), "%s/corrupt%d", root, i);
            snprintf(cmd, sizeof(cmd), "cp -r %s/t0_bucketed_w2 %s", root, dir);
            if (system(cmd) != 0)
                FAIL("cannot copy a checkpoint for the corruption tests");
            snprintf(file, sizeof(file), "%s/train_state.00001.bin", dir);
            if (cases[i].at >= 0) {
                patch_u64(file, cases[i].at, cases[i].value);
            } else {
                struct stat sb;
                if (stat(file, &sb) != 0 || truncate(file, sb.st_size - 4) != 0)
                    FAIL("cannot truncate '%s'", file);
            }
            int rc = load_all(dir, 1000, err, sizeof(err));
            check(rc != 0 && strstr(err, file) && strstr(err, cases[i].says), "%s is an error naming the file: %s",
                  cases[i].what, err);
        }
    }
    /* a missing rank file */
    snprintf(dir, sizeof(dir), "%s/t1_contiguous_w4", root);
    snprintf(cmd, sizeof(cmd), "%s/train_state.00002.bin", dir);
    unlink(cmd);
    float m[8], v[8];
    CheckpointState st;
    CkptRange head = {0, 8};
    int rc = checkpoint_load_moments_try(dir, 4099, &head, 1, m, v, &st, err, sizeof(err));
    check(rc != 0 && strstr(err, "train_state.00002.bin") != NULL, "a missing rank file is an error naming it: %s",
          err);
    /* a rank file from a run with another world size */
    snprintf(cmd, sizeof(cmd), "cp %s/t1_contiguous_w3/train_state.00002.bin %s/", root, dir);
    rc = system(cmd) == 0 ? checkpoint_load_moments_try(dir, 4099, &head, 1, m, v, &st, err, sizeof(err)) : 0;
    check(rc != 0 && strstr(err, "rank 2 of 3") != NULL,
          "a rank file of a run of another world size is an error naming it: %s", err);
    /* a model of another size */
    snprintf(dir, sizeof(dir), "%s/t0_contiguous_w2", root);
    rc = checkpoint_load_moments_try(dir, 1001, &head, 1, m, v, &st, err, sizeof(err));
    check(rc != 0 && strstr(err, "1000") != NULL, "state of another model size is refused: %s", err);
    test_xxh64();
    test_json_duplicates(root);
    test_manifest(root);
    test_multi_rank_sums(root);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        printf("warning: could not remove %s\n", root);
    return check_summary();
}
