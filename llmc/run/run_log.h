/*
 * run_log.h: what a training run tells the user, on the console and in its
 * JSON lines log (--log), the same for both trainers:
 *
 *   {"run": {"program": ..., "commit": ..., "command": [argv...], "resumed_from": path or null,
 *            "model": {the LlamaConfig}, "flags": {every flag's value}}}
 *   {"step": N, "loss": ..., "lr": ..., "grad_norm": ..., "ms": ..., "tokens_per_s": ...,
 *    and on the GPU "tokens_per_s_per_gpu", "gpus", "zero_stage", "mfu", "peak_mem_gib", "device_mem_gib",
 *    "host_peak_gib" (the process's peak resident host memory: --offload's state lives there), and with
 *    --update-gather delta "update_bytes_per_param" (the new weights' bytes on the wire a weight)}
 *   {"step": N, "val_loss": ...}
 *   {"step": N, "sample": text, "prompt": text, "tokens": [ids of the prompt and the sample]}
 * with the same numbers on one console line per step. The loss is written
 * with 9 significant digits, which give a float back exactly. A fresh run
 * starts the log anew; --resume appends to it, behind a new "run" line, so the
 * log keeps the whole history of a run. The log's folder is made if missing.
 * The commit is the one the binary was built from (GIT_COMMIT, from the Makefile).
 *
 * Plain C; compiles as C++ too. Writes only stdout and the log file.
 */
#ifndef LLMC_RUN_LOG_H
#define LLMC_RUN_LOG_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "llmc/common/fileutil.h"
#include "llmc/run/flags.h"
#include "llmc/formats/json.h"
#include "llmc/model/llama_config.h"
#include "llmc/common/utils.h"

#ifndef GIT_COMMIT
#define GIT_COMMIT "unknown"
#endif

/* Seconds on a monotonic clock, for step times. */
static inline double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    FILE *json; /* NULL: no log file */
    char path[LLMC_PATH_MAX];
} RunLog;

/* Every line is flushed as written, and a failed write (a full disk) ends the run
 * naming the log: a run that goes on logging nowhere has lost its record. */
static inline void run_log_flush_(RunLog *log)
{
    if (fflush(log->json) != 0 || ferror(log->json))
        FAIL("cannot write the log '%s': %s\n  hint: free space there (the newest checkpoint stays intact: go on "
             "with --resume), or pass another --log",
             log->path, strerror(errno));
}

/* One optimizer step's numbers. */
typedef struct {
    int step, steps; /* steps done, of steps */
    double loss, lr, grad_norm, ms, tokens_per_s;
    int skipped;    /* the update was skipped: the loss or the gradient was not finite (--on-nan), or no targets */
    int no_targets; /* every target of the step's batch was masked: nothing to learn, the update skipped */
    int gpus;       /* 0 on the CPU; then the fields below are not reported */
    int zero_stage;
    double mfu, peak_mem_gib, device_mem_gib, host_peak_gib;
    double update_bytes; /* --update-gather delta: the new weights' bytes on the wire a weight; 0: not reported */
} StepLog;

/* {"vocab_size": ..., ...}: every field of llama_config.h's table, by its .llmt key without "config.". */
static inline void run_log_config_json_(FILE *f, const LlamaConfig *c)
{
    fprintf(f, "{");
    for (int i = 0; i < LLAMA_CONFIG_N_FIELDS; i++) {
        const ConfigField *field = &LLAMA_CONFIG_FIELDS[i];
        char value[64];
        config_field_format(value, sizeof(value), c, field, 1);
        fprintf(f, "%s\"%s\": %s", i ? ", " : "", field->key + strlen("config."), value);
    }
    fprintf(f, "}");
}

/* {"--flag": value, ...} for every flag of the table; options holds the values. */
static inline void run_log_flags_json_(FILE *f, const Flag *flags, int n_flags, const void *options)
{
    int first = 1;
    fprintf(f, "{");
    for (int i = 0; i < n_flags; i++) {
        const Flag *fl = &flags[i];
        if (fl->type == FLAG_HEADING)
            continue;
        const char *field = (const char *)options + fl->offset;
        fprintf(f, first ? "" : ", ");
        first = 0;
        json_write_string(f, fl->name);
        fprintf(f, ": ");
        if (fl->type == FLAG_INT && *(const int *)field == FLAG_INT_UNSET)
            fprintf(f, "null");
        else if (fl->type == FLAG_INT)
            fprintf(f, "%d", *(const int *)field);
        else if (fl->type == FLAG_FLOAT)
            fprintf(f, "%.9g", (double)*(const float *)field);
        else if (fl->type == FLAG_DOUBLE)
            fprintf(f, "%.17g", *(const double *)field);
        else if (fl->type == FLAG_SWITCH)
            fprintf(f, "%s", *(const int *)field ? "true" : "false");
        else if (*(const char *const *)field)
            json_write_string(f, *(const char *const *)field);
        else
            fprintf(f, "null");
    }
    fprintf(f, "}");
}

/* Opens the log at path ('' or NULL: none), appending when append (--resume),
 * and writes the run line: the program, the commit, the command line, the run
 * id (train_state.h), the checkpoint it resumed from (NULL or "": none), the
 * model and the value of every flag of the table (options holds them). */
static inline void run_log_open(RunLog *log, const char *path, int append, uint64_t run_id, const char *resumed_from,
                                int argc, char **argv, const LlamaConfig *config, const Flag *flags, int n_flags,
                                const void *options)
{
    log->json = NULL;
    if (!path || !path[0])
        return;
    if (path_format(log->path, sizeof(log->path), "%s", path) != 0)
        FAIL("--log: the path '%.100s...' is too long", path);
    const char *slash = strrchr(path, '/');
    if (slash && slash != path) {
        char dir[LLMC_PATH_MAX];
        if (path_format(dir, sizeof(dir), "%.*s", (int)(slash - path), path) != 0 || make_dirs(dir) != 0)
            FAIL("cannot create the folder of the log '%s': %s\n  hint: pass another --log, or --log '' for none", path,
                 strerror(errno));
    }
    log->json = fopen(path, append ? "a" : "w");
    if (!log->json)
        FAIL("cannot open the log '%s': %s\n  hint: pass another --log, or --log '' for none", path, strerror(errno));
    FILE *f = log->json;
    fprintf(f, "{\"run\": {\"program\": ");
    json_write_string(f, argv[0]);
    fprintf(f, ", \"commit\": ");
    json_write_string(f, GIT_COMMIT);
    fprintf(f, ", \"command\": [");
    for (int i = 0; i < argc; i++) {
        fprintf(f, i ? ", " : "");
        json_write_string(f, argv[i]);
    }
    fprintf(f, "], \"run_id\": \"%016llx\", \"resumed_from\": ", (unsigned long long)run_id);
    if (resumed_from && resumed_from[0])
        json_write_string(f, resumed_from);
    else
        fprintf(f, "null");
    fprintf(f, ", \"model\": ");
    run_log_config_json_(f, config);
    fprintf(f, ", \"flags\": ");
    run_log_flags_json_(f, flags, n_flags, options);
    fprintf(f, "}}\n");
    run_log_flush_(log);
}

static inline void run_log_step(RunLog *log, const StepLog *r)
{
    printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s", r->step, r->steps, r->loss, r->lr,
           r->grad_norm, r->ms, r->tokens_per_s);
    if (r->gpus > 0)
        printf(" | MFU %.1f%% | mem %.2f GiB (device %.2f)", 100 * r->mfu, r->peak_mem_gib, r->device_mem_gib);
    printf("%s\n", r->no_targets ? " | skipped: no targets (all masked)" : r->skipped ? " | skipped: not finite" : "");
    if (r->gpus > 1)
        printf("           %d GPUs: %.0f tok/s per GPU\n", r->gpus, r->tokens_per_s / r->gpus);
    if (!log->json)
        return;
    fprintf(log->json, "{\"step\": %d, \"loss\": ", r->step);
    json_write_number(log->json, "%.9g", r->loss); /* null when not finite */
    fprintf(log->json, ", \"lr\": %.6e, \"grad_norm\": ", r->lr);
    json_write_number(log->json, "%.6f", r->grad_norm);
    fprintf(log->json, ", \"ms\": %.3f, \"tokens_per_s\": %.1f", r->ms, r->tokens_per_s);
    if (r->gpus > 0)
        fprintf(log->json,
                ", \"tokens_per_s_per_gpu\": %.1f, \"gpus\": %d, \"zero_stage\": %d, \"mfu\": %.5f, "
                "\"peak_mem_gib\": %.4f, \"device_mem_gib\": %.4f, \"host_peak_gib\": %.4f",
                r->tokens_per_s / r->gpus, r->gpus, r->zero_stage, r->mfu, r->peak_mem_gib, r->device_mem_gib,
                r->host_peak_gib);
    if (r->update_bytes > 0)
        fprintf(log->json, ", \"update_bytes_per_param\": %.4f", r->update_bytes);
    fprintf(log->json, "%s%s}\n", r->skipped ? ", \"skipped\": true" : "",
            r->no_targets ? ", \"no_targets\": true" : "");
    run_log_flush_(log);
}

/* The validation loss after `step` steps. */
static inline void run_log_eval(RunLog *log, int step, double val_loss)
{
    printf("step %5d | val loss %.4f\n", step, val_loss);
    if (log->json) {
        fprintf(log->json, "{\"step\": %d, \"val_loss\": ", step);
        json_write_number(log->json, "%.6f", val_loss);
        fprintf(log->json, "}\n");
        run_log_flush_(log);
    }
}

/* A sample of text after `step` steps: the prompt's and the new tokens. */
static inline void run_log_sample(RunLog *log, int step, const char *prompt, const char *sample, const int *tokens,
                                  int n_tokens)
{
    printf("--- sample after step %d:\n%s%s\n---\n", step, prompt, sample);
    if (!log->json)
        return;
    fprintf(log->json, "{\"step\": %d, \"sample\": ", step);
    json_write_string(log->json, sample);
    fprintf(log->json, ", \"prompt\": ");
    json_write_string(log->json, prompt);
    fprintf(log->json, ", \"tokens\": [");
    for (int i = 0; i < n_tokens; i++)
        fprintf(log->json, i ? ", %d" : "%d", tokens[i]);
    fprintf(log->json, "]}\n");
    run_log_flush_(log);
}

static inline void run_log_close(RunLog *log)
{
    if (log->json && fclose(log->json) != 0)
        FAIL("cannot write the log '%s': %s\n  hint: free space there, or pass another --log", log->path,
             strerror(errno));
    log->json = NULL;
}

#endif /* LLMC_RUN_LOG_H */
