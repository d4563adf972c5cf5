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
 *   112  u64 run id (0 in files written before run ids)
 *   120  zeros to 128
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
 * the file's before anything is allocated from it; every rank's file must
 * carry rank 0's step and run id.
 *
 * Checksums (checkpoint.h's manifest): the writer hashes each file (XXH64,
 * fileutil.h) as its bytes go to fwrite; the loader hashes each file as it
 * reads it, and says which files it read whole, in order (their hash is the
 * file's), and which only in part (another world size's ranges), for the
 * caller to check against the manifest.
 *
 * The run id is drawn at random when a run starts fresh and carried through
 * every resume: it tells one run's checkpoints from another's in the same
 * directory, so --keep never deletes a checkpoint of another run.
 *
 * The *_try functions return 0, or -1 with a message naming the file in err.
 * Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_TRAIN_STATE_H
#define LLMC_TRAIN_STATE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "llmc/formats/dataloader.h"
#include "llmc/common/fileutil.h"

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
    uint64_t run_id; /* which run wrote it; 0: unknown (written before run ids) */
} CheckpointState;

/* The state of a single-process run `run_id` after `step` optimizer steps (rank
 * 0 of 1); a sharded optimizer sets rank and world per file. */
static inline CheckpointState checkpoint_state(uint64_t run_id, uint64_t step, uint64_t adam_step, uint64_t rng_state)
{
    CheckpointState st;
    memset(&st, 0, sizeof(st));
    st.run_id = run_id;
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
            return set_error(err, errlen, "'%s': range %d, [%lld, +%lld), is outside the %lld parameters", path, i,
                             (long long)r.offset, (long long)r.count, (long long)total);
        }
        if (r.count == 0)
            continue;
        if (r.offset < end) {
            path_format(err, errlen,
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
 * them; adam_m, adam_v: their moments concatenated (NULL: zeros). *sum (NULL:
 * none): the file's size and XXH64, of the bytes as they were written. */
static inline int ckpt_write_state(const char *path, const CheckpointState *st, int64_t total, const CkptRange *ranges,
                                   int n_ranges, const float *adam_m, const float *adam_v, FileSum *sum, char *err,
                                   size_t errlen)
{
    unsigned char h[CKPT_STATE_HEADER_BYTES], entry[16];
    int64_t count = 0;
    for (int i = 0; i < n_ranges; i++)
        count += ranges[i].count;
    memset(h, 0, sizeof(h));
    memcpy(h, CKPT_STATE_MAGIC, 8);
    put_u32le(h + 8, CKPT_STATE_VERSION);
    put_u32le(h + 12, CKPT_STATE_HEADER_BYTES);
    put_u64le(h + 16, st->step);
    put_u64le(h + 24, st->adam_step);
    put_u64le(h + 32, st->rng_state);
    put_u32le(h + 40, (uint32_t)st->rank);
    put_u32le(h + 44, (uint32_t)st->world);
    put_u64le(h + 48, (uint64_t)total);
    put_u64le(h + 56, (uint64_t)n_ranges);
    put_u64le(h + 64, (uint64_t)count);
    put_u64le(h + 72, st->data.epoch);
    put_u64le(h + 80, st->data.shard);
    put_u64le(h + 88, st->data.window);
    put_u64le(h + 96, st->data.seed);
    put_u64le(h + 104, st->data.layout);
    put_u64le(h + 112, st->run_id);
    FILE *f = fopen(path, "wb");
    if (!f)
        return set_error(err, errlen, "cannot create '%s': %s", path, strerror(errno));
    Xxh64 hash;
    xxh64_init(&hash);
    int ok = fwrite_hashed(h, sizeof(h), f, &hash);
    for (int i = 0; i < n_ranges && ok; i++) {
        put_u64le(entry, (uint64_t)ranges[i].offset);
        put_u64le(entry + 8, (uint64_t)ranges[i].count);
        ok = fwrite_hashed(entry, sizeof(entry), f, &hash);
    }
    for (int which = 0; which < 2 && ok; which++) {
        const float *src = which == 0 ? adam_m : adam_v;
        if (src) {
            ok = fwrite_hashed(src, sizeof(float) * (size_t)count, f, &hash);
        } else { /* no AdamW step yet: zero moments */
            static const float zeros[1024] = {0};
            for (int64_t i = 0; i < count && ok; i += 1024) {
                size_t n = (size_t)(count - i < 1024 ? count - i : 1024);
                ok = fwrite_hashed(zeros, sizeof(float) * n, f, &hash);
            }
        }
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok)
        return set_error(err, errlen, "cannot write '%s': %s\n  hint: is the disk full?", path, strerror(saved));
    if (sum) {
        file_sum_name(sum, path);
        sum->size = (int64_t)hash.total;
        sum->xxh64 = xxh64_digest(&hash);
    }
    return 0;
}

/* The train_state file of `rank` in checkpoint (or staging) directory ckpt_dir. */
static inline void checkpoint_state_file(char *out, size_t n, const char *ckpt_dir, int rank, int world)
{
    if (world <= 1)
        path_format(out, n, "%s/train_state.bin", ckpt_dir);
    else
        path_format(out, n, "%s/train_state.%05d.bin", ckpt_dir, rank);
}

/* Rank 0's train_state file of a checkpoint: train_state.bin, or where there is
 * none the first of several ranks' files; 1 in the second case. */
static inline int checkpoint_state_file_rank0(char *out, size_t n, const char *ckpt_dir)
{
    checkpoint_state_file(out, n, ckpt_dir, 0, 1);
    if (path_exists(out))
        return 0;
    checkpoint_state_file(out, n, ckpt_dir, 0, 2);
    return 1;
}

/* A fresh run's id: 64 bits from /dev/urandom (from the clock and the process
 * id where it cannot be read), never 0. */
static inline uint64_t run_id_new(void)
{
    uint64_t id = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&id, sizeof(id), 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40);
        id = splitmix64(&id);
    }
    if (f)
        fclose(f);
    return id ? id : 1;
}

/* The run id in rank 0's train state file of checkpoint directory ckpt_dir; 0
 * where there is none, or it is unreadable or written before run ids. */
static inline uint64_t checkpoint_run_id(const char *ckpt_dir)
{
    char path[LLMC_PATH_MAX + 64];
    unsigned char h[CKPT_STATE_HEADER_BYTES];
    checkpoint_state_file_rank0(path, sizeof(path), ckpt_dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    int ok =
        fread(h, 1, sizeof(h), f) == sizeof(h) && memcmp(h, CKPT_STATE_MAGIC "\0", 8) == 0 && get_u32le(h + 8) >= 2;
    fclose(f);
    return ok ? get_u64le(h + 112) : 0;
}

/* One train_state file as the loader sees it. */
typedef struct {
    CheckpointState state;
    int64_t n_ranges;  /* entries of ranges */
    int64_t count;     /* moments in the file: the sum of the ranges' counts */
    int64_t data_at;   /* byte offset of m[0]; v[0] is count floats later */
    CkptRange *ranges; /* in file order, the moments of each following the previous' */
    int64_t size;      /* of the file */
    Xxh64 hash;        /* of the bytes read so far, while they follow each other from the start */
    int64_t hashed_to; /* the end of those bytes */
    int out_of_order;  /* a read that did not start at hashed_to: hash is not the file's */
} CkptStateFile;

/* What the moments loader read of one train_state file. */
typedef struct {
    FileSum sum; /* its name and size, and its XXH64 where whole */
    int whole;   /* 1: every byte was read, in order, so that sum.xxh64 is the file's */
} CkptStateRead;

/* Feeds n bytes read at offset `at` of a file to its hash, when they follow the ones before. */
static inline void ckpt_hash_read_(CkptStateFile *file, int64_t at, const void *data, size_t n)
{
    if (file->out_of_order || at != file->hashed_to) {
        file->out_of_order = 1;
        return;
    }
    xxh64_update(&file->hash, data, n);
    file->hashed_to += (int64_t)n;
}

/* The header and range table of an open train_state file into *out (its
 * ranges allocated here); sizes are checked against the file's before they
 * allocate. */
static inline int ckpt_read_header_(FILE *f, const char *path, int64_t size, int64_t total, CkptStateFile *out,
                                    char *err, size_t errlen)
{
    unsigned char h[CKPT_STATE_HEADER_BYTES], entry[16];
    CheckpointState *st = &out->state;
    xxh64_init(&out->hash);
    out->size = size;
    if (size < CKPT_STATE_HEADER_BYTES || fread(h, 1, sizeof(h), f) != sizeof(h))
        return set_error(err, errlen, "'%s' is too short (%lld bytes) to be a train_state.bin", path, (long long)size);
    ckpt_hash_read_(out, 0, h, sizeof(h));
    if (memcmp(h, CKPT_STATE_MAGIC "\0", 8) != 0)
        return set_error(err, errlen, "'%s' is not a train_state.bin (bad magic)", path);
    uint32_t version = get_u32le(h + 8);
    if (version != 1 && version != CKPT_STATE_VERSION)
        return set_error(err, errlen, "'%s' has version %u, this build reads versions 1 to %d", path, version,
                         CKPT_STATE_VERSION);
    if (get_u32le(h + 12) != CKPT_STATE_HEADER_BYTES)
        return set_error(err, errlen, "'%s' has a header of %u bytes, expected %d (corrupt)", path, get_u32le(h + 12),
                         CKPT_STATE_HEADER_BYTES);
    st->step = get_u64le(h + 16);
    st->adam_step = get_u64le(h + 24);
    st->rng_state = get_u64le(h + 32);
    st->rank = (int32_t)get_u32le(h + 40);
    st->world = (int32_t)get_u32le(h + 44);
    int64_t file_total = (int64_t)get_u64le(h + 48);
    st->data.epoch = get_u64le(h + 72);
    st->data.shard = get_u64le(h + 80);
    st->data.window = get_u64le(h + 88);
    st->data.seed = get_u64le(h + 96);
    st->data.layout = get_u64le(h + 104);
    st->run_id = version >= 2 ? get_u64le(h + 112) : 0;
    if (file_total != total)
        return set_error(err, errlen, "'%s' holds optimizer state of %lld parameters, this model has %lld", path,
                         (long long)file_total, (long long)total);
    if (st->world < 1 || st->rank < 0 || st->rank >= st->world)
        return set_error(err, errlen, "'%s': rank %d of %d is impossible (corrupt)", path, st->rank, st->world);
    out->count = (int64_t)get_u64le(h + 64);
    if (version == 1) { /* one range, no table */
        out->n_ranges = 1;
        out->ranges = (CkptRange *)malloc_check(sizeof(CkptRange), "checkpoint ranges");
        out->ranges[0].offset = (int64_t)get_u64le(h + 56);
        out->ranges[0].count = out->count;
        out->data_at = CKPT_STATE_HEADER_BYTES;
        return 0;
    }
    out->n_ranges = (int64_t)get_u64le(h + 56);
    /* every range holds at least one of the total elements: more is corruption, and a table needs its bytes */
    if (out->n_ranges < 0 || out->n_ranges > total)
        return set_error(err, errlen, "'%s' claims %lld ranges of the %lld parameters (corrupt)", path,
                         (long long)out->n_ranges, (long long)total);
    if (out->n_ranges > (size - CKPT_STATE_HEADER_BYTES) / 16)
        return set_error(err, errlen,
                         "'%s' is %lld bytes, too short for its table of %lld ranges (truncated or "
                         "corrupt)",
                         path, (long long)size, (long long)out->n_ranges);
    out->ranges = (CkptRange *)malloc_check((size_t)(out->n_ranges > 0 ? out->n_ranges : 1) * sizeof(CkptRange),
                                            "checkpoint ranges");
    for (int64_t i = 0; i < out->n_ranges; i++) {
        if (fread(entry, 1, sizeof(entry), f) != sizeof(entry))
            return set_error(err, errlen, "'%s': short read of the range table", path);
        ckpt_hash_read_(out, CKPT_STATE_HEADER_BYTES + 16 * i, entry, sizeof(entry));
        out->ranges[i].offset = (int64_t)get_u64le(entry);
        out->ranges[i].count = (int64_t)get_u64le(entry + 8);
    }
    out->data_at = CKPT_STATE_HEADER_BYTES + 16 * out->n_ranges;
    return 0;
}

/* The ranges of a file read by ckpt_read_header_ against its moments count and size. */
static inline int ckpt_check_ranges_(const char *path, int64_t size, int64_t total, const CkptStateFile *in, char *err,
                                     size_t errlen)
{
    int64_t sum = 0;
    if (in->count < 0 || in->count > total)
        return set_error(err, errlen, "'%s' claims %lld moments of the %lld parameters (corrupt)", path,
                         (long long)in->count, (long long)total);
    for (int64_t i = 0; i < in->n_ranges; i++) {
        const CkptRange *r = &in->ranges[i];
        if (r->offset < 0 || r->count < 0 || r->offset > total || r->count > total - r->offset)
            return set_error(err, errlen,
                             "'%s': rank %d of %d, range [%lld, +%lld) of %lld parameters is impossible "
                             "(corrupt)",
                             path, in->state.rank, in->state.world, (long long)r->offset, (long long)r->count,
                             (long long)total);
        if (r->count > in->count - sum)
            return set_error(err, errlen, "'%s': its ranges hold more than the %lld moments of its header (corrupt)",
                             path, (long long)in->count);
        sum += r->count;
    }
    if (sum != in->count)
        return set_error(err, errlen, "'%s': its ranges hold %lld moments, its header says %lld (corrupt)", path,
                         (long long)sum, (long long)in->count);
    if (size != in->data_at + 8 * in->count)
        return set_error(err, errlen, "'%s' is %lld bytes, its header describes %lld (truncated or corrupt)", path,
                         (long long)size, (long long)(in->data_at + 8 * in->count));
    return 0;
}

/* Reads and checks the header and range table of the train_state file at path
 * (of version 1 or 2) into *out, whose ranges the caller frees. */
static inline int ckpt_read_state(const char *path, int64_t total, CkptStateFile *out, char *err, size_t errlen)
{
    int64_t size;
    memset(out, 0, sizeof(*out));
    FILE *f = open_regular_file(path, &size, err, errlen);
    if (!f)
        return -1;
    int rc = ckpt_read_header_(f, path, size, total, out, err, errlen);
    fclose(f);
    if (rc == 0)
        rc = ckpt_check_ranges_(path, size, total, out, err, errlen);
    if (rc != 0) {
        free(out->ranges);
        out->ranges = NULL;
    }
    return rc;
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

/* The train_state files of one checkpoint directory, as the moments loader reads them. */
typedef struct {
    const char *dir;
    int64_t total;
    int world;
    CkptStateFile *files; /* [world], rank order */
    int n_files, files_cap;
    CkptPiece *pieces; /* every file's non-empty ranges, by offset */
    int64_t n_pieces;
} CkptMomentsSource;

static inline void ckpt_moments_free_(CkptMomentsSource *src)
{
    for (int r = 0; r < src->n_files; r++)
        free(src->files[r].ranges);
    free(src->files);
    free(src->pieces);
}

/* Reads the headers of every rank's file: train_state.bin alone, or as many
 * per-rank files as rank 0's header says, all of one step. */
static inline int ckpt_moments_files_(CkptMomentsSource *src, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 64];
    src->world = 1;
    if (checkpoint_state_file_rank0(path, sizeof(path), src->dir)) {
        src->files = (CkptStateFile *)grow_array(src->files, 0, &src->files_cap, sizeof(CkptStateFile), path);
        if (ckpt_read_state(path, src->total, &src->files[0], err, errlen) != 0)
            return -1;
        src->n_files = 1;
        src->world = src->files[0].state.world;
        if (src->world < 2) /* a file of one rank of one is train_state.bin, which is not there */
            return set_error(err, errlen, "'%s' is named for one rank of several but says it is rank 0 of 1 (corrupt?)",
                             path);
    }
    for (int r = 0; r < src->world; r++) { /* grown as read: a corrupt world fails at its first missing file */
        checkpoint_state_file(path, sizeof(path), src->dir, r, src->world);
        if (r == src->n_files) { /* rank 0's file may have been read above */
            src->files =
                (CkptStateFile *)grow_array(src->files, src->n_files, &src->files_cap, sizeof(CkptStateFile), path);
            if (ckpt_read_state(path, src->total, &src->files[src->n_files], err, errlen) != 0)
                return -1;
            src->n_files++;
        }
        const CheckpointState *h = &src->files[r].state;
        if (h->rank != r || h->world != src->world)
            return set_error(err, errlen,
                             "'%s' is rank %d of %d; expected rank %d of %d (a checkpoint mixed from "
                             "several runs?)",
                             path, h->rank, h->world, r, src->world);
        if (h->step != src->files[0].state.step || h->run_id != src->files[0].state.run_id)
            return set_error(err, errlen,
                             "'%s' is of step %llu of run %016llx, rank 0's file of step %llu of run %016llx (a "
                             "checkpoint mixed from several runs?)",
                             path, (unsigned long long)h->step, (unsigned long long)h->run_id,
                             (unsigned long long)src->files[0].state.step,
                             (unsigned long long)src->files[0].state.run_id);
        src->n_pieces += src->files[r].n_ranges;
    }
    return 0;
}

/* Sorts every file's non-empty ranges by offset; they must tile [0, total). */
static inline int ckpt_moments_tile_(CkptMomentsSource *src, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 64], other[LLMC_PATH_MAX + 64];
    src->pieces = (CkptPiece *)malloc_check((size_t)(src->n_pieces > 0 ? src->n_pieces : 1) * sizeof(CkptPiece),
                                            "checkpoint ranges");
    src->n_pieces = 0;
    for (int r = 0; r < src->n_files; r++) {
        int64_t at = 0;
        for (int64_t i = 0; i < src->files[r].n_ranges; i++) {
            CkptPiece p = {src->files[r].ranges[i].offset, src->files[r].ranges[i].count, at, r};
            at += p.count;
            if (p.count > 0)
                src->pieces[src->n_pieces++] = p;
        }
    }
    qsort(src->pieces, (size_t)src->n_pieces, sizeof(CkptPiece), ckpt_piece_cmp);
    int64_t next = 0;
    for (int64_t k = 0; k < src->n_pieces; k++) {
        const CkptPiece *p = &src->pieces[k];
        if (p->offset < next) {
            checkpoint_state_file(path, sizeof(path), src->dir, p[-1].file, src->world);
            checkpoint_state_file(other, sizeof(other), src->dir, p->file, src->world);
            return set_error(err, errlen,
                             "the train_state files of '%s' overlap: '%s' holds [%lld, +%lld), '%s' holds "
                             "[%lld, +%lld) (a checkpoint mixed from several runs?)",
                             src->dir, path, (long long)p[-1].offset, (long long)p[-1].count, other,
                             (long long)p->offset, (long long)p->count);
        }
        if (p->offset > next)
            break;
        next = p->offset + p->count;
    }
    if (next != src->total)
        return set_error(err, errlen,
                         "the train_state files of '%s' leave a gap at element %lld of %lld parameters "
                         "(a rank's file is missing or from another run?)",
                         src->dir, (long long)next, (long long)src->total);
    return 0;
}

/* What each wanted range needs from which file: n_reads copies, sorted by file and place in it. */
static inline CkptRead *ckpt_moments_plan_(const CkptMomentsSource *src, const CkptRange *wanted, int n_wanted,
                                           int *n_reads)
{
    CkptRead *reads = NULL;
    int cap = 0;
    int64_t dst = 0;
    *n_reads = 0;
    for (int i = 0; i < n_wanted; i++) {
        int64_t lo = wanted[i].offset, hi = wanted[i].offset + wanted[i].count, first = 0, last = src->n_pieces;
        if (hi > src->total)
            hi = src->total;
        while (first < last) { /* the first piece that ends after lo */
            int64_t mid = first + (last - first) / 2;
            if (src->pieces[mid].offset + src->pieces[mid].count <= lo)
                first = mid + 1;
            else
                last = mid;
        }
        for (int64_t k = first; k < src->n_pieces && src->pieces[k].offset < hi; k++) {
            const CkptPiece *p = &src->pieces[k];
            int64_t a = p->offset > lo ? p->offset : lo, b = p->offset + p->count < hi ? p->offset + p->count : hi;
            reads = (CkptRead *)grow_array(reads, *n_reads, &cap, sizeof(CkptRead), src->dir);
            CkptRead r = {p->at + (a - p->offset), dst + (a - wanted[i].offset), b - a, p->file};
            reads[(*n_reads)++] = r;
        }
        dst += wanted[i].count;
    }
    qsort(reads, (size_t)*n_reads, sizeof(CkptRead), ckpt_read_cmp);
    return reads;
}

/* Carries out the reads, each file's in file order: all of m, then all of v;
 * each read feeds the file's hash (ckpt_hash_read_). */
static inline int ckpt_moments_read_(CkptMomentsSource *src, const CkptRead *reads, int n_reads, float *m, float *v,
                                     char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 64];
    for (int i = 0; i < n_reads;) {
        int r = reads[i].file, end = i;
        while (end < n_reads && reads[end].file == r)
            end++;
        checkpoint_state_file(path, sizeof(path), src->dir, r, src->world);
        FILE *f = fopen(path, "rb");
        if (!f)
            return set_error(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        int ok = 1;
        for (int which = 0; which < 2 && ok; which++) {
            for (int j = i; j < end && ok; j++) {
                const CkptRead *c = &reads[j];
                off_t at = (off_t)src->files[r].data_at + (off_t)(which * src->files[r].count + c->src) * 4;
                float *to = (which == 0 ? m : v) + c->dst;
                ok = fseeko(f, at, SEEK_SET) == 0 && fread(to, sizeof(float), (size_t)c->n, f) == (size_t)c->n;
                if (ok)
                    ckpt_hash_read_(&src->files[r], (int64_t)at, to, (size_t)c->n * sizeof(float));
            }
        }
        fclose(f);
        if (!ok)
            return set_error(err, errlen, "'%s': short read of the AdamW moments (truncated?)", path);
        i = end;
    }
    return 0;
}

/* The AdamW moments of wanted[n_wanted] (ranges of the flat buffers) into m and
 * v, each the sum of their counts, concatenated in wanted order, from the
 * train_state files of ckpt_dir, whatever world size and ranges wrote them: all
 * files' ranges together must tile [0, total). Wanted ranges may come in any
 * order and overlap; their elements at or past total are zero (ZeRO padding).
 * state receives rank 0's header (step, data position, RNG). *reads (NULL: not
 * wanted; else the caller frees it): what was read of each of the *n_reads
 * files, in rank order, with the checksum of those read whole (on success). */
static inline int checkpoint_load_moments_read_try(const char *ckpt_dir, int64_t total, const CkptRange *wanted,
                                                   int n_wanted, float *m, float *v, CheckpointState *state,
                                                   CkptStateRead **reads_out, int *n_reads_out, char *err,
                                                   size_t errlen)
{
    int64_t count = 0;
    if (n_wanted < 0 || (n_wanted > 0 && !wanted))
        return set_error(err, errlen, "loading the AdamW moments of '%s': %d wanted ranges is impossible", ckpt_dir,
                         n_wanted);
    for (int i = 0; i < n_wanted; i++) {
        if (wanted[i].offset < 0 || wanted[i].count < 0 || wanted[i].count > INT64_MAX - wanted[i].offset)
            return set_error(err, errlen,
                             "loading the AdamW moments of '%s': wanted range %d, [%lld, +%lld), is "
                             "impossible",
                             ckpt_dir, i, (long long)wanted[i].offset, (long long)wanted[i].count);
        count += wanted[i].count;
    }
    if (count > 0) {
        memset(m, 0, (size_t)count * sizeof(float));
        memset(v, 0, (size_t)count * sizeof(float));
    }
    CkptMomentsSource src;
    memset(&src, 0, sizeof(src));
    src.dir = ckpt_dir;
    src.total = total;
    int rc = ckpt_moments_files_(&src, err, errlen);
    if (rc == 0)
        rc = ckpt_moments_tile_(&src, err, errlen);
    if (rc == 0) {
        int n_reads;
        CkptRead *reads = ckpt_moments_plan_(&src, wanted, n_wanted, &n_reads);
        rc = ckpt_moments_read_(&src, reads, n_reads, m, v, err, errlen);
        free(reads);
        *state = src.files[0].state;
    }
    if (rc == 0 && reads_out) {
        *reads_out = (CkptStateRead *)calloc_check((size_t)src.n_files, sizeof(CkptStateRead), "checkpoint reads");
        *n_reads_out = src.n_files;
        for (int r = 0; r < src.n_files; r++) {
            CkptStateRead *out = &(*reads_out)[r];
            const CkptStateFile *file = &src.files[r];
            char path[LLMC_PATH_MAX + 64];
            checkpoint_state_file(path, sizeof(path), ckpt_dir, r, src.world);
            file_sum_name(&out->sum, path);
            out->sum.size = file->size;
            out->whole = !file->out_of_order && file->hashed_to == file->size;
            out->sum.xxh64 = out->whole ? xxh64_digest(&file->hash) : 0;
        }
    }
    ckpt_moments_free_(&src);
    return rc;
}

/* checkpoint_load_moments_read_try without the checksums */
static inline int checkpoint_load_moments_try(const char *ckpt_dir, int64_t total, const CkptRange *wanted,
                                              int n_wanted, float *m, float *v, CheckpointState *state, char *err,
                                              size_t errlen)
{
    return checkpoint_load_moments_read_try(ckpt_dir, total, wanted, n_wanted, m, v, state, NULL, NULL, err, errlen);
}

#endif /* LLMC_TRAIN_STATE_H */
