/*
 * train_state.h: what else training needs to continue bit for bit besides
 * the weights, in train_state.bin: step, AdamW step and moments, data
 * position, RNG. Little-endian, CKPT_STATE_HEADER_BYTES of header:
 *     0  char[8] magic "LLMCKPT\0"   8 u32 version (2)
 *    12  u32 header bytes (128)      16 u64 step
 *    24  u64 AdamW step count        32 u64 RNG state
 *    40  i32 rank   44 i32 world     48 i64 total (layout.total)
 *    56  i64 number of ranges n      64 i64 moments count
 *    72  DataLoaderState: u64 epoch, shard, window, seed, layout
 *   112  zeros to 128
 * then the range table, n x (i64 offset, i64 count): ascending, not
 * overlapping, adjacent ones merged; then AdamW m[count] and v[count], fp32,
 * each the ranges' elements of the flat buffers concatenated in table order
 * (count = the sum of the ranges' counts).
 *
 * One file with the range [0, total) (rank 0 of 1), or with ZeRO-sharded
 * optimizer state one file per rank, train_state.<rank, 5 digits>.bin, holding
 * whatever list of ranges that rank owns (with per-bucket sharding one slice
 * of every bucket, interleaved with the other ranks'); all files' ranges
 * together tile [0, total). A resume of any world size reads, for each range
 * it needs, the parts of whichever files hold it. Version 1 (still read) had
 * no table: one range, its offset at 56 and its count at 64, the moments at 128.
 *
 * Loading checks the magic, version and sizes, the range table, and that the
 * ranges of all ranks' files tile [0, total); every size is checked against
 * the file's before anything is allocated from it. The *_try functions return
 * 0, or -1 with a message naming the file in err. Plain C (POSIX); compiles as
 * C++ too.
 */
#ifndef LLMC_TRAIN_STATE_H
#define LLMC_TRAIN_STATE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "dataloader.h"
#include "fileutil.h"

#define CKPT_STATE_MAGIC "LLMCKPT"
#define CKPT_STATE_VERSION 2 /* 1 (one range per file) is read too */
#define CKPT_STATE_HEADER_BYTES 128

/* Elements [offset, offset + count) of the flat AdamW buffers. */
typedef struct {
    int64_t offset, count;
} CkptRange;

typedef struct {
    uint64_t step;      /* optimizer steps completed */
    uint64_t adam_step; /* AdamW's step count (bias correction) */
    uint64_t rng_state;
    int32_t rank, world; /* which file of how many (the ranges travel beside the state) */
    DataLoaderState data;
} CheckpointState;

/* The state of a single-process run after `step` optimizer steps (rank 0 of 1);
 * a sharded optimizer sets rank and world per file. */
static inline CheckpointState checkpoint_state(uint64_t step, uint64_t adam_step, uint64_t rng_state)
{
    CheckpointState st;
    memset(&st, 0, sizeof(st));
    st.step = step;
    st.adam_step = adam_step;
    st.rng_state = rng_state;
    st.world = 1;
    return st;
}

/* The ranges a file is written with: checks that ranges[n_ranges] lie in
 * [0, total] with counts >= 0, ascending without overlap, and writes them to out
 * (room for n_ranges) with the empty ones dropped and adjacent ones
 * (a.offset + a.count == b.offset) merged, *n_out of them. Merging moves no
 * moment: they are concatenated in range order either way. */
static inline int ckpt_merge_ranges(const char *path, const CkptRange *ranges, int n_ranges, int64_t total,
                                    CkptRange *out, int *n_out, char *err, size_t errlen)
{
    int n = 0;
    int64_t end = 0; /* of the last non-empty range */
    for (int i = 0; i < n_ranges; i++) {
        CkptRange r = ranges[i];
        if (r.offset < 0 || r.count < 0 || r.offset > total || r.count > total - r.offset) {
            ckpt_path(err, errlen, "'%s': range %d, [%lld, +%lld), is outside the %lld parameters", path, i,
                      (long long)r.offset, (long long)r.count, (long long)total);
            return -1;
        }
        if (r.count == 0)
            continue;
        if (r.offset < end) {
            ckpt_path(err, errlen,
                      "'%s': range %d, [%lld, +%lld), starts before the end %lld of the range before it "
                      "(the ranges must ascend without overlap)",
                      path, i, (long long)r.offset, (long long)r.count, (long long)end);
            return -1;
        }
        if (n > 0 && out[n - 1].offset + out[n - 1].count == r.offset)
            out[n - 1].count += r.count;
        else
            out[n++] = r;
        end = r.offset + r.count;
    }
    *n_out = n;
    return 0;
}

/* A train_state file of format 2: ranges[n_ranges] as ckpt_merge_ranges leaves
 * them; adam_m, adam_v: their moments concatenated (NULL: zeros). */
static inline int ckpt_write_state(const char *path, const CheckpointState *st, int64_t total, const CkptRange *ranges,
                                   int n_ranges, const float *adam_m, const float *adam_v, char *err, size_t errlen)
{
    unsigned char h[CKPT_STATE_HEADER_BYTES], entry[16];
    FILE *f = NULL;
    int ok, saved;
    int64_t count = 0;
    for (int i = 0; i < n_ranges; i++)
        count += ranges[i].count;
    memset(h, 0, sizeof(h));
    memcpy(h, CKPT_STATE_MAGIC, 8);
    ckpt_put_u32(h + 8, CKPT_STATE_VERSION);
    ckpt_put_u32(h + 12, CKPT_STATE_HEADER_BYTES);
    ckpt_put_u64(h + 16, st->step);
    ckpt_put_u64(h + 24, st->adam_step);
    ckpt_put_u64(h + 32, st->rng_state);
    ckpt_put_u32(h + 40, (uint32_t)st->rank);
    ckpt_put_u32(h + 44, (uint32_t)st->world);
    ckpt_put_u64(h + 48, (uint64_t)total);
    ckpt_put_u64(h + 56, (uint64_t)n_ranges);
    ckpt_put_u64(h + 64, (uint64_t)count);
    ckpt_put_u64(h + 72, st->data.epoch);
    ckpt_put_u64(h + 80, st->data.shard);
    ckpt_put_u64(h + 88, st->data.window);
    ckpt_put_u64(h + 96, st->data.seed);
    ckpt_put_u64(h + 104, st->data.layout);
    f = fopen(path, "wb");
    if (!f)
        CKPT_ERR("cannot create '%s': %s", path, strerror(errno));
    ok = fwrite(h, 1, sizeof(h), f) == sizeof(h);
    for (int i = 0; i < n_ranges && ok; i++) {
        ckpt_put_u64(entry, (uint64_t)ranges[i].offset);
        ckpt_put_u64(entry + 8, (uint64_t)ranges[i].count);
        ok = fwrite(entry, 1, sizeof(entry), f) == sizeof(entry);
    }
    for (int which = 0; which < 2 && ok; which++) {
        const float *src = which == 0 ? adam_m : adam_v;
        if (src) {
            ok = fwrite(src, sizeof(float), (size_t)count, f) == (size_t)count;
        } else { /* no AdamW step yet: zero moments */
            static const float zeros[1024] = {0};
            for (int64_t i = 0; i < count && ok; i += 1024) {
                size_t n = (size_t)(count - i < 1024 ? count - i : 1024);
                ok = fwrite(zeros, sizeof(float), n, f) == n;
            }
        }
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    saved = errno;
    ok = (fclose(f) == 0) && ok;
    f = NULL;
    if (!ok)
        CKPT_ERR("cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
    return 0;
fail:
    if (f)
        fclose(f);
    return -1;
}

/* The train_state file of `rank` in checkpoint (or staging) directory ckpt_dir. */
static inline void checkpoint_state_file(char *out, size_t n, const char *ckpt_dir, int rank, int world)
{
    if (world <= 1)
        ckpt_path(out, n, "%s/train_state.bin", ckpt_dir);
    else
        ckpt_path(out, n, "%s/train_state.%05d.bin", ckpt_dir, rank);
}

/* One train_state file as the loader sees it. */
typedef struct {
    CheckpointState state;
    int64_t n_ranges;  /* entries of ranges */
    int64_t count;     /* moments in the file: the sum of the ranges' counts */
    int64_t data_at;   /* byte offset of m[0]; v[0] is count floats later */
    CkptRange *ranges; /* in file order, the moments of each following the previous' */
} CkptStateFile;

/* Reads and checks the header and range table of the train_state file at path
 * (of version 1 or 2) into *out, whose ranges the caller frees. Every size is
 * checked against the file's before anything is allocated from it. */
static inline int ckpt_read_state(const char *path, int64_t total, CkptStateFile *out, char *err, size_t errlen)
{
    unsigned char h[CKPT_STATE_HEADER_BYTES], entry[16];
    int64_t size, file_total, sum = 0;
    uint32_t version;
    CheckpointState *st = &out->state;
    FILE *f = fopen(path, "rb");
    memset(out, 0, sizeof(*out));
    if (!f)
        CKPT_ERR("cannot open '%s': %s", path, strerror(errno));
    fseeko(f, 0, SEEK_END);
    size = (int64_t)ftello(f);
    fseeko(f, 0, SEEK_SET);
    if (size < CKPT_STATE_HEADER_BYTES || fread(h, 1, sizeof(h), f) != sizeof(h))
        CKPT_ERR("'%s' is too short (%lld bytes) to be a train_state.bin", path, (long long)size);
    if (memcmp(h, CKPT_STATE_MAGIC "\0", 8) != 0)
        CKPT_ERR("'%s' is not a train_state.bin (bad magic)", path);
    version = ckpt_get_u32(h + 8);
    if (version != 1 && version != CKPT_STATE_VERSION)
        CKPT_ERR("'%s' has version %u, this build reads versions 1 to %d", path, version, CKPT_STATE_VERSION);
    if (ckpt_get_u32(h + 12) != CKPT_STATE_HEADER_BYTES)
        CKPT_ERR("'%s' has a header of %u bytes, expected %d (corrupt)", path, ckpt_get_u32(h + 12),
                 CKPT_STATE_HEADER_BYTES);
    st->step = ckpt_get_u64(h + 16);
    st->adam_step = ckpt_get_u64(h + 24);
    st->rng_state = ckpt_get_u64(h + 32);
    st->rank = (int32_t)ckpt_get_u32(h + 40);
    st->world = (int32_t)ckpt_get_u32(h + 44);
    file_total = (int64_t)ckpt_get_u64(h + 48);
    st->data.epoch = ckpt_get_u64(h + 72);
    st->data.shard = ckpt_get_u64(h + 80);
    st->data.window = ckpt_get_u64(h + 88);
    st->data.seed = ckpt_get_u64(h + 96);
    st->data.layout = ckpt_get_u64(h + 104);
    if (file_total != total)
        CKPT_ERR("'%s' holds optimizer state of %lld parameters, this model has %lld", path, (long long)file_total,
                 (long long)total);
    if (st->world < 1 || st->rank < 0 || st->rank >= st->world)
        CKPT_ERR("'%s': rank %d of %d is impossible (corrupt)", path, st->rank, st->world);
    out->count = (int64_t)ckpt_get_u64(h + 64);
    if (version == 1) { /* one range, no table */
        out->n_ranges = 1;
        out->ranges = (CkptRange *)malloc_check(sizeof(CkptRange), "checkpoint ranges");
        out->ranges[0].offset = (int64_t)ckpt_get_u64(h + 56);
        out->ranges[0].count = out->count;
        out->data_at = CKPT_STATE_HEADER_BYTES;
    } else {
        out->n_ranges = (int64_t)ckpt_get_u64(h + 56);
        /* every range holds at least one of the total elements: more is corruption, and a table needs its bytes */
        if (out->n_ranges < 0 || out->n_ranges > total)
            CKPT_ERR("'%s' claims %lld ranges of the %lld parameters (corrupt)", path, (long long)out->n_ranges,
                     (long long)total);
        if (out->n_ranges > (size - CKPT_STATE_HEADER_BYTES) / 16)
            CKPT_ERR("'%s' is %lld bytes, too short for its table of %lld ranges (truncated or corrupt)", path,
                     (long long)size, (long long)out->n_ranges);
        out->ranges = (CkptRange *)malloc_check((size_t)(out->n_ranges > 0 ? out->n_ranges : 1) * sizeof(CkptRange),
                                                "checkpoint ranges");
        for (int64_t i = 0; i < out->n_ranges; i++) {
            if (fread(entry, 1, sizeof(entry), f) != sizeof(entry))
                CKPT_ERR("'%s': short read of the range table", path);
            out->ranges[i].offset = (int64_t)ckpt_get_u64(entry);
            out->ranges[i].count = (int64_t)ckpt_get_u64(entry + 8);
        }
        out->data_at = CKPT_STATE_HEADER_BYTES + 16 * out->n_ranges;
    }
    if (out->count < 0 || out->count > total)
        CKPT_ERR("'%s' claims %lld moments of the %lld parameters (corrupt)", path, (long long)out->count,
                 (long long)total);
    for (int64_t i = 0; i < out->n_ranges; i++) {
        const CkptRange *r = &out->ranges[i];
        if (r->offset < 0 || r->count < 0 || r->offset > total || r->count > total - r->offset)
            CKPT_ERR("'%s': rank %d of %d, range [%lld, +%lld) of %lld parameters is impossible (corrupt)", path,
                     st->rank, st->world, (long long)r->offset, (long long)r->count, (long long)total);
        if (r->count > out->count - sum)
            CKPT_ERR("'%s': its ranges hold more than the %lld moments of its header (corrupt)", path,
                     (long long)out->count);
        sum += r->count;
    }
    if (sum != out->count)
        CKPT_ERR("'%s': its ranges hold %lld moments, its header says %lld (corrupt)", path, (long long)sum,
                 (long long)out->count);
    if (size != out->data_at + 8 * out->count)
        CKPT_ERR("'%s' is %lld bytes, its header describes %lld (truncated or corrupt)", path, (long long)size,
                 (long long)(out->data_at + 8 * out->count));
    fclose(f);
    return 0;
fail:
    if (f)
        fclose(f);
    free(out->ranges);
    out->ranges = NULL;
    return -1;
}

/* A non-empty range of one file: where it lies in the flat buffers and where
 * its moments are in the file (elements after the file's m[0]). */
typedef struct {
    int64_t offset, count, at;
    int file;
} CkptPiece;

/* A copy from a file: n moments from element src of its m (and of its v) to
 * element dst of the caller's m (and v). */
typedef struct {
    int64_t src, dst, n;
    int file;
} CkptRead;

static inline int ckpt_piece_cmp(const void *a, const void *b)
{
    const CkptPiece *x = (const CkptPiece *)a, *y = (const CkptPiece *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : x->file - y->file;
}

static inline int ckpt_read_cmp(const void *a, const void *b)
{
    const CkptRead *x = (const CkptRead *)a, *y = (const CkptRead *)b;
    if (x->file != y->file)
        return x->file - y->file;
    return x->src < y->src ? -1 : x->src > y->src ? 1 : 0;
}

/* The AdamW moments of wanted[n_wanted] (ranges of the flat buffers) into m and
 * v, each the sum of their counts, concatenated in wanted order, from the
 * train_state files of ckpt_dir, whatever world size and ranges wrote them: all
 * files' ranges together must tile [0, total). Wanted ranges may come in any
 * order and overlap; their elements at or past total are zero (ZeRO padding).
 * state receives rank 0's header (step, data position, RNG). */
static inline int checkpoint_load_moments_try(const char *ckpt_dir, int64_t total, const CkptRange *wanted,
                                              int n_wanted, float *m, float *v, CheckpointState *state, char *err,
                                              size_t errlen)
{
    char path[CKPT_PATH_MAX + 64], other[CKPT_PATH_MAX + 64];
    FILE *f = NULL;
    CkptStateFile *files = NULL;
    CkptPiece *pieces = NULL;
    CkptRead *reads = NULL;
    int world = 1, n_files = 0, files_cap = 0, n_reads = 0, reads_cap = 0, result = -1;
    int64_t n_pieces = 0, k = 0, next = 0, dst = 0;
    if (n_wanted < 0 || (n_wanted > 0 && !wanted))
        CKPT_ERR("loading the AdamW moments of '%s': %d wanted ranges is impossible", ckpt_dir, n_wanted);
    for (int i = 0; i < n_wanted; i++) {
        if (wanted[i].offset < 0 || wanted[i].count < 0 || wanted[i].count > INT64_MAX - wanted[i].offset)
            CKPT_ERR("loading the AdamW moments of '%s': wanted range %d, [%lld, +%lld), is impossible", ckpt_dir, i,
                     (long long)wanted[i].offset, (long long)wanted[i].count);
        dst += wanted[i].count;
    }
    if (dst > 0) {
        memset(m, 0, (size_t)dst * sizeof(float));
        memset(v, 0, (size_t)dst * sizeof(float));
    }
    /* which files: train_state.bin alone, or as many per-rank files as rank 0's header says */
    checkpoint_state_file(path, sizeof(path), ckpt_dir, 0, 1);
    if (!ckpt_exists(path)) {
        checkpoint_state_file(path, sizeof(path), ckpt_dir, 0, 2);
        files = (CkptStateFile *)ckpt_grow(files, n_files, &files_cap, sizeof(CkptStateFile), path);
        if (ckpt_read_state(path, total, &files[0], err, errlen) != 0)
            goto fail;
        n_files = 1;
        world = files[0].state.world;
        if (world < 2) /* a file of one rank of one is train_state.bin, which is not there */
            CKPT_ERR("'%s' is named for one rank of several but says it is rank 0 of 1 (corrupt?)", path);
    }
    for (int r = 0; r < world; r++) { /* grown as read: a corrupt world fails at its first missing file */
        checkpoint_state_file(path, sizeof(path), ckpt_dir, r, world);
        if (r == n_files) { /* rank 0's file may have been read above */
            files = (CkptStateFile *)ckpt_grow(files, n_files, &files_cap, sizeof(CkptStateFile), path);
            if (ckpt_read_state(path, total, &files[n_files], err, errlen) != 0)
                goto fail;
            n_files++;
        }
        const CheckpointState *h = &files[r].state;
        if (h->rank != r || h->world != world)
            CKPT_ERR("'%s' is rank %d of %d; expected rank %d of %d (a checkpoint mixed from several runs?)", path,
                     h->rank, h->world, r, world);
        if (h->step != files[0].state.step)
            CKPT_ERR("'%s' is of step %llu, rank 0's file of step %llu (a checkpoint mixed from several runs?)", path,
                     (unsigned long long)h->step, (unsigned long long)files[0].state.step);
        n_pieces += files[r].n_ranges;
    }
    *state = files[0].state;
    /* every file's non-empty ranges, by offset: they must tile [0, total) */
    pieces = (CkptPiece *)malloc_check((size_t)(n_pieces > 0 ? n_pieces : 1) * sizeof(CkptPiece), "checkpoint ranges");
    n_pieces = 0;
    for (int r = 0; r < n_files; r++) {
        int64_t at = 0;
        for (int64_t i = 0; i < files[r].n_ranges; i++) {
            CkptPiece p = {files[r].ranges[i].offset, files[r].ranges[i].count, at, r};
            at += p.count;
            if (p.count > 0)
                pieces[n_pieces++] = p;
        }
    }
    qsort(pieces, (size_t)n_pieces, sizeof(CkptPiece), ckpt_piece_cmp);
    for (k = 0; k < n_pieces; k++) {
        if (pieces[k].offset < next) {
            checkpoint_state_file(path, sizeof(path), ckpt_dir, pieces[k - 1].file, world);
            checkpoint_state_file(other, sizeof(other), ckpt_dir, pieces[k].file, world);
            CKPT_ERR("the train_state files of '%s' overlap: '%s' holds [%lld, +%lld), '%s' holds [%lld, +%lld) "
                     "(a checkpoint mixed from several runs?)",
                     ckpt_dir, path, (long long)pieces[k - 1].offset, (long long)pieces[k - 1].count, other,
                     (long long)pieces[k].offset, (long long)pieces[k].count);
        }
        if (pieces[k].offset > next)
            break;
        next = pieces[k].offset + pieces[k].count;
    }
    if (next != total)
        CKPT_ERR("the train_state files of '%s' leave a gap at element %lld of %lld parameters (a rank's file is "
                 "missing or from another run?)",
                 ckpt_dir, (long long)next, (long long)total);
    /* what each wanted range needs from which file, then each file's reads in file order */
    dst = 0;
    for (int i = 0; i < n_wanted; i++) {
        int64_t lo = wanted[i].offset, hi = wanted[i].offset + wanted[i].count, first = 0, last = n_pieces;
        if (hi > total)
            hi = total;
        while (first < last) { /* the first piece that ends after lo */
            int64_t mid = first + (last - first) / 2;
            if (pieces[mid].offset + pieces[mid].count <= lo)
                first = mid + 1;
            else
                last = mid;
        }
        for (k = first; k < n_pieces && pieces[k].offset < hi; k++) {
            int64_t a = pieces[k].offset > lo ? pieces[k].offset : lo;
            int64_t b = pieces[k].offset + pieces[k].count < hi ? pieces[k].offset + pieces[k].count : hi;
            reads = (CkptRead *)ckpt_grow(reads, n_reads, &reads_cap, sizeof(CkptRead), ckpt_dir);
            reads[n_reads].src = pieces[k].at + (a - pieces[k].offset);
            reads[n_reads].dst = dst + (a - wanted[i].offset);
            reads[n_reads].n = b - a;
            reads[n_reads].file = pieces[k].file;
            n_reads++;
        }
        dst += wanted[i].count;
    }
    qsort(reads, (size_t)n_reads, sizeof(CkptRead), ckpt_read_cmp);
    for (int i = 0; i < n_reads;) {
        int r = reads[i].file, end = i;
        while (end < n_reads && reads[end].file == r)
            end++;
        checkpoint_state_file(path, sizeof(path), ckpt_dir, r, world);
        f = fopen(path, "rb");
        if (!f)
            CKPT_ERR("cannot open '%s': %s", path, strerror(errno));
        for (int which = 0; which < 2; which++) { /* all of m, then all of v: forward through the file */
            for (int j = i; j < end; j++) {
                const CkptRead *c = &reads[j];
                off_t at = (off_t)files[r].data_at + (off_t)(which * files[r].count + c->src) * 4;
                float *to = (which == 0 ? m : v) + c->dst;
                if (fseeko(f, at, SEEK_SET) != 0 || fread(to, sizeof(float), (size_t)c->n, f) != (size_t)c->n)
                    CKPT_ERR("'%s': short read of the AdamW moments (truncated?)", path);
            }
        }
        fclose(f);
        f = NULL;
        i = end;
    }
    result = 0;
fail: /* success comes this way too */
    if (f)
        fclose(f);
    for (int r = 0; r < n_files; r++)
        free(files[r].ranges);
    free(files);
    free(pieces);
    free(reads);
    return result;
}

#endif /* LLMC_TRAIN_STATE_H */
