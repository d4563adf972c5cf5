/* Tests of llmc/parallel/process_groups.h: host identities from NCCL_HOSTID, the
 * scheduler or the hostname; ranks grouped by host in the order of their lowest
 * rank, whatever the launcher's placement; --shard-group's consecutive groups;
 * uneven hosts told apart; bad group sizes refused with a message. */
#include "llmc/parallel/process_groups.h"
#include "tests/fake_env.h"

static int passed = 0, failed = 0;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    ok ? passed++ : failed++;
}

static void expect_identity(const char *what, const char **env, const char *id, const char *source)
{
    char text[128];
    const char *from = NULL;
    fake_env = env;
    uint64_t h = host_identity(fake_env_lookup, "node7", text, sizeof(text), &from);
    int ok = strcmp(text, id) == 0 && strcmp(from, source) == 0 && h == fnv1a64(id);
    printf("  identity '%s' from %s\n", text, from);
    check(ok, what);
}

/* ids given as small integers; expect host_of and position_of, and per_host */
static void expect_groups(const char *what, const uint64_t *ids, int world, int shard_group, const int *host_of,
                          const int *position_of, int hosts, int per_host)
{
    ProcessGroups g;
    char err[256] = "";
    int rc = process_groups_make(&g, ids, world, shard_group, err, sizeof(err));
    int ok = rc == 0 && g.hosts == hosts && g.per_host == per_host;
    for (int r = 0; ok && r < world; r++)
        ok = g.host_of[r] == host_of[r] && g.position_of[r] == position_of[r];
    char described[96] = "";
    if (rc == 0)
        process_groups_describe(&g, described, sizeof(described));
    printf("  %s %s\n", described, err);
    check(ok, what);
    process_groups_free(&g);
}

int main(void)
{
    const char *none[] = {NULL};
    const char *nccl[] = {"NCCL_HOSTID", "fake-host-1", "SLURM_NODEID", "3", NULL};
    const char *slurm[] = {"SLURM_NODEID", "3", "GROUP_RANK", "1", NULL};
    const char *torchrun[] = {"GROUP_RANK", "1", NULL};
    const char *empty_id[] = {"NCCL_HOSTID", "", NULL};
    expect_identity("the hostname when nothing is set", none, "hostname=node7", "the hostname");
    expect_identity("NCCL_HOSTID first (one machine standing in for several)", nccl, "NCCL_HOSTID=fake-host-1",
                    "NCCL_HOSTID");
    expect_identity("Slurm's node id before torchrun's", slurm, "SLURM_NODEID=3", "Slurm's node id");
    expect_identity("torchrun's GROUP_RANK", torchrun, "GROUP_RANK=1", "torchrun's GROUP_RANK");
    expect_identity("an empty NCCL_HOSTID is not an identity", empty_id, "hostname=node7", "the hostname");
    check(fnv1a64("NCCL_HOSTID=a") != fnv1a64("NCCL_HOSTID=b"), "different identities, different hashes");

    /* 8 ranks on 2 hosts, placed by block and round-robin */
    uint64_t block[8] = {5, 5, 5, 5, 9, 9, 9, 9}, robin[8] = {9, 5, 9, 5, 9, 5, 9, 5};
    int block_host[8] = {0, 0, 0, 0, 1, 1, 1, 1}, block_pos[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    int robin_host[8] = {0, 1, 0, 1, 0, 1, 0, 1}, robin_pos[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    expect_groups("2 hosts of 4, ranks by block", block, 8, 0, block_host, block_pos, 2, 4);
    expect_groups("2 hosts of 4, ranks round-robin: hosts in the order of their lowest rank", robin, 8, 0, robin_host,
                  robin_pos, 2, 4);
    int pairs_host[8] = {0, 0, 1, 1, 2, 2, 3, 3}, pairs_pos[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    expect_groups("--shard-group 2 overrides the identities", block, 8, 2, pairs_host, pairs_pos, 4, 2);
    uint64_t one[4] = {1, 1, 1, 1}, each[4] = {1, 2, 3, 4};
    int zeros[4] = {0, 0, 0, 0}, seq[4] = {0, 1, 2, 3};
    expect_groups("one host", one, 4, 0, zeros, seq, 1, 4);
    expect_groups("a GPU per host", each, 4, 0, seq, zeros, 4, 1);
    uint64_t uneven[5] = {1, 1, 1, 2, 2};
    int uneven_host[5] = {0, 0, 0, 1, 1}, uneven_pos[5] = {0, 1, 2, 0, 1};
    expect_groups("hosts of 3 and 2 GPUs: grouped, per_host 0", uneven, 5, 0, uneven_host, uneven_pos, 2, 0);

    ProcessGroups g;
    char err[256] = "";
    int rc = process_groups_make(&g, block, 8, 3, err, sizeof(err));
    printf("  %s\n", err);
    check(rc != 0 && strstr(err, "--shard-group 3") && strstr(err, "8 ranks"), "--shard-group 3 of 8 ranks refused");
    rc = process_groups_make(&g, block, 0, 0, err, sizeof(err));
    check(rc != 0, "a world of 0 ranks refused");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
