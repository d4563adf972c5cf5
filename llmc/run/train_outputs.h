/*
 * train_outputs.h: what a training run shows and leaves besides its log and
 * checkpoints, the same for both trainers: samples of text (--sample-every,
 * sampler.h, decoded with tokenizer.h) and the final model as an HF directory
 * (--export, hf_model.h), which also gets the BOS and EOS ids and the
 * tokenizer file, as checkpoints do.
 *
 * The tokenizer: --tokenizer, else NAME_tokenizer.model beside the train
 * shards NAME_train_*.bin (data/prepare.py writes it there), else the
 * --init-from directory's tokenizer.model (or original/tokenizer.model, where
 * Meta's repositories keep the tiktoken file). Its vocabulary must fit the
 * model's. The BOS and EOS ids: the shards', else those --init-from's
 * config.json names, else the tokenizer's.
 *
 * Reads the tokenizer file; writes stdout, the log, the export directory
 * (staged in DIR.tmp and renamed, so it is whole or absent). Plain C;
 * compiles as C++ too.
 */
#ifndef LLMC_TRAIN_OUTPUTS_H
#define LLMC_TRAIN_OUTPUTS_H

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "llmc/common/fileutil.h"
#include "llmc/formats/hf_model.h"
#include "llmc/model/llama_config.h"
#include "llmc/run/run_log.h"
#include "llmc/run/sampler.h"
#include "llmc/formats/tokenizer.h"
#include "llmc/run/train_flags.h"
#include "llmc/model/param_layout.h"

typedef struct {
    char tokenizer_path[LLMC_PATH_MAX]; /* "": none */
    Tokenizer tok;
    int have_tok;
    HfExtras extras; /* for every model directory the run writes */
} TrainOutputs;

/* NAME_tokenizer.model for a shard NAME_train_NNNNNN.bin or NAME_val_NNNNNN.bin; 0 if not that shape. */
static inline int shard_tokenizer_path(const char *shard, char *out, size_t n)
{
    const char *suffixes[] = {"_train_", "_val_"};
    size_t len = strlen(shard);
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(suffixes[i]);
        if (len >= k + 10 && strcmp(shard + len - 4, ".bin") == 0 && strncmp(shard + len - 10 - k, suffixes[i], k) == 0)
            return path_format(out, n, "%.*s_tokenizer.model", (int)(len - 10 - k), shard) == 0;
    }
    return 0;
}

/* Finds and loads the tokenizer and settles the BOS and EOS ids (see the top).
 * first_shard: NULL for random data; shard_bos/eos: the shards' header's. */
static inline void train_outputs_open(TrainOutputs *o, const TrainFlags *t, const char *first_shard, int shard_bos,
                                      int shard_eos, const HfTokenIds *init_ids, int vocab_size)
{
    memset(o, 0, sizeof(*o));
    char candidate[LLMC_PATH_MAX], err[2048];
    if (t->data.tokenizer) {
        if (path_format(o->tokenizer_path, sizeof(o->tokenizer_path), "%s", t->data.tokenizer) != 0)
            FAIL("--tokenizer: the path '%.100s...' is too long", t->data.tokenizer);
    } else if (first_shard && shard_tokenizer_path(first_shard, candidate, sizeof(candidate)) &&
               path_exists(candidate)) {
        snprintf(o->tokenizer_path, sizeof(o->tokenizer_path), "%s", candidate);
    } else if (t->model.init_from && path_is_dir(t->model.init_from)) {
        const char *places[] = {"%s/tokenizer.model", "%s/original/tokenizer.model"};
        for (int i = 0; i < 2 && !o->tokenizer_path[0]; i++) {
            if (path_format(candidate, sizeof(candidate), places[i], t->model.init_from) == 0 && path_exists(candidate))
                snprintf(o->tokenizer_path, sizeof(o->tokenizer_path), "%s", candidate);
        }
    }
    if (o->tokenizer_path[0]) {
        if (tokenizer_load_try(&o->tok, o->tokenizer_path, err, sizeof(err)) != 0)
            FAIL("the tokenizer: %s\n  hint: pass the file the shards were made with as --tokenizer", err);
        if (o->tok.vocab_size > vocab_size)
            FAIL("the tokenizer '%s' has %d tokens, more than the model's vocab_size %d", o->tokenizer_path,
                 o->tok.vocab_size, vocab_size);
        o->have_tok = 1;
        o->extras.tokenizer = &o->tok;
    }
    if (t->sample.every > 0 && !o->have_tok)
        FAIL("--sample-every needs the shards' tokenizer to show text, and none was found\n"
             "  hint: pass --tokenizer PATH (data/prepare.py writes NAME_tokenizer.model beside the shards)");
    if (first_shard)
        o->extras.ids = hf_token_ids(shard_bos, shard_eos);
    else if (init_ids->bos_id >= 0 || init_ids->n_eos > 0)
        o->extras.ids = *init_ids;
    else if (o->have_tok)
        o->extras.ids = hf_token_ids(o->tok.bos_id, o->tok.eos_id);
    else
        o->extras.ids = hf_token_ids(-1, -1);
}

static inline void train_outputs_close(TrainOutputs *o)
{
    if (o->have_tok)
        tokenizer_free(&o->tok);
    o->have_tok = 0;
}

/* Whether a sample is due after steps_done of total_steps. */
static inline int train_sample_due(const SampleFlags *f, int steps_done, int total_steps)
{
    return f->every > 0 && (steps_done % f->every == 0 || steps_done == total_steps);
}

/* A sample after `step` steps: the prompt (or the BOS token) continued by up to
 * --sample-tokens tokens, the whole within max_len; printed and logged. Every
 * rank calls it (the logits may need all of them); all draw the same tokens. */
static inline void train_sample(TrainOutputs *o, const SampleFlags *f, int step, int max_len, int vocab_size,
                                NextLogitsFn next_logits, void *ctx, RunLog *log)
{
    const char *prompt = f->prompt ? f->prompt : "";
    int cap = (int)strlen(prompt) + 2 + f->tokens, n = 0;
    int *tokens = (int *)malloc_check(sizeof(int) * (size_t)cap, "sample tokens");
    if (prompt[0])
        n = tokenizer_encode(&o->tok, prompt, tokens);
    else
        tokens[n++] = o->extras.ids.bos_id >= 0 ? o->extras.ids.bos_id : o->tok.bos_id;
    if (n >= max_len) { /* keep the prompt's end, room for one new token */
        memmove(tokens, tokens + n - (max_len - 1), sizeof(int) * (size_t)(max_len - 1));
        n = max_len - 1;
    }
    int max_new = f->tokens < max_len - n ? f->tokens : max_len - n;
    Sampler s = {(float)f->temperature, (float)f->top_p, (uint64_t)f->seed ^ ((uint64_t)step << 32)};
    int end =
        sample_text(next_logits, ctx, vocab_size, &s, tokens, n, max_new, o->extras.ids.eos_ids, o->extras.ids.n_eos);
    char *shown_prompt = tokenizer_decode(&o->tok, tokens, n), *text = tokenizer_decode(&o->tok, tokens + n, end - n);
    run_log_sample(log, step, shown_prompt, text, tokens, end);
    free(shown_prompt);
    free(text);
    free(tokens);
}

/* Before any work: --export must name a directory that does not exist yet or
 * is empty, so that no export overwrites anything (a model directory given by
 * mistake, say). */
static inline void train_export_check(const CheckpointFlags *ck)
{
    if (!ck->export_dir || !path_exists(ck->export_dir))
        return;
    DIR *d = opendir(ck->export_dir);
    struct dirent *e;
    int empty = d != NULL;
    while (d && (e = readdir(d)) != NULL)
        empty &= strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    if (d)
        closedir(d);
    if (!empty)
        FAIL("--export '%s' exists and is not an empty directory\n  hint: name a new directory; an export "
             "overwrites nothing",
             ck->export_dir);
}

/* The model (master weights on the host) as an HF directory at --export:
 * written into DIR.tmp, then renamed to DIR (train_export_check: absent or empty). */
static inline void train_export(const TrainOutputs *o, const CheckpointFlags *ck, const LlamaConfig *c,
                                const ParamLayout *layout, const float *master)
{
    char staging[LLMC_PATH_MAX], err[2048];
    const char *dir = ck->export_dir;
    if (path_format(staging, sizeof(staging), "%s.tmp", dir) != 0)
        FAIL("--export: the path '%.100s...' is too long", dir);
    if (path_exists(staging))
        remove_flat_dir(staging);
    if (make_dirs(staging) != 0)
        FAIL("--export: cannot create '%s': %s", staging, strerror(errno));
    int bf16 = strcmp(ck->export_dtype, "bf16") == 0;
    /* a failed export (a full disk) leaves nothing behind, not a half-written DIR.tmp */
    if (hf_model_write_try(staging, c, layout, master, bf16, -1, &o->extras, err, sizeof(err)) != 0) {
        remove_flat_dir(staging);
        FAIL("--export: %s\n  hint: free space there; the checkpoints, if any, are HF model directories already", err);
    }
    fsync_path(staging);
    train_export_check(ck); /* still absent or empty */
    if (path_exists(dir))
        rmdir(dir);
    if (rename(staging, dir) != 0) {
        int e = errno;
        remove_flat_dir(staging);
        FAIL("--export: cannot rename '%s' to '%s': %s", staging, dir, strerror(e));
    }
    printf("exported the model to '%s' (%s)\n", dir, ck->export_dtype);
}

#endif /* LLMC_TRAIN_OUTPUTS_H */
