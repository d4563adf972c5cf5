/* Tests of llmc/parallel/launch.h: rank, world and local rank from flags and from each
 * launcher's environment variables, and the errors for inconsistent input. */
#include "llmc/parallel/launch.h"
#include "tests/fake_env.h"

static int passed = 0, failed = 0;

static void expect_ok(const char *what, const char **env, LaunchFlags flags, int gpus, int rank, int world,
                      int local_rank, const char *source)
{
    LaunchInfo info;
    char err[256] = "";
    fake_env = env;
    int rc = launch_info_try(&info, &flags, fake_env_lookup, gpus, err, sizeof(err));
    int ok = rc == 0 && info.rank == rank && info.world == world && info.local_rank == local_rank &&
             strcmp(info.source, source) == 0;
    printf("%s %s: rc %d, rank %d/%d, local %d, from %s %s\n", ok ? "PASS" : "FAIL", what, rc, info.rank, info.world,
           info.local_rank, info.source ? info.source : "-", err);
    ok ? passed++ : failed++;
}

static void expect_error(const char *what, const char **env, LaunchFlags flags, int gpus, const char *mention)
{
    LaunchInfo info;
    char err[256] = "";
    fake_env = env;
    int rc = launch_info_try(&info, &flags, fake_env_lookup, gpus, err, sizeof(err));
    int ok = rc != 0 && strstr(err, mention) != NULL;
    printf("%s %s: rc %d, message '%s' (must mention '%s')\n", ok ? "PASS" : "FAIL", what, rc, err, mention);
    ok ? passed++ : failed++;
}

int main(void)
{
    LaunchFlags none = {-1, -1, -1};
    const char *empty[] = {NULL};
    expect_ok("nothing set: one process", empty, none, 8, 0, 1, 0, "single process");

    LaunchFlags r5 = {5, 8, -1};
    expect_ok("flags: local rank from rank % GPUs", empty, r5, 4, 5, 8, 1, "flags");
    LaunchFlags r5l = {5, 8, 3};
    expect_ok("flags: explicit local rank", empty, r5l, 4, 5, 8, 3, "flags");
    LaunchFlags half = {2, -1, -1};
    expect_error("flags: --rank without --world-size", empty, half, 4, "--world-size");

    const char *ompi[] = {"OMPI_COMM_WORLD_RANK",
                          "11",
                          "OMPI_COMM_WORLD_SIZE",
                          "16",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "3",
                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "8",
                          "RANK",
                          "0",
                          "WORLD_SIZE",
                          "1",
                          NULL};
    expect_ok("mpirun over two hosts, before torchrun variables", ompi, none, 8, 11, 16, 3, "mpirun (Open MPI)");
    expect_ok("flags win over the environment", ompi, r5, 8, 5, 8, 5, "flags");

    const char *torchrun[] = {"RANK", "6", "WORLD_SIZE", "8", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "4", NULL};
    expect_ok("torchrun-style variables", torchrun, none, 4, 6, 8, 2, "torchrun-style environment");
    const char *slurm[] = {"SLURM_PROCID", "9", "SLURM_NTASKS", "16", "SLURM_LOCALID", "1", NULL};
    expect_ok("Slurm", slurm, none, 8, 9, 16, 1, "Slurm");
    const char *pmi[] = {"PMI_RANK", "3", "PMI_SIZE", "4", NULL};
    expect_ok("PMI without a local rank: rank % GPUs", pmi, none, 2, 3, 4, 1, "PMI");

    const char *rank_only[] = {"RANK", "1", NULL};
    expect_error("RANK without WORLD_SIZE", rank_only, none, 8, "WORLD_SIZE");
    const char *outside[] = {"RANK", "4", "WORLD_SIZE", "4", NULL};
    expect_error("rank outside the world", outside, none, 8, "outside a world of 4");
    const char *junk[] = {"OMPI_COMM_WORLD_RANK", "x1", "OMPI_COMM_WORLD_SIZE", "2", NULL};
    expect_error("a rank that is not a number", junk, none, 8, "OMPI_COMM_WORLD_RANK");
    const char *crowded[] = {"RANK", "5", "WORLD_SIZE", "8", "LOCAL_RANK", "5", "LOCAL_WORLD_SIZE", "8", NULL};
    expect_error("more processes than GPUs on a host", crowded, none, 4, "one process per GPU");
    expect_error("no GPU", torchrun, none, 0, "no GPU");

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
