/*
 * checkpoint.h: save and resume training: checkpoint directories, written
 * atomically, found and pruned.
 *
 * A checkpoint is a directory <dir>/step_<08d>/ (step = optimizer steps done):
 *   model.safetensors  the fp32 weights, HF names (safetensors.h); loads with
 *                      LlamaForCausalLM.from_pretrained(<dir>/step_<08d>)
 *   config.json        HF LlamaConfig of the model (hf_config.h), and
 *   generation_config.json, tokenizer.model: the rest of an HF model
 *                      directory (hf_model.h), so --init-from takes a checkpoint
 *   train_state.bin    step, AdamW step and moments, data position, RNG, or
 *                      one train_state.<rank>.bin per rank (train_state.h)
 *   COMPLETE           marker: the checkpoint is whole, and its manifest:
 *       step 6
 *       run 0123456789abcdef
 *       xxh64 <16 hex digits> <bytes> <name>   one line per other file, by name
 *       end xxh64 <16 hex digits>               of every byte above this line
 *                      (XXH64, fileutil.h: xxh64sum prints the same hashes).
 *
 * Checksums: each file's XXH64 is computed as it is written (the weights and
 * the optimizer state hashed from the very bytes that go to fwrite; the small
 * files that hf_model.h writes, config.json, generation_config.json and the
 * tokenizer's, read back once, at the commit). With several processes each
 * rank that writes a train_state.<rank>.bin writes its line beside it, in
 * train_state.<rank>.bin.xxh64; the commit (rank 0) gathers those lines into
 * the manifest and removes them. A resume checks every file against the
 * manifest as it reads it (the weights: their header read again, the data
 * hashed in memory once loaded; config.json and each train_state file hashed as
 * read), and the rank 0 train state's run id against the manifest's; what the
 * loader does not read whole (the tokenizer, generation_config.json, the state
 * files that another world size reads in parts) is read once to hash, by one
 * rank. --init-from a checkpoint directory checks all but the optimizer state.
 * A file that differs is refused naming it, the hash and size expected and
 * found. A COMPLETE without checksums ("step N" alone, from a build before
 * them) is accepted with a warning: nothing can be checked.
 *
 * Atomicity: everything is written into <dir>/step_<08d>.tmp/ (the staging
 * directory, one name that every rank of a multi-process save can find), each file
 * fsync'ed, the directory renamed to step_<08d>/ (an existing one of that step
 * is moved aside first), then COMPLETE written under a temporary name, fsync'ed
 * and renamed into place, and the directory fsync'ed. A checkpoint without
 * COMPLETE (a write killed midway) is ignored by checkpoint_find_latest; the
 * next save removes it and every leftover *.tmp* directory (never a complete
 * checkpoint), then keeps only the newest K complete checkpoints (K = 0: all)
 * of the run that saves (its run id, train_state.h): another run's are left.
 *
 * Loading validates everything against the model built from the run's flags:
 * config.json's fields that change the model (the shape, rms_norm_eps, the rope
 * theta and scaling, max_position_embeddings: hf_config_check_try), the weights
 * (safetensors.h) and the optimizer state (train_state.h).
 *
 * The *_try functions return 0, or -1 with a message naming the file in err;
 * the plain ones print it and exit(1). Plain C (POSIX); compiles as C++ too.
 */
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/common/fileutil.h"
#include "llmc/formats/hf_config.h"
#include "llmc/formats/hf_model.h"
#include "llmc/model/llama_config.h"
#include "llmc/formats/safetensors.h"
#include "llmc/formats/train_state.h"
#include "llmc/common/utils.h"
#include "llmc/model/param_layout.h"

/* Whether a run saves after completing steps_done of total_steps: every save_every
 * steps (0: never) and at the end. */
static inline int checkpoint_due(int steps_done, int save_every, int total_steps)
{
    return (save_every > 0 && steps_done % save_every == 0) || steps_done == total_steps;
}

/* ---- the manifest (COMPLETE) ---- */

#define CKPT_MANIFEST_MAX_BYTES ((size_t)64 << 20)
#define CKPT_SUM_SUFFIX ".xxh64" /* a rank's train_state.<rank>.bin.xxh64 until the commit */
#define CKPT_OLDER_HINT                                                                                                \
    "use an older checkpoint (--resume takes the one before once this one is moved out of --checkpoint-dir)"

typedef struct {
    int has_sums; /* 0: a COMPLETE of a build before checksums ("step N" alone): nothing to check */
    uint64_t step, run_id;
    FileSum *files;
    unsigned char *checked; /* per file: checked against the file on disk */
    int n, cap;
} CkptManifest;

static inline void ckpt_manifest_init(CkptManifest *man, uint64_t step, uint64_t run_id)
{
    memset(man, 0, sizeof(*man));
    man->has_sums = 1;
    man->step = step;
    man->run_id = run_id;
}

static inline void checkpoint_manifest_free(CkptManifest *man)
{
    free(man->files);
    free(man->checked);
    memset(man, 0, sizeof(*man));
}

/* The index of the file named name, or -1. */
static inline int ckpt_manifest_find(const CkptManifest *man, const char *name)
{
    for (int i = 0; i < man->n; i++) {
        if (strcmp(man->files[i].name, name) == 0)
            return i;
    }
    return -1;
}

static inline void ckpt_manifest_add(CkptManifest *man, const FileSum *sum)
{
    int at = ckpt_manifest_find(man, sum->name);
    if (at < 0) {
        if (man->n == man->cap) {
            man->cap = man->cap ? 2 * man->cap : 16;
            man->files = (FileSum *)realloc(man->files, (size_t)man->cap * sizeof(FileSum));
            man->checked = (unsigned char *)realloc(man->checked, (size_t)man->cap);
            if (!man->files || !man->checked)
                FAIL("out of host memory growing a checkpoint manifest");
        }
        at = man->n++;
    }
    man->files[at] = *sum;
    man->checked[at] = 0;
}

/* A file name of a checkpoint directory: plain, printable, no space. */
static inline int ckpt_plain_name_(const char *name)
{
    if (!name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return 0;
    for (const char *p = name; *p; p++) {
        if (*p == '/' || (unsigned char)*p <= ' ' || (unsigned char)*p == 0x7f)
            return 0;
    }
    return 1;
}

/* exactly 16 lowercase hex digits at p, into *out */
static inline int ckpt_parse_hex16_(const char *p, uint64_t *out)
{
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* The decimal digits at *p (at least one, at most INT64_MAX) into *out, *p moved past them. */
static inline int ckpt_parse_decimal_(const char **p, int64_t *out)
{
    int64_t v = 0;
    const char *s = *p;
    if (*s < '0' || *s > '9')
        return -1;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    *p = s;
    *out = v;
    return 0;
}

/* One line "xxh64 <16 hex> <bytes> <name>" (without its newline) into *sum. */
static inline int ckpt_parse_sum_line_(const char *line, FileSum *sum)
{
    if (strncmp(line, "xxh64 ", 6) != 0 || ckpt_parse_hex16_(line + 6, &sum->xxh64) != 0 || line[22] != ' ')
        return -1;
    const char *p = line + 23;
    if (ckpt_parse_decimal_(&p, &sum->size) != 0 || *p != ' ' || strlen(p + 1) >= sizeof(sum->name) ||
        !ckpt_plain_name_(p + 1))
        return -1;
    memcpy(sum->name, p + 1, strlen(p + 1) + 1);
    return 0;
}

static inline int ckpt_sum_line_(char *out, size_t n, const FileSum *sum)
{
    return snprintf(out, n, "xxh64 %016llx %lld %s\n", (unsigned long long)sum->xxh64, (long long)sum->size, sum->name);
}

static inline int ckpt_sum_by_name_(const void *a, const void *b)
{
    return strcmp(((const FileSum *)a)->name, ((const FileSum *)b)->name);
}

/* The manifest as COMPLETE holds it (see the top), its files sorted by name;
 * the caller frees it. */
static inline char *ckpt_manifest_text(CkptManifest *man, size_t *len)
{
    qsort(man->files, (size_t)man->n, sizeof(FileSum), ckpt_sum_by_name_);
    size_t cap = 128 + (size_t)man->n * (sizeof(man->files[0].name) + 64), at = 0;
    char *text = (char *)malloc_check(cap, "checkpoint manifest");
    at += (size_t)snprintf(text + at, cap - at, "step %llu\nrun %016llx\n", (unsigned long long)man->step,
                           (unsigned long long)man->run_id);
    for (int i = 0; i < man->n; i++)
        at += (size_t)ckpt_sum_line_(text + at, cap - at, &man->files[i]);
    uint64_t end = xxh64(text, at);
    at += (size_t)snprintf(text + at, cap - at, "end xxh64 %016llx\n", (unsigned long long)end);
    *len = at;
    return text;
}

/* The manifest of COMPLETE's text[0..len) (path names it in errors): an older
 * build's "step N" (or nothing) gives has_sums 0; anything else must be a whole,
 * unchanged manifest. */
static inline int ckpt_manifest_parse_try(const char *path, const char *text, size_t len, CkptManifest *man, char *err,
                                          size_t errlen)
{
    ckpt_manifest_init(man, 0, 0);
    char line[512];
    const char *why = NULL;
    int n_lines = 0;
    size_t at = 0;
    for (; at < len && !why; n_lines++) {
        const char *nl = (const char *)memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - at;
        if (n >= sizeof(line) || memchr(text + at, '\0', n)) {
            why = "a line too long or holding a NUL";
            continue;
        }
        memcpy(line, text + at, n);
        line[n] = '\0';
        size_t line_at = at;
        at = nl ? end + 1 : len;
        const char *p = line + 5;
        int64_t step = 0;
        FileSum sum;
        uint64_t end_hash;
        if (n_lines == 0) {
            if (strncmp(line, "step ", 5) != 0 || ckpt_parse_decimal_(&p, &step) != 0 || *p != '\0')
                why = "its first line is not \"step N\"";
            man->step = (uint64_t)step;
            if (at == len && !why) { /* "step N" alone: a checkpoint of a build before checksums */
                man->has_sums = 0;
                return 0;
            }
        } else if (n_lines == 1) {
            if (strncmp(line, "run ", 4) != 0 || strlen(line) != 20 || ckpt_parse_hex16_(line + 4, &man->run_id) != 0)
                why = "its second line is not \"run <16 hex digits>\"";
        } else if (strncmp(line, "end ", 4) == 0) {
            if (strncmp(line, "end xxh64 ", 10) != 0 || strlen(line) != 26 || ckpt_parse_hex16_(line + 10, &end_hash))
                why = "its last line is not \"end xxh64 <16 hex digits>\"";
            else if (!nl || at != len)
                why = "there is more after its \"end\" line";
            else if (xxh64(text, line_at) != end_hash)
                why = "its lines do not match their checksum on the \"end\" line";
            else
                return 0;
        } else if (ckpt_parse_sum_line_(line, &sum) != 0) {
            why = "a line is not \"xxh64 <16 hex digits> <bytes> <file name>\"";
        } else if (ckpt_manifest_find(man, sum.name) >= 0) {
            why = "it names a file twice";
        } else {
            ckpt_manifest_add(man, &sum);
        }
    }
    if (len == 0) { /* an empty marker (made by hand, or by a build before markers held the step) */
        man->has_sums = 0;
        return 0;
    }
    checkpoint_manifest_free(man);
    return set_error(err, errlen,
                     "the checkpoint's manifest '%s' is corrupt (line %d: %s; truncated or edited)\n"
                     "  hint: the file changed since it was saved; restore it, or " CKPT_OLDER_HINT,
                     path, n_lines, why ? why : "it ends without its \"end\" line");
}

/* The manifest of checkpoint directory ckpt_dir, from its COMPLETE. */
static inline int checkpoint_manifest_read_try(const char *ckpt_dir, CkptManifest *man, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 64], *text;
    size_t len = 0;
    memset(man, 0, sizeof(*man));
    path_format(path, sizeof(path), "%s/COMPLETE", ckpt_dir);
    if (read_file_hashed_try(path, CKPT_MANIFEST_MAX_BYTES, &text, &len, NULL, err, errlen) != 0)
        return -1;
    int rc = ckpt_manifest_parse_try(path, text, len, man, err, errlen);
    free(text);
    return rc;
}

/* Checks got (a file of ckpt_dir as read) against the manifest and marks it checked. */
static inline int checkpoint_check_sum_try(const char *ckpt_dir, CkptManifest *man, const FileSum *got, char *err,
                                           size_t errlen)
{
    const char *hint = "  hint: the file changed since it was saved (a disk error, an edit, or a file copied from "
                       "another checkpoint); restore it, or " CKPT_OLDER_HINT;
    int at = ckpt_manifest_find(man, got->name);
    if (at < 0)
        return set_error(err, errlen,
                         "'%s/%s' is not in the checkpoint's manifest '%s/COMPLETE' (a file added after the save?)\n%s",
                         ckpt_dir, got->name, ckpt_dir, hint);
    const FileSum *want = &man->files[at];
    if (want->size != got->size)
        return set_error(err, errlen,
                         "'%s/%s' does not match the checkpoint's manifest '%s/COMPLETE': expected %lld bytes of "
                         "xxh64 %016llx, found %lld bytes\n%s",
                         ckpt_dir, got->name, ckpt_dir, (long long)want->size, (unsigned long long)want->xxh64,
                         (long long)got->size, hint);
    if (want->xxh64 != got->xxh64)
        return set_error(err, errlen,
                         "'%s/%s' does not match the checkpoint's manifest '%s/COMPLETE': expected xxh64 %016llx, "
                         "found xxh64 %016llx (%lld bytes)\n%s",
                         ckpt_dir, got->name, ckpt_dir, (unsigned long long)want->xxh64, (unsigned long long)got->xxh64,
                         (long long)got->size, hint);
    man->checked[at] = 1;
    return 0;
}

/* Which rank of `world` reads file name whole to check it when no loader did:
 * train_state.<r>.bin rank r % world (which read it whole when the world and
 * sharding are the saved ones), every other file rank 0. */
static inline int ckpt_checking_rank_(const char *name, int world)
{
    const char *p = name + 12;
    long r = 0;
    if (strncmp(name, "train_state.", 12) != 0 || *p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9' && r < 1000000000L; p++)
        r = r * 10 + (*p - '0');
    return strcmp(p, ".bin") == 0 ? (int)(r % world) : 0;
}

static inline int ckpt_is_state_file_(const char *name)
{
    return strncmp(name, "train_state.", 12) == 0;
}

/* The files of the manifest that nobody checked while loading, of those that
 * rank `rank` of `world` checks (ckpt_checking_rank_), each read whole to
 * hash; with_state 0 leaves out the optimizer state (--init-from). */
static inline int checkpoint_check_rest_try(const char *ckpt_dir, CkptManifest *man, int rank, int world,
                                            int with_state, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 300];
    for (int i = 0; i < man->n; i++) {
        const char *name = man->files[i].name;
        if (man->checked[i] || ckpt_checking_rank_(name, world) != rank || (!with_state && ckpt_is_state_file_(name)))
            continue;
        FileSum got;
        path_format(path, sizeof(path), "%s/%s", ckpt_dir, name);
        if (!path_exists(path))
            return set_error(
                err, errlen,
                "'%s' is in the checkpoint's manifest but missing\n  hint: restore it, or " CKPT_OLDER_HINT, path);
        if (file_xxh64_try(path, &got, err, errlen) != 0 || checkpoint_check_sum_try(ckpt_dir, man, &got, err, errlen))
            return -1;
    }
    return 0;
}

/* After the optimizer state of ckpt_dir was loaded (reads: what
 * checkpoint_load_moments_read_try read of each file; state: rank 0's header):
 * its run id is the manifest's, every file read is in the manifest and those
 * read whole match it; then the rest (checkpoint_check_rest_try) that rank
 * `rank` of `world` checks. Nothing to do for a manifest without checksums. */
static inline int checkpoint_verify_try(const char *ckpt_dir, CkptManifest *man, const CheckpointState *state,
                                        const CkptStateRead *reads, int n_reads, int rank, int world, char *err,
                                        size_t errlen)
{
    if (!man->has_sums)
        return 0;
    if (n_reads > 0 && state->run_id != man->run_id)
        return set_error(
            err, errlen,
            "'%s/%s' belongs to run %016llx, but the checkpoint's manifest '%s/COMPLETE' is of run %016llx "
            "(a file copied from another run's checkpoint of the same step?)\n  hint: restore this run's "
            "file, or " CKPT_OLDER_HINT,
            ckpt_dir, reads[0].sum.name, (unsigned long long)state->run_id, ckpt_dir, (unsigned long long)man->run_id);
    for (int i = 0; i < n_reads; i++) {
        if (reads[i].whole && checkpoint_check_sum_try(ckpt_dir, man, &reads[i].sum, err, errlen) != 0)
            return -1;
        if (!reads[i].whole && ckpt_manifest_find(man, reads[i].sum.name) < 0)
            return checkpoint_check_sum_try(ckpt_dir, man, &reads[i].sum, err, errlen); /* names it: not listed */
    }
    return checkpoint_check_rest_try(ckpt_dir, man, rank, world, 1, err, errlen);
}

/* The checksum of model.safetensors as safetensors_write_params_try writes it
 * (fp32, in layout order): its header, read again (small), then the data,
 * hashed from params (layout->total floats) - the bytes that were written, or
 * that the loader read - so that the data is never read twice. *sum gets the
 * file's size and that hash, which is the file's when its header is the one
 * saved (a changed header changes the hash). must_fit: the file must be the
 * header and the data, nothing else (when it was just written). */
static inline int ckpt_weights_sum_try(const char *path, const ParamLayout *layout, const float *params, int must_fit,
                                       FileSum *sum, char *err, size_t errlen)
{
    unsigned char n8[8];
    FILE *f = open_regular_file(path, &sum->size, err, errlen);
    if (!f)
        return -1;
    file_sum_name(sum, path);
    uint64_t hlen = sum->size >= 8 && fread(n8, 1, 8, f) == 8 ? get_u64le(n8) : 0;
    if (hlen < 2 || hlen > SAFETENSORS_MAX_HEADER || (int64_t)hlen > sum->size - 8) {
        fclose(f);
        return set_error(err, errlen, "'%s': bad safetensors header length %llu for a file of %lld bytes", path,
                         (unsigned long long)hlen, (long long)sum->size);
    }
    if (must_fit && sum->size != 8 + (int64_t)hlen + layout->total * (int64_t)sizeof(float)) {
        fclose(f);
        return set_error(err, errlen, "'%s' is %lld bytes, not a header of %llu and %lld fp32 weights", path,
                         (long long)sum->size, (unsigned long long)hlen, (long long)layout->total);
    }
    char *header = (char *)malloc_check((size_t)hlen, "safetensors header");
    int ok = fread(header, 1, (size_t)hlen, f) == (size_t)hlen;
    fclose(f);
    if (ok) {
        Xxh64 h;
        xxh64_init(&h);
        xxh64_update(&h, n8, 8);
        xxh64_update(&h, header, (size_t)hlen);
        xxh64_update(&h, params, (size_t)layout->total * sizeof(float));
        sum->xxh64 = xxh64_digest(&h);
    }
    free(header);
    return ok ? 0 : set_error(err, errlen, "'%s': short read of the safetensors header", path);
}

/* A rank's checksum line beside its file in the staging directory
 * (<name>.xxh64), for the commit to gather. */
static inline int checkpoint_write_sum_try(const char *staging, const FileSum *sum, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 300], line[400];
    path_format(path, sizeof(path), "%s/%s" CKPT_SUM_SUFFIX, staging, sum->name);
    int n = ckpt_sum_line_(line, sizeof(line), sum);
    return write_file_synced(path, line, (size_t)n, err, errlen);
}

/* The manifest's files from the staging directory: first the ranks' .xxh64
 * lines (which are then removed), then every other file that has no checksum
 * yet, read to hash (the small files hf_model.h writes); every file of the
 * manifest must be there. */
static inline int ckpt_gather_sums_(const char *staging, CkptManifest *man, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 300], *text;
    size_t len = 0, suffix = strlen(CKPT_SUM_SUFFIX);
    for (int pass = 0; pass < 2; pass++) {
        DIR *d = opendir(staging);
        if (!d)
            return set_error(err, errlen, "cannot list '%s': %s", staging, strerror(errno));
        struct dirent *e;
        int rc = 0;
        while (rc == 0 && (e = readdir(d)) != NULL) {
            const char *name = e->d_name;
            size_t n = strlen(name);
            int is_sum = n > suffix && strcmp(name + n - suffix, CKPT_SUM_SUFFIX) == 0;
            FileSum sum;
            path_format(path, sizeof(path), "%s/%s", staging, name);
            if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || is_sum != (pass == 0))
                continue;
            if (is_sum) {
                rc = read_file_hashed_try(path, 4096, &text, &len, NULL, err, errlen);
                if (rc == 0) {
                    if (len > 0 && text[len - 1] == '\n')
                        text[len - 1] = '\0';
                    if (strlen(text) != len - 1 || ckpt_parse_sum_line_(text, &sum) != 0 ||
                        strlen(sum.name) != n - suffix || strncmp(sum.name, name, n - suffix) != 0)
                        rc = set_error(err, errlen, "'%s' is not the checksum line of '%.*s'", path, (int)(n - suffix),
                                       name);
                    free(text);
                }
                if (rc == 0) {
                    ckpt_manifest_add(man, &sum);
                    unlink(path);
                }
            } else if (ckpt_manifest_find(man, name) < 0 && ckpt_plain_name_(name)) {
                rc = file_xxh64_try(path, &sum, err, errlen);
                if (rc == 0)
                    ckpt_manifest_add(man, &sum);
            }
        }
        closedir(d);
        if (rc != 0)
            return -1;
    }
    for (int i = 0; i < man->n; i++) {
        path_format(path, sizeof(path), "%s/%s", staging, man->files[i].name);
        if (!path_exists(path))
            return set_error(err, errlen, "'%s' has a checksum but was not written", path);
    }
    return 0;
}

/* step if name is exactly "step_" followed by digits, else -1 */
static inline int64_t ckpt_parse_step_name(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || name[5] == '\0')
        return -1;
    int64_t step = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || step > INT64_MAX / 10 - 10)
            return -1;
        step = step * 10 + (*p - '0');
    }
    return step;
}

static inline int ckpt_is_complete(const char *dir, const char *name)
{
    char buf[LLMC_PATH_MAX];
    path_format(buf, sizeof(buf), "%s/%s/COMPLETE", dir, name);
    return path_exists(buf);
}

/* Removes leftover *.tmp* directories and step dirs without COMPLETE, then all
 * but the newest keep complete checkpoints of run run_id (keep <= 0: all). A
 * checkpoint whose state names another run is neither counted nor removed; one
 * without a run id (an older build's) counts as this run's. */
static inline void ckpt_cleanup(const char *dir, int keep, uint64_t run_id)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    char buf[LLMC_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step_", 5) != 0)
            continue;
        path_format(buf, sizeof(buf), "%s/%s", dir, e->d_name);
        int64_t step = ckpt_parse_step_name(e->d_name);
        if (step < 0) {
            if (strstr(e->d_name, ".tmp") && !ckpt_is_complete(dir, e->d_name))
                remove_flat_dir(buf);
            continue;
        }
        if (!ckpt_is_complete(dir, e->d_name)) {
            remove_flat_dir(buf);
            continue;
        }
        uint64_t owner = checkpoint_run_id(buf);
        if (owner != 0 && run_id != 0 && owner != run_id)
            continue;
        steps = (int64_t *)grow_array(steps, n, &cap, sizeof(int64_t), dir);
        steps[n++] = step;
    }
    closedir(d);
    if (keep > 0 && n > keep) {
        /* sort descending, remove the tail */
        for (int i = 1; i < n; i++) {
            int64_t v = steps[i];
            int j = i;
            for (; j > 0 && steps[j - 1] < v; j--)
                steps[j] = steps[j - 1];
            steps[j] = v;
        }
        for (int i = keep; i < n; i++) {
            path_format(buf, sizeof(buf), "%s/step_%08lld/COMPLETE", dir, (long long)steps[i]);
            unlink(buf); /* incomplete first, so a crash midway leaves nothing that looks whole */
            path_format(buf, sizeof(buf), "%s/step_%08lld", dir, (long long)steps[i]);
            remove_flat_dir(buf);
        }
    }
    free(steps);
}

/* Where a save of `step` writes before it is committed: <dir>/step_<08d>.tmp. */
static inline void checkpoint_staging_path(char *out, size_t n, const char *dir, uint64_t step)
{
    path_format(out, n, "%s/step_%08llu.tmp", dir, (unsigned long long)step);
}

/* Step 1 of a save: creates <dir>/step_<08d>.tmp/ (removing a stale one), whose
 * path goes to staging. In a multi-process save one process does this, then all
 * write their files into it (checkpoint_write_*_try), then one commits. */
static inline int checkpoint_stage_try(const char *dir, uint64_t step, char *staging, size_t staging_len, char *err,
                                       size_t errlen)
{
    if (make_dirs(dir) != 0) {
        return set_error(err, errlen, "cannot create checkpoint directory '%s': %s", dir, strerror(errno));
    }
    checkpoint_staging_path(staging, staging_len, dir, step);
    if (path_exists(staging))
        remove_flat_dir(staging);
    if (mkdir(staging, 0755) != 0) {
        return set_error(err, errlen, "cannot create '%s': %s", staging, strerror(errno));
    }
    return 0;
}

/* The model's files into the staging directory: an HF model directory
 * (hf_model.h) with the fp32 weights, params (layout->total floats), so that
 * resuming is exact. *weights_sum: the checksum of model.safetensors
 * (ckpt_weights_sum_try); the commit hashes the other, small files. */
static inline int checkpoint_write_model_try(const char *staging, uint64_t step, const LlamaConfig *config,
                                             const ParamLayout *layout, const float *params, const HfExtras *extras,
                                             FileSum *weights_sum, char *err, size_t errlen)
{
    char path[LLMC_PATH_MAX + 64];
    if (hf_model_write_try(staging, config, layout, params, 0, (int64_t)step, extras, err, errlen) != 0)
        return -1;
    path_format(path, sizeof(path), "%s/model.safetensors", staging);
    return ckpt_weights_sum_try(path, layout, params, 1, weights_sum, err, errlen);
}

/* This process's train_state file into the staging directory: the moments of
 * ranges[n_ranges] of the flat AdamW buffers (of total elements), which must lie
 * in [0, total), ascend and not overlap; adam_m and adam_v each hold the sum of
 * their counts, the ranges' moments concatenated in range order (NULL: zeros,
 * before the first AdamW step). Empty ranges are dropped and adjacent ones
 * merged. No range at all is a valid file (a rank that owns nothing). The file
 * is train_state.bin for world 1, else train_state.<rank>.bin. *sum (NULL:
 * none): its checksum, of the bytes as written. */
static inline int checkpoint_write_state_try(const char *staging, const CheckpointState *state, int64_t total,
                                             const CkptRange *ranges, int n_ranges, const float *adam_m,
                                             const float *adam_v, FileSum *sum, char *err, size_t errlen)
{
    char file[LLMC_PATH_MAX + 64];
    CkptRange *merged;
    int n = 0, rc;
    checkpoint_state_file(file, sizeof(file), staging, state->rank, state->world);
    if (state->world < 1 || state->rank < 0 || state->rank >= state->world) {
        return set_error(err, errlen, "'%s': rank %d of %d is impossible", file, state->rank, state->world);
    }
    if (total < 0 || n_ranges < 0 || (n_ranges > 0 && !ranges)) {
        return set_error(err, errlen, "'%s': %d ranges of %lld parameters is impossible", file, n_ranges,
                         (long long)total);
    }
    merged = (CkptRange *)malloc_check((size_t)(n_ranges > 0 ? n_ranges : 1) * sizeof(CkptRange), "checkpoint ranges");
    rc = ckpt_merge_ranges(file, ranges, n_ranges, total, merged, &n, err, errlen);
    if (rc == 0)
        rc = ckpt_write_state(file, state, total, merged, n, adam_m, adam_v, sum, err, errlen);
    free(merged);
    return rc;
}

/* Last step of a save, once every file is in the staging directory: the
 * manifest from sums[n_sums] (the checksums the caller computed while writing),
 * the ranks' .xxh64 lines and a hash of each other file (ckpt_gather_sums_),
 * fsync, rename to <dir>/step_<08d>/, COMPLETE (the manifest) written last,
 * then keep the newest `keep` complete checkpoints of run run_id (0: all).
 * out_path (may be NULL) receives the directory. */
static inline int checkpoint_commit_try(const char *dir, uint64_t step, uint64_t run_id, int keep, const FileSum *sums,
                                        int n_sums, char *out_path, size_t out_len, char *err, size_t errlen)
{
    char staging[LLMC_PATH_MAX], final_dir[LLMC_PATH_MAX], file[LLMC_PATH_MAX + 64], aside[LLMC_PATH_MAX + 64];
    char marker_tmp[LLMC_PATH_MAX + 64];
    path_format(final_dir, sizeof(final_dir), "%s/step_%08llu", dir, (unsigned long long)step);
    checkpoint_staging_path(staging, sizeof(staging), dir, step);
    CkptManifest man;
    ckpt_manifest_init(&man, step, run_id);
    for (int i = 0; i < n_sums; i++)
        ckpt_manifest_add(&man, &sums[i]);
    if (ckpt_gather_sums_(staging, &man, err, errlen) != 0) {
        checkpoint_manifest_free(&man);
        return -1;
    }
    size_t marker_len;
    char *marker = ckpt_manifest_text(&man, &marker_len);
    checkpoint_manifest_free(&man);
    fsync_path(staging);
    if (path_exists(final_dir)) { /* the same step saved before: move it aside, the cleanup removes it */
        path_format(aside, sizeof(aside), "%s.tmp%ld.old", final_dir, (long)getpid());
        path_format(file, sizeof(file), "%s/COMPLETE", final_dir);
        unlink(file);
        if (rename(final_dir, aside) != 0) {
            free(marker);
            return set_error(err, errlen, "cannot move the old '%s' aside: %s", final_dir, strerror(errno));
        }
    }
    if (rename(staging, final_dir) != 0) {
        free(marker);
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", staging, final_dir, strerror(errno));
    }
    fsync_path(dir);
    path_format(marker_tmp, sizeof(marker_tmp), "%s/COMPLETE.tmp", final_dir);
    path_format(file, sizeof(file), "%s/COMPLETE", final_dir);
    int rc = write_file_synced(marker_tmp, marker, marker_len, err, errlen);
    free(marker);
    if (rc != 0)
        return -1;
    if (rename(marker_tmp, file) != 0) {
        return set_error(err, errlen, "cannot rename '%s' to '%s': %s", marker_tmp, file, strerror(errno));
    }
    fsync_path(final_dir);
    ckpt_cleanup(dir, keep, run_id);
    if (out_path)
        path_format(out_path, out_len, "%s", final_dir);
    return 0;
}

/* A whole single-process save: <dir>/step_<08d>/ written atomically (see the top
 * of this file). params and adam_m/adam_v hold layout->total floats; adam_m/adam_v
 * may be NULL before the first AdamW step (written as zeros). */
static inline int checkpoint_save_try(const char *dir, const LlamaConfig *config, const ParamLayout *layout,
                                      const float *params, const float *adam_m, const float *adam_v,
                                      const HfExtras *extras, const CheckpointState *state, int keep, char *out_path,
                                      size_t out_len, char *err, size_t errlen)
{
    char staging[LLMC_PATH_MAX];
    if (checkpoint_stage_try(dir, state->step, staging, sizeof(staging), err, errlen) != 0)
        return -1;
    CkptRange all = {0, layout->total};
    FileSum sums[2];
    if (checkpoint_write_model_try(staging, state->step, config, layout, params, extras, &sums[0], err, errlen) != 0 ||
        checkpoint_write_state_try(staging, state, layout->total, &all, 1, adam_m, adam_v, &sums[1], err, errlen) !=
            0 ||
        checkpoint_commit_try(dir, state->step, state->run_id, keep, sums, 2, out_path, out_len, err, errlen) != 0) {
        if (path_exists(staging)) /* a failed save leaves no staging directory behind */
            remove_flat_dir(staging);
        return -1;
    }
    return 0;
}

static inline void checkpoint_save(const char *dir, const LlamaConfig *config, const ParamLayout *layout,
                                   const float *params, const float *adam_m, const float *adam_v,
                                   const HfExtras *extras, const CheckpointState *state, int keep, char *out_path,
                                   size_t out_len)
{
    char err[2048];
    if (checkpoint_save_try(dir, config, layout, params, adam_m, adam_v, extras, state, keep, out_path, out_len, err,
                            sizeof(err)) != 0) {
        FAIL("saving a checkpoint: %s", err);
    }
}

/* 0 and the newest complete checkpoint's directory in out_path, or -1 if dir
 * holds none (or does not exist). */
static inline int checkpoint_find_latest(const char *dir, char *out_path, size_t out_len)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step = ckpt_parse_step_name(e->d_name);
        if (step > best && ckpt_is_complete(dir, e->d_name))
            best = step;
    }
    closedir(d);
    if (best < 0)
        return -1;
    path_format(out_path, out_len, "%s/step_%08lld", dir, (long long)best);
    return 0;
}

/* The files of one checkpoint belong together: the step of the directory's
 * name, of its COMPLETE marker, of the train state and (where it names one) of
 * the weights' metadata are the same. Checkpoints mixed by hand, or renamed, are
 * refused: a resume would take up another point of the run, and --keep could
 * then delete newer checkpoints. */
static inline int checkpoint_check_step_try(const char *ckpt_dir, uint64_t state_step, int64_t weights_step, char *err,
                                            size_t errlen)
{
    const char *slash = strrchr(ckpt_dir, '/');
    int64_t named = ckpt_parse_step_name(slash ? slash + 1 : ckpt_dir);
    char path[LLMC_PATH_MAX + 64], marker[64] = "";
    path_format(path, sizeof(path), "%s/COMPLETE", ckpt_dir);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(marker, 1, sizeof(marker) - 1, f) : 0;
    if (f)
        fclose(f);
    marker[got] = '\0';
    marker[strcspn(marker, "\n")] = '\0'; /* the first line: the manifest goes on with the files */
    unsigned long long complete = 0;
    int has_marker_step = sscanf(marker, "step %llu", &complete) == 1;
    if ((named >= 0 && (uint64_t)named != state_step) || (has_marker_step && complete != state_step) ||
        (weights_step >= 0 && (uint64_t)weights_step != state_step))
        return set_error(err, errlen,
                         "'%s' mixes steps: its name says %lld, COMPLETE %s, the train state %llu and the weights %lld "
                         "(a checkpoint put together from several, or renamed)\n  hint: resume from an untouched "
                         "checkpoint directory",
                         ckpt_dir, (long long)named, has_marker_step ? marker : "nothing",
                         (unsigned long long)state_step, (long long)weights_step);
    return 0;
}

/* Before any work, for --checkpoint-dir dir: a name that fits the paths built
 * from it, a directory (made if missing) where a file can be created, and
 * unless resume, no complete checkpoint of another run in it, whose
 * --keep pruning and --resume would otherwise mix with this run's. */
static inline int checkpoint_dir_check_try(const char *dir, int resume, char *err, size_t errlen)
{
    char probe[LLMC_PATH_MAX + 64], latest[LLMC_PATH_MAX];
    if (!dir[0])
        return set_error(err, errlen, "--checkpoint-dir is empty: name a directory");
    if (strlen(dir) + 40 > LLMC_PATH_MAX)
        return set_error(err, errlen, "--checkpoint-dir '%.60s...' is %zu characters; at most %d fit the paths in it",
                         dir, strlen(dir), LLMC_PATH_MAX - 40);
    if (make_dirs(dir) != 0)
        return set_error(err, errlen, "cannot create --checkpoint-dir '%s': %s", dir, strerror(errno));
    path_format(probe, sizeof(probe), "%s/.write_test.%ld", dir, (long)getpid());
    FILE *f = fopen(probe, "wb");
    if (!f)
        return set_error(err, errlen,
                         "cannot write into --checkpoint-dir '%s': %s\n  hint: check its permissions, "
                         "or choose another directory",
                         dir, strerror(errno));
    fclose(f);
    unlink(probe);
    if (!resume && checkpoint_find_latest(dir, latest, sizeof(latest)) == 0)
        return set_error(err, errlen,
                         "--checkpoint-dir '%s' holds the checkpoints of an earlier run (newest: '%s')\n"
                         "  hint: add --resume to continue that run, or choose another directory (nothing is "
                         "deleted)",
                         dir, latest);
    return 0;
}

/* The weights of a complete checkpoint directory into params (layout->total
 * floats), after reading its manifest into *man (COMPLETE; the caller frees it
 * with checkpoint_manifest_free, also on an error) and checking config.json
 * against it and against `config` (hf_config_check_text_try); the weights are
 * checked against the manifest once loaded. */
static inline int checkpoint_load_model_try(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                            float *params, int64_t *weights_step, CkptManifest *man, char *err,
                                            size_t errlen)
{
    char path[LLMC_PATH_MAX + 64], *text = NULL;
    size_t len = 0;
    FileSum sum;
    memset(man, 0, sizeof(*man));
    path_format(path, sizeof(path), "%s/COMPLETE", ckpt_dir);
    if (!path_exists(path)) {
        return set_error(err, errlen, "'%s' has no COMPLETE marker: the checkpoint was not finished", ckpt_dir);
    }
    if (checkpoint_manifest_read_try(ckpt_dir, man, err, errlen) != 0)
        return -1;
    path_format(path, sizeof(path), "%s/config.json", ckpt_dir);
    if (read_file_hashed_try(path, HF_CONFIG_MAX_BYTES, &text, &len, &sum, err, errlen) != 0)
        return -1;
    int rc = man->has_sums ? checkpoint_check_sum_try(ckpt_dir, man, &sum, err, errlen) : 0;
    if (rc == 0)
        rc = hf_config_check_text_try(text, len, path, config, err, errlen);
    free(text);
    path_format(path, sizeof(path), "%s/model.safetensors", ckpt_dir);
    if (rc == 0)
        rc = safetensors_load_params_try(path, layout, params, weights_step, err, errlen);
    if (rc == 0 && man->has_sums) {
        rc = ckpt_weights_sum_try(path, layout, params, 0, &sum, err, errlen);
        if (rc == 0)
            rc = checkpoint_check_sum_try(ckpt_dir, man, &sum, err, errlen);
    }
    return rc;
}

/* The warning for a checkpoint whose COMPLETE holds no checksums. */
static inline void checkpoint_warn_unverified(const char *ckpt_dir)
{
    fprintf(stderr,
            "warning: '%s' has no checksums (its COMPLETE is from a build before them): its files are not "
            "verified\n",
            ckpt_dir);
}

/* --init-from path, once its weights are in params (layout->total floats):
 * where path is a checkpoint directory with a manifest, every file but the
 * optimizer state (which --init-from does not read) must match it; exits
 * naming the file otherwise. A directory without COMPLETE (an HF model
 * directory, as transformers writes it) or a weights file has nothing to check;
 * a COMPLETE without checksums gets a warning. */
static inline void checkpoint_init_from_verify(const char *path, const ParamLayout *layout, const float *params)
{
    char file[LLMC_PATH_MAX + 64], err[2048];
    CkptManifest man;
    FileSum sum;
    path_format(file, sizeof(file), "%s/COMPLETE", path);
    if (!path_is_dir(path) || !path_exists(file))
        return;
    if (checkpoint_manifest_read_try(path, &man, err, sizeof(err)) != 0)
        FAIL("--init-from: %s", err);
    int rc = 0;
    if (man.has_sums) {
        path_format(file, sizeof(file), "%s/config.json", path);
        rc = file_xxh64_try(file, &sum, err, sizeof(err)) ||
             checkpoint_check_sum_try(path, &man, &sum, err, sizeof(err));
        path_format(file, sizeof(file), "%s/model.safetensors", path);
        if (rc == 0)
            rc = ckpt_weights_sum_try(file, layout, params, 0, &sum, err, sizeof(err)) ||
                 checkpoint_check_sum_try(path, &man, &sum, err, sizeof(err));
        if (rc == 0)
            rc = checkpoint_check_rest_try(path, &man, 0, 1, 0, err, sizeof(err));
    } else {
        checkpoint_warn_unverified(path);
    }
    checkpoint_manifest_free(&man);
    if (rc != 0)
        FAIL("--init-from: %s", err);
}

/* Load a whole checkpoint directory (written by checkpoint_save) into a model
 * built with `config`: weights, AdamW moments and the state, every file checked
 * against the manifest (a warning where it has no checksums). A
 * single-process resume takes a single-process checkpoint: one of several ranks
 * is refused. */
static inline int checkpoint_load_try(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                      float *params, float *adam_m, float *adam_v, CheckpointState *state, char *err,
                                      size_t errlen)
{
    int64_t weights_step = -1;
    CkptManifest man;
    CkptStateRead *reads = NULL;
    int n_reads = 0;
    CkptRange all = {0, layout->total};
    int rc = checkpoint_load_model_try(ckpt_dir, config, layout, params, &weights_step, &man, err, errlen);
    if (rc == 0)
        rc = checkpoint_load_moments_read_try(ckpt_dir, layout->total, &all, 1, adam_m, adam_v, state, &reads, &n_reads,
                                              err, errlen);
    if (rc == 0)
        rc = checkpoint_check_step_try(ckpt_dir, state->step, weights_step, err, errlen);
    if (rc == 0 && state->world != 1)
        rc = set_error(err, errlen,
                       "'%s' holds the AdamW state of %d ranks; this loader needs the state of one process "
                       "(resume it with train_llama)",
                       ckpt_dir, state->world);
    if (rc == 0)
        rc = checkpoint_verify_try(ckpt_dir, &man, state, reads, n_reads, 0, 1, err, errlen);
    if (rc == 0 && !man.has_sums)
        checkpoint_warn_unverified(ckpt_dir);
    free(reads);
    checkpoint_manifest_free(&man);
    return rc;
}

static inline void checkpoint_load(const char *ckpt_dir, const LlamaConfig *config, const ParamLayout *layout,
                                   float *params, float *adam_m, float *adam_v, CheckpointState *state)
{
    char err[2048];
    if (checkpoint_load_try(ckpt_dir, config, layout, params, adam_m, adam_v, state, err, sizeof(err)) != 0) {
        FAIL("resuming from a checkpoint: %s", err);
    }
}

#endif /* LLMC_CHECKPOINT_H */
