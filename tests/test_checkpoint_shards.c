/* Tests of llmc/checkpoint.h's sharded optimizer state: train_state files
 * written by W ranks (ZeRO 1, one file per rank, the last shard cut at the end
 * of the parameters) must give back every rank's range of the moments for a
 * resume on any other number of ranks, with the padding past the end zero;
 * a missing or foreign rank file is an error that names it. Runs in a
 * temporary directory, no GPU. */
#include <stdlib.h>
#include <unistd.h>

#include "llmc/checkpoint.h"
#include "tests/check.h"

/* The shard of rank r of `world` as train_llama cuts it: multiples of 8, the last one short. */
static void shard_of(int64_t total, int world, int r, int64_t *first, int64_t *count)
{
    int64_t shard = ((total + world - 1) / world + 7) / 8 * 8;
    *first = (int64_t)r * shard;
    *count = total - *first < shard ? total - *first : shard;
    if (*count < 0)
        *count = 0;
    if (*count == 0)
        *first = total;
}

static float moment(int which, int64_t i)
{
    return (which ? -1.0f : 1.0f) * (float)(i % 1000) * 0.5f + (float)which;
}

/* Writes the state files of `world` ranks into dir (as each rank would). */
static int write_world(const char *dir, int64_t total, int world)
{
    char err[1024];
    for (int r = 0; r < world; r++) {
        int64_t first, count;
        shard_of(total, world, r, &first, &count);
        CheckpointState st = checkpoint_state(7, 7, 99, total);
        st.rank = r;
        st.world = world;
        st.shard_offset = first;
        st.shard_count = count;
        float *m = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "m");
        float *v = (float *)malloc_check((size_t)(count + 1) * sizeof(float), "v");
        for (int64_t i = 0; i < count; i++) {
            m[i] = moment(0, first + i);
            v[i] = moment(1, first + i);
        }
        int rc = checkpoint_write_state_try(dir, &st, total, m, v, err, sizeof(err));
        free(m);
        free(v);
        if (rc != 0) {
            printf("  %s\n", err);
            return -1;
        }
    }
    return 0;
}

/* Every rank of `world` loads its padded range; returns 1 when all values are right. */
static int load_world(const char *dir, int64_t total, int world)
{
    int64_t shard = ((total + world - 1) / world + 7) / 8 * 8;
    int ok = 1;
    char err[1024];
    for (int r = 0; r < world && ok; r++) {
        float *m = (float *)malloc_check((size_t)shard * sizeof(float), "m");
        float *v = (float *)malloc_check((size_t)shard * sizeof(float), "v");
        CheckpointState st;
        memset(&st, 0, sizeof(st));
        int64_t first = (int64_t)r * shard;
        ok = checkpoint_load_moments_try(dir, total, first, shard, m, v, &st, err, sizeof(err)) == 0;
        if (!ok)
            printf("  %s\n", err);
        for (int64_t i = 0; ok && i < shard; i++) {
            int64_t at = first + i;
            ok = at < total ? m[i] == moment(0, at) && v[i] == moment(1, at) : m[i] == 0.0f && v[i] == 0.0f;
        }
        ok = ok && st.step == 7 && st.adam_step == 7 && st.rng_state == 99;
        free(m);
        free(v);
    }
    return ok;
}

int main(void)
{
    char root[] = "/tmp/test_checkpoint_shards_XXXXXX";
    if (!mkdtemp(root))
        FAIL("mkdtemp failed");
    const int64_t totals[] = {1000, 4099};
    const int worlds[] = {1, 2, 3, 4, 8};
    char dir[256], cmd[512], err[1024];
    for (int t = 0; t < 2; t++) {
        for (int w = 0; w < 5; w++) {
            snprintf(dir, sizeof(dir), "%s/t%d_w%d", root, t, worlds[w]);
            mkdir(dir, 0755);
            int ok = write_world(dir, totals[t], worlds[w]) == 0;
            for (int l = 0; ok && l < 5; l++) {
                check(load_world(dir, totals[t], worlds[l]), "%lld parameters saved by %d rank(s), resumed by %d",
                      (long long)totals[t], worlds[w], worlds[l]);
            }
        }
    }
    /* a missing rank file */
    snprintf(dir, sizeof(dir), "%s/t1_w4", root);
    snprintf(cmd, sizeof(cmd), "%s/train_state.00002.bin", dir);
    unlink(cmd);
    float m[8], v[8];
    CheckpointState st;
    int rc = checkpoint_load_moments_try(dir, 4099, 0, 8, m, v, &st, err, sizeof(err));
    check(rc != 0 && strstr(err, "train_state.00002.bin") != NULL, "a missing rank file is an error naming it: %s",
          err);
    /* a rank file from a run with another world size */
    snprintf(cmd, sizeof(cmd), "cp %s/t1_w3/train_state.00002.bin %s/", root, dir);
    rc = system(cmd) == 0 ? checkpoint_load_moments_try(dir, 4099, 0, 8, m, v, &st, err, sizeof(err)) : 0;
    check(rc != 0 && strstr(err, "rank 2 of 3") != NULL, "a rank file of another run is an error naming it: %s", err);
    /* a model of another size */
    snprintf(dir, sizeof(dir), "%s/t0_w2", root);
    rc = checkpoint_load_moments_try(dir, 1001, 0, 8, m, v, &st, err, sizeof(err));
    check(rc != 0 && strstr(err, "1000") != NULL, "state of another model size is refused: %s", err);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        printf("warning: could not remove %s\n", root);
    return check_summary();
}
