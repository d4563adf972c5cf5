/*
 * train_llama.cu: trains a Llama 3 family model (llmc/llama_config.h) on one
 * GPU or several in bf16 with fp32 master weights, bf16 gradients and fp32
 * AdamW moments: 14 bytes per parameter, divided over the GPUs by ZeRO
 * sharding. The fp32 master is the bf16 weights plus a 16-bit residual
 * (llmc/master_weights.h), exact and without a second weight copy. Gradients
 * are bf16 as in llm.c: each is one fp32-accumulated GEMM or kernel rounded
 * once, plus one rounding per extra logits chunk (lm_head) and per extra
 * micro-step; the first micro-step writes them, later ones add.
 *
 * One micro-step, N = B*T tokens:
 *   forward:  embedding -> per layer [rmsnorm -> fused QKV GEMM -> RoPE in place
 *             -> cuDNN causal GQA attention -> o_proj -> fused residual add +
 *             rmsnorm -> fused gate/up GEMM -> SwiGLU -> down_proj -> fused
 *             residual add + next rmsnorm] -> final rmsnorm
 *   loss:     chunked lm_head + cross-entropy; the N x V logits never exist at
 *             once; lm_head's gradient accumulates in fp32 chunk by chunk
 *   backward: the same in reverse; SwiGLU and the norms are recomputed rather
 *             than stored (--recompute 1, the default); --recompute 2 also
 *             recomputes the gate/up GEMM, for long sequences
 * then, once per optimizer step: gradients summed over the GPUs -> global grad
 * norm -> clip coefficient (on the device, no host sync) -> AdamW over each
 * bucket's range that this GPU updates (decay on matrices only).
 *
 * Parameters, gradients and moments are flat buffers with the layout of
 * llama_param_layout(), so q/k/v and gate/up are single fused matrices, cut
 * into per-layer buckets for ZeRO data parallelism (llmc/zero_plan.h, zero.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/llama_config.h"
#include "llmc/tensorfile.h"
#include "llmc/dataloader.h"
#include "llmc/schedule.h"
#include "llmc/matmul.h"
#include "llmc/attention.h"
#include "llmc/rmsnorm.h"
#include "llmc/rope.h"
#include "llmc/swiglu.h"
#include "llmc/embedding.h"
#include "llmc/fused_classifier.h"
#include "llmc/adamw.h"
#include "llmc/checkpoint.h"
#include "llmc/distributed.h"
#include "llmc/zero.h"
#include "llmc/flags.h"
#include "llmc/profile.h"
#include "llmc/watchdog.h"

/* Dense bf16 peak of an H100 SXM, the MFU denominator (PaLM/torchtitan convention). */
#define PEAK_BF16_FLOPS 989e12
/* Largest workspace the deterministic attention backward may take. */
#define DETERMINISTIC_ATTENTION_MAX_BYTES (2.0 * 1073741824.0)

#include "llmc/llama_model.h"
#include "llmc/llama_checkpoint.h"


#ifndef TESTING
/* ------------------------------------------------------------------------- */
/* the command line program                                                   */

typedef struct {
    const char *train_pattern, *val_pattern, *preset, *init_from, *log_path, *schedule, *rendezvous, *checkpoint_dir;
    int save_every, keep, resume;
    int B, T, steps, warmup, eval_every, eval_batches, recompute, random_data, seed, total_batch, profile_step;
    int zero_stage;
    LaunchFlags launch;
    float rendezvous_timeout, comm_timeout;
    float lr, min_lr_frac, decay_frac, logits_budget_mb;
    AdamWConfig opt;
    LlamaConfig shape; /* explicit overrides; 0 = from the preset */
    int untied;
} Args;

#define F(name, type, field, help) FLAG(name, type, Args, field, help)
static const Flag TRAIN_FLAGS[] = {
    FLAG_SECTION("data"),
    F("--train", FLAG_STRING, train_pattern, "train shards, a glob"),
    F("--val", FLAG_STRING, val_pattern, "val shards, a glob ('' = no evaluation)"),
    F("--random-data", FLAG_SWITCH, random_data, "random tokens instead of shards (benchmarks)"),
    FLAG_SECTION("model"),
    F("--preset", FLAG_STRING, preset, "llama3.2-1b, llama3.2-3b, llama3.1-8b, nano, tiny or small (default tiny)"),
    F("--init-from", FLAG_STRING, init_from, "start from a .llmt weights file (its shape, no preset needed)"),
    F("--vocab", FLAG_INT, shape.vocab_size, "vocabulary size (overrides the preset)"),
    F("--d-model", FLAG_INT, shape.d_model, "hidden size (overrides the preset)"),
    F("--n-layer", FLAG_INT, shape.n_layer, "decoder layers (overrides the preset)"),
    F("--n-head", FLAG_INT, shape.n_head, "query heads (overrides the preset)"),
    F("--n-kv-head", FLAG_INT, shape.n_kv_head, "key/value heads (overrides the preset)"),
    F("--head-dim", FLAG_INT, shape.head_dim, "head size (default d_model / n_head)"),
    F("--ffn-dim", FLAG_INT, shape.ffn_dim, "SwiGLU hidden size (overrides the preset)"),
    F("--untied", FLAG_SWITCH, untied, "untie lm_head from the embedding"),
    FLAG_SECTION("batch"),
    F("-B", FLAG_INT, B, "sequences per micro-batch and GPU"),
    F("-T", FLAG_INT, T, "sequence length"),
    F("--total-batch", FLAG_INT, total_batch,
      "tokens per optimizer step over all GPUs, a multiple of B*T*GPUs "
      "(default B*T*GPUs)"),
    FLAG_SECTION("optimizer"),
    F("--lr", FLAG_FLOAT, lr, "peak learning rate"),
    F("--schedule", FLAG_STRING, schedule, "cosine, linear, constant or wsd"),
    F("--warmup", FLAG_INT, warmup, "warmup steps"),
    F("--min-lr-frac", FLAG_FLOAT, min_lr_frac, "final lr as a fraction of --lr"),
    F("--decay-frac", FLAG_FLOAT, decay_frac, "wsd: fraction of the steps spent decaying"),
    F("--weight-decay", FLAG_FLOAT, opt.weight_decay, "AdamW weight decay, on matrices only"),
    F("--beta1", FLAG_FLOAT, opt.beta1, "AdamW beta1"),
    F("--beta2", FLAG_FLOAT, opt.beta2, "AdamW beta2"),
    F("--eps", FLAG_FLOAT, opt.eps, "AdamW epsilon"),
    F("--grad-clip", FLAG_FLOAT, opt.grad_clip, "max global gradient norm, 0 = off"),
    FLAG_SECTION("run"),
    F("--steps", FLAG_INT, steps, "optimizer steps"),
    F("--eval-every", FLAG_INT, eval_every, "evaluate on the val shards every N steps, 0 = never"),
    F("--eval-batches", FLAG_INT, eval_batches, "val batches per evaluation"),
    F("--recompute", FLAG_INT, recompute,
      "0: store every activation; 1: recompute norms and SwiGLU; 2: also the "
      "gate/up GEMM (least memory)"),
    F("--logits-budget-mb", FLAG_FLOAT, logits_budget_mb, "memory for one chunk of logits"),
    F("--profile-step", FLAG_INT, profile_step, "print where step N's GPU time goes, by kernel class"),
    F("--seed", FLAG_INT, seed, "init and data-order seed"),
    F("--log", FLAG_STRING, log_path, "JSON lines log ('' = none)"),
    FLAG_SECTION("checkpoints"),
    F("--checkpoint-dir", FLAG_STRING, checkpoint_dir,
      "save DIR/step_<08d>/: model.safetensors (fp32, HF names), "
      "config.json, optimizer state; at the end and"),
    F("--save-every", FLAG_INT, save_every, "every N steps (0 = only at the end)"),
    F("--keep", FLAG_INT, keep, "keep the newest K complete checkpoints (0 = all)"),
    F("--resume", FLAG_SWITCH, resume, "continue from the newest complete checkpoint (on any number of GPUs)"),
    FLAG_SECTION("several GPUs (one process per GPU: mpirun, a scheduler, or scripts/launch_multi_gpu.sh)"),
    F("--zero-stage", FLAG_INT, zero_stage,
      "0: all-reduce, every GPU keeps all optimizer state; 1: AdamW state "
      "sharded over the GPUs; 2: gradients too, reduce-scattered per layer during "
      "backward; 3: weights too, gathered per layer just ahead of use"),
    F("--rank", FLAG_INT, launch.rank,
      "this process's rank, when no launcher variable says it (mpirun, "
      "RANK/WORLD_SIZE, Slurm and PMI are read)"),
    F("--world-size", FLAG_INT, launch.world, "number of processes, with --rank"),
    F("--local-rank", FLAG_INT, launch.local_rank, "GPU on this host (default rank % GPUs)"),
    F("--rendezvous", FLAG_STRING, rendezvous,
      "without MPI: tcp://HOST:PORT of rank 0 or file:PATH on a shared "
      "file system (default tcp://$MASTER_ADDR:$MASTER_PORT)"),
    F("--rendezvous-timeout", FLAG_FLOAT, rendezvous_timeout, "seconds to wait for all ranks"),
    F("--comm-timeout", FLAG_FLOAT, comm_timeout,
      "seconds a rank waits without progress (a peer died) before it exits "
      "with an error, 0 = forever"),
};
#undef F
#define N_TRAIN_FLAGS ((int)(sizeof(TRAIN_FLAGS) / sizeof(TRAIN_FLAGS[0])))

static Args default_args(void)
{
    Args a;
    memset(&a, 0, sizeof(a));
    a.train_pattern = "data/shards/corpus_train_*.bin";
    a.val_pattern = "data/shards/corpus_val_*.bin";
    a.log_path = "log/train_llama.jsonl";
    a.schedule = "cosine";
    a.B = 4;
    a.T = 256;
    a.steps = 50;
    a.warmup = 10;
    a.eval_every = 25;
    a.eval_batches = 8;
    a.recompute = 1;
    a.seed = 1337;
    a.lr = 3e-4f;
    a.min_lr_frac = 0.1f;
    a.decay_frac = 0.2f;
    a.logits_budget_mb = 512.0f;
    a.profile_step = -1;
    a.opt.beta1 = 0.9f;
    a.opt.beta2 = 0.95f;
    a.opt.eps = 1e-8f;
    a.opt.weight_decay = 0.1f;
    a.opt.grad_clip = 1.0f;
    a.zero_stage = 1;
    a.keep = 3;
    a.launch.rank = a.launch.world = a.launch.local_rank = -1;
    a.rendezvous_timeout = 300.0f;
    a.comm_timeout = 600.0f;
    return a;
}

static void usage(void)
{
    Args defaults = default_args();
    printf("usage: ./train_llama [flags]\n"
           "Trains a Llama 3 family model on one GPU or several (bf16, fp32 master weights, AdamW).\n\n");
    flags_usage(stdout, TRAIN_FLAGS, N_TRAIN_FLAGS, &defaults);
    printf("  %-22s this text\n", "-h, --help");
    exit(0);
}

static void parse_args(Args *a, int argc, char **argv)
{
    *a = default_args();
    flags_parse(TRAIN_FLAGS, N_TRAIN_FLAGS, argc, argv, a, usage);
    a->opt.lr = a->lr;
    if (a->B <= 0 || a->T <= 0)
        FAIL("-B and -T must be positive (got %d, %d)", a->B, a->T);
    if (a->steps <= 0)
        FAIL("--steps must be positive (got %d)", a->steps);
    if (a->warmup < 0 || a->eval_every < 0 || a->eval_batches <= 0)
        FAIL("--warmup and --eval-every must be >= 0, --eval-batches > 0");
    if (a->recompute < 0 || a->recompute > 2)
        FAIL("--recompute takes 0, 1 or 2 (got %d)", a->recompute);
    if (a->zero_stage < 0 || a->zero_stage > 3)
        FAIL("--zero-stage takes 0, 1, 2 or 3 (got %d)", a->zero_stage);
    if (a->save_every < 0 || a->keep < 0)
        FAIL("--save-every and --keep must be >= 0");
    if ((a->resume || a->save_every > 0) && !a->checkpoint_dir)
        FAIL("--resume and --save-every need --checkpoint-dir DIR");
    if (!(a->rendezvous_timeout > 0))
        FAIL("--rendezvous-timeout must be positive");
    if (!(a->comm_timeout >= 0))
        FAIL("--comm-timeout must be >= 0 seconds (0 = wait forever; got %g)", a->comm_timeout);
    char err[2048];
    if (a->rendezvous && rendezvous_check_spec(a->rendezvous, err, sizeof(err)) != 0)
        FAIL("--rendezvous: %s", err);
    if (!(a->lr > 0) || a->min_lr_frac < 0 || a->min_lr_frac > 1)
        FAIL("--lr must be positive and --min-lr-frac in [0, 1]");
    if (!(a->decay_frac > 0 && a->decay_frac <= 1))
        FAIL("--decay-frac must be in (0, 1]");
    if (!(a->opt.beta1 >= 0 && a->opt.beta1 < 1 && a->opt.beta2 >= 0 && a->opt.beta2 < 1 && a->opt.eps > 0))
        FAIL("AdamW needs 0 <= beta1, beta2 < 1 and eps > 0");
    if (!(a->logits_budget_mb > 0))
        FAIL("--logits-budget-mb must be positive");
    if (a->init_from && (a->preset || a->shape.d_model || a->shape.n_layer || a->shape.vocab_size))
        FAIL("--init-from takes the model shape from the file; drop --preset and the shape flags");
}

static LlamaConfig config_from_args(const Args *a)
{
    LlamaConfig c;
    if (a->init_from) {
        TensorFile tf;
        tensorfile_open(&tf, a->init_from);
        c = llama_config_from_tensorfile(&tf);
        tensorfile_close(&tf);
        return c;
    }
    const char *preset = a->preset ? a->preset : "tiny";
    if (llama_preset(preset, &c) != 0) {
        fprintf(stderr, "error: unknown preset '%s'; known presets:", preset);
        for (int i = 0; i < LLAMA_N_PRESETS; i++)
            fprintf(stderr, " %s", LLAMA_PRESETS[i].name);
        fprintf(stderr, "\n");
        exit(1);
    }
    if (a->shape.vocab_size)
        c.vocab_size = a->shape.vocab_size;
    if (a->shape.d_model)
        c.d_model = a->shape.d_model;
    if (a->shape.n_layer)
        c.n_layer = a->shape.n_layer;
    if (a->shape.n_head)
        c.n_head = a->shape.n_head;
    if (a->shape.n_kv_head)
        c.n_kv_head = a->shape.n_kv_head;
    if (a->shape.ffn_dim)
        c.ffn_dim = a->shape.ffn_dim;
    c.head_dim = a->shape.head_dim ? a->shape.head_dim : c.d_model / c.n_head;
    if (a->untied)
        c.tie_embeddings = 0;
    char err[2048];
    if (llama_config_check(&c, err, sizeof(err)) != 0)
        FAIL("bad model shape: %s", err);
    return c;
}

/* Source of micro-batches: shards through the data loader, or random tokens. */
typedef struct {
    DataLoader loader;
    int random;
    uint64_t rng;
    int vocab, rank, world;
    int *inputs, *targets; /* the random batch */
} BatchSource;

/* This rank's N tokens of the next global batch. Random tokens are drawn for the
 * whole global batch on every rank, so any world size sees the same batches. */
static void batch_next(BatchSource *src, int64_t N, const int **inputs, const int **targets)
{
    if (!src->random) {
        dataloader_next_batch_or_die(&src->loader);
        *inputs = src->loader.inputs;
        *targets = src->loader.targets;
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        int *out = pass == 0 ? src->inputs : src->targets;
        for (int r = 0; r < src->world; r++) {
            for (int64_t i = 0; i < N; i++) {
                int token = (int)(splitmix64(&src->rng) % (uint64_t)src->vocab);
                if (r == src->rank)
                    out[i] = token;
            }
        }
    }
    *inputs = src->inputs;
    *targets = src->targets;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The profiled step's time per kernel class, to stdout and the log. */
static void print_profile(FILE *log, int step, double wall_ms)
{
    float ms[PROF_CLASSES];
    float busy = profile_end_step(ms);
    printf("profile of step %d: %.1f ms wall\n", step, wall_ms);
    for (int c = 0; c < PROF_CLASSES; c++) {
        printf("  %-28s %8.2f ms %5.1f%%\n", PROFILE_CLASS_NAMES[c], ms[c], 100.0 * ms[c] / wall_ms);
    }
    printf("  %-28s %8.2f ms %5.1f%%\n", "idle (gaps, host, sync)", wall_ms - busy, 100.0 * (wall_ms - busy) / wall_ms);
    if (!log)
        return;
    fprintf(log, "{\"step\": %d, \"profile_ms\": {", step);
    for (int c = 0; c < PROF_CLASSES; c++)
        fprintf(log, "\"%s\": %.4f, ", PROFILE_CLASS_NAMES[c], ms[c]);
    fprintf(log, "\"idle\": %.4f, \"wall\": %.4f}}\n", wall_ms - busy, wall_ms);
}

/* Mean val loss over all ranks' slices of `batches` global batches. */
static float evaluate(Llama *m, DataLoader *val, int batches, cudaStream_t s)
{
    dataloader_reset(val);
    int64_t N = llama_tokens(m);
    double loss_sum_total = 0.0;
    int64_t count = 0;
    float part;
    for (int b = 0; b < batches; b++) {
        dataloader_next_batch_or_die(val);
        llama_set_batch(m, val->inputs, val->targets, 0, s);
        llama_eval_micro(m, 0, s);
        CUDA_CHECK(cudaMemcpyAsync(&part, m->loss_parts, sizeof(float), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        loss_sum_total += part;
        count += count_targets(val->targets, N);
    }
    loss_sum_total = dist_sum_host(m->dist, loss_sum_total, s);
    double total_count = dist_sum_host(m->dist, (double)count, s);
    return total_count > 0 ? (float)(loss_sum_total / total_count) : NAN;
}

int main(int argc, char **argv)
{
    Args a;
    parse_args(&a, argc, argv);
    /* flags, model and data are all checked before the GPU is touched */
    LlamaConfig config = config_from_args(&a);
    if (config.d_model % 8 != 0 || config.head_dim % 8 != 0 || config.ffn_dim % 8 != 0)
        FAIL("the GPU kernels need d_model, head_dim and ffn_dim to be multiples of 8 (got %d, %d, %d)", config.d_model,
             config.head_dim, config.ffn_dim);
    if (a.T > config.max_seq_len)
        FAIL("-T %d exceeds the model's max_seq_len %d\n  hint: lower -T", a.T, config.max_seq_len);
    LaunchInfo launch = dist_launch_info(&a.launch);
    int rank = launch.rank, world = launch.world;
    int64_t N = (int64_t)a.B * a.T, NW = N * world; /* tokens per micro-step: per GPU, all GPUs */
    int total_batch = a.total_batch ? a.total_batch : (int)NW;
    if (total_batch % NW != 0)
        FAIL("--total-batch %d is not a multiple of B*T*GPUs = %lld\n  hint: pick a multiple, e.g. %lld", total_batch,
             (long long)NW, (long long)NW * ((total_batch + NW - 1) / NW));
    int accum = (int)(total_batch / NW);
    ScheduleKind kind;
    if (schedule_kind_from_name(a.schedule, &kind) != 0)
        FAIL("unknown --schedule '%s' (cosine, linear, constant, wsd)", a.schedule);
    LrSchedule schedule = {kind, a.lr, a.min_lr_frac, a.warmup, a.steps, a.decay_frac};

    BatchSource src;
    memset(&src, 0, sizeof(src));
    src.random = a.random_data;
    src.vocab = config.vocab_size;
    src.rng = (uint64_t)a.seed;
    src.rank = rank;
    src.world = world;
    if (src.random) {
        src.inputs = (int *)malloc_check((size_t)N * sizeof(int), "random batch");
        src.targets = (int *)malloc_check((size_t)N * sizeof(int), "random batch");
    } else {
        dataloader_init_or_die(&src.loader, a.train_pattern, a.B, a.T, rank, world, 1, (uint64_t)a.seed,
                               config.vocab_size);
    }
    int have_val = !src.random && a.val_pattern[0] && a.eval_every > 0;
    DataLoader val;
    if (have_val)
        dataloader_init_eval_or_die(&val, a.val_pattern, a.B, a.T, rank, world, config.vocab_size);

    int device_count = 0;
    cudaError_t status = cudaGetDeviceCount(&device_count);
    if (status != cudaSuccess || device_count == 0) {
        fprintf(stderr,
                "error: no CUDA GPU found (%s)\n  hint: on a machine without a GPU, train with the CPU "
                "reference instead: ./train_llama_ref --help\n",
                cudaGetErrorString(status));
        return 1;
    }
    Dist dist;
    dist_init(&dist, &launch, a.rendezvous, a.rendezvous_timeout);
    /* with peers, a rank that stops hearing from them exits instead of waiting forever */
    Watchdog watchdog;
    watchdog_start(&watchdog, rank, world > 1 ? a.comm_timeout : 0.0, world > 1 ? dist_async_error : NULL, &dist,
                   "startup");
    /* rank 0 speaks for all; the others only report errors */
    int speaker = rank == 0;
    if (!speaker && !freopen("/dev/null", "w", stdout))
        FAIL("rank %d: cannot silence stdout", rank);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dist.local_rank));
    printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    if (world > 1)
        printf("ranks: %d (from %s, %s), ZeRO stage %d\n", world, launch.source,
               dist.mpi ? "NCCL id by MPI" : "NCCL id by rendezvous", a.zero_stage);
    llama_config_print(&config, stdout);
    matmul_setup();
    attention_setup();
    /* cuDNN's deterministic backward keeps dP in a B*H*T*T bf16 workspace: take it
     * while that stays small, else the atomic dQ backward, whose sums can differ
     * between runs in the last bits */
    double det_workspace = 2.0 * a.B * config.n_head * (double)a.T * a.T;
    int deterministic = det_workspace <= DETERMINISTIC_ATTENTION_MAX_BYTES;
    attention_set_deterministic(deterministic);
    Llama model;
    llama_build(&model, &config, a.B, a.T, a.recompute, accum, (size_t)(a.logits_budget_mb * 1048576.0), &dist,
                a.zero_stage);
    /* a resume restores weights, AdamW state, step, data position and RNG, so the
     * run continues as if never stopped (the schedule follows the global step) */
    char resume_from[LLMC_PATH_MAX] = "";
    if (a.resume && checkpoint_find_latest(a.checkpoint_dir, resume_from, sizeof(resume_from)) != 0) {
        printf("resume: no complete checkpoint in '%s'; starting fresh\n", a.checkpoint_dir);
        resume_from[0] = '\0';
    }
    int start_step = 0;
    if (resume_from[0]) {
        CheckpointState st;
        llama_load_checkpoint(&model, resume_from, &st);
        start_step = (int)st.step;
        src.rng = st.rng_state;
        if (!src.random)
            dataloader_set_state_or_die(&src.loader, &st.data);
        printf("resumed from '%s' at step %d\n", resume_from, start_step);
    } else if (a.init_from) {
        llama_load_weights(&model, a.init_from);
    } else {
        llama_init_random(&model, (uint64_t)a.seed);
    }
    double flops_per_token = llama_flops_per_token(&config, a.T);
    printf("parameters: %.3f M; batch %d x %d x %d accum x %d GPUs = %d tokens/step; recompute %d; logits chunk %d "
           "rows\n",
           model.layout.total / 1e6, a.B, a.T, accum, world, total_batch, a.recompute, model.logits_chunk);
    printf("data: %s\n", src.random ? "random tokens" : a.train_pattern);
    printf("attention backward: %s\n", deterministic ? "deterministic"
                                                     : "atomic dQ (a deterministic one would need "
                                                       "a workspace over 2 GiB)");

    FILE *log = NULL;
    if (speaker && a.log_path[0]) {
        const char *slash = strrchr(a.log_path, '/');
        if (slash) {
            char dir[1024];
            snprintf(dir, sizeof(dir), "%.*s", (int)(slash - a.log_path), a.log_path);
            char cmd[1100];
            snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
            if (system(cmd) != 0)
                FAIL("cannot create the log folder '%s'", dir);
        }
        log = fopen_check(a.log_path, "w");
    }

    watchdog_progress(&watchdog, "model ready");
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    /* pinned, so the uploads are truly asynchronous */
    int *step_inputs, *step_targets;
    float *h_parts;
    CUDA_CHECK(cudaMallocHost(&step_inputs, (size_t)N * accum * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&step_targets, (size_t)N * accum * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&h_parts, (size_t)accum * sizeof(float)));
    double tokens_per_s_sum = 0.0;
    int timed_steps = 0;
    for (int step = start_step; step < a.steps; step++) {
        if (have_val && (step % a.eval_every == 0)) {
            float vl = evaluate(&model, &val, a.eval_batches, stream);
            watchdog_progress(&watchdog, "evaluation at step %d", step);
            printf("step %5d | val loss %.4f\n", step, vl);
            if (log)
                fprintf(log, "{\"step\": %d, \"val_loss\": %.6f}\n", step, vl);
        }
        /* all micro-batches first: the loss is averaged over the whole step's targets */
        for (int k = 0; k < accum; k++) {
            const int *in, *tg;
            batch_next(&src, N, &in, &tg);
            memcpy(step_inputs + (int64_t)k * N, in, (size_t)N * sizeof(int));
            memcpy(step_targets + (int64_t)k * N, tg, (size_t)N * sizeof(int));
        }
        /* the loss is the mean over every rank's targets */
        double count = dist_sum_host(&dist, (double)count_targets(step_targets, N * accum), stream);
        float inv_count = count > 0 ? (float)(1.0 / count) : 0.0f;
        float lr = schedule_lr(&schedule, step);
        int profiling = step + 1 == a.profile_step;
        if (profiling)
            profile_begin_step(stream);
        double wall0 = now_seconds();
        for (int k = 0; k < accum; k++) {
            llama_set_batch(&model, step_inputs + (int64_t)k * N, step_targets + (int64_t)k * N, k, stream);
            llama_micro_step(&model, inv_count, k, stream);
        }
        llama_update(&model, &a.opt, lr, stream);
        float norm_sq;
        CUDA_CHECK(
            cudaMemcpyAsync(h_parts, model.loss_parts, (size_t)accum * sizeof(float), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaMemcpyAsync(&norm_sq, model.grad_norm_sq, sizeof(float), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        double wall = now_seconds() - wall0;
        double loss = 0.0;
        for (int k = 0; k < accum; k++)
            loss += h_parts[k];
        loss = dist_sum_host(&dist, loss, stream) * inv_count;
        double tokens_per_s = total_batch / wall; /* all GPUs */
        double mfu = tokens_per_s / world * flops_per_token / PEAK_BF16_FLOPS;
        size_t free_b, total_b;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        /* the attention workspace is allocated in its own translation unit, with its own count */
        double peak_gib = (cuda_bytes_allocated_peak + attention_workspace_bytes()) / 1073741824.0;
        double used_gib = (total_b - free_b) / 1073741824.0;
        if (step > 0) {
            tokens_per_s_sum += tokens_per_s;
            timed_steps++;
        }
        printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | MFU %.1f%% | mem %.2f GiB "
               "(device %.2f)\n",
               step + 1, a.steps, loss, lr, sqrt(norm_sq), wall * 1e3, tokens_per_s, 100 * mfu, peak_gib, used_gib);
        if (world > 1)
            printf("           %d GPUs: %.0f tok/s per GPU\n", world, tokens_per_s / world);
        if (profiling)
            print_profile(log, step + 1, wall * 1e3);
        if (!isfinite(loss))
            FAIL("loss is %f at step %d\n  hint: lower --lr or check the data", loss, step + 1);
        watchdog_progress(&watchdog, "step %d", step + 1);
        if (log) {
            fprintf(log,
                    "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.3f, "
                    "\"tokens_per_s\": %.1f, \"tokens_per_s_per_gpu\": %.1f, \"gpus\": %d, \"zero_stage\": %d, "
                    "\"mfu\": %.5f, \"peak_mem_gib\": %.4f, \"device_mem_gib\": %.4f}\n",
                    step + 1, loss, lr, sqrt(norm_sq), wall * 1e3, tokens_per_s, tokens_per_s / world, world,
                    a.zero_stage, mfu, peak_gib, used_gib);
            fflush(log);
        }
        if (a.checkpoint_dir && checkpoint_due(step + 1, a.save_every, a.steps)) {
            CheckpointState st = checkpoint_state((uint64_t)(step + 1), (uint64_t)model.adam_step, src.rng);
            if (!src.random)
                dataloader_get_state(&src.loader, &st.data);
            llama_save_checkpoint(&model, a.checkpoint_dir, a.keep, st, stream);
            watchdog_progress(&watchdog, "checkpoint of step %d", step + 1);
        }
    }
    if (have_val) {
        float vl = evaluate(&model, &val, a.eval_batches, stream);
        printf("final val loss %.4f\n", vl);
        if (log)
            fprintf(log, "{\"step\": %d, \"val_loss\": %.6f}\n", a.steps, vl);
    }
    if (timed_steps)
        printf("mean after the first step: %.0f tok/s (%.0f per GPU), MFU %.1f%%\n", tokens_per_s_sum / timed_steps,
               tokens_per_s_sum / timed_steps / world,
               100.0 * tokens_per_s_sum / timed_steps / world * flops_per_token / PEAK_BF16_FLOPS);
    if (log)
        fclose(log);
    attention_teardown();
    matmul_teardown();
    watchdog_stop(&watchdog);
    dist_finalize(&dist);
    return 0;
}
#endif /* TESTING */
