/*
 * test_llama.cu: checks train_llama.cu on the GPU against the PyTorch (HF
 * transformers) reference dumps in testdata/: logits, loss, every block
 * output, the final norm output, every gradient and the losses and gradient
 * norms of N AdamW steps. Also checks that two identical runs give bit-identical
 * gradients (a moving result is a race), that every recompute level gives
 * the same gradients, and that ZeRO stages 0 to 3 (their staging buffers,
 * events and second stream run on one GPU too) train alike.
 *
 *   ./test_llama [DUMP.dump.llmt ...]     (default: both committed dumps)
 *
 * Error metric, per tensor: max|gpu - ref| / max|ref|, the largest error seen
 * relative to the tensor's scale (a per-element relative error is meaningless
 * for entries near zero). The normwise ||gpu - ref|| / ||ref|| is printed too.
 */
#define TESTING
#include "train_llama.cu"

/* Tolerances. The reference is fp32; the GPU stores weights and activations
 * in bf16 (8 significant bits, relative rounding 2^-9 = 0.2%) and accumulates
 * in fp32. Errors of a few roundings compound through the layers: */
#define TOL_FORWARD 2.5e-2f /* logits, block outputs: a few bf16 roundings per layer */
#define TOL_LOSS 5e-3f      /* the loss averages many rows, so their errors mostly cancel */
#define TOL_GRAD 6e-2f      /* gradients pass through every layer twice (forward and backward) */
#define TOL_STEPS 2e-2f     /* N-step losses and grad norms: bf16 forward, fp32 AdamW */

static int n_pass = 0, n_fail = 0;
static Dist single_process; /* test_llama runs on one GPU */
static float worst_forward = 0, worst_grad = 0, worst_steps = 0;

static float compare(const char *what, const float *gpu, const float *ref, int64_t n, float tol, float *worst)
{
    double max_diff = 0, max_ref = 0, diff_sq = 0, ref_sq = 0;
    int bad_value = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(gpu[i]))
            bad_value = 1;
        double d = fabs((double)gpu[i] - ref[i]);
        max_diff = fmax(max_diff, d);
        max_ref = fmax(max_ref, fabs((double)ref[i]));
        diff_sq += d * d;
        ref_sq += (double)ref[i] * ref[i];
    }
    float rel = max_ref > 0 ? (float)(max_diff / max_ref) : (float)max_diff;
    float normwise = ref_sq > 0 ? (float)sqrt(diff_sq / ref_sq) : (float)sqrt(diff_sq);
    int ok = !bad_value && rel <= tol;
    printf("%s %-56s max rel %.3e (tol %.0e), normwise %.3e\n", ok ? "ok  " : "FAIL", what, rel, tol, normwise);
    if (ok)
        n_pass++;
    else
        n_fail++;
    if (worst && rel > *worst)
        *worst = rel;
    return rel;
}

static void check(const char *what, int ok)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

static float *download_bf16(const bf16 *d, int64_t n)
{
    uint16_t *bits = (uint16_t *)malloc_check((size_t)n * 2, "download");
    float *out = (float *)malloc_check((size_t)n * 4, "download");
    CUDA_CHECK(cudaMemcpy(bits, d, (size_t)n * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)bits[i] << 16;
        memcpy(&out[i], &u, 4);
    }
    free(bits);
    return out;
}

/* The full gradient (ZeRO stage 0 or 1) in the unpadded layout's order. */
static float *download_grads(const Llama *m)
{
    float *out = (float *)malloc_check((size_t)m->layout.total * 4, "download");
    for (int b = 0; b < m->zero.plan.n_buckets; b++) {
        const ZeroBucket *bk = &m->zero.plan.buckets[b];
        float *part = download_bf16(zero_bucket_grads(&m->zero, b), bk->numel);
        memcpy(out + bk->offset, part, (size_t)bk->numel * 4);
        free(part);
    }
    return out;
}

static float *download_f32(const float *d, int64_t n)
{
    float *out = (float *)malloc_check((size_t)n * 4, "download");
    CUDA_CHECK(cudaMemcpy(out, d, (size_t)n * 4, cudaMemcpyDeviceToHost));
    return out;
}

static float meta_float(const TensorFile *tf, const char *key)
{
    const char *v = tensorfile_meta(tf, key);
    if (!v)
        FAIL("'%s' has no metadata key '%s'", tf->path, key);
    return (float)atof(v);
}

/* One forward/backward of the dump's batch at a recompute level; returns the loss. */
static float run_micro_step(Llama *m, const int *tokens, const int *targets, cudaStream_t s)
{
    int64_t N = llama_tokens(m);
    int count = count_targets(targets, N);
    /* no memset: micro-step 0 must overwrite whatever gradients the last step left */
    llama_set_batch(m, tokens, targets, 0, s);
    llama_micro_step(m, 1.0f / (float)count, 0, s);
    float loss_sum_host;
    CUDA_CHECK(cudaMemcpyAsync(&loss_sum_host, m->loss_parts, sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return loss_sum_host / (float)count;
}

/* Losses and final master weights of n AdamW steps on the batch, taken as
 * `micro_steps` micro-steps, with ZeRO `stage` on this one GPU. */
static float *zero_stage_run(const LlamaConfig *c, const char *weights_path, const int *tokens, const int *targets,
                             int B, int T, int micro_steps, int stage, int n, const AdamWConfig *opt, float **master,
                             cudaStream_t s)
{
    Llama m;
    int rows = B / micro_steps;
    llama_build(&m, c, rows, T, 1, micro_steps, (size_t)64 << 20, &single_process, stage);
    llama_load_weights(&m, weights_path);
    int count = count_targets(targets, (int64_t)B * T);
    float *losses = (float *)malloc_check(sizeof(float) * n, "losses");
    for (int k = 0; k < n; k++) {
        for (int micro = 0; micro < micro_steps; micro++) {
            int64_t at = (int64_t)micro * rows * T;
            llama_set_batch(&m, tokens + at, targets + at, micro, s);
            llama_micro_step(&m, 1.0f / (float)count, micro, s);
        }
        llama_update(&m, opt, opt->lr, s);
        float *parts = download_f32(m.loss_parts, micro_steps);
        losses[k] = 0.0f;
        for (int micro = 0; micro < micro_steps; micro++)
            losses[k] += parts[micro];
        losses[k] /= (float)count;
        free(parts);
    }
    *master = llama_download_master(&m, s);
    return losses;
}

/* ZeRO stages 2 and 3 move gradients and weights through staging buffers, events
 * and a second stream even on one GPU: with the whole batch in one micro-step
 * every stage must give the same bits as stage 1 (losses and the final fp32
 * master weights). With several micro-steps, stages 2 and 3 sum them after the
 * bf16 rounding of each (one more rounding per micro-step than stage 1's
 * accumulating GEMMs), so they match each other bit for bit and stage 1 within
 * the N-step tolerance. */
static void test_zero_stages(const LlamaConfig *c, const char *weights_path, const int *tokens, const int *targets,
                             int B, int T, int n, const AdamWConfig *opt, const float *stage0_losses, cudaStream_t s)
{
    ParamLayout layout = llama_param_layout(c);
    int64_t P = layout.total;
    llama_param_layout_free(&layout);
    char what[160];
    int splits[2] = {1, B}; /* the whole batch at once, then one row per micro-step */
    for (int split = 0; split < (B > 1 ? 2 : 1); split++) {
        int micro_steps = splits[split];
        float *ref_master,
            *ref = zero_stage_run(c, weights_path, tokens, targets, B, T, micro_steps, 1, n, opt, &ref_master, s);
        if (micro_steps == 1)
            check("ZeRO 1 on one GPU: the same losses as the N-step run",
                  memcmp(ref, stage0_losses, sizeof(float) * n) == 0);
        float *stage2_master = NULL, *stage2 = NULL;
        for (int stage = 0; stage <= 3; stage++) {
            if (stage == 1)
                continue;
            float *master, *losses = zero_stage_run(c, weights_path, tokens, targets, B, T, micro_steps, stage, n, opt,
                                                    &master, s);
            int same = memcmp(losses, ref, sizeof(float) * n) == 0 && memcmp(master, ref_master, P * 4) == 0;
            if (micro_steps == 1 || stage == 0) {
                snprintf(what, sizeof(what),
                         "ZeRO %d, %d micro-step(s): losses and master weights bit-identical to ZeRO 1", stage,
                         micro_steps);
                check(what, same);
            } else {
                snprintf(what, sizeof(what), "ZeRO %d, %d micro-steps: losses vs ZeRO 1", stage, micro_steps);
                compare(what, losses, ref, n, TOL_STEPS, NULL);
            }
            if (stage == 2) {
                stage2 = losses;
                stage2_master = master;
                continue;
            }
            if (stage == 3) {
                snprintf(what, sizeof(what),
                         "ZeRO 3, %d micro-step(s): losses and master weights bit-identical to ZeRO 2", micro_steps);
                check(what,
                      memcmp(losses, stage2, sizeof(float) * n) == 0 && memcmp(master, stage2_master, P * 4) == 0);
            }
            free(losses);
            free(master);
        }
        free(stage2);
        free(stage2_master);
        free(ref);
        free(ref_master);
    }
}

static void test_dump(const char *dump_path)
{
    char weights_path[1024];
    snprintf(weights_path, sizeof(weights_path), "%s", dump_path);
    char *suffix = strstr(weights_path, ".dump.llmt");
    if (!suffix)
        FAIL("'%s' is not named *.dump.llmt", dump_path);
    strcpy(suffix, ".weights.llmt");
    printf("== %s\n", dump_path);

    TensorFile dump;
    tensorfile_open(&dump, dump_path);
    LlamaConfig c = llama_config_from_tensorfile(&dump);
    int B = atoi(tensorfile_meta(&dump, "dump.B")), T = atoi(tensorfile_meta(&dump, "dump.T"));
    int n_steps = atoi(tensorfile_meta(&dump, "dump.n_steps"));
    int64_t N = (int64_t)B * T, C = c.d_model, V = c.vocab_size;
    int *tokens = (int *)malloc_check((size_t)N * sizeof(int), "tokens");
    int *targets = (int *)malloc_check((size_t)N * sizeof(int), "targets");
    tensorfile_read(&dump, "input_tokens", TF_INT32, N, tokens);
    tensorfile_read(&dump, "targets", TF_INT32, N, targets);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));

    /* recompute level 0 keeps every activation, so all can be compared */
    Llama m;
    llama_build(&m, &c, B, T, 0, 1, (size_t)64 << 20, &single_process, 0);
    llama_load_weights(&m, weights_path);
    {
        /* the fp32 master, split into bf16 + residual on upload, must join back bit for bit */
        float *file_weights = (float *)malloc_check((size_t)m.layout.total * sizeof(float), "weights");
        TensorFile wf;
        tensorfile_open(&wf, weights_path);
        for (int i = 0; i < m.layout.n_tensors; i++) {
            const ParamTensor *t = &m.layout.tensors[i];
            tensorfile_read(&wf, t->name, TF_FLOAT32, t->numel, file_weights + t->offset);
        }
        tensorfile_close(&wf);
        float *master = llama_download_master(&m, s);
        check("fp32 master weights on the device equal the weights file bit for bit",
              memcmp(master, file_weights, (size_t)m.layout.total * sizeof(float)) == 0);
        free(master);
        free(file_weights);
    }
    float loss = run_micro_step(&m, tokens, targets, s);

    float ref_loss;
    tensorfile_read(&dump, "loss", TF_FLOAT32, 1, &ref_loss);
    compare("loss", &loss, &ref_loss, 1, TOL_LOSS, &worst_forward);

    /* logits in full: the trainer never forms them, so multiply here */
    bf16 *logits_d = alloc_bf16(N * V, "test logits");
    matmul_forward(logits_d, m.ln_final, pweight(&m, param_index_lm_head(&c)), (int)N, (int)C, (int)V, s);
    float *logits = download_bf16(logits_d, N * V);
    float *ref = tensorfile_load_f32(&dump, "logits", N * V);
    compare("logits", logits, ref, N * V, TOL_FORWARD, &worst_forward);
    free(logits);
    free(ref);
    char name[160];
    for (int l = 0; l < c.n_layer; l++) {
        snprintf(name, sizeof(name), "block_out.%d", l);
        float *got = download_bf16(l == c.n_layer - 1 ? m.res_final : m.res_attn_in[l + 1], N * C);
        ref = tensorfile_load_f32(&dump, name, N * C);
        compare(name, got, ref, N * C, TOL_FORWARD, &worst_forward);
        free(got);
        free(ref);
    }
    float *got = download_bf16(m.ln_final, N * C);
    ref = tensorfile_load_f32(&dump, "final_norm_out", N * C);
    compare("final_norm_out", got, ref, N * C, TOL_FORWARD, &worst_forward);
    free(got);
    free(ref);

    float *grads = download_grads(&m);
    for (int i = 0; i < m.layout.n_tensors; i++) {
        const ParamTensor *t = &m.layout.tensors[i];
        snprintf(name, sizeof(name), "grad.%s", t->name);
        ref = tensorfile_load_f32(&dump, name, t->numel);
        compare(name, grads + t->offset, ref, t->numel, TOL_GRAD, &worst_grad);
        free(ref);
    }

    /* the same step again must give bit-identical gradients: a difference is a race */
    run_micro_step(&m, tokens, targets, s);
    float *again = download_grads(&m);
    check("gradients bit-identical between two identical runs",
          memcmp(grads, again, (size_t)m.layout.total * sizeof(float)) == 0);
    free(again);

    /* recomputing activations must not change anything */
    for (int level = 1; level <= 2; level++) {
        Llama r;
        llama_build(&r, &c, B, T, level, 1, (size_t)64 << 20, &single_process, 0);
        llama_load_weights(&r, weights_path);
        run_micro_step(&r, tokens, targets, s);
        float *g = download_grads(&r);
        snprintf(name, sizeof(name), "recompute level %d gives bit-identical gradients", level);
        check(name, memcmp(grads, g, (size_t)m.layout.total * sizeof(float)) == 0);
        free(g);
    }

    /* gradient accumulation: the batch as B micro-steps of one row each must give
     * the full batch's loss (up to fp32 summation order) and gradients up to bf16
     * accumulation: each micro-step's gradient and each running sum is rounded to
     * bf16 (at most 2^-9 relative each, 2B roundings) against the full batch's one
     * rounding; the tolerance allows 4B such roundings, for partial gradients up to
     * twice the size of the total */
    {
        Llama acc;
        llama_build(&acc, &c, 1, T, 1, B, (size_t)64 << 20, &single_process, 0);
        llama_load_weights(&acc, weights_path);
        int count = count_targets(targets, N);
        for (int k = 0; k < B; k++) {
            llama_set_batch(&acc, tokens + (int64_t)k * T, targets + (int64_t)k * T, k, s);
            llama_micro_step(&acc, 1.0f / (float)count, k, s);
        }
        float *parts = download_f32(acc.loss_parts, B);
        float acc_loss = 0.0f;
        for (int k = 0; k < B; k++)
            acc_loss += parts[k];
        acc_loss /= (float)count;
        compare("grad accumulation: loss of B micro-steps vs one batch", &acc_loss, &loss, 1, 1e-5f, NULL);
        float *g = download_grads(&acc);
        compare("grad accumulation: gradients of B micro-steps vs one batch", g, grads, acc.layout.total,
                4.0f * B / 512.0f, NULL);
        free(g);
        free(parts);
    }
    free(grads);

    /* N AdamW steps on the same batch, as the reference did */
    AdamWConfig opt = {meta_float(&dump, "optim.lr"),           meta_float(&dump, "optim.beta1"),
                       meta_float(&dump, "optim.beta2"),        meta_float(&dump, "optim.eps"),
                       meta_float(&dump, "optim.weight_decay"), meta_float(&dump, "optim.grad_clip")};
    float *losses = (float *)malloc_check(sizeof(float) * n_steps, "losses");
    float *norms = (float *)malloc_check(sizeof(float) * n_steps, "norms");
    for (int k = 0; k < n_steps; k++) {
        losses[k] = run_micro_step(&m, tokens, targets, s);
        llama_update(&m, &opt, opt.lr, s);
        float norm_sq;
        CUDA_CHECK(cudaMemcpy(&norm_sq, m.grad_norm_sq, sizeof(float), cudaMemcpyDeviceToHost));
        norms[k] = sqrtf(norm_sq);
    }
    float *ref_losses = tensorfile_load_f32(&dump, "train.losses", n_steps);
    float *ref_norms = tensorfile_load_f32(&dump, "train.grad_norms", n_steps);
    for (int k = 0; k < n_steps; k++) {
        printf("     step %d: loss %.5f (ref %.5f), grad norm %.4f (ref %.4f)\n", k, losses[k], ref_losses[k], norms[k],
               ref_norms[k]);
    }
    compare("train.losses", losses, ref_losses, n_steps, TOL_STEPS, &worst_steps);
    test_zero_stages(&c, weights_path, tokens, targets, B, T, n_steps, &opt, losses, s);
    compare("train.grad_norms", norms, ref_norms, n_steps, TOL_STEPS, &worst_steps);
    check("loss falls over the AdamW steps", losses[n_steps - 1] < losses[0]);
    free(losses);
    free(norms);
    free(ref_losses);
    free(ref_norms);
    free(tokens);
    free(targets);
    tensorfile_close(&dump);
}

int main(int argc, char **argv)
{
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
        fprintf(stderr, "error: test_llama needs a CUDA GPU; the CPU checks are `make test`\n");
        return 1;
    }
    matmul_setup();
    attention_setup();
    dist_init_single(&single_process);
    const char *defaults[] = {"testdata/tiny_gqa_tied.dump.llmt", "testdata/small_mha_untied_rope31.dump.llmt"};
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            test_dump(argv[i]);
    } else {
        for (int i = 0; i < 2; i++)
            test_dump(defaults[i]);
    }
    printf("max relative error: forward %.3e, gradients %.3e, N-step %.3e\n", worst_forward, worst_grad, worst_steps);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    attention_teardown();
    matmul_teardown();
    return n_fail ? 1 : 0;
}
