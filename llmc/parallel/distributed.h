/*
 * distributed.h: one process per GPU, NCCL between them.
 *
 *   dist_init: who this process is (llmc/parallel/launch.h: flags, mpirun, torchrun-style,
 *     Slurm or PMI variables), which GPU it takes (its rank on its host), and
 *     NCCL's communicators. Rank 0 makes NCCL's unique id and the others get it
 *     by MPI_Bcast when built with MPI (USE_MPI) and started by mpirun, otherwise
 *     through llmc/parallel/rendezvous.h (--rendezvous tcp://HOST:PORT or file:PATH, by
 *     default tcp://MASTER_ADDR:MASTER_PORT). Before NCCL starts it may set NCCL's socket
 *     threads and connections for hosts joined by TCP (llmc/parallel/nccl_sockets.h).
 *   process groups: three communicators (DistGroup): every rank; the ranks of
 *     this rank's host; the ranks at its position on every host (llmc/
 *     process_groups.h says how hosts are told apart). The latter two are split
 *     from the first (ncclCommSplit), and are the first itself, or a group of
 *     one, where they coincide with it. A fourth, of every rank again (control),
 *     carries the host-side sums on the compute stream, apart from ZeRO's
 *     collectives on their own stream.
 *   collectives: sums over a group's ranks of bf16 or fp32 device buffers
 *     (all-reduce, reduce-scatter) and all-gather, each on the caller's stream,
 *     alone or grouped into one launch; a group of one copies or does nothing,
 *     so single-GPU runs take the same code path.
 *   dist_sum_host: the sum over ranks of one host integer or double (blocking),
 *     for counts and losses that every rank must agree on.
 *   dist_async_error: NCCL's asynchronous error state, for llmc/parallel/watchdog.h's
 *     probe (NCCL allows the call from another thread).
 *
 * Every NCCL and MPI call is checked; the error names the rank, the call and
 * what to try. Reads and writes only the buffers passed in.
 */
#ifndef LLMC_DISTRIBUTED_H
#define LLMC_DISTRIBUTED_H

#include <errno.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#ifdef USE_MPI
#include <mpi.h>
#endif

#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"
#include "llmc/parallel/launch.h"
#include "llmc/parallel/nccl_sockets.h"
#include "llmc/parallel/process_groups.h"
#include "llmc/parallel/rendezvous.h"

/* A communicator and this rank's place in it; comm is NULL for a group of one. */
typedef struct {
    ncclComm_t comm;
    int rank, size;
} DistGroup;

typedef struct {
    int rank, world, local_rank;
    const char *source; /* where rank and world came from (launch.h) */
    int mpi;            /* MPI initialised by dist_init */
    DistGroup all;      /* every rank */
    DistGroup host;     /* the ranks of this rank's host (size 0 when the hosts hold different counts) */
    DistGroup across;   /* the ranks at this rank's position on every host (size 0 likewise) */
    DistGroup control;  /* every rank again, for dist_sum_host and the like on the compute stream, so that they
                           never run beside ZeRO's collectives (on their own stream) on one communicator */
    ProcessGroups groups;
    const char *host_source; /* where host identities came from (process_groups.h) */
    int machine_ranks;       /* ranks on this rank's machine (the same gethostname(), whatever NCCL_HOSTID says):
                                they share its host memory; 0 or 1 alone */
    int nccl_sockets_set;    /* NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD set by dist_init (nccl_sockets.h) */
    double *sum_scratch;     /* 8 device bytes for dist_sum_host, dist_broadcast_u64 and the host ids */
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

/* The groups of a world of one: every group is this rank alone. */
static inline void dist_groups_alone_(Dist *d)
{
    d->all.rank = 0;
    d->all.size = 1;
    d->host = d->across = d->control = d->all;
    uint64_t id = 0;
    char err[256];
    if (process_groups_make(&d->groups, &id, 1, 0, err, sizeof(err)) != 0)
        FAIL("%s", err);
    d->host_source = "one process";
}

/* One process, rank 0 of 1, on the current device: for tests and tools. */
static inline void dist_init_single(Dist *d)
{
    memset(d, 0, sizeof(*d));
    d->world = 1;
    d->source = "single process";
    dist_groups_alone_(d);
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

/* Every rank's x into ids[world] (host), through ids_d[world] (device), over d->all. */
static inline void dist_all_gather_u64_(Dist *d, uint64_t x, uint64_t *ids_d, uint64_t *ids)
{
    CUDA_CHECK(cudaMemcpy(d->sum_scratch, &x, sizeof(x), cudaMemcpyHostToDevice));
    NCCL_CHECK(ncclAllGather(d->sum_scratch, ids_d, 1, ncclUint64, d->all.comm, 0));
    CUDA_CHECK(cudaMemcpy(ids, ids_d, sizeof(uint64_t) * (size_t)d->world, cudaMemcpyDeviceToHost));
}

/* The host ids of every rank, gathered over d->all, grouped (process_groups.h), and
 * the host and across communicators split from the world's. shard_group > 0: groups
 * of that many consecutive ranks instead of hosts. */
static inline void dist_groups_init(Dist *d, int shard_group)
{
    char hostname[256] = "unknown", id_text[320], err[512];
    if (gethostname(hostname, sizeof(hostname) - 1) != 0)
        snprintf(hostname, sizeof(hostname), "unknown");
    uint64_t mine = host_identity(dist_getenv, hostname, id_text, sizeof(id_text), &d->host_source);
    if (shard_group > 0)
        d->host_source = "--shard-group";
    uint64_t *ids_d = (uint64_t *)cuda_malloc_named(sizeof(uint64_t) * (size_t)d->world, "host ids");
    uint64_t *ids = (uint64_t *)malloc_check(sizeof(uint64_t) * (size_t)d->world, "host ids");
    /* first the machines' names, then the host identities (which NCCL_HOSTID may split a machine into) */
    uint64_t machine = fnv1a64(hostname);
    dist_all_gather_u64_(d, machine, ids_d, ids);
    d->machine_ranks = 0;
    for (int r = 0; r < d->world; r++)
        d->machine_ranks += ids[r] == machine;
    dist_all_gather_u64_(d, mine, ids_d, ids);
    cuda_free(ids_d);
    if (process_groups_make(&d->groups, ids, d->world, shard_group, err, sizeof(err)) != 0)
        FAIL("rank %d: %s", d->rank, err);
    free(ids);
    const ProcessGroups *g = &d->groups;
    int host = g->host_of[d->rank], position = g->position_of[d->rank];
    if (g->per_host == 0) { /* no host or across group: --shard-over host refuses such a world */
        d->host.size = d->across.size = 0;
        return;
    }
    d->host.rank = position;
    d->host.size = g->per_host;
    d->across.rank = host;
    d->across.size = g->hosts;
    /* every rank calls both splits (NCCL's rule); a group that is the world, or of one, is not split */
    if (g->hosts == 1)
        d->host.comm = d->all.comm;
    else if (g->per_host > 1)
        NCCL_CHECK(ncclCommSplit(d->all.comm, host, position, &d->host.comm, NULL));
    if (g->per_host == 1)
        d->across.comm = d->all.comm;
    else if (g->hosts > 1)
        NCCL_CHECK(ncclCommSplit(d->all.comm, position, host, &d->across.comm, NULL));
}

/* Before NCCL starts: asks it for more threads and connections between hosts joined by TCP, where
 * nccl_sockets.h says so (reading the configuration files NCCL reads: NCCL_CONF_FILE or ~/.nccl.conf, and
 * /etc/nccl.conf). Returns whether it set them. */
static inline int dist_set_nccl_sockets_(int world)
{
    const char *conf = getenv("NCCL_CONF_FILE"), *home = getenv("HOME");
    char home_conf[1024] = "";
    if (home)
        snprintf(home_conf, sizeof(home_conf), "%s/.nccl.conf", home);
    const char *files[3] = {conf && conf[0] ? conf : home_conf, "/etc/nccl.conf", NULL};
    if (!nccl_sockets_wanted(world, dist_getenv, NCCL_SOCKETS_IB_DIR, NCCL_SOCKETS_NET_DIR, files))
        return 0;
    if (setenv("NCCL_SOCKET_NTHREADS", NCCL_SOCKETS_THREADS, 0) != 0 ||
        setenv("NCCL_NSOCKS_PERTHREAD", NCCL_SOCKETS_PER_THREAD, 0) != 0)
        FAIL("rank %d: setenv failed for NCCL's socket settings: %s", dist_rank_for_errors, strerror(errno));
    return 1;
}

/* Takes the GPU of info->local_rank and joins the NCCL communicators (see the top).
 * rendezvous: a spec for rendezvous.h, or NULL for MASTER_ADDR/MASTER_PORT; not
 * used under mpirun when built with MPI. shard_group: see dist_groups_init. */
static inline void dist_init(Dist *d, const LaunchInfo *info, const char *rendezvous, double timeout_s, int shard_group)
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
    d->all.rank = d->rank;
    d->all.size = d->world;
    if (d->world == 1) {
        dist_groups_alone_(d);
        return;
    }

    d->nccl_sockets_set = dist_set_nccl_sockets_(d->world); /* before NCCL reads its settings */
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
    NCCL_CHECK(ncclCommInitRank(&d->all.comm, d->world, id, d->rank));
    /* the control communicator moves a few bytes at a time: one channel */
    ncclConfig_t one_channel = NCCL_CONFIG_INITIALIZER;
    one_channel.minCTAs = one_channel.maxCTAs = 1;
    d->control = d->all;
    NCCL_CHECK(ncclCommSplit(d->all.comm, 0, d->rank, &d->control.comm, &one_channel));
    dist_groups_init(d, shard_group);
}

static inline void dist_finalize(Dist *d)
{
    /* the host and across groups may be the world's communicator itself */
    if (d->host.comm && d->host.comm != d->all.comm)
        NCCL_CHECK(ncclCommDestroy(d->host.comm));
    if (d->across.comm && d->across.comm != d->all.comm)
        NCCL_CHECK(ncclCommDestroy(d->across.comm));
    if (d->control.comm && d->control.comm != d->all.comm)
        NCCL_CHECK(ncclCommDestroy(d->control.comm));
    if (d->all.comm)
        NCCL_CHECK(ncclCommDestroy(d->all.comm));
    d->all.comm = d->host.comm = d->across.comm = d->control.comm = NULL;
    process_groups_free(&d->groups);
    cuda_free(d->sum_scratch);
#ifdef USE_MPI
    if (d->mpi)
        MPI_CHECK(MPI_Finalize());
#endif
    d->mpi = 0;
}

/* 1: bytes (codes, moved as they are), 2: bf16, 4: fp32, 8: 64-bit words (moved as they are) */
static inline ncclDataType_t dist_type(int bytes_per_element)
{
    return bytes_per_element == 1   ? ncclUint8
           : bytes_per_element == 2 ? ncclBfloat16
           : bytes_per_element == 8 ? ncclUint64
                                    : ncclFloat32;
}

/* buf[count] = sum over the group's ranks, in place. element_bytes: 2 (bf16) or 4 (fp32). */
static inline void dist_all_reduce_sum(const DistGroup *g, void *buf, int64_t count, int element_bytes,
                                       cudaStream_t stream)
{
    if (g->size == 1)
        return;
    profile_push(PROF_COMM, stream);
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, dist_type(element_bytes), ncclSum, g->comm, stream));
    profile_pop(stream);
}

/* buf[count] = the largest over the group's ranks, in place (exact in any order). element_bytes: 4 (fp32) or 8
 * (uint64). */
static inline void dist_all_reduce_max(const DistGroup *g, void *buf, int64_t count, int element_bytes,
                                       cudaStream_t stream)
{
    if (g->size == 1)
        return;
    profile_push(PROF_COMM, stream);
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, dist_type(element_bytes), ncclMax, g->comm, stream));
    profile_pop(stream);
}

/* recv[count] = sum over the group's ranks of send[g->rank * count, (g->rank + 1) * count). */
static inline void dist_reduce_scatter_sum(const DistGroup *g, const void *send, void *recv, int64_t count,
                                           int element_bytes, cudaStream_t stream)
{
    profile_push(PROF_COMM, stream);
    if (g->size == 1) {
        if (send != recv)
            CUDA_CHECK(cudaMemcpyAsync(recv, send, (size_t)count * element_bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
        NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)count, dist_type(element_bytes), ncclSum, g->comm, stream));
    }
    profile_pop(stream);
}

/* recv[r * count, (r + 1) * count) = the group's rank r's send[count]; send may be recv + g->rank * count. */
static inline void dist_all_gather(const DistGroup *g, const void *send, void *recv, int64_t count, int element_bytes,
                                   cudaStream_t stream)
{
    profile_push(PROF_COMM, stream);
    if (g->size == 1) {
        if (send != recv)
            CUDA_CHECK(cudaMemcpyAsync(recv, send, (size_t)count * element_bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
        NCCL_CHECK(ncclAllGather(send, recv, (size_t)count, dist_type(element_bytes), g->comm, stream));
    }
    profile_pop(stream);
}

/* recv[r * bytes, (r + 1) * bytes) = the group's rank r's send[g->rank * bytes, ...) for every other rank r: each
 * rank's r-th piece goes to rank r (NCCL point-to-point calls in one group); the rank's own piece stays in send,
 * and recv's slot of its own is not written. send and recv apart. Two ranks: each sends the other one piece, which
 * is what an all-gather of that piece moves, and NCCL's collectives move it 1.24-1.47x faster per byte than its
 * point-to-point calls over the network transport (dev/bench/nccl_bench's all_gather against all_to_all,
 * docs/multi_gpu.md); the all-gather writes the piece sent into recv's slot of its own. */
static inline void dist_all_to_all(const DistGroup *g, const void *send, void *recv, int64_t bytes, cudaStream_t stream)
{
    if (g->size == 1)
        return;
    profile_push(PROF_COMM, stream);
    if (g->size == 2) {
        NCCL_CHECK(ncclAllGather((const char *)send + (int64_t)(1 - g->rank) * bytes, recv, (size_t)bytes, ncclUint8,
                                 g->comm, stream));
    } else {
        NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r < g->size; r++) {
            if (r == g->rank)
                continue;
            NCCL_CHECK(ncclSend((const char *)send + (int64_t)r * bytes, (size_t)bytes, ncclUint8, r, g->comm, stream));
            NCCL_CHECK(ncclRecv((char *)recv + (int64_t)r * bytes, (size_t)bytes, ncclUint8, r, g->comm, stream));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    profile_pop(stream);
}

/* The sum over ranks of x; blocks until every rank has called it. */
static inline double dist_sum_host(const Dist *d, double x, cudaStream_t stream)
{
    if (d->world == 1)
        return x;
    CUDA_CHECK(cudaMemcpyAsync(d->sum_scratch, &x, sizeof(double), cudaMemcpyHostToDevice, stream));
    NCCL_CHECK(ncclAllReduce(d->sum_scratch, d->sum_scratch, 1, ncclFloat64, ncclSum, d->control.comm, stream));
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
    NCCL_CHECK(ncclBroadcast(d->sum_scratch, d->sum_scratch, 1, ncclUint64, 0, d->control.comm, stream));
    CUDA_CHECK(cudaMemcpyAsync(&x, d->sum_scratch, sizeof(x), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return x;
}

/* A WatchdogProbe (llmc/parallel/watchdog.h): non-zero, with why in msg, once NCCL has
 * seen an error on one of this rank's communicators (a peer gone over the network). */
static inline int dist_async_error(void *dist, char *msg, size_t msg_size)
{
    const Dist *d = (const Dist *)dist;
    const DistGroup *groups[4] = {&d->all, &d->host, &d->across, &d->control};
    const char *names[4] = {"all ranks'", "its host's", "the across-hosts", "the control"};
    for (int i = 0; i < 4; i++) {
        ncclResult_t state = ncclSuccess;
        if (!groups[i]->comm || ncclCommGetAsyncError(groups[i]->comm, &state) != ncclSuccess || state == ncclSuccess ||
            state == ncclInProgress)
            continue;
        snprintf(msg, msg_size, "NCCL reports %s on %s communicator", ncclGetErrorString(state), names[i]);
        return 1;
    }
    return 0;
}

#endif /* LLMC_DISTRIBUTED_H */
