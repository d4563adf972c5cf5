/* Tests of llmc/parallel/zero_plan.h on the test models and the published shapes, at
 * world sizes that divide nothing evenly: every element owned exactly once,
 * equal aligned shares, little padding, buckets along the layers. */
#include "llmc/parallel/zero_plan.h"
#include "llmc/formats/llmt_config.h"
#include "llmc/model/param_layout.h"

#include "tests/check.h"

static void check_plan(int ok, const char *what, const char *model, int world)
{
    check(ok, "%s (%s, world %d)", what, model, world);
}

/* Sharded over hosts (zero_plan_shard_over_hosts): for every host size that divides
 * the world, ranks placed round-robin over the hosts (the harder case: a host's
 * ranks are not consecutive), each rank's share lies inside its group share (the
 * one its position on its host names, which its host's ranks tile), and the
 * ranks' shares still own every element exactly once. */
static void test_over_hosts(const char *name, const ParamLayout *layout, int world)
{
    for (int per_host = 1; per_host <= world; per_host++) {
        if (world % per_host != 0)
            continue;
        int hosts = world / per_host;
        uint64_t *ids = (uint64_t *)malloc_check(sizeof(uint64_t) * world, "ids");
        for (int r = 0; r < world; r++)
            ids[r] = 1000 + r % hosts; /* round-robin */
        ProcessGroups g;
        char err[256];
        if (process_groups_make(&g, ids, world, 0, err, sizeof(err)) != 0)
            FAIL("%s", err);
        ZeroPlan plan = zero_plan(layout, world);
        zero_plan_shard_over_hosts(&plan, &g);
        int ok = plan.group_size == per_host && plan.groups == hosts, tiled = 1;
        int *owner = (int *)malloc_check(sizeof(int) * world, "owners");
        for (int b = 0; b < plan.n_buckets; b++) {
            const ZeroBucket *z = &plan.buckets[b];
            ok &= z->group_share * per_host == z->padded && z->group_share == z->shard * hosts;
            for (int i = 0; i < world; i++)
                owner[i] = -1;
            int64_t owned = 0;
            for (int r = 0; r < world; r++) {
                int share = plan.share_of[r];
                tiled &= share >= 0 && share < world && owner[share] < 0;
                if (share >= 0 && share < world)
                    owner[share] = r;
                int64_t begin, end, gbegin, gend, at;
                zero_owned_range(&plan, b, r, &begin, &end);
                zero_group_model_range(&plan, b, g.position_of[r], &gbegin, &gend);
                owned += end - begin;
                ok &= (end == begin) || (begin >= gbegin && end <= gend);
                zero_update_range(&plan, 1, r, b, &at);
                ok &= at == z->padded_offset + (int64_t)share * z->shard &&
                      (at - z->padded_offset) / z->group_share == g.position_of[r] &&
                      (at - z->padded_offset) % z->group_share == (int64_t)g.host_of[r] * z->shard;
            }
            tiled &= owned == z->numel;
        }
        char what[128];
        snprintf(what, sizeof(what), "over %d hosts of %d: shares inside their group shares, each owned once", hosts,
                 per_host);
        check_plan(ok && tiled, what, name, world);
        free(owner);
        free(ids);
        process_groups_free(&g);
        zero_plan_free(&plan);
    }
}

static void test_model(const char *name, const LlamaConfig *c)
{
    ParamLayout layout = llama_param_layout(c);
    int worlds[] = {1, 2, 3, 4, 7, 8, 16};
    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        int world = worlds[w];
        ZeroPlan plan = zero_plan(&layout, world);
        int contiguous = 1, equal_aligned = 1, little_padding = 1, layers = plan.n_buckets == c->n_layer + 2;
        int64_t owned = 0, next = 0, next_padded = 0, most = 0;
        for (int b = 0; b < plan.n_buckets; b++) {
            const ZeroBucket *z = &plan.buckets[b];
            most = z->numel > most ? z->numel : most;
            contiguous &= z->offset == next && z->padded_offset == next_padded;
            next += z->numel;
            next_padded += z->padded;
            equal_aligned &= z->shard * world == z->padded && z->shard % ZERO_ALIGN == 0 && z->group_share == z->shard;
            little_padding &= z->padded - z->numel < (int64_t)world * ZERO_ALIGN;
            int64_t last_end = z->offset;
            for (int r = 0; r < world; r++) {
                int64_t begin, end;
                zero_owned_range(&plan, b, r, &begin, &end);
                contiguous &= begin == last_end && end >= begin; /* ranks tile the bucket in order */
                owned += end - begin;
                last_end = end;
            }
            contiguous &= last_end == z->offset + z->numel;
            if (b >= 1 && b <= c->n_layer) /* a layer bucket is exactly that layer's tensors */
                layers &= z->offset == layout.tensors[param_index_layer(&layout, b - 1, LAYER_ATTN_NORM)].offset &&
                          z->numel == layout.tensors[param_index_layer(&layout, b - 1, LAYER_DOWN)].offset +
                                          layout.tensors[param_index_layer(&layout, b - 1, LAYER_DOWN)].numel -
                                          z->offset;
        }
        check_plan(owned == layout.total && next == layout.total && contiguous,
                   "every element owned by exactly one rank", name, world);
        check_plan(equal_aligned, "equal shares, multiples of ZERO_ALIGN", name, world);
        check_plan(little_padding && plan.padded_total == next_padded, "padding under world * ZERO_ALIGN per bucket",
                   name, world);
        check_plan(layers, "one bucket per layer between the embedding and the head", name, world);
        /* the embedding (or the untied head's bucket) is the largest: the host stages that much */
        check_plan(zero_plan_largest_bucket(&plan) == most && most >= (int64_t)c->vocab_size * c->d_model,
                   "the largest bucket is the embedding's or the head's", name, world);
        /* update ranges: stage 0 the whole padded bucket on every rank; stages 1 to 3
         * the ranks' shares tile it in rank order; a range's model elements come first */
        int64_t *state_at = (int64_t *)malloc_check(sizeof(int64_t) * plan.n_buckets, "state offsets");
        for (int stage = 0; stage <= 3; stage++) {
            int ranges_ok = 1, state_ok = 1;
            for (int r = 0; r < world; r++) {
                int64_t state_total = zero_state_offsets(&plan, stage, r, state_at), expect_state = 0;
                for (int b = 0; b < plan.n_buckets; b++) {
                    const ZeroBucket *z = &plan.buckets[b];
                    int64_t at, begin, end, count = zero_update_range(&plan, stage, r, b, &at);
                    zero_update_model_range(&plan, stage, r, b, &begin, &end);
                    int64_t want_at = z->padded_offset + (stage == 0 ? 0 : r * z->shard);
                    ranges_ok &= at == want_at && count == (stage == 0 ? z->padded : z->shard);
                    ranges_ok &= end >= begin && end - begin <= count && at % ZERO_ALIGN == 0;
                    if (end > begin) /* model element i sits at padded element i - offset + padded_offset */
                        ranges_ok &= begin - z->offset == at - z->padded_offset;
                    state_ok &= state_at[b] == expect_state && state_at[b] % ZERO_ALIGN == 0;
                    expect_state += count;
                }
                state_ok &= state_total == (stage == 0 ? plan.padded_total : plan.padded_total / world);
            }
            char what[96];
            snprintf(what, sizeof(what), "stage %d: update ranges and their model elements", stage);
            check_plan(ranges_ok, what, name, world);
            snprintf(what, sizeof(what), "stage %d: state offsets back to back, sized padded / world", stage);
            check_plan(state_ok, what, name, world);
        }
        free(state_at);
        zero_plan_free(&plan);
        test_over_hosts(name, &layout, world);
    }
    llama_param_layout_free(&layout);
}

/* A layout whose tensors skip a bucket (0, then 2): zero_plan refuses it, naming the tensor. */
static void plan_skipping_a_bucket(void *arg)
{
    (void)arg;
    ParamTensor tensors[2] = {{.name = "a", .rows = 8, .cols = 1, .numel = 8, .offset = 0, .bucket = 0},
                              {.name = "b", .rows = 8, .cols = 1, .numel = 8, .offset = 8, .bucket = 2}};
    ParamLayout layout = {.n_tensors = 2, .tensors = tensors, .total = 16, .n_buckets = 3};
    zero_plan(&layout, 2);
}

static void test_bucket_order(void)
{
    char msg[512];
    int status = run_child(plan_skipping_a_bucket, NULL, msg, sizeof(msg));
    check(status != 0 && strstr(msg, "tensor 1 (b) is in bucket 2 after bucket 0") != NULL,
          "a layout that skips a bucket is refused, naming the tensor: %s", msg);
}

int main(void)
{
    const char *dumps[] = {"testdata/tiny_gqa_tied.weights.llmt", "testdata/small_mha_untied_rope31.weights.llmt"};
    for (int i = 0; i < 2; i++) {
        TensorFile tf;
        tensorfile_open(&tf, dumps[i]);
        LlamaConfig c = llama_config_from_tensorfile(&tf);
        tensorfile_close(&tf);
        test_model(dumps[i], &c);
    }
    for (int i = 0; i < LLAMA_N_PRESETS; i++)
        test_model(LLAMA_PRESETS[i].name, &LLAMA_PRESETS[i].config);
    test_bucket_order();
    return check_summary();
}
