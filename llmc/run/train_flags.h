/*
 * train_flags.h: the flags both trainers take, in the sections of their
 * --help (data, model, batch, optimizer, run, checkpoints and samples), each
 * section a struct that goes to the part of the program
 * that uses it; their defaults, their checks, and what is derived from them:
 * the model config (a preset, an HF directory or a .llmt file), the
 * micro-steps per optimizer step, the learning-rate schedule.
 *
 * A trainer's flag table starts with TRAIN_FLAGS(Options, field), the shared
 * sections of a TrainFlags member named field, and adds its own. Every check
 * runs before any work, and an error names the flag, the value and what is
 * allowed. Reads argv through flags.h; plain C, compiles as C++ too.
 */
#ifndef LLMC_TRAIN_FLAGS_H
#define LLMC_TRAIN_FLAGS_H

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "llmc/formats/checkpoint.h"
#include "llmc/run/flags.h"
#include "llmc/formats/hf_model.h"
#include "llmc/model/llama_config.h"
#include "llmc/run/schedule.h"
#include "llmc/formats/tensorfile.h"
#include "llmc/common/utils.h"

/* A shape flag that was not given: the preset's value stands. */
#define SHAPE_UNSET FLAG_INT_UNSET
/* -B's bound; B*T*GPUs must also stay below 2^31 (train_micro_steps) */
#define TRAIN_MAX_B (1 << 20)

#define DEFAULT_TRAIN_SHARDS "data/shards/corpus_train_*.bin"
#define DEFAULT_VAL_SHARDS "data/shards/corpus_val_*.bin"

typedef struct {
    const char *train, *val; /* globs of token shards; val NULL: see train_val_shards */
    int random;              /* random tokens instead of shards (benchmarks) */
    const char *tokenizer;   /* the shards' tokenizer file; NULL: found beside them (train_outputs.h) */
    int doc_mask;            /* packed documents (llmc/model/documents.h): attention within each document */
    int doc_positions;       /* with doc_mask: RoPE positions restart at each document */
} DataFlags;

typedef struct {
    const char *preset, *init_from;
    int vocab_size, d_model, n_layer, n_head, n_kv_head, head_dim, ffn_dim; /* SHAPE_UNSET: the preset's */
    int untied;
} ModelFlags;

typedef struct {
    int B, T;        /* a micro-batch: B sequences of T tokens per process */
    int total_batch; /* tokens per optimizer step over all processes; 0: B*T*processes */
} BatchFlags;

typedef struct {
    AdamWConfig adamw;
    const char *schedule;
    int warmup;
    double min_lr_frac, decay_frac;
} OptimFlags;

typedef struct {
    int steps, eval_every, eval_batches, seed;
    const char *log;    /* JSON lines; '' = none */
    const char *on_nan; /* "skip" or "stop" */
    int max_skips;      /* skip: stop after this many skipped steps in a row */
} RunFlags;

typedef struct {
    const char *dir;
    int save_every, keep, resume;
    const char *export_dir, *export_dtype; /* the final model as an HF directory; "fp32" or "bf16" */
} CheckpointFlags;

typedef struct {
    int every, tokens;         /* a sample every N steps (0: none) and at the end, of K tokens */
    const char *prompt;        /* NULL or "": the BOS token alone */
    double temperature, top_p; /* temperature 0: greedy */
    int seed;
} SampleFlags;

typedef struct {
    DataFlags data;
    ModelFlags model;
    BatchFlags batch;
    OptimFlags optim;
    RunFlags run;
    CheckpointFlags ckpt;
    SampleFlags sample;
} TrainFlags;

/* The shared sections of the flag table of an options struct O whose TrainFlags member is m. */
#define TRAIN_FLAGS(O, m)                                                                                              \
    FLAG_SECTION("data"), FLAG("--train", FLAG_STRING, O, m.data.train, "train shards, a glob"),                       \
        FLAG("--val", FLAG_STRING, O, m.data.val,                                                                      \
             "val shards, a glob ('' = none; default: the default corpus's, with the default --train)"),               \
        FLAG("--random-data", FLAG_SWITCH, O, m.data.random, "random tokens instead of shards (benchmarks)"),          \
        FLAG("--tokenizer", FLAG_STRING, O, m.data.tokenizer,                                                          \
             "the shards' tokenizer file, for samples and exports (default: NAME_tokenizer.model beside the shards, "  \
             "or the --init-from directory's tokenizer.model)"),                                                       \
        FLAG("--doc-mask", FLAG_SWITCH, O, m.data.doc_mask,                                                            \
             "attention only within each document of a packed row: documents start at the shards' BOS token, and a "   \
             "row's first token starts one"),                                                                          \
        FLAG_NUM("--doc-positions", FLAG_INT, O, m.data.doc_positions, 0, 1, FLAG_CLOSED,                              \
                 "with --doc-mask: 1 (the default) restarts RoPE positions at each document (HF's position_ids), 0 "   \
                 "counts on along "                                                                                    \
                 "the row"),                                                                                           \
        FLAG_SECTION("model"),                                                                                         \
        FLAG("--preset", FLAG_STRING, O, m.model.preset, "the model's shape: a preset listed below (default tiny)"),   \
        FLAG("--init-from", FLAG_STRING, O, m.model.init_from,                                                         \
             "start from an HF model directory (config.json + safetensors, as save_pretrained writes; a checkpoint "   \
             "is one) or a .llmt weights file: its shape and weights, no preset needed"),                              \
        FLAG_NUM("--vocab", FLAG_INT, O, m.model.vocab_size, 1, LLAMA_MAX_VOCAB, FLAG_CLOSED,                          \
                 "vocabulary size (overrides the preset)"),                                                            \
        FLAG_NUM("--d-model", FLAG_INT, O, m.model.d_model, 1, LLAMA_MAX_D_MODEL, FLAG_CLOSED,                         \
                 "hidden size (overrides the preset)"),                                                                \
        FLAG_NUM("--n-layer", FLAG_INT, O, m.model.n_layer, 1, LLAMA_MAX_LAYERS, FLAG_CLOSED,                          \
                 "decoder layers (overrides the preset)"),                                                             \
        FLAG_NUM("--n-head", FLAG_INT, O, m.model.n_head, 1, LLAMA_MAX_HEADS, FLAG_CLOSED,                             \
                 "query heads (overrides the preset)"),                                                                \
        FLAG_NUM("--n-kv-head", FLAG_INT, O, m.model.n_kv_head, 1, LLAMA_MAX_HEADS, FLAG_CLOSED,                       \
                 "key/value heads, dividing n_head (overrides the preset)"),                                           \
        FLAG_NUM("--head-dim", FLAG_INT, O, m.model.head_dim, 1, LLAMA_MAX_HEAD_DIM, FLAG_CLOSED,                      \
                 "head size (default d_model / n_head)"),                                                              \
        FLAG_NUM("--ffn-dim", FLAG_INT, O, m.model.ffn_dim, 1, LLAMA_MAX_FFN, FLAG_CLOSED,                             \
                 "SwiGLU hidden size (overrides the preset)"),                                                         \
        FLAG("--untied", FLAG_SWITCH, O, m.model.untied, "untie lm_head from the embedding"), FLAG_SECTION("batch"),   \
        FLAG_NUM("-B", FLAG_INT, O, m.batch.B, 1, TRAIN_MAX_B, FLAG_CLOSED, "sequences per micro-batch (and GPU)"),    \
        FLAG_NUM("-T", FLAG_INT, O, m.batch.T, 1, LLAMA_MAX_SEQ_LEN, FLAG_CLOSED,                                      \
                 "sequence length, at most the model's max_seq_len"),                                                  \
        FLAG_NUM("--total-batch", FLAG_INT, O, m.batch.total_batch, 0, INT_MAX, FLAG_CLOSED,                           \
                 "tokens per optimizer step over all GPUs, a multiple of B*T*GPUs (default B*T*GPUs; more: gradient "  \
                 "accumulation)"),                                                                                     \
        FLAG_SECTION("optimizer"),                                                                                     \
        FLAG_NUM("--lr", FLAG_DOUBLE, O, m.optim.adamw.lr, 0, 10, FLAG_LO_OPEN, "peak learning rate"),                 \
        FLAG("--schedule", FLAG_STRING, O, m.optim.schedule,                                                           \
             "after warmup: cosine or linear to --min-lr-frac, constant, or wsd (llmc/run/schedule.h)"),               \
        FLAG_NUM("--warmup", FLAG_INT, O, m.optim.warmup, 0, INT_MAX, FLAG_CLOSED, "linear warmup steps"),             \
        FLAG_NUM("--min-lr-frac", FLAG_DOUBLE, O, m.optim.min_lr_frac, 0, 1, FLAG_CLOSED,                              \
                 "final lr as a fraction of --lr"),                                                                    \
        FLAG_NUM("--decay-frac", FLAG_DOUBLE, O, m.optim.decay_frac, 0, 1, FLAG_LO_OPEN,                               \
                 "wsd: fraction of the steps spent decaying"),                                                         \
        FLAG_NUM("--weight-decay", FLAG_DOUBLE, O, m.optim.adamw.weight_decay, 0, 10, FLAG_CLOSED,                     \
                 "AdamW weight decay, on matrices only"),                                                              \
        FLAG_NUM("--beta1", FLAG_DOUBLE, O, m.optim.adamw.beta1, 0, 1, FLAG_HI_OPEN, "AdamW beta1"),                   \
        FLAG_NUM("--beta2", FLAG_DOUBLE, O, m.optim.adamw.beta2, 0, 1, FLAG_HI_OPEN, "AdamW beta2"),                   \
        FLAG_NUM("--eps", FLAG_DOUBLE, O, m.optim.adamw.eps, 0, 1, FLAG_LO_OPEN, "AdamW epsilon"),                     \
        FLAG_NUM("--grad-clip", FLAG_DOUBLE, O, m.optim.adamw.grad_clip, 0, 1e9, FLAG_CLOSED,                          \
                 "max global gradient norm, 0 = off"),                                                                 \
        FLAG_SECTION("run"),                                                                                           \
        FLAG_NUM("--steps", FLAG_INT, O, m.run.steps, 1, INT_MAX, FLAG_CLOSED, "optimizer steps"),                     \
        FLAG_NUM("--eval-every", FLAG_INT, O, m.run.eval_every, 0, INT_MAX, FLAG_CLOSED,                               \
                 "evaluate on the val shards every N steps and at the end, 0 = never"),                                \
        FLAG_NUM("--eval-batches", FLAG_INT, O, m.run.eval_batches, 1, 1000000, FLAG_CLOSED,                           \
                 "val batches per evaluation"),                                                                        \
        FLAG_NUM("--seed", FLAG_INT, O, m.run.seed, 0, INT_MAX, FLAG_CLOSED, "init and data-order seed"),              \
        FLAG("--log", FLAG_STRING, O, m.run.log,                                                                       \
             "JSON lines log: the run's settings, then every step ('' = none; --resume appends)"),                     \
        FLAG("--on-nan", FLAG_STRING, O, m.run.on_nan,                                                                 \
             "a step whose loss or gradient is not finite: skip (its update, counted) or stop"),                       \
        FLAG_NUM("--max-skips", FLAG_INT, O, m.run.max_skips, 1, INT_MAX, FLAG_CLOSED,                                 \
                 "with --on-nan skip: stop after this many in a row"),                                                 \
        FLAG_SECTION("checkpoints"),                                                                                   \
        FLAG("--checkpoint-dir", FLAG_STRING, O, m.ckpt.dir,                                                           \
             "save DIR/step_<08d>/: model.safetensors (fp32, HF names), config.json, optimizer state; at the end "     \
             "and"),                                                                                                   \
        FLAG_NUM("--save-every", FLAG_INT, O, m.ckpt.save_every, 0, INT_MAX, FLAG_CLOSED,                              \
                 "every N steps (0 = only at the end)"),                                                               \
        FLAG_NUM("--keep", FLAG_INT, O, m.ckpt.keep, 0, INT_MAX, FLAG_CLOSED,                                          \
                 "keep the newest K complete checkpoints (0 = all)"),                                                  \
        FLAG("--resume", FLAG_SWITCH, O, m.ckpt.resume,                                                                \
             "continue from the newest complete checkpoint in --checkpoint-dir"),                                      \
        FLAG("--export", FLAG_STRING, O, m.ckpt.export_dir,                                                            \
             "at the end, write the model to DIR as an HF directory (config.json, generation_config.json, "            \
             "model.safetensors, tokenizer.model); DIR must be new or empty"),                                         \
        FLAG("--export-dtype", FLAG_STRING, O, m.ckpt.export_dtype, "fp32, or bf16 (half the size)"),                  \
        FLAG_SECTION("samples"),                                                                                       \
        FLAG_NUM("--sample-every", FLAG_INT, O, m.sample.every, 0, INT_MAX, FLAG_CLOSED,                               \
                 "print a sample of text every N steps and at the end (0 = never)"),                                   \
        FLAG_NUM("--sample-tokens", FLAG_INT, O, m.sample.tokens, 1, LLAMA_MAX_SEQ_LEN, FLAG_CLOSED,                   \
                 "tokens per sample"),                                                                                 \
        FLAG("--prompt", FLAG_STRING, O, m.sample.prompt, "text the samples continue (default: the BOS token alone)"), \
        FLAG_NUM("--temperature", FLAG_DOUBLE, O, m.sample.temperature, 0, 100, FLAG_CLOSED, "0 = greedy"),            \
        FLAG_NUM("--top-p", FLAG_DOUBLE, O, m.sample.top_p, 0, 1, FLAG_LO_OPEN,                                        \
                 "draw from the most likely tokens that make up this much"),                                           \
        FLAG_NUM("--sample-seed", FLAG_INT, O, m.sample.seed, 0, INT_MAX, FLAG_CLOSED, "the samples' random seed")

/* With --doc-mask, the token that starts a document: the shards' BOS (bos_id from their header, -1 if none), which
 * random tokens do not have; -1 without --doc-mask. */
static inline int train_doc_bos(const DataFlags *d, int bos_id)
{
    if (!d->doc_mask)
        return -1;
    if (d->random || bos_id < 0)
        FAIL("--doc-mask finds documents at the shards' BOS token: it needs --train shards whose header names one "
             "(not --random-data)");
    printf("packed documents: attention within each, starting at token %d; RoPE positions %s\n", bos_id,
           d->doc_positions ? "restart in each" : "run on along the row");
    return bos_id;
}

static inline TrainFlags train_flags_defaults(void)
{
    TrainFlags f;
    memset(&f, 0, sizeof(f));
    f.data.train = DEFAULT_TRAIN_SHARDS;
    f.data.doc_positions = FLAG_INT_UNSET; /* 1 with --doc-mask (train_flags_check) */
    f.model.vocab_size = f.model.d_model = f.model.n_layer = f.model.n_head = SHAPE_UNSET;
    f.model.n_kv_head = f.model.head_dim = f.model.ffn_dim = SHAPE_UNSET;
    f.batch.B = 4;
    f.batch.T = 256;
    f.optim.adamw.lr = 3e-4;
    f.optim.adamw.beta1 = 0.9;
    f.optim.adamw.beta2 = 0.95;
    f.optim.adamw.eps = 1e-8;
    f.optim.adamw.weight_decay = 0.1;
    f.optim.adamw.grad_clip = 1.0;
    f.optim.schedule = "cosine";
    f.optim.warmup = 10;
    f.optim.min_lr_frac = 0.1;
    f.optim.decay_frac = 0.2;
    f.run.steps = 50;
    f.run.eval_every = 25;
    f.run.eval_batches = 8;
    f.run.seed = 1337;
    f.run.log = "log/train.jsonl";
    f.run.on_nan = "skip";
    f.run.max_skips = 10;
    f.ckpt.keep = 3;
    f.ckpt.export_dtype = "fp32";
    f.sample.tokens = 64;
    f.sample.temperature = 1.0;
    f.sample.top_p = 0.95;
    f.sample.seed = 42;
    return f;
}

static inline int model_flags_shape_given(const ModelFlags *m)
{
    const int v[] = {m->vocab_size, m->d_model, m->n_layer, m->n_head, m->n_kv_head, m->head_dim, m->ffn_dim};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        if (v[i] != SHAPE_UNSET)
            return 1;
    }
    return m->untied;
}

/* Every check that needs neither the model nor the GPUs; exits naming the flag. */
static inline void train_flags_check(TrainFlags *f)
{
    const ModelFlags *m = &f->model; /* the numbers' ranges were checked by flags_parse (the FLAG_NUM table) */
    /* flags that would otherwise be ignored without a word */
    if (f->data.doc_positions != FLAG_INT_UNSET && !f->data.doc_mask)
        FAIL("--doc-positions %d says where RoPE positions restart in packed documents, which only --doc-mask "
             "finds\n  hint: add --doc-mask, or drop --doc-positions",
             f->data.doc_positions);
    if (f->data.doc_positions == FLAG_INT_UNSET)
        f->data.doc_positions = 1;
    if (f->data.random && strcmp(f->data.train, DEFAULT_TRAIN_SHARDS) != 0)
        FAIL("--random-data trains on random tokens, not on --train '%s'\n  hint: drop one of the two", f->data.train);
    if (f->data.random && f->data.val && f->data.val[0])
        FAIL("--random-data has no val shards to evaluate: --val '%s' would be ignored\n  hint: drop --val",
             f->data.val);
    if (m->init_from && (m->preset || model_flags_shape_given(m)))
        FAIL("--init-from takes the model shape from '%s'; drop --preset and the shape flags", m->init_from);
    ScheduleKind kind;
    if (schedule_kind_from_name(f->optim.schedule, &kind) != 0)
        FAIL("unknown --schedule '%s'; use cosine, linear, constant or wsd", f->optim.schedule);
    if ((f->ckpt.resume || f->ckpt.save_every > 0) && !f->ckpt.dir)
        FAIL("--resume and --save-every need --checkpoint-dir DIR");
    char err[2048];
    if (f->ckpt.dir && checkpoint_dir_check_try(f->ckpt.dir, f->ckpt.resume, err, sizeof(err)) != 0)
        FAIL("%s", err); /* now, not at the first save after hours of training */
    flag_choice("--on-nan", f->run.on_nan, "skip|stop");
    flag_choice("--export-dtype", f->ckpt.export_dtype, "fp32|bf16");
    if (f->ckpt.export_dir && !f->ckpt.export_dir[0])
        FAIL("--export needs a directory");
}

static inline void train_print_presets(FILE *out)
{
    fprintf(out, "presets:\n");
    for (int i = 0; i < LLAMA_N_PRESETS; i++) {
        const LlamaConfig *c = &LLAMA_PRESETS[i].config;
        fprintf(out, "  %-15s %s: d_model %d, %d layers, %d heads of %d (%d kv), ffn %d, vocab %d, max_seq_len %d\n",
                LLAMA_PRESETS[i].name, FAMILY_MODEL_TYPE[c->family], c->d_model, c->n_layer, c->n_head, c->head_dim,
                c->n_kv_head, c->ffn_dim, c->vocab_size, c->max_seq_len);
    }
}

/* --help: what the program does, its flags with their defaults, the presets; exits. */
static inline void train_usage(const char *program, const char *what, const Flag *flags, int n_flags,
                               const void *defaults)
{
    printf("usage: %s [flags]\n%s\n\n", program, what);
    flags_usage(stdout, flags, n_flags, defaults);
    printf("  %-22s this text\n", "-h, --help");
    train_print_presets(stdout);
    exit(0);
}

/* The model: the --init-from directory's or file's (*ids: the BOS and EOS its
 * config names), or the preset (default tiny) with the shape flags over it. */
static inline LlamaConfig train_model_config(const ModelFlags *m, HfTokenIds *ids)
{
    LlamaConfig c;
    *ids = hf_token_ids(-1, -1);
    if (m->init_from)
        return model_config_load(m->init_from, ids);
    const char *preset = m->preset ? m->preset : "tiny";
    if (llama_preset(preset, &c) != 0) {
        fprintf(stderr, "error: unknown --preset '%s'\n", preset);
        train_print_presets(stderr);
        exit(1);
    }
    if (m->vocab_size != SHAPE_UNSET)
        c.vocab_size = m->vocab_size;
    if (m->d_model != SHAPE_UNSET)
        c.d_model = m->d_model;
    if (m->n_layer != SHAPE_UNSET)
        c.n_layer = m->n_layer;
    if (m->n_head != SHAPE_UNSET)
        c.n_head = m->n_head;
    if (m->n_kv_head != SHAPE_UNSET)
        c.n_kv_head = m->n_kv_head;
    if (m->ffn_dim != SHAPE_UNSET)
        c.ffn_dim = m->ffn_dim;
    if (m->head_dim != SHAPE_UNSET) {
        c.head_dim = m->head_dim;
    } else if (m->d_model != SHAPE_UNSET || m->n_head != SHAPE_UNSET) {
        if (c.d_model % c.n_head != 0)
            FAIL("d_model %d is not a multiple of n_head %d\n  hint: change --d-model or --n-head, or give --head-dim",
                 c.d_model, c.n_head);
        c.head_dim = c.d_model / c.n_head;
    }
    if (m->untied)
        c.tie_embeddings = 0;
    char err[512];
    if (llama_config_check(&c, err, sizeof(err)) != 0)
        FAIL(
            "bad model shape: %s\n  hint: adjust --d-model --n-layer --n-head --n-kv-head --head-dim --ffn-dim --vocab",
            err);
    return c;
}

/* The val shards' glob, or NULL for no evaluation: --val, else the default
 * corpus's val shards when training on the default corpus. */
static inline const char *train_val_shards(const TrainFlags *f)
{
    const char *val = f->data.val                                        ? f->data.val
                      : strcmp(f->data.train, DEFAULT_TRAIN_SHARDS) == 0 ? DEFAULT_VAL_SHARDS
                                                                         : "";
    return f->data.random || !val[0] || f->run.eval_every == 0 ? NULL : val;
}

/* The mean val loss of an evaluation over `batches` batches of the val shards (all
 * ranks' sums); an evaluation with no target at all ends the run, which would
 * otherwise log a null val loss at every evaluation. */
static inline float train_val_loss(double loss_sum, double count, int batches, const char *val_shards)
{
    if (!(count > 0))
        FAIL("the first %d val batch%s (--eval-batches) of '%s' hold no target: every target is masked\n  hint: "
             "evaluate on shards with completions (the pairs and chat formats of prepare.py mask the prompts only), "
             "raise --eval-batches, or pass --val '' to train without evaluating",
             batches, batches == 1 ? "" : "es", val_shards);
    return (float)(loss_sum / count);
}

/* Steps whose loss or gradient norm is not finite, for --on-nan, and steps
 * with no target to learn from. */
typedef struct {
    int in_a_row, total;
    int no_targets; /* steps whose every target was masked: skipped, never counted against --max-skips */
} NanGuard;

/* After a step: one with no targets (its update skipped by the caller) is counted
 * apart; a finite one resets the count; one whose loss or gradient norm is not
 * finite ends the run with --on-nan stop (or when its update could not be
 * skipped, or at the --max-skips-th in a row), else counts as skipped. The caller
 * has skipped its update when skipped_update; returns whether it did. */
static inline int nan_guard_step(NanGuard *g, const RunFlags *r, int step, double loss, double grad_norm,
                                 int skipped_update, int no_targets)
{
    if (no_targets) {
        g->no_targets++;
        return 1;
    }
    if (isfinite(loss) && isfinite(grad_norm)) {
        g->in_a_row = 0;
        return 0;
    }
    g->in_a_row++;
    g->total++;
    if (strcmp(r->on_nan, "stop") == 0 || !skipped_update)
        FAIL("step %d: loss %g, gradient norm %g: not finite%s; the run stops (no checkpoint is written with "
             "non-finite weights)\n  hint: lower --lr, check the data, or resume from the last checkpoint",
             step, loss, grad_norm, skipped_update ? "" : " (and the update was applied)");
    if (g->in_a_row >= r->max_skips)
        FAIL("step %d: %d steps in a row with a loss or gradient that is not finite (--max-skips %d); the run stops\n"
             "  hint: lower --lr, check the data, or resume from the last checkpoint",
             step, g->in_a_row, r->max_skips);
    return 1;
}

/* At the end of a run: the steps skipped, if any. */
static inline void nan_guard_report(const NanGuard *g)
{
    if (g->no_targets > 0)
        printf("%d step%s had no target to learn from (every target masked, as windows of a long prompt are) and "
               "%s skipped\n",
               g->no_targets, g->no_targets == 1 ? "" : "s", g->no_targets == 1 ? "was" : "were");
    if (g->total > 0)
        printf("%d step%s skipped: the loss or gradient norm was not finite (--on-nan skip)\n", g->total,
               g->total == 1 ? " was" : "s were");
}

/* Micro-steps per optimizer step for `processes` processes of B*T tokens each. */
static inline int train_micro_steps(const BatchFlags *b, int processes)
{
    int64_t per_step = (int64_t)b->B * b->T * processes;
    if (per_step > INT_MAX)
        FAIL("-B %d x -T %d x %d GPUs = %lld tokens per micro-step is too many (at most %d)", b->B, b->T, processes,
             (long long)per_step, INT_MAX);
    int64_t total = b->total_batch ? b->total_batch : per_step;
    if (total % per_step != 0)
        FAIL("--total-batch %lld is not a multiple of B*T*GPUs = %lld\n  hint: pick a multiple, e.g. %lld",
             (long long)total, (long long)per_step, (long long)(per_step * ((total + per_step - 1) / per_step)));
    return (int)(total / per_step);
}

static inline LrSchedule train_schedule(const OptimFlags *o, int steps)
{
    ScheduleKind kind = SCHEDULE_COSINE; /* train_flags_check refused unknown names */
    schedule_kind_from_name(o->schedule, &kind);
    LrSchedule s = {kind, (float)o->adamw.lr, (float)o->min_lr_frac, o->warmup, steps, (float)o->decay_frac};
    return s;
}

#endif /* LLMC_TRAIN_FLAGS_H */
