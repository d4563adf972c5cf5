/*
 * test_tensorfile.c: the .llmt reader (llmc/formats/tensorfile.h) on a committed dump
 * and on corrupted copies of it, the config checks between a weights file and
 * a dump, and llama_rope_inv_freq against HF's formula computed in double.
 *
 * Every error must come back as an error (not a crash or a silent success)
 * whose message names the file. Ends with "N passed, M failed".
 *
 * Build: gcc -O3 -march=native -fopenmp -std=gnu11 -Wall -Wextra -I. tests/test_tensorfile.c -o tests/test_tensorfile
 * -lm Run from the repository root: ./tests/test_tensorfile
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/formats/hf_model.h"
#include "llmc/model/llama_config.h"
#include "llmc/formats/llmt_config.h"
#include "llmc/formats/tensorfile.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/rope_freqs.h"
#include "tests/check.h"
#include "tests/dump_check.h"

#define DUMP "testdata/tiny_gqa_tied.dump.llmt"
#define WEIGHTS "testdata/tiny_gqa_tied.weights.llmt"
#define ROPE31_WEIGHTS "testdata/small_mha_untied_rope31.weights.llmt"

static char tmpdir[64];

static void expect(int ok, const char *what)
{
    check(ok, "%s", what);
}

/* A whole file in memory. */
typedef struct {
    unsigned char *data;
    size_t size;
} Bytes;

static Bytes read_bytes(const char *path)
{
    FILE *f = fopen_check(path, "rb");
    Bytes b;
    b.size = (size_t)file_size_check(f);
    b.data = (unsigned char *)malloc_check(b.size + 64, path); /* room to append garbage */
    fread_check(b.data, 1, b.size, f, path);
    fclose(f);
    return b;
}

static void write_bytes(const char *path, const unsigned char *data, size_t size)
{
    FILE *f = fopen_check(path, "wb");
    fwrite_check(data, 1, size, f, path);
    fclose(f);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* Where the fields of each index entry are, found by walking the index
 * independently of the reader under test (docs/tensor_file_format.md). */
typedef struct {
    size_t meta_value[64]; /* offset of each metadata value's length prefix */
    size_t meta_key[64];
    size_t tensor_start[64], tensor_dtype[64], tensor_offset[64];
    int n_meta, n_tensors;
} IndexMap;

static IndexMap map_index(const Bytes *b)
{
    IndexMap m;
    memset(&m, 0, sizeof(m));
    m.n_meta = (int)tf_u32((const char *)b->data + 12);
    m.n_tensors = (int)tf_u32((const char *)b->data + 16);
    if (m.n_meta > 64 || m.n_tensors > 64)
        FAIL("test file has more entries than this test maps");
    size_t pos = 64;
    for (int i = 0; i < m.n_meta; i++) {
        m.meta_key[i] = pos;
        pos += 4 + tf_u32((const char *)b->data + pos);
        m.meta_value[i] = pos;
        pos += 4 + tf_u32((const char *)b->data + pos);
    }
    for (int i = 0; i < m.n_tensors; i++) {
        m.tensor_start[i] = pos;
        pos += 4 + tf_u32((const char *)b->data + pos);
        m.tensor_dtype[i] = pos;
        uint32_t ndim = tf_u32((const char *)b->data + pos + 4);
        pos += 8 + 8 * (size_t)ndim;
        m.tensor_offset[i] = pos;
        pos += 16;
    }
    return m;
}

/* The metadata entry whose key is `key`, as an index into IndexMap's arrays. */
static int find_meta(const Bytes *b, const IndexMap *m, const char *key)
{
    for (int i = 0; i < m->n_meta; i++) {
        uint32_t len = tf_u32((const char *)b->data + m->meta_key[i]);
        if (len == strlen(key) && memcmp(b->data + m->meta_key[i] + 4, key, len) == 0)
            return i;
    }
    FAIL("'%s' has no metadata key '%s'", DUMP, key);
    return -1;
}

static void temp_path(char *out, size_t outlen, const char *name)
{
    snprintf(out, outlen, "%s/%s", tmpdir, name);
}

/* Writes the corrupted copy, opens it, and expects an error naming the file
 * that contains `needle`. */
static void expect_open_error(const char *name, const Bytes *b, size_t size, const char *needle, const char *what)
{
    char path[256], err[1536], line[2048];
    temp_path(path, sizeof(path), name);
    write_bytes(path, b->data, size);
    TensorFile tf;
    int rc = tensorfile_open_try(&tf, path, err, sizeof(err));
    int ok = rc != 0 && strstr(err, path) != NULL && strstr(err, needle) != NULL;
    snprintf(line, sizeof(line), "%s: %s", what, rc != 0 ? err : "opened without an error");
    expect(ok, line);
    if (rc == 0)
        tensorfile_close(&tf);
    unlink(path);
}

static void test_corrupt_files(void)
{
    printf("corrupted copies of %s\n", DUMP);
    Bytes good = read_bytes(DUMP);
    IndexMap map = map_index(&good);
    Bytes b = read_bytes(DUMP);
    uint64_t data_bytes = tf_u64((const char *)good.data + 40);

    expect_open_error("truncated.llmt", &b, b.size - 100, "truncated", "truncated file");
    expect_open_error("tiny.llmt", &b, 40, "too short", "file shorter than the header");
    memcpy(b.data, good.data, good.size);
    memcpy(b.data + good.size, "garbage!garbage!", 16);
    expect_open_error("trailing.llmt", &b, b.size + 16, "truncated or corrupt", "trailing garbage");

    b.data[0] = 'X';
    expect_open_error("magic.llmt", &b, b.size, "bad magic", "bad magic");
    memcpy(b.data, good.data, good.size);

    put_u32(b.data + 8, 2);
    expect_open_error("version.llmt", &b, b.size, "version 2", "wrong version");
    memcpy(b.data, good.data, good.size);

    put_u64(b.data + 24, map.meta_value[3] + 2 - 64);
    expect_open_error("meta_past_index.llmt", &b, b.size, "metadata entry 3 runs past the index",
                      "metadata entry running past the index");
    memcpy(b.data, good.data, good.size);

    int last = map.n_tensors - 1;
    put_u64(b.data + 24, map.tensor_offset[last] + 8 - 64);
    expect_open_error("tensor_past_index.llmt", &b, b.size, "runs past the index",
                      "tensor entry running past the index");
    memcpy(b.data, good.data, good.size);

    put_u64(b.data + map.tensor_offset[last], data_bytes);
    expect_open_error("tensor_past_data.llmt", &b, b.size, "runs past the end of the data",
                      "tensor running past the data");
    memcpy(b.data, good.data, good.size);

    put_u64(b.data + map.tensor_offset[0] + 8, tf_u64((const char *)good.data + map.tensor_offset[0] + 8) + 4);
    expect_open_error("nbytes.llmt", &b, b.size, "but its shape needs", "nbytes that disagrees with the shape");
    memcpy(b.data, good.data, good.size);

    put_u32(b.data + map.tensor_dtype[0], 9);
    expect_open_error("dtype.llmt", &b, b.size, "unknown dtype 9", "unknown dtype");
    memcpy(b.data, good.data, good.size);

    /* the audit of be39022: 64 + index_bytes wrapped to 0 and the index was read into 0 bytes */
    put_u64(b.data + 24, UINT64_MAX);
    expect_open_error("index_wraps.llmt", &b, b.size, "truncated or corrupt", "index size 2^64-1 (no wrap)");
    memcpy(b.data, good.data, good.size);

    b.data[20] = 1;
    expect_open_error("reserved20.llmt", &b, b.size, "reserved bytes", "reserved header word at 20 not zero");
    memcpy(b.data, good.data, good.size);
    b.data[63] = 7;
    expect_open_error("reserved48.llmt", &b, b.size, "reserved bytes", "reserved header bytes 48-63 not zero");
    memcpy(b.data, good.data, good.size);

    put_u64(b.data + map.tensor_offset[1], tf_u64((const char *)good.data + map.tensor_offset[1]) + 4);
    expect_open_error("misaligned.llmt", &b, b.size, "not a multiple of 64", "tensor offset not 64-aligned");
    memcpy(b.data, good.data, good.size);

    put_u64(b.data + map.tensor_offset[1], tf_u64((const char *)good.data + map.tensor_offset[0]));
    expect_open_error("overlap.llmt", &b, b.size, "overlap", "two tensors at the same offset");
    memcpy(b.data, good.data, good.size);

    put_u64(b.data + 24, tf_u64((const char *)good.data + 24) - 8); /* the last entry's nbytes now past the index */
    expect_open_error("short_index.llmt", &b, b.size, "runs past the index", "index shorter than its entries");
    free(b.data);
    free(good.data);
}

/* A FIFO named as a weights file: refused at once, not waited on (the audit: fopen blocked forever). */
static void test_not_a_regular_file(void)
{
    char path[256], err[1536];
    temp_path(path, sizeof(path), "fifo.llmt");
    if (mkfifo(path, 0600) != 0) {
        check(0, "mkfifo: %s", strerror(errno));
        return;
    }
    TensorFile tf;
    int rc = tensorfile_open_try(&tf, path, err, sizeof(err));
    check(rc != 0 && strstr(err, "not a regular file") && strstr(err, path), "a FIFO is refused: %s", err);
    unlink(path);
}

static const char *child_weights;
static void load_weights_of_child(void)
{
    TensorFile tf;
    tensorfile_open(&tf, child_weights);
    LlamaConfig c = llama_config_from_tensorfile(&tf);
    tensorfile_close(&tf);
    ParamLayout layout = llama_param_layout(&c);
    float *p = (float *)malloc_check((size_t)layout.total * sizeof(float), "weights");
    model_weights_load(child_weights, &layout, p);
}

static void test_read_errors(void)
{
    printf("reads that must fail on %s\n", DUMP);
    TensorFile tf;
    char err[1536], line[1700];
    const char *missing = "testdata/no_such_file.llmt";
    int rc = tensorfile_open_try(&tf, missing, err, sizeof(err));
    snprintf(line, sizeof(line), "missing file: %s", err);
    expect(rc != 0 && strstr(err, missing) != NULL, line);
    tensorfile_open(&tf, DUMP);
    float x[4];
    rc = tensorfile_read_try(&tf, "no_such_tensor", TF_FLOAT32, 1, x, err, sizeof(err));
    snprintf(line, sizeof(line), "missing tensor: %s", err);
    expect(rc != 0 && strstr(err, DUMP) && strstr(err, "no_such_tensor"), line);
    rc = tensorfile_read_try(&tf, "loss", TF_INT32, 1, x, err, sizeof(err));
    snprintf(line, sizeof(line), "dtype mismatch: %s", err);
    expect(rc != 0 && strstr(err, DUMP) && strstr(err, "'loss'"), line);
    rc = tensorfile_read_try(&tf, "loss", TF_FLOAT32, 4, x, err, sizeof(err));
    snprintf(line, sizeof(line), "size mismatch: %s", err);
    expect(rc != 0 && strstr(err, DUMP) && strstr(err, "'loss'"), line);
    tensorfile_close(&tf);
}

static const char *child_path;
static void load_config_of_child_path(void)
{
    TensorFile tf;
    tensorfile_open(&tf, child_path);
    llama_config_from_tensorfile(&tf);
}

/* Runs fn in a child process and returns 1 if it exits non-zero with an
 * error on stderr that contains both needles; for the functions that exit on
 * an error instead of returning one. The message's first line goes into msg. */
typedef struct {
    void (*fn)(void);
} VoidCall;
static void call_void(void *call)
{
    ((VoidCall *)call)->fn();
}
static int child_fails_with(void (*fn)(void), const char *needle1, const char *needle2, char *msg, size_t msglen)
{
    VoidCall call = {fn};
    int code = run_child(call_void, &call, msg, msglen);
    char *newline = strchr(msg, '\n');
    int named = strstr(msg, needle1) != NULL && strstr(msg, needle2) != NULL;
    if (newline)
        *newline = '\0'; /* report only the first line */
    return code != 0 && named;
}

/* A copy of the weights file with one metadata entry changed in place (same length). */
static void write_edited_weights(const char *path, const char *key, const char *new_key, const char *new_value)
{
    Bytes b = read_bytes(WEIGHTS);
    IndexMap map = map_index(&b);
    int i = find_meta(&b, &map, key);
    if (new_key)
        memcpy(b.data + map.meta_key[i] + 4, new_key, strlen(new_key));
    if (new_value) {
        if (tf_u32((const char *)b.data + map.meta_value[i]) != strlen(new_value))
            FAIL("edit must keep the length");
        memcpy(b.data + map.meta_value[i] + 4, new_value, strlen(new_value));
    }
    write_bytes(path, b.data, b.size);
    free(b.data);
}

static void test_config_mismatch(void)
{
    printf("weights files that do not fit %s\n", DUMP);
    TensorFile dump, weights;
    tensorfile_open(&dump, DUMP);
    char path[256], err[4096], line[4200];

    tensorfile_open(&weights, WEIGHTS);
    int rc = config_meta_match_try(&weights, &dump, err, sizeof(err));
    expect(rc == 0, "the committed weights file matches its dump");
    tensorfile_close(&weights);

    temp_path(path, sizeof(path), "other_d_model.weights.llmt");
    write_edited_weights(path, "config.d_model", NULL, "65");
    tensorfile_open(&weights, path);
    rc = config_meta_match_try(&weights, &dump, err, sizeof(err));
    snprintf(line, sizeof(line), "config disagrees with the dump: %.*s", (int)strcspn(err, "\n"), err);
    expect(rc != 0 && strstr(err, path) && strstr(err, DUMP) && strstr(err, "config.d_model"), line);
    tensorfile_close(&weights);
    unlink(path);

    temp_path(path, sizeof(path), "no_n_head.weights.llmt");
    write_edited_weights(path, "config.n_head", "config.n_hexd", NULL);
    tensorfile_open(&weights, path);
    rc = config_meta_match_try(&weights, &dump, err, sizeof(err));
    snprintf(line, sizeof(line), "config key missing, against the dump: %s", err);
    expect(rc != 0 && strstr(err, path) && strstr(err, "config.n_head"), line);
    tensorfile_close(&weights);
    child_path = path;
    int ok = child_fails_with(load_config_of_child_path, path, "config.n_head", err, sizeof(err));
    snprintf(line, sizeof(line), "config key missing, loading the config: %s", err);
    expect(ok, line);
    unlink(path);

    /* the audit: metadata numbers were read with atoi ("2abc" = 2) and without bounds (477218589 layers) */
    temp_path(path, sizeof(path), "junk_number.weights.llmt");
    write_edited_weights(path, "config.n_layer", NULL, "x");
    child_path = path;
    ok = child_fails_with(load_config_of_child_path, path, "config.n_layer = 'x' is not a whole number", err,
                          sizeof(err));
    expect(ok, "a metadata size that is no number is refused");
    unlink(path);
    temp_path(path, sizeof(path), "huge_layers.weights.llmt");
    Bytes b = read_bytes(WEIGHTS);
    IndexMap map = map_index(&b);
    int i = find_meta(&b, &map, "config.n_layer");
    /* "2" -> "9": the value keeps its length; then a longer one through the vocab key ("1000" -> "9e99") */
    b.data[map.meta_value[i] + 4] = '9';
    int v = find_meta(&b, &map, "config.vocab_size");
    memcpy(b.data + map.meta_value[v] + 4, "9e99", 4);
    write_bytes(path, b.data, b.size);
    free(b.data);
    ok = child_fails_with(load_config_of_child_path, path, "config.vocab_size = '9e99'", err, sizeof(err));
    expect(ok, "a metadata size beyond the bounds is refused");
    unlink(path);

    /* the audit: a transposed matrix of the same element count loaded and trained */
    temp_path(path, sizeof(path), "transposed.weights.llmt");
    b = read_bytes(WEIGHTS);
    map = map_index(&b);
    const char *q = "model.layers.0.self_attn.o_proj.weight"; /* [64, 64]: make it [32, 128] */
    int t = -1;
    for (int k = 0; k < map.n_tensors; k++) {
        uint32_t len = tf_u32((const char *)b.data + map.tensor_start[k]);
        if (len == strlen(q) && memcmp(b.data + map.tensor_start[k] + 4, q, len) == 0)
            t = k;
    }
    if (t < 0)
        FAIL("'%s' has no %s", WEIGHTS, q);
    put_u64(b.data + map.tensor_dtype[t] + 8, 32);
    put_u64(b.data + map.tensor_dtype[t] + 16, 128);
    write_bytes(path, b.data, b.size);
    free(b.data);
    child_weights = path;
    ok = child_fails_with(load_weights_of_child, path, "has 2 dimensions [32, 128], the model's is [64, 64]", err,
                          sizeof(err));
    expect(ok, "a matrix of the right size but another shape is refused");
    unlink(path);
    tensorfile_close(&dump);
}

static void test_good_files(void)
{
    printf("what reference/tensorfile.py wrote\n");
    TensorFile tf;
    char err[1536];
    int rc = tensorfile_open_try(&tf, DUMP, err, sizeof(err));
    expect(rc == 0, "the committed dump opens");
    if (rc != 0)
        return;
    const char *kind = tensorfile_meta(&tf, "kind"), *B = tensorfile_meta(&tf, "dump.B");
    expect(kind && strcmp(kind, "reference_dump") == 0 && B && strcmp(B, "3") == 0 && !tensorfile_meta(&tf, "nokey"),
           "metadata: kind reference_dump, dump.B 3, absent key absent");
    const TensorEntry *logits = tensorfile_find(&tf, "logits");
    expect(logits && logits->dtype == TF_FLOAT32 && logits->ndim == 3 && logits->shape[0] == 3 &&
               logits->shape[1] == 13 && logits->shape[2] == 1000 && logits->nbytes == 3 * 13 * 1000 * 4 &&
               logits->offset % 64 == 0 && !tensorfile_find(&tf, "nothing"),
           "logits is float32 [3, 13, 1000] at a 64-aligned offset");
    float loss;
    tensorfile_read(&tf, "loss", TF_FLOAT32, 1, &loss);
    uint32_t bits;
    memcpy(&bits, &loss, 4);
    /* the float32 that python wrote: 7.170825004577637 */
    expect(bits == 1088780134u, "loss reads back bit for bit (7.170825)");
    int32_t tokens[39], targets[39];
    tensorfile_read(&tf, "input_tokens", TF_INT32, 39, tokens);
    tensorfile_read(&tf, "targets", TF_INT32, 39, targets);
    expect(tokens[0] == 488 && tokens[1] == 509 && tokens[4] == 25 && targets[0] == IGNORE_INDEX && targets[1] == 153,
           "input_tokens and targets (with the ignore index) read back");
    tensorfile_close(&tf);

    tensorfile_open(&tf, WEIGHTS);
    LlamaConfig c = llama_config_from_tensorfile(&tf);
    ParamLayout layout = llama_param_layout(&c);
    int all_found = tf.n_tensors == layout.n_tensors;
    for (int i = 0; i < layout.n_tensors; i++) {
        const TensorEntry *t = tensorfile_find(&tf, layout.tensors[i].name);
        all_found = all_found && t && t->numel == layout.tensors[i].numel && t->shape[0] == layout.tensors[i].rows;
    }
    expect(c.vocab_size == 1000 && c.d_model == 64 && c.n_kv_head == 2 && c.tie_embeddings == 1 && all_found,
           "weights file: config and every tensor of the parameter layout, with its shape");
    llama_param_layout_free(&layout);
    tensorfile_close(&tf);
}

/* HF's _compute_default_rope_parameters and _compute_llama3_parameters, in double. */
static void test_rope_inv_freq(void)
{
    printf("llama_rope_inv_freq on %s\n", ROPE31_WEIGHTS);
    TensorFile tf;
    tensorfile_open(&tf, ROPE31_WEIGHTS);
    LlamaConfig c = llama_config_from_tensorfile(&tf);
    tensorfile_close(&tf);
    int half = c.head_dim / 2, bands[3] = {0, 0, 0};
    float got[256];
    llama_rope_inv_freq(&c, got);
    double max_err = 0.0;
    double low_wavelen = c.rope_original_max_pos / (double)c.rope_low_freq_factor;
    double high_wavelen = c.rope_original_max_pos / (double)c.rope_high_freq_factor;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)c.rope_theta, 2.0 * i / c.head_dim);
        double wavelen = 2.0 * M_PI / f;
        if (wavelen > low_wavelen) {
            f /= c.rope_factor;
            bands[0]++;
        } else if (wavelen < high_wavelen) {
            bands[2]++;
        } else {
            double smooth = (c.rope_original_max_pos / wavelen - c.rope_low_freq_factor) /
                            ((double)c.rope_high_freq_factor - c.rope_low_freq_factor);
            f = (1.0 - smooth) * f / c.rope_factor + smooth * f;
            bands[1]++;
        }
        double err = fabs(got[i] - f) / f;
        if (err > max_err)
            max_err = err;
    }
    char line[256];
    snprintf(line, sizeof(line), "inv_freq matches HF's llama3 scaling in double: max rel error %.2e (tol 1e-6)",
             max_err);
    expect(c.rope_scaling_llama3 && max_err < 1e-6, line);
    snprintf(line, sizeof(line), "the config exercises every band: %d scaled, %d smoothed, %d kept", bands[0], bands[1],
             bands[2]);
    expect(bands[0] > 0 && bands[1] > 0 && bands[2] > 0, line);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_tensorfile.XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        FAIL("cannot make a temporary directory: %s", strerror(errno));
    test_good_files();
    test_corrupt_files();
    test_not_a_regular_file();
    test_read_errors();
    test_config_mismatch();
    test_rope_inv_freq();
    rmdir(tmpdir);
    return check_summary();
}
