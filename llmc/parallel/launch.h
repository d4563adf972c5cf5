/*
 * launch.h: which process of a multi-process run this is: its global rank and
 * the world size, and its rank and count on its own host (which GPU it takes).
 *
 * Sources, first match wins:
 *   1. flags (--rank, --world-size, --local-rank), for schedulers that start
 *      the processes themselves; local rank defaults to rank % GPUs per host
 *   2. Open MPI's mpirun:  OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
 *   3. torchrun style:     RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
 *   4. Slurm's srun:       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 *   5. PMI (MPICH, Hydra): PMI_RANK, PMI_SIZE
 *   6. none of them: one process, rank 0 of 1
 * A source that is only partly set (RANK without WORLD_SIZE), numbers that are
 * not integers, or ranks outside [0, world) are errors that name the variable.
 * Reads the environment through a caller-supplied lookup, so tests need not
 * touch the real one; writes only the struct.
 */
#ifndef LLMC_LAUNCH_H
#define LLMC_LAUNCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int rank, world;             /* global */
    int local_rank, local_world; /* on this host: local_rank picks the GPU */
    const char *source;          /* which of the sources above */
} LaunchInfo;

typedef const char *(*EnvLookup)(const char *name);

/* Flags not given are -1. */
typedef struct {
    int rank, world, local_rank;
} LaunchFlags;

/* 0 and *out = the integer value of `value`, or -1 with a message naming `name`. */
static inline int launch_parse_int_(const char *name, const char *value, int *out, char *err, size_t errlen)
{
    char *end;
    long x = strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || x < 0 || x > 1000000) {
        snprintf(err, errlen, "%s='%s' is not a non-negative integer", name, value);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* Reads rank/world/local rank/local world from the named variables of one
 * source; 1 if the source is present and valid, 0 if absent, -1 on error.
 * local_size_var may be NULL (then local_world stays 0, derived later). */
static inline int launch_from_vars_(LaunchInfo *info, EnvLookup env, const char *source, const char *rank_var,
                                    const char *world_var, const char *local_rank_var, const char *local_size_var,
                                    char *err, size_t errlen)
{
    const char *r = env(rank_var), *w = env(world_var);
    if (!r && !w)
        return 0;
    if (!r || !w) {
        snprintf(err, errlen, "%s is set but %s is not (%s launch): set both, or neither", r ? rank_var : world_var,
                 r ? world_var : rank_var, source);
        return -1;
    }
    if (launch_parse_int_(rank_var, r, &info->rank, err, errlen) ||
        launch_parse_int_(world_var, w, &info->world, err, errlen))
        return -1;
    info->local_rank = -1;
    info->local_world = 0;
    const char *lr = env(local_rank_var), *lw = local_size_var ? env(local_size_var) : NULL;
    if (lr && launch_parse_int_(local_rank_var, lr, &info->local_rank, err, errlen))
        return -1;
    if (lw && launch_parse_int_(local_size_var, lw, &info->local_world, err, errlen))
        return -1;
    info->source = source;
    return 1;
}

/*
 * Fills *info; gpus_per_host (> 0) is the number of GPUs this host has, used
 * when the launcher does not say the local rank. 0, or -1 with a message.
 */
static inline int launch_info_try(LaunchInfo *info, const LaunchFlags *flags, EnvLookup env, int gpus_per_host,
                                  char *err, size_t errlen)
{
    memset(info, 0, sizeof(*info));
    int found = 0;
    if (flags->rank >= 0 || flags->world >= 0) {
        if (flags->rank < 0 || flags->world < 0) {
            snprintf(err, errlen, "--rank and --world-size go together: give both, or neither");
            return -1;
        }
        info->rank = flags->rank;
        info->world = flags->world;
        info->local_rank = flags->local_rank;
        info->source = "flags";
        found = 1;
    }
    static const char *sources[][5] = {
        {"mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"torchrun-style environment", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
        {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
        {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    };
    for (size_t i = 0; !found && i < sizeof(sources) / sizeof(sources[0]); i++) {
        found = launch_from_vars_(info, env, sources[i][0], sources[i][1], sources[i][2], sources[i][3], sources[i][4],
                                  err, errlen);
        if (found < 0)
            return -1;
    }
    if (!found) {
        info->rank = 0;
        info->world = 1;
        info->local_rank = 0;
        info->local_world = 1;
        info->source = "single process";
        return 0;
    }
    if (info->world < 1 || info->rank >= info->world) {
        snprintf(err, errlen, "rank %d is outside a world of %d processes (from %s)", info->rank, info->world,
                 info->source);
        return -1;
    }
    if (gpus_per_host < 1) {
        snprintf(err, errlen, "no GPU on this host for rank %d", info->rank);
        return -1;
    }
    if (info->local_rank < 0)
        info->local_rank = info->rank % gpus_per_host;
    if (info->local_world <= 0)
        info->local_world = info->world < gpus_per_host ? info->world : gpus_per_host;
    if (info->local_rank >= info->local_world || info->local_rank >= gpus_per_host) {
        snprintf(err, errlen,
                 "rank %d has local rank %d, but this host runs %d processes on %d GPUs (from %s): "
                 "start at most one process per GPU",
                 info->rank, info->local_rank, info->local_world, gpus_per_host, info->source);
        return -1;
    }
    return 0;
}

#endif /* LLMC_LAUNCH_H */
