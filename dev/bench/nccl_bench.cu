/*
 * nccl_bench.cu: the time of each collective the trainer runs (bf16 all-gather,
 * reduce-scatter and all-reduce; fp32 reduce-scatter for --grad-reduce fp32; the
 * byte all-to-all of --grad-reduce int8|e4m3, NCCL's grouped sends and receives, at two ranks an all-gather) over
 * each of its process groups (llmc/parallel/distributed.h: all ranks, a host's, across
 * hosts), at sizes from 1 MiB to 1 GiB, for dev/bench/scaling_model.py's fit of
 * latency + bytes / bandwidth.
 *
 * Launched as the trainer is (one process per GPU: mpirun, or RANK / WORLD_SIZE /
 * LOCAL_RANK with MASTER_ADDR / MASTER_PORT), with NCCL_HOSTID per process where
 * one machine stands in for several hosts. Each point: 3 warm-up launches, then
 * the median of --iters launched back to back (so that the ranks keep pace),
 * each timed by the CUDA events between it and the next on its stream; all
 * groups of a kind run at once (every host's group together), as in training.
 * Rank 0 prints one JSON line per point: collective, group, ranks, bytes (the
 * whole buffer: the gathered output, the scattered input, or what a rank sends to all), seconds, and NCCL's
 * bus bandwidth convention (bytes x (n - 1) / n / seconds). The buffers hold
 * random bits, not zeros.
 *
 * Usage: nccl_bench [--shard-group N] [--iters K] [--max-mib M] [--label TEXT]
 */
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/parallel/distributed.h"

__global__ void fill_random_bits(uint32_t *p, int64_t n, uint32_t seed)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        /* bf16 pairs or fp32 of moderate exponent: no NaN or infinity in the sums */
        p[i] = (x & 0x807f807fu) | 0x3c003c00u;
    }
}

typedef enum { AG, RS, AR, RS32, A2A } Collective;
static const char *NAMES[] = {"all_gather", "reduce_scatter", "all_reduce", "reduce_scatter_fp32", "all_to_all"};

/* recv: the all-to-all's output, as large as buf */
static void launch(Collective c, const DistGroup *g, void *buf, void *recv, int64_t bytes, cudaStream_t s)
{
    int64_t elems = bytes / (c == RS32 ? 4 : 2), per_rank = elems / g->size;
    char *base = (char *)buf;
    switch (c) {
    case AG:
        dist_all_gather(g, base + per_rank * 2 * g->rank, buf, per_rank, 2, s);
        break;
    case RS:
        dist_reduce_scatter_sum(g, buf, base + per_rank * 2 * g->rank, per_rank, 2, s);
        break;
    case RS32:
        dist_reduce_scatter_sum(g, buf, base + per_rank * 4 * g->rank, per_rank, 4, s);
        break;
    case AR:
        dist_all_reduce_sum(g, buf, elems, 2, s);
        break;
    case A2A:
        dist_all_to_all(g, buf, recv, bytes / g->size, s);
        break;
    }
}

int main(int argc, char **argv)
{
    int shard_group = 0, iters = 10, max_mib = 1024;
    const char *label = "";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shard-group"))
            shard_group = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-mib"))
            max_mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--label"))
            label = argv[i + 1];
        else
            FAIL("unknown flag %s\n  usage: nccl_bench [--shard-group N] [--iters K] [--max-mib M] [--label TEXT]",
                 argv[i]);
    }
    LaunchFlags flags = {-1, -1, -1};
    LaunchInfo info = dist_launch_info(&flags);
    Dist d;
    dist_init(&d, &info, NULL, 300.0, shard_group);
    char hosts[96];
    process_groups_describe(&d.groups, hosts, sizeof(hosts));
    /* NCCL's socket threads x connections per channel as set (by dist_init or the user), "" at NCCL's defaults */
    char sockets[64] = "";
    if (getenv("NCCL_SOCKET_NTHREADS") || getenv("NCCL_NSOCKS_PERTHREAD"))
        snprintf(sockets, sizeof(sockets), "%sx%s", getenv("NCCL_SOCKET_NTHREADS") ?: "1",
                 getenv("NCCL_NSOCKS_PERTHREAD") ?: "1");
    if (d.rank == 0)
        fprintf(stderr, "nccl_bench: %d ranks on %s (hosts told by %s)%s%s\n", d.world, hosts, d.host_source,
                sockets[0] ? ", NCCL sockets " : "", sockets);
    size_t max_bytes = (size_t)max_mib << 20;
    void *buf = cuda_malloc_named(max_bytes, "bench buffer"), *recv = cuda_malloc_named(max_bytes, "all-to-all output");
    fill_random_bits<<<1024, 256>>>((uint32_t *)buf, (int64_t)(max_bytes / 4), 1234u + d.rank);
    CUDA_CHECK_LAST();
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* events around each launch, issued back to back so that the ranks keep pace with each other */
    cudaEvent_t *marks = (cudaEvent_t *)malloc_check(sizeof(cudaEvent_t) * (size_t)(iters + 1), "events");
    for (int k = 0; k <= iters; k++)
        CUDA_CHECK(cudaEventCreate(&marks[k]));
    CUDA_CHECK(cudaDeviceSynchronize());
    const DistGroup *groups[3] = {&d.all, &d.host, &d.across};
    const char *group_names[3] = {"all", "host", "across"};
    float *times = (float *)malloc_check(sizeof(float) * (size_t)iters, "times");
    for (int gi = 0; gi < 3; gi++) {
        const DistGroup *g = groups[gi];
        if (g->size <= 1 || (gi > 0 && g->comm == d.all.comm))
            continue; /* a group of one, or the world again */
        for (int c = AG; c <= A2A; c++) {
            for (size_t bytes = (size_t)1 << 20; bytes <= max_bytes; bytes *= 4) {
                /* a whole number of 16-byte elements per rank */
                size_t unit = (size_t)g->size * 16, b = bytes / unit * unit;
                for (int w = 0; w < 3; w++)
                    launch((Collective)c, g, buf, recv, (int64_t)b, s);
                CUDA_CHECK(cudaEventRecord(marks[0], s));
                for (int k = 0; k < iters; k++) {
                    launch((Collective)c, g, buf, recv, (int64_t)b, s);
                    CUDA_CHECK(cudaEventRecord(marks[k + 1], s));
                }
                CUDA_CHECK(cudaEventSynchronize(marks[iters]));
                for (int k = 0; k < iters; k++)
                    CUDA_CHECK(cudaEventElapsedTime(&times[k], marks[k], marks[k + 1]));
                std::sort(times, times + iters);
                double sec = times[iters / 2] * 1e-3;
                double bus = (double)b * (g->size - 1) / g->size / sec;
                if (d.rank == 0)
                    printf("{\"bench\": \"nccl\", \"label\": \"%s\", \"collective\": \"%s\", \"group\": \"%s\", "
                           "\"ranks\": %d, \"world\": %d, \"hosts\": %d, \"bytes\": %zu, \"seconds\": %.6e, "
                           "\"busbw_gbs\": %.3f%s%s%s}\n",
                           label, NAMES[c], group_names[gi], g->size, d.world, d.groups.hosts, b, sec, bus / 1e9,
                           sockets[0] ? ", \"sockets\": \"" : "", sockets, sockets[0] ? "\"" : "");
                fflush(stdout);
            }
        }
    }
    free(times);
    for (int k = 0; k <= iters; k++)
        CUDA_CHECK(cudaEventDestroy(marks[k]));
    free(marks);
    CUDA_CHECK(cudaStreamDestroy(s));
    cuda_free(buf);
    cuda_free(recv);
    dist_finalize(&d);
    return 0;
}
