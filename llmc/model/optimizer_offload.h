/*
 * optimizer_offload.h: AdamW in host memory (--offload optimizer). The fp32
 * master weights and both AdamW moments of the ranges this rank updates live
 * on the host, in the order of its optimizer state (zero.state_at); the GPU
 * keeps only the bf16 weights and gradients (4 bytes per parameter instead of
 * 14). After the last micro-step's backward the GPU sums and clips the
 * gradients as without offload (llama_optimizer.h: the global norm must be
 * known before any update, so the host waits for the clip coefficient, then
 * runs bucket by bucket):
 *
 *   bucket b's gradients (bf16) -> pinned slot b % 2    compute stream
 *   AdamW on every core (llmc/kernels/adamw_cpu.h)      host, fp32 master, m, v
 *   its new bf16 weights (pinned slot b % 2) -> GPU     copy stream
 *
 * with bucket b+1's download and bucket b-1's upload in flight while the host
 * works on b; the compute stream waits for the last upload. The host runs the
 * GPU kernel's arithmetic (adamw_step.h) on the same bf16 gradients, fp32
 * masters and clip coefficient, so a step gives the same bits with or without
 * offload (test_llama checks it). A non-finite clip coefficient skips the
 * update, as on the GPU.
 *
 * Memory: host, pageable: master, m and v, 12 bytes per updated parameter
 * (offload_host_bytes, times the ranks sharing the machine, checked against
 * MemAvailable before any is taken);
 * pinned: two slots of gradients and weights for the largest bucket share (8
 * bytes per element of it). Device: nothing, but while a checkpoint of several
 * ranks is saved, one slot of residuals (llama_params.h, 2 bytes per element).
 */
#ifndef LLMC_OPTIMIZER_OFFLOAD_H
#define LLMC_OPTIMIZER_OFFLOAD_H

#include <stdio.h>
#include <string.h>

#include "llmc/common/cuda_common.h"
#include "llmc/common/utils.h"
#include "llmc/kernels/adamw.h"
#include "llmc/kernels/adamw_cpu.h"
#include "llmc/parallel/zero.h"

typedef enum { OFFLOAD_NONE = 0, OFFLOAD_OPTIMIZER = 1 } OffloadMode;

typedef struct {
    float *m, *v;                    /* host [zero.state_total]; the master is LlamaParams.host_master */
    uint16_t *grads[2], *weights[2]; /* pinned slots, [slot] elements each */
    int64_t slot;                    /* the largest bucket share */
    cudaStream_t copy;               /* the uploads */
    cudaEvent_t downloaded[2], uploaded[2], done;
} HostAdamW;

/* The largest range one bucket of z updates on this rank. */
static inline int64_t offload_slot_elements(const Zero *z)
{
    int64_t slot = 1;
    for (int b = 0; b < z->plan.n_buckets; b++)
        if (z->update_count[b] > slot)
            slot = z->update_count[b];
    return slot;
}

/* Host memory --offload optimizer takes: master, m, v and the pinned slots. */
static inline size_t offload_host_bytes(const Zero *z)
{
    /* master, m, v; two slots each of gradients and weights (grads[2], weights[2]) */
    return (size_t)z->state_total * 3 * sizeof(float) + (size_t)offload_slot_elements(z) * 4 * sizeof(uint16_t);
}

/* MemAvailable of /proc/meminfo in bytes, or 0 where it cannot be read. */
static inline size_t host_memory_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (size_t)kib * 1024;
}

/* Ends the run, before anything is allocated, when the host lacks the memory offload needs: this rank's share
 * times the ranks on its machine (machine_ranks, 0 or 1 alone), whose shares are about the same size. */
static inline void offload_check_host_memory(const Zero *z, int machine_ranks)
{
    int ranks = machine_ranks > 1 ? machine_ranks : 1;
    size_t need = offload_host_bytes(z) * (size_t)ranks, have = host_memory_available();
    if (have == 0) {
        printf(
            "warning: --offload optimizer: MemAvailable unreadable in /proc/meminfo; needs %.2f GiB of host memory\n",
            need / 1073741824.0);
        return;
    }
    if (need > have)
        FAIL("--offload optimizer: the fp32 master weights and AdamW moments on the host (12 bytes per parameter, "
             "%lld parameters per rank, %d rank(s) on this machine) and the pinned copy slots need %.2f GiB of host "
             "memory, and %.2f GiB are available (MemAvailable in /proc/meminfo)\n  hint: free host memory, or shard "
             "the optimizer over more GPUs (--zero-stage 1 or more; hosts)",
             (long long)z->state_total, ranks, need / 1073741824.0, have / 1073741824.0);
}

static inline void host_adamw_build(HostAdamW *h, const Zero *z)
{
    memset(h, 0, sizeof(*h));
    size_t n = (size_t)z->state_total;
    /* zeros: the moments start at zero, and the padding stays zero */
    h->m = (float *)calloc(n ? n : 1, sizeof(float));
    h->v = (float *)calloc(n ? n : 1, sizeof(float));
    if (!h->m || !h->v)
        FAIL("--offload optimizer: could not allocate the AdamW moments on the host (%.2f GiB)",
             2.0 * n * sizeof(float) / 1073741824.0);
    h->slot = offload_slot_elements(z);
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaMallocHost((void **)&h->grads[i], (size_t)h->slot * sizeof(uint16_t)));
        CUDA_CHECK(cudaMallocHost((void **)&h->weights[i], (size_t)h->slot * sizeof(uint16_t)));
        CUDA_CHECK(cudaEventCreateWithFlags(&h->downloaded[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&h->uploaded[i], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming));
    CUDA_CHECK(cudaStreamCreateWithFlags(&h->copy, cudaStreamNonBlocking));
}

static inline void host_adamw_free(HostAdamW *h)
{
    if (!h->m)
        return;
    free(h->m);
    free(h->v);
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaFreeHost(h->grads[i]));
        CUDA_CHECK(cudaFreeHost(h->weights[i]));
        CUDA_CHECK(cudaEventDestroy(h->downloaded[i]));
        CUDA_CHECK(cudaEventDestroy(h->uploaded[i]));
    }
    CUDA_CHECK(cudaEventDestroy(h->done));
    CUDA_CHECK(cudaStreamDestroy(h->copy));
    memset(h, 0, sizeof(*h));
}

/* AdamW over padded elements [first, first + n) of the flat buffers, whose state starts at master, m, v and whose
 * gradients and new weights are grads and weights: each stretch with the decay flag of its run (adamw.h). */
static inline void host_adamw_range(float *master, float *m, float *v, const uint16_t *grads, uint16_t *weights,
                                    int64_t first, int64_t n, const AdamWRuns *runs, float scale, AdamWScalars s)
{
    int r = 0;
    while (r + 1 < runs->n_runs && runs->host_start[r + 1] <= first)
        r++;
    for (int64_t at = first; at < first + n; r++) {
        int64_t end = r + 1 < runs->n_runs && runs->host_start[r + 1] < first + n ? runs->host_start[r + 1] : first + n;
        int64_t i = at - first;
        adamw_cpu_update(master + i, m + i, v + i, NULL, grads + i, weights + i, end - at, scale,
                         runs->host_decay[r] ? s.decay : 1.0f, s);
        at = end;
    }
}

/* One step on the host (see the top): clip_coef is the device's clip coefficient, computed on stream. */
static inline void host_adamw_step(HostAdamW *h, Zero *z, float *master, const AdamWRuns *runs, const float *clip_coef,
                                   AdamWScalars s, cudaStream_t stream)
{
    float scale;
    CUDA_CHECK(cudaMemcpyAsync(&scale, clip_coef, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (!isfinite(scale))
        return; /* a non-finite gradient norm: the step is skipped, nothing written (as adamw.h) */
    int n_buckets = z->plan.n_buckets;
    for (int b = 0; b <= n_buckets; b++) {
        if (b < n_buckets) { /* the download of bucket b, one ahead of the host's work */
            CUDA_CHECK(cudaMemcpyAsync(h->grads[b % 2], zero_update_grads(z, b),
                                       (size_t)z->update_count[b] * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream));
            CUDA_CHECK(cudaEventRecord(h->downloaded[b % 2], stream));
        }
        if (b == 0)
            continue;
        int k = b - 1, slot = k % 2;
        CUDA_CHECK(cudaEventSynchronize(h->downloaded[slot]));
        CUDA_CHECK(cudaEventSynchronize(h->uploaded[slot])); /* bucket k - 2's upload has left the slot */
        int64_t at = z->state_at[k];
        host_adamw_range(master + at, h->m + at, h->v + at, h->grads[slot], h->weights[slot], z->update_at[k],
                         z->update_count[k], runs, scale, s);
        CUDA_CHECK(cudaMemcpyAsync(zero_update_weights(z, k), h->weights[slot],
                                   (size_t)z->update_count[k] * sizeof(uint16_t), cudaMemcpyHostToDevice, h->copy));
        CUDA_CHECK(cudaEventRecord(h->uploaded[slot], h->copy));
    }
    CUDA_CHECK(cudaEventRecord(h->done, h->copy));
    CUDA_CHECK(cudaStreamWaitEvent(stream, h->done, 0));
}

#endif /* LLMC_OPTIMIZER_OFFLOAD_H */
