/*
 * process_groups.h: which ranks share a host, from every rank's host identity,
 * for the communicators of llmc/parallel/distributed.h.
 *
 *   host group:    the ranks of one host, in rank order (a rank's place there is its
 *                  position); with --shard-over host, ZeRO shards weights and
 *                  gradients over it (the shard group), over NVLink
 *   replica group: the ranks at the same position on every host, in host order (a
 *                  rank's place there is its host index); it carries what crosses hosts
 *
 * A host's identity is NCCL_HOSTID when set (one machine can then stand in for
 * several: NCCL, which reads the same variable, uses its network transport between
 * such "hosts" and NVLink inside each), else the scheduler's node number
 * (SLURM_NODEID, torchrun's GROUP_RANK), else the hostname; ranks exchange its
 * 64-bit FNV-1a hash. Hosts are numbered in the order of their lowest rank.
 * --shard-group N instead cuts the ranks into consecutive groups of N.
 *
 * Pure arithmetic on the exchanged hashes (distributed.h does the exchange and
 * splits the communicators); reads the environment through an EnvLookup, as
 * launch.h does. Allocates the two per-rank tables.
 */
#ifndef LLMC_PROCESS_GROUPS_H
#define LLMC_PROCESS_GROUPS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/parallel/launch.h" /* EnvLookup */

typedef struct {
    int world;
    int hosts;        /* distinct host identities (or groups of --shard-group) */
    int per_host;     /* ranks on every host; 0 when the hosts hold different counts */
    int *host_of;     /* [world] each rank's host index */
    int *position_of; /* [world] each rank's place among its host's ranks */
} ProcessGroups;

static inline uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* This rank's host identity: its text into id[len], its hash returned, and
 * where it came from into *source. hostname: gethostname()'s answer. */
static inline uint64_t host_identity(EnvLookup env, const char *hostname, char *id, size_t len, const char **source)
{
    static const char *vars[][2] = {
        {"NCCL_HOSTID", "NCCL_HOSTID"}, {"SLURM_NODEID", "Slurm's node id"}, {"GROUP_RANK", "torchrun's GROUP_RANK"}};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = env(vars[i][0]);
        if (v && *v) {
            snprintf(id, len, "%s=%s", vars[i][0], v);
            *source = vars[i][1];
            return fnv1a64(id);
        }
    }
    snprintf(id, len, "hostname=%s", hostname);
    *source = "the hostname";
    return fnv1a64(id);
}

static inline void process_groups_free(ProcessGroups *g)
{
    free(g->host_of);
    free(g->position_of);
    memset(g, 0, sizeof(*g));
}

/* Groups the world's ranks by ids[world] (each rank's host hash), or into
 * consecutive groups of shard_group ranks when shard_group > 0. 0, or -1 with
 * the reason in err. */
static inline int process_groups_make(ProcessGroups *g, const uint64_t *ids, int world, int shard_group, char *err,
                                      size_t errlen)
{
    memset(g, 0, sizeof(*g));
    if (world < 1) {
        snprintf(err, errlen, "process groups: a world of %d ranks", world);
        return -1;
    }
    if (shard_group > 0 && world % shard_group != 0) {
        snprintf(err, errlen,
                 "--shard-group %d does not divide the %d ranks; hint: give a divisor of the number of GPUs, or 0 "
                 "to group the ranks by host",
                 shard_group, world);
        return -1;
    }
    g->world = world;
    g->host_of = (int *)malloc(sizeof(int) * (size_t)world);
    g->position_of = (int *)malloc(sizeof(int) * (size_t)world);
    int *count = (int *)calloc((size_t)world, sizeof(int)); /* ranks seen so far per host */
    if (!g->host_of || !g->position_of || !count) {
        free(count);
        process_groups_free(g);
        snprintf(err, errlen, "process groups: out of host memory for %d ranks", world);
        return -1;
    }
    for (int r = 0; r < world; r++) {
        int h = 0;
        if (shard_group > 0) {
            h = r / shard_group;
            g->hosts = h + 1;
        } else { /* the host of the lowest rank with r's id, or a new one */
            int first = 0;
            while (ids[first] != ids[r])
                first++;
            h = first == r ? g->hosts++ : g->host_of[first];
        }
        g->host_of[r] = h;
        g->position_of[r] = count[h]++;
    }
    g->per_host = count[0];
    for (int h = 1; h < g->hosts; h++)
        if (count[h] != g->per_host)
            g->per_host = 0;
    free(count);
    return 0;
}

/* The ranks per host, as "2 hosts of 4 GPUs" or "3 hosts of 2 to 4 GPUs", into out. */
static inline void process_groups_describe(const ProcessGroups *g, char *out, size_t len)
{
    if (g->per_host > 0) {
        snprintf(out, len, "%d host%s of %d GPU%s", g->hosts, g->hosts == 1 ? "" : "s", g->per_host,
                 g->per_host == 1 ? "" : "s");
        return;
    }
    int lo = g->world, hi = 0;
    for (int h = 0; h < g->hosts; h++) {
        int n = 0;
        for (int r = 0; r < g->world; r++)
            n += g->host_of[r] == h;
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
    }
    snprintf(out, len, "%d hosts of %d to %d GPUs", g->hosts, lo, hi);
}

#endif /* LLMC_PROCESS_GROUPS_H */
