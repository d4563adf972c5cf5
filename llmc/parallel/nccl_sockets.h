/*
 * nccl_sockets.h: how many helper threads and TCP connections NCCL's socket
 * transport gives each channel between two hosts.
 *
 * Hosts without an InfiniBand or RoCE device (and no other network plugin) are
 * joined by NCCL over TCP. Unless told otherwise NCCL gives each channel one
 * helper thread with one connection (2 threads x 8 on AWS's ENA, which it
 * recognises by the NIC's vendor). On the 2-host stand-in that bounded the
 * link: 4 threads of 2 connections moved stage 1's step from 91.7-94.1% of one
 * GPU's throughput to 96.2-97.4% in four runs of five, with the same losses
 * (docs/multi_gpu.md, "Where the gap is, and NCCL's sockets"); NCCL's own
 * documentation suggests 4 for fast TCP networks. So before NCCL starts the
 * trainer asks for 4 x 2 (nccl_sockets_wanted), when
 *   - there are several ranks (ranks of one host do not use sockets, so the
 *     setting is inert there),
 *   - NCCL will use its built-in socket transport: NCCL_NET unset or "Socket",
 *     no NCCL_NET_PLUGIN, and no device in /sys/class/infiniband (where
 *     InfiniBand, RoCE and AWS's EFA appear) unless NCCL_IB_DISABLE=1,
 *   - no network device of /sys/class/net is AWS's (vendor 0x1d0f), whose
 *     2 x 8 NCCL chooses itself,
 *   - neither NCCL_SOCKET_NTHREADS nor NCCL_NSOCKS_PERTHREAD is set, in the
 *     environment or in NCCL's configuration files (NCCL_CONF_FILE, else
 *     ~/.nccl.conf and /etc/nccl.conf): a user's or an administrator's choice
 *     stands. NCCL_SOCKET_NTHREADS=1 NCCL_NSOCKS_PERTHREAD=1 gives NCCL's own
 *     defaults back.
 * Reads the environment through an EnvLookup and the device directories and
 * configuration files by path, so that tests can fake them all; writes nothing.
 */
#ifndef LLMC_NCCL_SOCKETS_H
#define LLMC_NCCL_SOCKETS_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "llmc/parallel/launch.h"

#define NCCL_SOCKETS_THREADS "4"
#define NCCL_SOCKETS_PER_THREAD "2"
#define NCCL_SOCKETS_IB_DIR "/sys/class/infiniband"
#define NCCL_SOCKETS_NET_DIR "/sys/class/net"
#define NCCL_SOCKETS_AWS_VENDOR "0x1d0f" /* PCI vendor of AWS's ENA, whose sockets NCCL sets itself */

/* Whether the file at path has a line setting name ("NAME=value", as NCCL's configuration files do). */
static inline int nccl_conf_sets_(const char *path, const char *name)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    char line[1024];
    size_t len = strlen(name);
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        const char *p = line + strspn(line, " \t");
        found = strncmp(p, name, len) == 0 && p[len] == '=';
    }
    fclose(f);
    return found;
}

/* Whether ib_dir lists a network device (an entry not starting with '.'); 0 when it does not exist. */
static inline int nccl_ib_devices_(const char *ib_dir)
{
    DIR *dir = opendir(ib_dir);
    if (!dir)
        return 0;
    int devices = 0;
    for (struct dirent *e = readdir(dir); e; e = readdir(dir))
        devices += e->d_name[0] != '.';
    closedir(dir);
    return devices > 0;
}

/* Whether a device of net_dir (as /sys/class/net: NAME/device/vendor) is AWS's. */
static inline int nccl_aws_nic_(const char *net_dir)
{
    DIR *dir = opendir(net_dir);
    if (!dir)
        return 0;
    int aws = 0;
    for (struct dirent *e = readdir(dir); e && !aws; e = readdir(dir)) {
        char path[1024], vendor[16] = "";
        snprintf(path, sizeof(path), "%s/%s/device/vendor", net_dir, e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        aws = fgets(vendor, sizeof(vendor), f) && strncmp(vendor, NCCL_SOCKETS_AWS_VENDOR, 6) == 0;
        fclose(f);
    }
    closedir(dir);
    return aws;
}

/* 1 when the trainer should set NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD (see the top), else 0.
 * conf_files: NCCL's configuration files, NULL-terminated; files that do not exist are skipped. */
static inline int nccl_sockets_wanted(int world, EnvLookup env, const char *ib_dir, const char *net_dir,
                                      const char *const *conf_files)
{
    static const char *const names[2] = {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"};
    if (world < 2 || env("NCCL_NET_PLUGIN"))
        return 0;
    const char *net = env("NCCL_NET"), *ib_disable = env("NCCL_IB_DISABLE");
    if (net && strcmp(net, "Socket") != 0)
        return 0;
    /* no NCCL_NET: NCCL takes InfiniBand where there is a device it may use */
    if (!net && !(ib_disable && strcmp(ib_disable, "1") == 0) && nccl_ib_devices_(ib_dir))
        return 0;
    if (nccl_aws_nic_(net_dir))
        return 0;
    for (int i = 0; i < 2; i++) {
        if (env(names[i]))
            return 0;
        for (int f = 0; conf_files[f]; f++)
            if (nccl_conf_sets_(conf_files[f], names[i]))
                return 0;
    }
    return 1;
}

#endif /* LLMC_NCCL_SOCKETS_H */
