/* Tests of llmc/checkpoint.h's sharded optimizer state: train_state files
 * written by W ranks, each holding a list of ranges of the flat moments (ZeRO 1:
 * one contiguous shard per rank, the last cut at the end of the parameters;
 * per-bucket sharding: one slice of every bucket per rank, interleaved with the
 * other ranks'), must give back any list of wanted ranges bit for bit for a
 * resume on any other number of ranks and either sharding, with the padding past
 * the end zero. Adjacent ranges are merged when written; version 1 files (one
 * range, no table) still load; overlapping or missing ranges, a missing or
 * foreign rank file and a corrupt range table are errors that name what is
 * wrong. Runs in a temporary directory, no GPU. */
#include <stdlib.h>
#include <unistd.h>

#include "llmc/checkpoint.h"
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
 * the writer drops). BUCKETED: as llmc/zero_plan.h cuts them, each bucket padded
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

/* Writes rank r of world's state file into dir, with the moments of ranges. */
static int write_rank(const char *dir, int64_t total, int world, int r, uint64_t step, const CkptRange *ranges, int n,
                      char *err, size_t errlen)
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
    int rc = checkpoint_write_state_try(dir, &st, total, ranges, n, m, v, err, errlen);
    free(m);
    free(v);
    return rc;
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
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        printf("warning: could not remove %s\n", root);
    return check_summary();
}
