/* Tests of llmc/parallel/nccl_sockets.h: when the trainer asks NCCL for 4 threads x 2 connections between hosts
 * joined by TCP. Device directories and configuration files are made in a temporary directory: an empty and a
 * missing /sys/class/infiniband, one with a device, network devices of another vendor and of AWS's, and NCCL
 * configuration files that set or do not set the two variables. */
#include <sys/stat.h>

#include "llmc/parallel/nccl_sockets.h"
#include "tests/check.h"
#include "tests/fake_env.h"

static char root[256];

/* root/rel as a path, in a buffer of the caller's */
static const char *at(char *path, size_t len, const char *rel)
{
    snprintf(path, len, "%s/%s", root, rel);
    return path;
}

static void make_dir(const char *rel)
{
    char path[512];
    if (mkdir(at(path, sizeof(path), rel), 0700) != 0) {
        perror(path);
        exit(1);
    }
}

static void write_file(const char *rel, const char *text)
{
    char path[512];
    FILE *f = fopen(at(path, sizeof(path), rel), "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static int wanted(const char **env, int world, const char *ib, const char *net, const char *conf)
{
    fake_env = env;
    char ib_path[512], net_path[512], conf_path[512], missing[512];
    const char *files[3] = {at(conf_path, sizeof(conf_path), conf), at(missing, sizeof(missing), "missing.conf"), NULL};
    return nccl_sockets_wanted(world, fake_env_lookup, at(ib_path, sizeof(ib_path), ib),
                               at(net_path, sizeof(net_path), net), files);
}

int main(void)
{
    snprintf(root, sizeof(root), "/tmp/test_nccl_sockets.XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    make_dir("ib_empty");
    make_dir("ib_mlx");
    make_dir("ib_mlx/mlx5_0");
    make_dir("net_other");
    make_dir("net_other/eth0");
    make_dir("net_other/eth0/device");
    write_file("net_other/eth0/device/vendor", "0x15b3\n");
    make_dir("net_other/lo"); /* no device/vendor, as the loopback */
    make_dir("net_aws");
    make_dir("net_aws/ens5");
    make_dir("net_aws/ens5/device");
    write_file("net_aws/ens5/device/vendor", "0x1d0f\n");
    write_file("plain.conf", "NCCL_DEBUG=WARN\n# NCCL_SOCKET_NTHREADS=8 in a comment\n");
    write_file("threads.conf", "NCCL_DEBUG=WARN\nNCCL_SOCKET_NTHREADS=8\n");
    write_file("socks.conf", "  NCCL_NSOCKS_PERTHREAD=4\n");

    const char *none[] = {NULL};
    check(wanted(none, 2, "ib_missing", "net_other", "plain.conf") == 1, "2 ranks, no InfiniBand directory: set");
    check(wanted(none, 8, "ib_empty", "net_other", "plain.conf") == 1, "8 ranks, an empty InfiniBand directory: set");
    check(wanted(none, 1, "ib_empty", "net_other", "plain.conf") == 0, "one rank: not set");
    check(wanted(none, 2, "ib_mlx", "net_other", "plain.conf") == 0, "an InfiniBand device: not set");
    const char *ib_off[] = {"NCCL_IB_DISABLE", "1", NULL};
    check(wanted(ib_off, 2, "ib_mlx", "net_other", "plain.conf") == 1, "an InfiniBand device, NCCL_IB_DISABLE=1: set");
    const char *ib_on[] = {"NCCL_IB_DISABLE", "0", NULL};
    check(wanted(ib_on, 2, "ib_mlx", "net_other", "plain.conf") == 0,
          "an InfiniBand device, NCCL_IB_DISABLE=0: not set");
    const char *socket[] = {"NCCL_NET", "Socket", NULL};
    check(wanted(socket, 2, "ib_mlx", "net_other", "plain.conf") == 1, "an InfiniBand device, NCCL_NET=Socket: set");
    const char *ib_net[] = {"NCCL_NET", "IB", NULL};
    check(wanted(ib_net, 2, "ib_empty", "net_other", "plain.conf") == 0, "NCCL_NET=IB: not set");
    const char *plugin[] = {"NCCL_NET_PLUGIN", "libnccl-net-tcpx.so", NULL};
    check(wanted(plugin, 2, "ib_empty", "net_other", "plain.conf") == 0, "a network plugin: not set");
    check(wanted(none, 2, "ib_empty", "net_aws", "plain.conf") == 0, "AWS's ENA (NCCL picks 2 x 8 itself): not set");
    const char *threads[] = {"NCCL_SOCKET_NTHREADS", "1", NULL};
    check(wanted(threads, 2, "ib_empty", "net_other", "plain.conf") == 0, "NCCL_SOCKET_NTHREADS set: not set");
    const char *socks[] = {"NCCL_NSOCKS_PERTHREAD", "1", NULL};
    check(wanted(socks, 2, "ib_empty", "net_other", "plain.conf") == 0, "NCCL_NSOCKS_PERTHREAD set: not set");
    check(wanted(none, 2, "ib_empty", "net_other", "threads.conf") == 0,
          "NCCL_SOCKET_NTHREADS in a configuration file: not set");
    check(wanted(none, 2, "ib_empty", "net_other", "socks.conf") == 0,
          "NCCL_NSOCKS_PERTHREAD in a configuration file (indented): not set");
    check(wanted(none, 2, "ib_empty", "net_missing", "missing.conf") == 1,
          "no network directory and no configuration file: set");

    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary();
}
