/*
 * train_loop.h: the run of a trainer, one loop for train_llama.cu and
 * train_llama_ref.c so that the two cannot drift apart:
 *
 *   start   resume from the newest complete checkpoint (the model's weights and
 *           AdamW state, the step, the data position, the RNG and the run id),
 *           or start fresh (--init-from or a random init)
 *   step    evaluate when due; load the step's micro-batches and count their
 *           targets over every rank; a step with none is logged and skipped (the
 *           weights and AdamW state stay), else the trainer's optimizer step;
 *           the log line, the NaN guard, a checkpoint and a sample when due
 *   end     the last evaluation, what the guard skipped, the export
 *
 * The trainer supplies its model's operations (TrainOps: a step, an evaluation
 * batch, checkpoint load and save, weights, the sums over its ranks); the loop
 * owns the order of things, the data, the clock of each step (from the last
 * step's end, or from where an evaluation, a checkpoint or a sample ended, to
 * this step's end) and the log. Memory: the step's tokens and targets
 * (2 x accum x B x T ints, pinned where the trainer allocates them).
 */
#ifndef LLMC_TRAIN_LOOP_H
#define LLMC_TRAIN_LOOP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "llmc/run/batch_source.h"
#include "llmc/formats/checkpoint.h"
#include "llmc/formats/dataloader.h"
#include "llmc/run/run_log.h"
#include "llmc/run/sampler.h"
#include "llmc/run/train_flags.h"
#include "llmc/run/train_outputs.h"
#include "llmc/formats/train_state.h"
#include "llmc/common/utils.h"
#include "llmc/model/param_layout.h"

typedef struct {
    void *ctx; /* the trainer's model, passed to every operation */
    /* rank 0's x on every rank, and the sum of x over the ranks (NULL: one process) */
    uint64_t (*agree)(void *ctx, uint64_t x);
    double (*sum)(void *ctx, double x);
    /* the weights of --init-from, or a random init from seed */
    void (*init_weights)(void *ctx, const char *init_from, uint64_t seed);
    /* a checkpoint directory's weights, this rank's AdamW state and step into the model; *st: the rest */
    void (*load_checkpoint)(void *ctx, const char *path, CheckpointState *st);
    /* one optimizer step over accum micro-batches of B*T tokens (inputs and targets back to back), whose
     * targets over every rank are `count` > 0: out's loss (the mean over them), grad_norm and skipped */
    void (*step)(void *ctx, const int *inputs, const int *targets, int accum, double count, int step, float lr,
                 StepLog *out);
    /* the summed loss of one micro-batch of B*T tokens, without gradients */
    double (*eval_batch)(void *ctx, const int *inputs, const int *targets);
    /* AdamW steps taken, for the checkpoint */
    uint64_t (*adam_steps)(void *ctx);
    void (*save)(void *ctx, const CheckpointFlags *ck, const HfExtras *extras, CheckpointState st);
    NextLogitsFn next_logits; /* for samples (sampler.h) */
    /* the fp32 master weights, for the export: on rank 0 a copy the loop frees, NULL on the others */
    float *(*master_copy)(void *ctx);
    /* optional: what the trainer adds to a step's log line (the GPU's MFU and memory), what it logs after it
     * (a profile), and where it has moved on (a watchdog's progress: "step 5"; step < 0: none) */
    void (*annotate)(void *ctx, StepLog *r);
    void (*logged)(void *ctx, const StepLog *r);
    void (*progress)(void *ctx, const char *what, int step);
} TrainOps;

typedef struct {
    const TrainFlags *t;
    const LlamaConfig *config;
    const ParamLayout *layout;
    BatchSource *src;
    DataLoader *val; /* NULL: no evaluation */
    const char *val_shards;
    TrainOutputs *outputs;
    RunLog *log;
    int accum;          /* micro-steps per optimizer step */
    int64_t step_units; /* B * T tokens of this rank per micro-step */
    int *inputs;        /* [accum * step_units], then the targets, as many */
    int rank;
    /* set by train_loop_start */
    int start_step;
    uint64_t run_id;
    char resumed_from[LLMC_PATH_MAX];
    /* after the run: the mean tokens/s of the steps after the first (all ranks) */
    double tokens_per_s_mean;
} TrainLoop;

/* The loop over a run of flags t on this rank: its model's config and layout, its data (src; val opened at
 * val_shards, or NULL), its outputs, accum micro-steps of step_units tokens a step, and inputs: the trainer's room
 * for a step's tokens then targets (2 x accum x step_units ints; pinned on the GPU). The log comes after
 * train_loop_start, which says the run id and the checkpoint it resumed from. */
static inline void train_loop_init(TrainLoop *L, const TrainFlags *t, const LlamaConfig *config,
                                   const ParamLayout *layout, BatchSource *src, DataLoader *val, const char *val_shards,
                                   TrainOutputs *outputs, int accum, int64_t step_units, int *inputs, int rank)
{
    memset(L, 0, sizeof(*L));
    L->t = t;
    L->config = config;
    L->layout = layout;
    L->src = src;
    L->val = val;
    L->val_shards = val_shards;
    L->outputs = outputs;
    L->accum = accum;
    L->step_units = step_units;
    L->inputs = inputs;
    L->rank = rank;
}

static inline void train_progress_(const TrainOps *ops, const char *what, int step)
{
    if (ops->progress)
        ops->progress(ops->ctx, what, step);
}

static inline double train_sum_(const TrainOps *ops, double x)
{
    return ops->sum ? ops->sum(ops->ctx, x) : x;
}

/* Resumes from the newest complete checkpoint of --checkpoint-dir with --resume (or
 * starts fresh, saying so), else initialises the weights: L->start_step, run_id and
 * resumed_from. A resumed run continues as if never stopped; a fresh one takes rank
 * 0's new run id. */
static inline void train_loop_start(TrainLoop *L, const TrainOps *ops)
{
    const TrainFlags *t = L->t;
    L->resumed_from[0] = '\0';
    L->start_step = 0;
    L->run_id = ops->agree ? ops->agree(ops->ctx, run_id_new()) : run_id_new();
    if (t->ckpt.resume && checkpoint_find_latest(t->ckpt.dir, L->resumed_from, sizeof(L->resumed_from)) != 0) {
        printf("resume: no complete checkpoint in '%s'; starting fresh\n", t->ckpt.dir);
        L->resumed_from[0] = '\0';
    }
    if (!L->resumed_from[0]) {
        ops->init_weights(ops->ctx, t->model.init_from, (uint64_t)t->run.seed);
        return;
    }
    CheckpointState st;
    ops->load_checkpoint(ops->ctx, L->resumed_from, &st);
    if (st.step > (uint64_t)INT_MAX || st.adam_step > (uint64_t)INT_MAX)
        FAIL("rank %d: '%s': step %llu is out of range (corrupt?)", L->rank, L->resumed_from,
             (unsigned long long)st.step);
    if (st.step >= (uint64_t)t->run.steps)
        FAIL("'%s' is at step %llu, at or past --steps %d: nothing to train\n  hint: raise --steps to go on",
             L->resumed_from, (unsigned long long)st.step, t->run.steps);
    batch_source_set_state(L->src, st.rng_state, &st.data, L->resumed_from);
    if (st.run_id != 0)
        L->run_id = st.run_id;
    printf("resumed run %016llx from '%s' at step %llu\n", (unsigned long long)L->run_id, L->resumed_from,
           (unsigned long long)st.step);
    L->start_step = (int)st.step;
}

/* The mean val loss over --eval-batches batches from the start of the val shards, over all ranks. */
static inline float train_evaluate(TrainLoop *L, const TrainOps *ops)
{
    DataLoader *val = L->val;
    int batches = L->t->run.eval_batches;
    dataloader_reset(val);
    double loss_sum = 0.0, count = 0.0;
    for (int b = 0; b < batches; b++) {
        dataloader_next_batch_or_die(val);
        loss_sum += ops->eval_batch(ops->ctx, val->inputs, val->targets);
        count += (double)count_targets(val->targets, L->step_units);
    }
    return train_val_loss(train_sum_(ops, loss_sum), train_sum_(ops, count), batches, L->val_shards);
}

/* One optimizer step (see the top) into *r; *clock: where its time starts, then its end. */
static inline void train_one_step(TrainLoop *L, const TrainOps *ops, int step, StepLog *r, double *clock)
{
    const TrainFlags *t = L->t;
    int64_t N = L->step_units;
    int *inputs = L->inputs, *targets = L->inputs + N * L->accum;
    for (int k = 0; k < L->accum; k++) {
        const int *in, *tg;
        batch_source_next(L->src, &in, &tg);
        memcpy(inputs + k * N, in, (size_t)N * sizeof(int));
        memcpy(targets + k * N, tg, (size_t)N * sizeof(int));
    }
    double count = train_sum_(ops, (double)count_targets(targets, N * L->accum));
    LrSchedule schedule = train_schedule(&t->optim, t->run.steps);
    memset(r, 0, sizeof(*r));
    r->step = step + 1;
    r->steps = t->run.steps;
    r->lr = schedule_lr(&schedule, step);
    if (count > 0) {
        ops->step(ops->ctx, inputs, targets, L->accum, count, step, (float)r->lr, r);
    } else { /* every target masked (a window inside a long prompt): nothing to learn */
        r->loss = NAN;
        r->skipped = r->no_targets = 1;
    }
    double end = now_seconds();
    r->ms = (end - *clock) * 1e3;
    *clock = end;
    r->tokens_per_s = (double)N * L->accum / (r->ms * 1e-3); /* this rank's; annotate may make it all ranks' */
    if (ops->annotate)
        ops->annotate(ops->ctx, r);
}

/* The run from L->start_step (train_loop_start) to --steps, and its end (see the top). */
static inline void train_loop_run(TrainLoop *L, const TrainOps *ops)
{
    const TrainFlags *t = L->t;
    NanGuard guard = {0, 0, 0};
    double tokens_per_s_sum = 0.0, clock = now_seconds();
    train_progress_(ops, "model ready", -1);
    for (int step = L->start_step; step < t->run.steps; step++) {
        if (L->val && step % t->run.eval_every == 0) {
            run_log_eval(L->log, step, train_evaluate(L, ops));
            train_progress_(ops, "evaluation at step", step);
            clock = now_seconds();
        }
        StepLog r;
        train_one_step(L, ops, step, &r, &clock);
        tokens_per_s_sum += step > L->start_step ? r.tokens_per_s : 0.0;
        run_log_step(L->log, &r);
        if (ops->logged)
            ops->logged(ops->ctx, &r);
        nan_guard_step(&guard, &t->run, step + 1, r.loss, r.grad_norm, r.skipped, r.no_targets);
        train_progress_(ops, "step", step + 1);
        if (t->ckpt.dir && checkpoint_due(step + 1, t->ckpt.save_every, t->run.steps)) {
            CheckpointState st = checkpoint_state(L->run_id, (uint64_t)(step + 1), ops->adam_steps(ops->ctx), 0);
            batch_source_get_state(L->src, &st.rng_state, &st.data);
            ops->save(ops->ctx, &t->ckpt, &L->outputs->extras, st);
            train_progress_(ops, "checkpoint of step", step + 1);
            clock = now_seconds();
        }
        if (train_sample_due(&t->sample, step + 1, t->run.steps)) {
            train_sample(L->outputs, &t->sample, step + 1, t->batch.T, L->config->vocab_size, ops->next_logits,
                         ops->ctx, L->log);
            train_progress_(ops, "sample after step", step + 1);
            clock = now_seconds();
        }
    }
    if (L->val)
        run_log_eval(L->log, t->run.steps, train_evaluate(L, ops));
    nan_guard_report(&guard);
    if (t->ckpt.export_dir) {
        float *master = ops->master_copy(ops->ctx); /* every rank gives its part */
        if (L->rank == 0)
            train_export(L->outputs, &t->ckpt, L->config, L->layout, master);
        free(master);
    }
    int timed = t->run.steps - L->start_step - 1;
    L->tokens_per_s_mean = timed > 0 ? tokens_per_s_sum / timed : 0.0;
}

#endif /* LLMC_TRAIN_LOOP_H */
