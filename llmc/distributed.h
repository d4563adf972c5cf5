/*
 * distributed.h: one process per GPU, NCCL between them.
 *
 *   dist_init: who this process is (llmc/launch.h: flags, mpirun, torchrun-style,
 *     Slurm or PMI variables), which GPU it takes (its rank on its host), and
 *     NCCL's communicator. Rank 0 makes NCCL's unique id and the others get it
 *     by MPI_Bcast when built with MPI (USE_MPI) and started by mpirun, otherwise
 *     through llmc/rendezvous.h (--rendezvous tcp://HOST:PORT or file:PATH, by
 *     default tcp://MASTER_ADDR:MASTER_PORT).
 *   collectives: sums over all ranks of bf16 or fp32 device buffers (all-reduce,
 *     reduce-scatter) and all-gather, each on the caller's stream, alone or
 *     grouped into one launch; with one rank they copy or do nothing, so
 *     single-GPU runs take the same code path.
 *   dist_sum_host: the sum over ranks of one host integer or double (blocking),
 *     for counts and losses that every rank must agree on.
 *   dist_async_error: NCCL's asynchronous error state, for llmc/watchdog.h's
 *     probe (NCCL allows the call from another thread).
 *
 * Every NCCL and MPI call is checked; the error names the rank, the call and
 * what to try. Reads and writes only the buffers passed in.
 */
#ifndef LLMC_DISTRIBUTED_H
#define LLMC_DISTRIBUTED_H

#include <nccl.h>
#include <stdlib.h>
#ifdef USE_MPI
#include <mpi.h>
#endif

#include "cuda_common.h"
#include "profile.h"
#include "launch.h"
#include "rendezvous.h"

typedef struct {
    int rank, world, local_rank;
    const char *source;  /* where rank and world came from (launch.h) */
    int mpi;             /* MPI initialised by dist_init */
    ncclComm_t comm;     /* NULL with one rank */
    double *sum_scratch; /* 8 device bytes for dist_sum_host and dist_broadcast_u64 */
} Dist;

static int dist_rank_for_errors = 0;

static inline void nccl_check_at(ncclResult_t status, const char *what, const char *file, int line)
{
    if (status != ncclSuccess && status != ncclInProgress) {
        fail_at(file, line, "rank %d: NCCL error in %s: %s\n  hint: %s", dist_rank_for_errors, what,
                ncclGetErrorString(status),
                status == ncclSystemError || status == ncclRemoteError
                    ? "a peer died or the network failed; the first rank to fail says why (NCCL_DEBUG=WARN shows more)"
                : status == ncclInvalidUsage
                    ? "every rank must call the same collectives with the same sizes; start all ranks with the same "
                      "flags"
                    : "rerun with NCCL_DEBUG=WARN to see why");
    }
}
#define NCCL_CHECK(call) nccl_check_at((call), #call, __FILE__, __LINE__)

#ifdef USE_MPI
static inline void mpi_check_at(int status, const char *what, const char *file, int line)
{
    if (status != MPI_SUCCESS) {
        char message[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(status, message, &len);
        fail_at(file, line, "rank %d: MPI error in %s: %s\n  hint: check that mpirun started every rank",
                dist_rank_for_errors, what, message);
    }
}
#define MPI_CHECK(call) mpi_check_at((call), #call, __FILE__, __LINE__)
#endif

static inline const char *dist_getenv(const char *name)
{
    return getenv(name);
}

/* One process, rank 0 of 1, on the current device: for tests and tools. */
static inline void dist_init_single(Dist *d)
{
    memset(d, 0, sizeof(*d));
    d->world = 1;
    d->source = "single process";
    d->sum_scratch = (double *)cuda_malloc_named(sizeof(double), "rank sum scratch");
}

/* Who this process is, from flags or the launcher's variables (launch.h); needs no
 * GPU, so that bad launches fail before any is touched. Exits with a message on error. */
static inline LaunchInfo dist_launch_info(const LaunchFlags *flags)
{
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
        cudaGetLastError();
        gpus = 1;
    }
    LaunchInfo info;
    char err[2048];
    if (launch_info_try(&info, flags, dist_getenv, gpus, err, sizeof(err)) != 0)
        FAIL("%s", err);
    return info;
}

/* Takes the GPU of info->local_rank and joins the NCCL communicator of all ranks.
 * rendezvous: a spec for rendezvous.h, or NULL for MASTER_ADDR/MASTER_PORT; not
 * used under mpirun when built with MPI. */
static inline void dist_init(Dist *d, const LaunchInfo *info, const char *rendezvous, double timeout_s)
{
    memset(d, 0, sizeof(*d));
    int gpus = 0;
    CUDA_CHECK(cudaGetDeviceCount(&gpus));
    char err[2048];
    d->rank = info->rank;
    d->world = info->world;
    d->local_rank = info->local_rank;
    d->source = info->source;
    dist_rank_for_errors = d->rank;
    if (d->local_rank >= gpus)
        FAIL("rank %d: local rank %d but this host has %d GPU(s)\n  hint: start at most one process per GPU on "
             "each host",
             d->rank, d->local_rank, gpus);
    CUDA_CHECK(cudaSetDevice(d->local_rank));
    d->sum_scratch = (double *)cuda_malloc_named(sizeof(double), "rank sum scratch");
    if (d->world == 1)
        return;

    ncclUniqueId id;
    if (d->rank == 0)
        NCCL_CHECK(ncclGetUniqueId(&id));
    int by_mpi = 0;
#ifdef USE_MPI
    by_mpi = strcmp(d->source, "mpirun (Open MPI)") == 0 || strcmp(d->source, "PMI") == 0;
    if (by_mpi) {
        MPI_CHECK(MPI_Init(NULL, NULL));
        d->mpi = 1;
        int mpi_rank = 0, mpi_world = 0;
        MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank));
        MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &mpi_world));
        if (mpi_rank != d->rank || mpi_world != d->world)
            FAIL("rank %d: MPI says rank %d of %d, the launcher's variables %d of %d", d->rank, mpi_rank, mpi_world,
                 d->rank, d->world);
        MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    }
#endif
    if (!by_mpi) {
        char spec[600];
        if (rendezvous) {
            snprintf(spec, sizeof(spec), "%s", rendezvous);
        } else if (rendezvous_spec_from_env(dist_getenv, spec, sizeof(spec), err, sizeof(err)) != 0) {
            FAIL("rank %d of %d (from %s): %s\n  hint: pass --rendezvous tcp://HOST:PORT (rank 0's host) or "
                 "file:PATH on a shared file system%s",
                 d->rank, d->world, d->source, err,
#ifdef USE_MPI
                 ""
#else
                 ", or rebuild with MPI (make USE_MPI=1) to launch with mpirun alone"
#endif
            );
        }
        if (rendezvous_share(spec, d->rank, d->world, &id, sizeof(id), timeout_s, err, sizeof(err)) != 0)
            FAIL("%s", err);
    }
    NCCL_CHECK(ncclCommInitRank(&d->comm, d->world, id, d->rank));
}

static inline void dist_finalize(Dist *d)
{
    if (d->comm)
        NCCL_CHECK(ncclCommDestroy(d->comm));
    d->comm = NULL;
    cuda_free(d->sum_scratch);
#ifdef USE_MPI
    if (d->mpi)
        MPI_CHECK(MPI_Finalize());
#endif
    d->mpi = 0;
}

static inline ncclDataType_t dist_type(int bytes_per_element)
{
    return bytes_per_element == 2 ? ncclBfloat16 : ncclFloat32;
}

/* buf[count] = sum over ranks, in place. element_bytes: 2 (bf16) or 4 (fp32). */
static inline void dist_all_reduce_sum(const Dist *d, void *buf, int64_t count, int element_bytes, cudaStream_t stream)
{
    if (d->world == 1)
        return;
    profile_push(PROF_COMM, stream);
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, dist_type(element_bytes), ncclSum, d->comm, stream));
    profile_pop(stream);
}

/* recv[count] = sum over ranks of send[rank * count, (rank + 1) * count). */
static inline void dist_reduce_scatter_sum(const Dist *d, const void *send, void *recv, int64_t count,
                                           int element_bytes, cudaStream_t stream)
{
    profile_push(PROF_COMM, stream);
    if (d->world == 1) {
        if (send != recv)
            CUDA_CHECK(cudaMemcpyAsync(recv, send, (size_t)count * element_bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
        NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)count, dist_type(element_bytes), ncclSum, d->comm, stream));
    }
    profile_pop(stream);
}

/* recv[r * count, (r + 1) * count) = rank r's send[count]; send may be recv + rank * count. */
static inline void dist_all_gather(const Dist *d, const void *send, void *recv, int64_t count, int element_bytes,
                                   cudaStream_t stream)
{
    profile_push(PROF_COMM, stream);
    if (d->world == 1) {
        if (send != recv)
            CUDA_CHECK(cudaMemcpyAsync(recv, send, (size_t)count * element_bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
        NCCL_CHECK(ncclAllGather(send, recv, (size_t)count, dist_type(element_bytes), d->comm, stream));
    }
    profile_pop(stream);
}

/* Collectives issued between these two are launched together, as one (NCCL's
 * group calls): many small per-bucket collectives then cost about one. */
static inline void dist_group_begin(const Dist *d)
{
    if (d->world > 1)
        NCCL_CHECK(ncclGroupStart());
}
static inline void dist_group_end(const Dist *d)
{
    if (d->world > 1)
        NCCL_CHECK(ncclGroupEnd());
}

/* The sum over ranks of x; blocks until every rank has called it. */
static inline double dist_sum_host(const Dist *d, double x, cudaStream_t stream)
{
    if (d->world == 1)
        return x;
    CUDA_CHECK(cudaMemcpyAsync(d->sum_scratch, &x, sizeof(double), cudaMemcpyHostToDevice, stream));
    NCCL_CHECK(ncclAllReduce(d->sum_scratch, d->sum_scratch, 1, ncclFloat64, ncclSum, d->comm, stream));
    CUDA_CHECK(cudaMemcpyAsync(&x, d->sum_scratch, sizeof(double), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return x;
}

/* Rank 0's x on every rank; blocks until every rank has called it. */
static inline uint64_t dist_broadcast_u64(const Dist *d, uint64_t x, cudaStream_t stream)
{
    if (d->world == 1)
        return x;
    CUDA_CHECK(cudaMemcpyAsync(d->sum_scratch, &x, sizeof(x), cudaMemcpyHostToDevice, stream));
    NCCL_CHECK(ncclBroadcast(d->sum_scratch, d->sum_scratch, 1, ncclUint64, 0, d->comm, stream));
    CUDA_CHECK(cudaMemcpyAsync(&x, d->sum_scratch, sizeof(x), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return x;
}

/* A WatchdogProbe (llmc/watchdog.h): non-zero, with why in msg, once NCCL has
 * seen an error on this rank's communicator (a peer gone over the network). */
static inline int dist_async_error(void *dist, char *msg, size_t msg_size)
{
    const Dist *d = (const Dist *)dist;
    ncclResult_t state = ncclSuccess;
    if (!d->comm || ncclCommGetAsyncError(d->comm, &state) != ncclSuccess || state == ncclSuccess ||
        state == ncclInProgress)
        return 0;
    snprintf(msg, msg_size, "NCCL reports %s on this rank's communicator", ncclGetErrorString(state));
    return 1;
}

#endif /* LLMC_DISTRIBUTED_H */
