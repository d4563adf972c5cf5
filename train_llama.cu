/*
 * train_llama.cu: trains a Llama 3 family model on one GPU or several, in
 * bf16 with fp32 master weights (14 bytes per parameter, divided over the GPUs
 * by ZeRO). The program builds the GPUs and the model and supplies the model's
 * operations to the run, which it shares with the CPU reference
 * (llmc/run/train_loop.h: start or resume, step, evaluate, log, save, sample,
 * export); the model and its parts live in llmc/ (docs/architecture.md draws how
 * one step flows through the files):
 *
 *   build:    flags (train_flags.h) -> model config -> ranks, NCCL, watchdog
 *             -> the model (llama_model.h) -> resume (llama_checkpoint.h) or init
 *   step:     each micro-batch (batch_source.h): forward, fused classifier,
 *             backward (llama_layer.h); then the optimizer step with ZeRO's
 *             gradient reduction (llama_optimizer.h, zero.h); one host sync at
 *             the step's end (with several GPUs two more: the step's target
 *             count and loss summed over the ranks, dist_sum_host)
 *   evaluate: the val shards' mean loss, every --eval-every steps and at the end
 *   log:      a console line and a JSON line per step (run_log.h)
 *   save:     a checkpoint every --save-every steps and at the end
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "llmc/kernels/attention.h"
#include "llmc/run/batch_source.h"
#include "llmc/formats/checkpoint.h"
#include "llmc/common/cuda_common.h"
#include "llmc/formats/dataloader.h"
#include "llmc/parallel/distributed.h"
#include "llmc/run/flags.h"
#include "llmc/model/llama_checkpoint.h"
#include "llmc/model/llama_config.h"
#include "llmc/model/llama_model.h"
#include "llmc/kernels/matmul.h"
#include "llmc/common/profile.h"
#include "llmc/run/run_log.h"
#include "llmc/run/schedule.h"
#include "llmc/run/train_flags.h"
#include "llmc/run/train_loop.h"
#include "llmc/run/train_outputs.h"
#include "llmc/parallel/watchdog.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/linear_shapes.h"

/* Dense bf16 peak of an H100 SXM, the MFU denominator (PaLM/torchtitan convention). */
#define PEAK_BF16_FLOPS 989e12

typedef struct {
    TrainFlags t;
    int recompute, profile_step, fp8, gemm_autotune;
    const char *fp8_recipe, *fp8_weights;
    int fp8_weights_made; /* --fp8-weights, parsed */
    float logits_budget_mb;
    int zero_stage, shard_group;
    const char *shard_over, *grad_accum, *grad_reduce, *weight_gather, *update_gather;
    int shard_over_hosts, grad_accum_mode, grad_reduce_mode, weight_gather_mode, update_gather_mode; /* parsed */
    const char *offload;
    int offload_mode; /* OffloadMode, parsed */
    LaunchFlags launch;
    const char *rendezvous;
    float rendezvous_timeout, comm_timeout;
} Args;

static const Flag FLAGS[] = {
    TRAIN_FLAGS(Args, t),
    FLAG_SECTION("GPU memory and speed"),
    FLAG_NUM("--recompute", FLAG_INT, Args, recompute, 0, 3, FLAG_CLOSED,
             "0: store every activation; 1: recompute norms and SwiGLU; 2: also the gate/up GEMM; 3: keep only "
             "each layer's input and run its forward again in backward (least memory, for long contexts)"),
    FLAG("--fp8", FLAG_SWITCH, Args, fp8,
         "the layers' Linear maps (qkv, o, gate/up, down) on FP8: inputs and weights E4M3, output gradients E5M2, one "
         "scale per tensor from its current amax (lm_head, attention, norms and AdamW stay as they are; MFU still "
         "counts bf16 FLOPs)"),
    FLAG("--fp8-recipe", FLAG_STRING, Args, fp8_recipe,
         "the FP8 scales (implies --fp8): tensor (the default: the fastest, see docs/benchmarks.md), row (one per row "
         "of each operand, all E4M3) or block (1x128 blocks of activations and gradients, 128x128 of weights, all "
         "E4M3; dimensions and B*T multiples of 128)"),
    FLAG("--fp8-weights", FLAG_STRING, Args, fp8_weights,
         "with --fp8 at ZeRO stages 0-2: auto (the default: the layers' weight codes, both layouts, kept for a step "
         "where the memory allows it, else made at each use) or made (made at each use: 2 bytes per layer weight "
         "less, 3.3 GiB at the 8B cut to 8 layers, for a quantisation pass per weight and use; the same bits either "
         "way). Stage 3 gathers the codes or makes them at each use already"),
    FLAG("--offload", FLAG_STRING, Args, offload,
         "none (the default) or optimizer: the fp32 master weights and AdamW moments in host memory (12 bytes per "
         "parameter, checked at start), AdamW on the CPU's cores after each step's backward; the GPU keeps 4 bytes "
         "per parameter instead of 14 (bf16 weights and gradients). With ZeRO each rank offloads the ranges it "
         "updates; the same bits as without"),
    FLAG_NUM("--logits-budget-mb", FLAG_FLOAT, Args, logits_budget_mb, 0, 1 << 20, FLAG_LO_OPEN,
             "the least memory for one chunk of the lm_head's logits; the chunk takes the backward's scratch, free "
             "while the loss is computed, where that is more (at recompute 1's size at every level: 855 MB at "
             "Qwen2.5-1.5B, 16 x 1024): only a budget above that costs memory"),
    FLAG_NUM("--gemm-autotune", FLAG_INT, Args, gemm_autotune, 0, 1, FLAG_CLOSED,
             "1: each large GEMM shape times cuBLASLt's first 8 algorithms on first use and keeps the fastest (its "
             "first pick left 5-13% at Qwen2.5-1.5B's larger GEMMs on an H100); two runs may then pick differently and "
             "differ in the last bits. 0: cuBLASLt's first pick, for runs that must match bit for bit"),
    FLAG_NUM("--profile-step", FLAG_INT, Args, profile_step, 0, INT_MAX, FLAG_CLOSED,
             "print where step N's GPU time goes, by kernel class"),
    FLAG_SECTION("several GPUs (one process per GPU: mpirun, a scheduler, or scripts/launch_multi_gpu.sh; hosts "
                 "joined by TCP get NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=2 unless either is set)"),
    FLAG_NUM("--zero-stage", FLAG_INT, Args, zero_stage, 0, 3, FLAG_CLOSED,
             "0: all-reduce, every GPU keeps all optimizer state; 1: AdamW state sharded over the GPUs; 2: gradients "
             "too (2 bytes per parameter / GPUs, or a full-size buffer while accumulating, see --grad-accum); 3: "
             "weights too, gathered per layer just ahead of use. Every stage sums the gradients once per step, each "
             "layer as soon as the last micro-step's backward has it"),
    FLAG("--shard-over", FLAG_STRING, Args, shard_over,
         "world (the default): stages 1-3 shard over all GPUs; host: weights (stage 3) and gradients (2, 3) sharded "
         "over the GPUs of each host, so stage 3's per-layer gathers stay on NVLink, and summed across hosts once per "
         "step; the AdamW state stays sharded over all GPUs. Use host on several hosts (docs/multi_gpu.md)"),
    FLAG_NUM("--shard-group", FLAG_INT, Args, shard_group, 0, INT_MAX, FLAG_CLOSED,
             "GPUs per host for --shard-over host (0: told by NCCL_HOSTID, the scheduler or the hostname)"),
    FLAG("--grad-accum", FLAG_STRING, Args, grad_accum,
         "stages 2 and 3 with several micro-steps: auto (the default: local where memory allows), local (a "
         "full-size gradient buffer, 2 bytes per parameter, summed over the GPUs once per step) or sharded (each "
         "micro-step reduce-scattered into the GPU's share: less memory, a reduction per micro-step)"),
    FLAG("--grad-reduce", FLAG_STRING, Args, grad_reduce,
         "bf16 (the default: NCCL sums bf16, one rounding per GPU added), fp32 (summed in fp32 and rounded once per "
         "level, through 128 MiB chunks: twice the bytes on the wire), or int8 / e4m3 (stages 1-3; ZeRO++'s qgZ: "
         "one-byte codes and an fp32 scale per 128 values, exchanged all-to-all, summed in fp32: half the bytes of "
         "bf16, each value within 1/254 of its block's largest (int8) or 1/16 of itself (e4m3) per level; on 2 "
         "stand-in hosts over sockets at a 0.5M-token batch it took stages 1 and 2 from 87% to 88-90% of one GPU: "
         "docs/multi_gpu.md)"),
    FLAG(
        "--weight-gather", FLAG_STRING, Args, weight_gather,
        "stage 3: auto (the default: bf16, or with --fp8 per tensor the Linear maps' own FP8 codes, gathered at half "
        "the bytes and exact), bf16 (exact) or int8 / e4m3 (ZeRO++'s qwZ: each layer's per-use gather moves codes "
        "and scales, about half the bytes; the forward and backward compute with the decoded weights, within the "
        "codec's error, while AdamW updates the exact ones; over 1000 steps int8 stayed within 0.4% of exact's losses, "
        "e4m3 moved the train loss 0.7%: prefer int8; it pays where the gathers cross a slow link, 1.74x at one "
        "micro-step on 2 stand-in hosts with --grad-reduce int8, and not with --shard-over host, whose gathers stay "
        "on NVLink)"),
    FLAG("--update-gather", FLAG_STRING, Args, update_gather,
         "how the weights AdamW updated reach the other GPUs (stages 1 and 2, and stage 3 with --shard-over host, "
         "across the hosts): bf16 (the default: all-gathered) or delta (each weight's change of bf16 bits as one "
         "byte, the few that do not fit with their exact value: the same bits in about half the bytes; where most "
         "changes are within 7 ulps, packed as a nibble a weight and the wider ones beside them, 0.6-0.7 bytes a "
         "weight on the 1B at lr 3e-4; for slow links between GPUs: on a 22 Gb/s stand-in with --grad-reduce int8, "
         "byte codes took 2 hosts x 1 at stage 1 from 87.5% to 91.0% of one GPU's speed and 2 x 2 with --shard-over "
         "host at stage 2 from 86.7% to 90.1%, and packing reached 93.0-93.1% at stage 1 (0.7-2.7% over byte codes); "
         "costs a byte per weight a GPU updates and per weight of the "
         "largest bucket (0.8-1.2 GiB on the 1B), one wait of the host a step; not with --offload optimizer)"),
    FLAG_NUM(
        "--rank", FLAG_INT, Args, launch.rank, 0, INT_MAX - 1, FLAG_CLOSED,
        "this process's rank, when no launcher variable says it (mpirun, RANK/WORLD_SIZE, Slurm and PMI are read)"),
    FLAG_NUM("--world-size", FLAG_INT, Args, launch.world, 1, INT_MAX, FLAG_CLOSED, "number of processes, with --rank"),
    FLAG_NUM("--local-rank", FLAG_INT, Args, launch.local_rank, 0, INT_MAX - 1, FLAG_CLOSED,
             "GPU on this host (default rank % GPUs)"),
    FLAG("--rendezvous", FLAG_STRING, Args, rendezvous,
         "without MPI: tcp://HOST:PORT of rank 0 or file:PATH on a shared file system (default "
         "tcp://$MASTER_ADDR:$MASTER_PORT)"),
    FLAG_NUM("--rendezvous-timeout", FLAG_FLOAT, Args, rendezvous_timeout, 0, 1e6, FLAG_LO_OPEN,
             "seconds to wait for all ranks"),
    FLAG_NUM("--comm-timeout", FLAG_FLOAT, Args, comm_timeout, 0, 1e6, FLAG_CLOSED,
             "seconds a rank waits without progress (a peer died) before it exits with an error, 0 = forever"),
};
#define N_FLAGS ((int)(sizeof(FLAGS) / sizeof(FLAGS[0])))

static Args default_args(void)
{
    Args a;
    memset(&a, 0, sizeof(a));
    a.t = train_flags_defaults();
    a.t.run.log = "log/train_llama.jsonl";
    a.recompute = 1;
    a.logits_budget_mb = 512.0f;
    a.gemm_autotune = 1;
    a.profile_step = -1;
    a.zero_stage = 1;
    a.launch.rank = a.launch.world = a.launch.local_rank = -1;
    a.rendezvous_timeout = 300.0f;
    a.comm_timeout = 600.0f;
    return a;
}

static void usage(void)
{
    Args defaults = default_args();
    train_usage("./train_llama",
                "Trains a Llama 3 family model on one GPU or several (bf16, fp32 master weights, AdamW).", FLAGS,
                N_FLAGS, &defaults);
}

/* The flags, checked: everything that needs no GPU is refused here. *init_ids:
 * the BOS and EOS that --init-from's config names. */
static LlamaConfig parse_args(Args *a, int argc, char **argv, HfTokenIds *init_ids)
{
    *a = default_args();
    flags_parse(FLAGS, N_FLAGS, argc, argv, a, usage);
    train_flags_check(&a->t);
    char err[2048];
    if (a->rendezvous && rendezvous_check_spec(a->rendezvous, err, sizeof(err)) != 0)
        FAIL("--rendezvous: %s", err);
    a->shard_over_hosts = flag_choice("--shard-over", a->shard_over, "world|host");
    a->grad_accum_mode = flag_choice("--grad-accum", a->grad_accum, "auto|local|sharded");
    a->grad_reduce_mode = flag_choice("--grad-reduce", a->grad_reduce, "bf16|fp32|int8|e4m3");
    a->weight_gather_mode = flag_choice("--weight-gather", a->weight_gather, "auto|bf16|int8|e4m3");
    a->update_gather_mode = flag_choice("--update-gather", a->update_gather, "bf16|delta");
    a->offload_mode = flag_choice("--offload", a->offload, "none|optimizer");
    a->fp8_weights_made = flag_choice("--fp8-weights", a->fp8_weights, "auto|made");
    if (a->shard_over_hosts && a->zero_stage == 0)
        FAIL("--shard-over host needs --zero-stage 1, 2 or 3 (stage 0 shards nothing)");
    if (a->grad_reduce_mode >= ZERO_SUM_INT8 && a->zero_stage == 0)
        FAIL("--grad-reduce %s needs --zero-stage 1, 2 or 3 (stage 0 all-reduces; the codes are reduce-scattered)",
             a->grad_reduce);
    if (a->weight_gather_mode >= ZERO_GATHER_INT8 && a->zero_stage != 3)
        FAIL("--weight-gather %s quantizes stage 3's per-layer gathers; stage %d gathers none\n  hint: add "
             "--zero-stage 3",
             a->weight_gather, a->zero_stage);
    if (a->update_gather_mode == ZERO_UPDATE_DELTA &&
        (a->zero_stage == 0 || (a->zero_stage == 3 && !a->shard_over_hosts)))
        FAIL("--update-gather delta: --zero-stage %d gathers no new weights%s\n  hint: use --zero-stage 1 or 2, or 3 "
             "with --shard-over host, or leave --update-gather out",
             a->zero_stage, a->zero_stage ? " (flat stage 3 keeps each GPU's own)" : "");
    if (a->update_gather_mode == ZERO_UPDATE_DELTA && a->offload_mode)
        FAIL("--update-gather delta needs AdamW on the GPU, which writes the changes; --offload optimizer runs it on "
             "the host\n  hint: leave one of the two out");
    if (a->shard_group > 0 && !a->shard_over_hosts)
        FAIL("--shard-group %d sizes the groups of --shard-over host\n  hint: add --shard-over host", a->shard_group);
    train_export_check(&a->t.ckpt);
    LlamaConfig c = train_model_config(&a->t.model, init_ids);
    if (c.d_model % 8 != 0 || c.head_dim % 8 != 0 || c.ffn_dim % 8 != 0)
        FAIL("the GPU kernels need d_model, head_dim and ffn_dim to be multiples of 8 (got %d, %d, %d)", c.d_model,
             c.head_dim, c.ffn_dim);
    if (a->t.batch.T > c.max_seq_len)
        FAIL("-T %d exceeds the model's max_seq_len %d\n  hint: lower -T", a->t.batch.T, c.max_seq_len);
    if (a->fp8_recipe) {
        a->fp8 = fp8_recipe_from_name(a->fp8_recipe);
        if (!a->fp8)
            FAIL("unknown --fp8-recipe '%s'; use tensor, row or block", a->fp8_recipe);
    }
    if (a->fp8_weights_made && !a->fp8)
        FAIL("--fp8-weights %s says where the FP8 weight codes come from; without --fp8 there are none\n  hint: add "
             "--fp8",
             a->fp8_weights);
    int64_t qkv = (int64_t)(c.n_head + 2 * c.n_kv_head) * c.head_dim;
    if (a->fp8 == FP8_BLOCK &&
        ((int64_t)a->t.batch.B * a->t.batch.T % 128 != 0 || !llama_linear_dims_multiple_of(&c, 128)))
        FAIL("--fp8-recipe block needs B*T, d_model, ffn_dim, n_head*head_dim and (n_head + 2 n_kv_head)*head_dim to "
             "be multiples of 128 (whole 128-blocks); got B*T %lld, %d, %d, %d, %lld\n  hint: --fp8-recipe row or "
             "tensor take multiples of 16",
             (long long)a->t.batch.B * a->t.batch.T, c.d_model, c.ffn_dim, c.n_head * c.head_dim, (long long)qkv);
    if (a->fp8 && ((int64_t)a->t.batch.B * a->t.batch.T % 16 != 0 || c.d_model % 16 != 0 || c.ffn_dim % 16 != 0 ||
                   c.n_head * c.head_dim % 16 != 0))
        FAIL("--fp8 needs B*T, d_model, ffn_dim and n_head*head_dim to be multiples of 16 (FP8 GEMMs sum over 16-byte "
             "rows); got B*T %lld, %d, %d, %d",
             (long long)a->t.batch.B * a->t.batch.T, c.d_model, c.ffn_dim, c.n_head * c.head_dim);
    return c;
}

/* The GPUs and their ranks: NCCL, a watchdog, the libraries, and the stream of the steps. */
typedef struct {
    LaunchInfo launch;
    Dist dist;
    Watchdog watchdog;
    cudaStream_t stream;
} Gpus;

static void gpus_start(Gpus *g, const Args *a, const LlamaConfig *c)
{
    int device_count = 0;
    cudaError_t status = cudaGetDeviceCount(&device_count);
    if (status != cudaSuccess || device_count == 0)
        FAIL("no CUDA GPU found (%s)\n  hint: on a machine without a GPU, train with the CPU reference instead: "
             "./train_llama_ref --help",
             cudaGetErrorString(status));
    dist_init(&g->dist, &g->launch, a->rendezvous, a->rendezvous_timeout, a->shard_group);
    /* with peers, a rank that stops hearing from them exits instead of waiting forever */
    int world = g->launch.world;
    watchdog_start(&g->watchdog, g->launch.rank, world > 1 ? a->comm_timeout : 0.0, world > 1 ? dist_async_error : NULL,
                   &g->dist, "startup");
    /* rank 0 speaks for all; the others only report errors */
    if (g->launch.rank != 0 && !freopen("/dev/null", "w", stdout))
        FAIL("rank %d: cannot silence stdout", g->launch.rank);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, g->dist.local_rank));
    printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    if (world > 1) {
        char hosts[96];
        process_groups_describe(&g->dist.groups, hosts, sizeof(hosts));
        printf("ranks: %d on %s (from %s, %s; hosts told by %s), ZeRO stage %d sharded over %s, gradients summed in "
               "%s%s%s%s\n",
               world, hosts, g->launch.source, g->dist.mpi ? "NCCL id by MPI" : "NCCL id by rendezvous",
               g->dist.host_source, a->zero_stage, a->shard_over_hosts ? "each host" : "all GPUs",
               a->grad_reduce ? a->grad_reduce : "bf16", a->zero_stage == 3 ? ", weights gathered in " : "",
               a->zero_stage == 3 ? (a->weight_gather ? a->weight_gather
                                     : a->fp8         ? "auto (see fp8 below)"
                                                      : "bf16")
                                  : "",
               a->update_gather_mode == ZERO_UPDATE_DELTA ? ", new weights gathered as their changes (delta)" : "");
        if (g->dist.nccl_sockets_set && g->dist.groups.hosts > 1)
            printf("  NCCL between hosts over TCP sockets: NCCL_SOCKET_NTHREADS=%s NCCL_NSOCKS_PERTHREAD=%s set, "
                   "NCCL's own being 1 and 1 (set either to choose; docs/multi_gpu.md)\n",
                   NCCL_SOCKETS_THREADS, NCCL_SOCKETS_PER_THREAD);
    }
    matmul_setup();
    matmul_set_autotune(a->gemm_autotune);
    attention_setup();
    /* cuDNN's deterministic backward keeps dP in a B*H*T*T bf16 workspace: take it while
     * that stays small, else the atomic dQ backward, whose sums vary in the last bits */
    int deterministic = attention_deterministic_fits(a->t.batch.B, c->n_head, a->t.batch.T);
    attention_set_deterministic(deterministic);
    printf("attention backward: %s\n",
           deterministic ? "deterministic" : "atomic dQ (a deterministic one would need a workspace over 2 GiB)");
    CUDA_CHECK(cudaStreamCreate(&g->stream));
}

static void gpus_stop(Gpus *g)
{
    CUDA_CHECK(cudaStreamDestroy(g->stream));
    profile_teardown();
    attention_teardown();
    matmul_teardown();
    watchdog_stop(&g->watchdog);
    dist_finalize(&g->dist);
}

/* The model's operations for the shared run (llmc/run/train_loop.h), on this rank's GPU. */
typedef struct {
    Llama *m;
    const Args *a;
    Gpus *gpus;
    cudaStream_t s;
    float *h_parts; /* pinned: each micro-step's summed loss */
    int total_batch, world;
    double flops_per_token;
    RunLog *log;
} GpuRun;

static uint64_t gpu_agree(void *ctx, uint64_t x)
{
    GpuRun *g = (GpuRun *)ctx;
    return dist_broadcast_u64(&g->gpus->dist, x, g->s);
}

static double gpu_sum(void *ctx, double x)
{
    GpuRun *g = (GpuRun *)ctx;
    return dist_sum_host(&g->gpus->dist, x, g->s);
}

static void gpu_init_weights(void *ctx, const char *init_from, uint64_t seed)
{
    GpuRun *g = (GpuRun *)ctx;
    if (init_from)
        llama_load_weights(g->m, init_from);
    else
        llama_init_random(g->m, seed);
}

static void gpu_load_checkpoint(void *ctx, const char *path, CheckpointState *st)
{
    llama_load_checkpoint(((GpuRun *)ctx)->m, path, st);
}

/* One optimizer step of accum micro-batches already loaded, over `count` targets of every rank; --profile-step
 * profiles it. The device skips an update whose gradient norm is not finite (adamw.h): then the step count
 * goes back too. */
static void gpu_step(void *ctx, const int *inputs, const int *targets, int accum, double count, int step, float lr,
                     StepLog *out)
{
    GpuRun *g = (GpuRun *)ctx;
    Llama *m = g->m;
    cudaStream_t s = g->s;
    int64_t N = llama_tokens(m);
    float inv_count = (float)(1.0 / count), norm_sq, clip_coef;
    int profiling = step + 1 == g->a->profile_step;
    if (profiling)
        profile_begin_step(s); /* its events were made at the start (main), outside the step's time */
    for (int k = 0; k < accum; k++) {
        llama_set_batch(m, inputs + k * N, targets + k * N, k, s);
        llama_micro_step(m, inv_count, k, s);
    }
    llama_update(m, &g->a->t.optim.adamw, lr, s);
    CUDA_CHECK(cudaMemcpyAsync(g->h_parts, m->loss_parts, (size_t)accum * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(&norm_sq, m->optimizer.grad_norm_sq, sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(&clip_coef, m->optimizer.clip_coef, sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    double loss = 0.0;
    for (int k = 0; k < accum; k++)
        loss += g->h_parts[k];
    out->loss = dist_sum_host(&g->gpus->dist, loss, s) * inv_count;
    out->grad_norm = sqrt(norm_sq);
    out->skipped = !isfinite(clip_coef);
    if (out->skipped)
        m->optimizer.step--;
}

static double gpu_eval_batch(void *ctx, const int *inputs, const int *targets)
{
    GpuRun *g = (GpuRun *)ctx;
    float part;
    llama_set_batch(g->m, inputs, targets, 0, g->s);
    llama_eval_micro(g->m, 0, g->s);
    CUDA_CHECK(cudaMemcpyAsync(&part, g->m->loss_parts, sizeof(float), cudaMemcpyDeviceToHost, g->s));
    CUDA_CHECK(cudaStreamSynchronize(g->s));
    return part;
}

static uint64_t gpu_adam_steps(void *ctx)
{
    return (uint64_t)((GpuRun *)ctx)->m->optimizer.step;
}

static void gpu_save(void *ctx, const CheckpointFlags *ck, const HfExtras *extras, CheckpointState st)
{
    GpuRun *g = (GpuRun *)ctx;
    llama_save_checkpoint(g->m, ck->dir, ck->keep, extras, st, g->s);
}

/* The logits after a sequence, for samples (sampler.h). */
static void gpu_next_logits(void *ctx, const int *tokens, int n, float *logits)
{
    GpuRun *g = (GpuRun *)ctx;
    llama_last_logits(g->m, tokens, n, logits, g->s);
}

static float *gpu_master_copy(void *ctx)
{
    GpuRun *g = (GpuRun *)ctx;
    return params_download_master(&g->m->params, &g->m->layout, g->s); /* every rank gives its part */
}

/* The GPU's part of a step's log line: throughput, MFU and memory. */
static void step_log_gpu(StepLog *r, const Args *a, int total_batch, int world, double flops_per_token)
{
    size_t free_b, total_b;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    r->steps = a->t.run.steps;
    r->tokens_per_s = total_batch / (r->ms * 1e-3); /* all GPUs */
    r->gpus = world;
    r->zero_stage = a->zero_stage;
    r->mfu = r->tokens_per_s / world * flops_per_token / PEAK_BF16_FLOPS;
    r->peak_mem_gib = cuda_bytes_allocated_peak / 1073741824.0;
    r->device_mem_gib = (total_b - free_b) / 1073741824.0;
    struct rusage usage;
    r->host_peak_gib = getrusage(RUSAGE_SELF, &usage) == 0 ? usage.ru_maxrss / 1048576.0 : 0.0; /* KiB on Linux */
}

static void gpu_annotate(void *ctx, StepLog *r)
{
    GpuRun *g = (GpuRun *)ctx;
    step_log_gpu(r, g->a, g->total_batch, g->world, g->flops_per_token);
    r->update_bytes = g->m->params.zero.update_bytes;
}

/* --profile-step: where the step's GPU time went, after its log line (reading the events here, after the step's
 * time was taken, keeps their 2 x ~450 queries out of the idle time the report shows). */
static void gpu_logged(void *ctx, const StepLog *r)
{
    GpuRun *g = (GpuRun *)ctx;
    if (r->step == g->a->profile_step && !r->no_targets) {
        float ms[PROF_CLASSES];
        float busy = profile_end_step(ms);
        profile_report(g->log->json, r->step, r->ms, ms, busy);
    }
}

static void gpu_progress(void *ctx, const char *what, int step)
{
    GpuRun *g = (GpuRun *)ctx;
    if (step < 0)
        watchdog_progress(&g->gpus->watchdog, "%s", what);
    else
        watchdog_progress(&g->gpus->watchdog, "%s %d", what, step);
}

int main(int argc, char **argv)
{
    Args a;
    HfTokenIds init_ids;
    LlamaConfig config = parse_args(&a, argc, argv, &init_ids);
    const TrainFlags *t = &a.t;
    Gpus gpus;
    gpus.launch = dist_launch_info(&a.launch);
    int rank = gpus.launch.rank, world = gpus.launch.world;
    int accum = train_micro_steps(&t->batch, world);
    int total_batch = t->batch.B * t->batch.T * world * accum;
    BatchSource src;
    batch_source_open(&src, t->data.train, t->data.random, t->batch.B, t->batch.T, rank, world, (uint64_t)t->run.seed,
                      config.vocab_size);
    const char *val_shards = train_val_shards(t);
    DataLoader val;
    if (val_shards)
        dataloader_init_eval_or_die(&val, val_shards, t->batch.B, t->batch.T, rank, world, config.vocab_size);
    TrainOutputs outputs;
    train_outputs_open(&outputs, t, src.random ? NULL : src.loader.shards[0].path, src.loader.bos_id, src.loader.eos_id,
                       &init_ids, config.vocab_size);

    gpus_start(&gpus, &a, &config);
    cudaStream_t s = gpus.stream;
    llama_config_print(&config, stdout);
    int doc_bos = train_doc_bos(&t->data, src.random ? -1 : src.loader.bos_id);
    LlamaOptions options = {.B = t->batch.B,
                            .T = t->batch.T,
                            .recompute = a.recompute,
                            .max_micro_steps = accum,
                            .logits_budget_bytes = (size_t)(a.logits_budget_mb * 1048576.0),
                            .dist = &gpus.dist,
                            .zero_stage = a.zero_stage,
                            .fp8 = a.fp8,
                            .fp8_weights_made = a.fp8_weights_made,
                            .doc_mask = doc_bos >= 0,
                            .doc_bos = doc_bos,
                            .doc_positions = t->data.doc_positions,
                            .shard_over_hosts = a.shard_over_hosts,
                            .grad_accum = a.grad_accum_mode,
                            .grad_reduce = a.grad_reduce_mode,
                            .weight_gather = a.weight_gather_mode,
                            .update_gather = a.update_gather_mode,
                            .offload = a.offload_mode};
    Llama model;
    llama_build(&model, &config, &options);
    if (a.profile_step > 0)
        profile_reserve();
    int *tokens; /* pinned, so the uploads are truly asynchronous: inputs, then targets */
    float *h_parts;
    CUDA_CHECK(cudaMallocHost(&tokens, (size_t)2 * llama_tokens(&model) * accum * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&h_parts, (size_t)accum * sizeof(float)));
    GpuRun run;
    memset(&run, 0, sizeof(run));
    run.m = &model;
    run.a = &a;
    run.gpus = &gpus;
    run.s = s;
    run.h_parts = h_parts;
    run.total_batch = total_batch;
    run.world = world;
    run.flops_per_token = llama_flops_per_token(&config, t->batch.T);
    TrainOps ops;
    memset(&ops, 0, sizeof(ops));
    ops.ctx = &run;
    ops.agree = gpu_agree;
    ops.sum = gpu_sum;
    ops.init_weights = gpu_init_weights;
    ops.load_checkpoint = gpu_load_checkpoint;
    ops.step = gpu_step;
    ops.eval_batch = gpu_eval_batch;
    ops.adam_steps = gpu_adam_steps;
    ops.save = gpu_save;
    ops.next_logits = gpu_next_logits;
    ops.master_copy = gpu_master_copy;
    ops.annotate = gpu_annotate;
    ops.logged = gpu_logged;
    ops.progress = gpu_progress;
    TrainLoop loop;
    train_loop_init(&loop, t, &config, &model.layout, &src, val_shards ? &val : NULL, val_shards, &outputs, accum,
                    llama_tokens(&model), tokens, rank);
    train_loop_start(&loop, &ops);
    RunLog log;
    run_log_open(&log, rank == 0 ? t->run.log : NULL, t->ckpt.resume, loop.run_id, loop.resumed_from, argc, argv,
                 &config, FLAGS, N_FLAGS, &a);
    loop.log = run.log = &log;
    printf("parameters: %.3f M; batch %d x %d x %d accum x %d GPUs = %d tokens/step; recompute %d; logits chunk %d "
           "rows%s%s\ndata: %s\n",
           model.layout.total / 1e6, t->batch.B, t->batch.T, accum, world, total_batch, a.recompute, model.logits_chunk,
           a.fp8 ? "; layer GEMMs in FP8, scaled per " : "", a.fp8 ? FP8_RECIPE_NAMES[a.fp8] : "",
           t->data.random ? "random tokens" : t->data.train);
    train_loop_run(&loop, &ops);
    if (loop.tokens_per_s_mean > 0)
        printf("mean after the first step: %.0f tok/s (%.0f per GPU), MFU %.1f%%\n", loop.tokens_per_s_mean,
               loop.tokens_per_s_mean / world,
               100.0 * loop.tokens_per_s_mean / world * run.flops_per_token / PEAK_BF16_FLOPS);
    if (a.gemm_autotune) {
        char line[256];
        matmul_tune_summary(line, sizeof(line), t->run.steps - loop.start_step);
        printf("%s\n", line);
    }

    CUDA_CHECK(cudaFreeHost(tokens));
    CUDA_CHECK(cudaFreeHost(h_parts));
    run_log_close(&log);
    train_outputs_close(&outputs);
    llama_free(&model);
    batch_source_close(&src);
    if (val_shards)
        dataloader_free(&val);
    gpus_stop(&gpus);
    return 0;
}
