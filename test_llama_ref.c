/*
 * test_llama_ref.c: checks the C reference trainer (train_llama_ref.c) against
 * the PyTorch dumps of reference/make_reference.py: logits, loss, every block
 * output, the final norm, every parameter gradient, and the losses and grad
 * norms of N AdamW steps on the same batch.
 *
 *   ./test_llama_ref                      # the three committed dumps and a greedy sample
 *   ./test_llama_ref testdata/X.dump.llmt # each dump with its X.weights.llmt
 *
 * Error metric of a tensor a against the reference b: the max relative error
 * max|a - b| / max|b| (checked against the tolerance), and the normwise
 * ||a - b|| / ||b|| (reported). Both sides are fp32; they differ only in
 * summation order (and FMA contraction), so errors sit a few orders of
 * magnitude above fp32's 6e-8 and grow with the length of the reductions.
 *
 * Build: gcc -O3 -march=native -fopenmp -std=gnu11 -Wall -Wextra -I. test_llama_ref.c -o test_llama_ref -lm
 */
#define TESTING
#include "train_llama_ref.c"
#include "tests/check.h"
#include "tests/dump_check.h"
#include "llmc/run/sampler.h"
#include "llmc/model/param_layout.h"

/* Tolerances on the max relative error, about 5x the largest error measured
 * on the committed dumps over -O0, -O3 -march=native (FMA contraction) and
 * OpenMP builds; "measured" below is that largest error. */
/* forward: a chain of fp32 matmuls, norms and softmaxes; measured 1.1e-6 */
#define TOL_FORWARD 5e-6
/* the loss: a mean of log-sum-exps, summed in double here; measured 1.4e-7 */
#define TOL_LOSS 1e-6
/* gradients: reductions over all B*T rows (the weight gradients) and back
 * through every layer and softmax, so they are longer; measured 2.2e-6 */
#define TOL_GRAD 1e-5
/* N AdamW steps: the rounding differences of the gradients pass through
 * Adam's m / sqrt(v), which is large where |g| is tiny, and compound over the
 * steps, but the loss averages them out; measured 5.6e-7 */
#define TOL_TRAIN_LOSS 3e-6
/* the grad norms of the later steps see weights that already differ; measured 6.4e-6 */
#define TOL_TRAIN_NORM 3e-5

enum { CAT_FORWARD, CAT_LOSS, CAT_GRAD, CAT_TRAIN_LOSS, CAT_TRAIN_NORM, N_CATS };
static const char *cat_names[N_CATS] = {"forward (logits, block_out, final_norm_out)", "loss", "gradients",
                                        "N-step losses", "N-step grad norms"};
static double cat_max[N_CATS];

/* The dump's model, computing as the dump did: packed documents (--doc-mask) where its metadata says so. */
static void load_for_dump(Llama *m, const char *weights_path, const TensorFile *dump)
{
    llama_load(m, weights_path);
    if (tensorfile_meta(dump, "dump.doc_bos")) { /* HF's position_ids and block-causal mask */
        m->doc_bos = (int)dump_meta_double(dump, "dump.doc_bos");
        m->doc_positions = (int)dump_meta_double(dump, "dump.doc_positions");
    }
}

static void test_dump(const char *dump_path)
{
    char weights_path[1100], err[4096];
    dump_weights_path(dump_path, weights_path, sizeof(weights_path));
    printf("%s (weights %s)\n", dump_path, weights_path);
    TensorFile dump, weights;
    tensorfile_open(&dump, dump_path);
    tensorfile_open(&weights, weights_path);
    if (config_meta_match_try(&weights, &dump, err, sizeof(err)) != 0)
        FAIL("%s", err);
    tensorfile_close(&weights);

    Llama model;
    load_for_dump(&model, weights_path, &dump);
    const LlamaConfig *c = &model.config;
    const TensorEntry *tokens_entry = tensorfile_find(&dump, "input_tokens");
    if (tokens_entry == NULL || tokens_entry->ndim != 2)
        FAIL("'%s' has no 2-D tensor 'input_tokens'", dump_path);
    int B = (int)tokens_entry->shape[0], T = (int)tokens_entry->shape[1];
    int64_t BT = (int64_t)B * T, C = c->d_model, V = c->vocab_size;
    int *inputs = (int *)malloc_check((size_t)BT * sizeof(int), "inputs");
    int *targets = (int *)malloc_check((size_t)BT * sizeof(int), "targets");
    tensorfile_read(&dump, "input_tokens", TF_INT32, BT, inputs);
    tensorfile_read(&dump, "targets", TF_INT32, BT, targets);

    /* forward */
    llama_forward(&model, inputs, targets, B, T);
    check_dump(&dump, "logits", model.acts.logits, BT * V, TOL_FORWARD, &cat_max[CAT_FORWARD]);
    check_dump(&dump, "loss", &model.mean_loss, 1, TOL_LOSS, &cat_max[CAT_LOSS]);
    for (int l = 0; l < c->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof(name), "block_out.%d", l);
        check_dump(&dump, name, model.acts.resid + (int64_t)(l + 1) * BT * C, BT * C, TOL_FORWARD,
                   &cat_max[CAT_FORWARD]);
    }
    check_dump(&dump, "final_norm_out", model.acts.lnf, BT * C, TOL_FORWARD, &cat_max[CAT_FORWARD]);

    /* backward */
    llama_zero_grad(&model);
    llama_backward(&model, 1.0f / (float)model.n_counted);
    for (int i = 0; i < model.layout.n_tensors; i++) {
        const ParamTensor *t = &model.layout.tensors[i];
        char name[128];
        snprintf(name, sizeof(name), "grad.%s", t->name);
        check_dump(&dump, name, model.grads + t->offset, t->numel, TOL_GRAD, &cat_max[CAT_GRAD]);
    }

    /* N AdamW steps on the same batch, from the same initial weights */
    int n_steps = (int)dump_meta_double(&dump, "dump.n_steps");
    AdamWConfig opt = dump_adamw_config(&dump);
    float grad_clip = (float)opt.grad_clip;
    float *losses = (float *)malloc_check((size_t)n_steps * sizeof(float), "losses");
    float *norms = (float *)malloc_check((size_t)n_steps * sizeof(float), "grad norms");
    for (int step = 0; step < n_steps; step++) {
        llama_zero_grad(&model);
        llama_forward(&model, inputs, targets, B, T);
        llama_backward(&model, 1.0f / (float)model.n_counted);
        norms[step] = clip_grad_norm(model.grads, model.layout.total, grad_clip);
        llama_adamw_step(&model, &opt);
        losses[step] = model.mean_loss;
    }
    check_dump(&dump, "train.losses", losses, n_steps, TOL_TRAIN_LOSS, &cat_max[CAT_TRAIN_LOSS]);
    check_dump(&dump, "train.grad_norms", norms, n_steps, TOL_TRAIN_NORM, &cat_max[CAT_TRAIN_NORM]);
    llama_free(&model);

    /* Gradient accumulation: one micro-batch per row, each scaled by 1 / (the
     * targets counted in the whole batch), must give the whole batch's gradients. */
    load_for_dump(&model, weights_path, &dump);
    llama_zero_grad(&model);
    int64_t counted = count_targets(targets, BT);
    for (int b = 0; b < B; b++) {
        llama_forward(&model, inputs + (int64_t)b * T, targets + (int64_t)b * T, 1, T);
        llama_backward(&model, 1.0f / (float)counted);
    }
    double worst = 0.0;
    for (int i = 0; i < model.layout.n_tensors; i++) {
        const ParamTensor *t = &model.layout.tensors[i];
        char name[128];
        snprintf(name, sizeof(name), "grad.%s", t->name);
        float *ref = tensorfile_load_f32(&dump, name, t->numel);
        worst = fmax(worst, max_rel_error(model.grads + t->offset, ref, t->numel, NULL));
        free(ref);
    }
    check(worst <= TOL_GRAD, "%-56s max rel %.3e (tol %.0e)", "grad accumulation over B micro-batches, worst grad",
          worst, TOL_GRAD);
    llama_free(&model);

    /* The test itself can fail: one embedding entry of the first input token
     * moved by 1e-3 (about 1% of its size) must break the logits check. */
    llama_load(&model, weights_path);
    param(&model, 0)[(int64_t)inputs[0] * C] += 1e-3f;
    llama_forward(&model, inputs, targets, B, T);
    float *ref = tensorfile_load_f32(&dump, "logits", BT * V);
    double perturbed = max_rel_error(model.acts.logits, ref, BT * V, NULL);
    free(ref);
    check(perturbed > TOL_FORWARD, "%-56s max rel %.3e (must exceed tol %.0e)",
          "sanity: a perturbed weight fails the logits check", perturbed, TOL_FORWARD);
    llama_free(&model);

    free(losses);
    free(norms);
    free(inputs);
    free(targets);
    tensorfile_close(&dump);
}

/* The parts of the trainer that the dumps do not cover: the learning-rate
 * schedule and the random init (HF's: normal(0, init_std) matrices, unit norms). */
static void test_schedule_and_init(void)
{
    printf("learning-rate schedule and init\n");
    struct {
        int step;
        ScheduleKind kind;
        double want;
    } cases[] = {
        {0, SCHEDULE_COSINE, 0.1},   /* warmup: linear from lr / warmup */
        {9, SCHEDULE_COSINE, 1.0},   /* end of warmup: the peak */
        {10, SCHEDULE_COSINE, 1.0},  /* cosine starts at the peak */
        {55, SCHEDULE_COSINE, 0.55}, /* halfway: between peak and min_lr_frac = 0.1 */
        {100, SCHEDULE_COSINE, 0.1}, /* the last step: min_lr_frac * lr */
        {55, SCHEDULE_LINEAR, 0.55}, /* linear: halfway too */
        {100, SCHEDULE_LINEAR, 0.1}, {60, SCHEDULE_CONSTANT, 1.0},
        {82, SCHEDULE_WSD, 1.0},  /* wsd: stable until the last 20% of the 91 decay steps */
        {100, SCHEDULE_WSD, 0.1}, /* then linear to the minimum */
    };
    double worst = 0.0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        LrSchedule schedule = {cases[i].kind, 1.0f, 0.1f, 10, 101, 0.2f};
        float lr = schedule_lr(&schedule, cases[i].step);
        worst = fmax(worst, fabs(lr - cases[i].want));
    }
    /* the schedule's arithmetic is in float: a few ulps */
    check(worst <= 1e-6, "schedule_lr: warmup, then cosine, linear, constant and wsd (max error %.1e, tol 1e-6)",
          worst);

    LlamaConfig config;
    llama_preset("tiny", &config);
    config.vocab_size = 1000;
    Llama a, b;
    llama_build(&a, &config);
    llama_build(&b, &config);
    llama_init_random(&a, 42);
    llama_init_random(&b, 42);
    int same = memcmp(a.params, b.params, (size_t)a.layout.total * sizeof(float)) == 0;
    llama_init_random(&b, 43);
    int differs = memcmp(a.params, b.params, (size_t)a.layout.total * sizeof(float)) != 0;
    double worst_std = 0.0, worst_mean = 0.0;
    int norms_one = 1;
    for (int i = 0; i < a.layout.n_tensors; i++) {
        const ParamTensor *t = &a.layout.tensors[i];
        const float *p = a.params + t->offset;
        double sum = 0.0, ss = 0.0;
        for (int64_t j = 0; j < t->numel; j++) {
            sum += p[j];
            ss += (double)p[j] * p[j];
            if (!t->is_matrix && p[j] != 1.0f)
                norms_one = 0;
        }
        if (!t->is_matrix)
            continue;
        double mean = sum / (double)t->numel, std = sqrt(ss / (double)t->numel - mean * mean);
        /* in units of the sampling error of the mean and of the std of n normals */
        worst_mean = fmax(worst_mean, fabs(mean) / (config.init_std / sqrt((double)t->numel)));
        worst_std = fmax(worst_std, fabs(std / config.init_std - 1.0) / sqrt(0.5 / (double)t->numel));
    }
    check(same && differs && norms_one && worst_mean < 5.0 && worst_std < 5.0,
          "init: seeded (same seed same %d, other seed differs %d), unit norms %d, mean and std of every matrix "
          "(worst %.1f, %.1f sigma, at most 5)",
          same, differs, norms_one, worst_mean, worst_std);
    llama_free(&a);
    llama_free(&b);
}

/* Greedy samples (sampler.h at temperature 0) from the committed weights: each
 * new token must be the argmax of the logits at the position before it in one
 * forward of the whole sequence, as the reference computes them. */
static void test_greedy_sample(const char *dump_path)
{
    char weights_path[1100];
    dump_weights_path(dump_path, weights_path, sizeof(weights_path));
    TensorFile dump;
    tensorfile_open(&dump, dump_path);
    int prompt[4], tokens[16];
    const TensorEntry *e = tensorfile_find(&dump, "input_tokens");
    if (!e)
        FAIL("'%s' has no input_tokens", dump_path);
    int *all = (int *)malloc_check(sizeof(int) * (size_t)e->numel, "tokens");
    tensorfile_read(&dump, "input_tokens", TF_INT32, e->numel, all);
    memcpy(prompt, all, sizeof(prompt)); /* the first 4 of row 0 */
    free(all);
    tensorfile_close(&dump);
    Llama m;
    llama_load(&m, weights_path);
    llama_alloc_activations(&m, 1, 16);
    memcpy(tokens, prompt, sizeof(prompt));
    Sampler greedy = {0.0f, 1.0f, 0};
    int n = sample_text(llama_last_logits, &m, m.config.vocab_size, &greedy, tokens, 4, 12, NULL, 0);
    llama_forward(&m, tokens, NULL, 1, n);
    int agree = n == 16;
    for (int k = 4; k < n; k++) {
        const float *z = m.acts.logits + (int64_t)(k - 1) * m.config.vocab_size;
        int best = 0;
        for (int v = 1; v < m.config.vocab_size; v++)
            best = z[v] > z[best] ? v : best;
        agree &= tokens[k] == best;
    }
    check(agree, "greedy sample of 12 tokens from %s: each the argmax of one forward of the whole sequence", dump_path);
    /* and a seeded draw gives the same tokens twice */
    int again[16], once[16];
    memcpy(once, prompt, sizeof(prompt));
    memcpy(again, prompt, sizeof(prompt));
    Sampler a = {1.0f, 0.9f, 7}, b = {1.0f, 0.9f, 7};
    sample_text(llama_last_logits, &m, m.config.vocab_size, &a, once, 4, 12, NULL, 0);
    sample_text(llama_last_logits, &m, m.config.vocab_size, &b, again, 4, 12, NULL, 0);
    check(memcmp(once, again, sizeof(once)) == 0, "a seeded sample (temperature 1, top-p 0.9) repeats itself");
    llama_free(&m);
}

/* A preset's model with vocab tokens, initialised at random from seed; returns its config. */
static LlamaConfig random_model(Llama *m, const char *preset, int vocab, uint64_t seed)
{
    LlamaConfig config;
    llama_preset(preset, &config);
    config.vocab_size = vocab;
    llama_build(m, &config);
    llama_init_random(m, seed);
    return config;
}

/* One optimizer step of train_llama_ref's on the next batch of src (at lr 1e-3). */
static void step_on(Llama *m, BatchSource *src, const TrainFlags *t, StepLog *r)
{
    const int *in, *tg;
    batch_source_next(src, &in, &tg);
    memset(r, 0, sizeof(*r));
    int64_t n = (int64_t)t->batch.B * t->batch.T;
    train_step(m, in, tg, 1, (double)count_targets(tg, n), t->batch.B, t->batch.T, &t->optim.adamw, 1e-3f, r);
}

/* --on-nan skip: a step whose gradient holds a NaN leaves the weights, the
 * moments and the step count untouched, and the next finite step trains. */
static void test_nan_step_skipped(void)
{
    Llama m;
    LlamaConfig config = random_model(&m, "tiny", 1000, 1);
    TrainFlags t = train_flags_defaults();
    t.batch.B = 2;
    t.batch.T = 16;
    t.run.steps = 10;
    llama_alloc_activations(&m, t.batch.B, t.batch.T);
    BatchSource src;
    batch_source_open(&src, NULL, 1, t.batch.B, t.batch.T, 0, 1, 7, config.vocab_size);
    StepLog r;
    step_on(&m, &src, &t, &r); /* a finite step first: moments not zero */
    size_t bytes = (size_t)m.layout.total * sizeof(float);
    float *params = (float *)malloc_check(bytes, "params"), *mom = (float *)malloc_check(bytes, "m"),
          *var = (float *)malloc_check(bytes, "v");
    int64_t at = m.layout.tensors[3].offset + 5; /* a weight of layer 0 */
    float saved = m.params[at];
    m.params[at] = NAN;
    memcpy(params, m.params, bytes);
    memcpy(mom, m.adam_m, bytes);
    memcpy(var, m.adam_v, bytes);
    int adam_step = m.adam_step;
    step_on(&m, &src, &t, &r);
    check(r.skipped && isnan(r.loss) && memcmp(params, m.params, bytes) == 0 && memcmp(mom, m.adam_m, bytes) == 0 &&
              memcmp(var, m.adam_v, bytes) == 0 && m.adam_step == adam_step,
          "a NaN weight: the step is skipped (loss %g), weights, moments and step count (%d) bit-identical", r.loss,
          m.adam_step);
    m.params[at] = saved;
    step_on(&m, &src, &t, &r);
    check(!r.skipped && isfinite(r.loss) && isfinite(r.grad_norm) && m.adam_step == adam_step + 1,
          "the next finite step trains (loss %.4f, norm %.4f, step count %d)", r.loss, r.grad_norm, m.adam_step);
    free(params);
    free(mom);
    free(var);
    batch_source_close(&src);
    llama_free(&m);
}

/* The logits (copied out) and, with targets, the gradients of the summed loss of one row. */
static float *row_logits_and_grads(Llama *m, const int *tokens, const int *targets, int T, float *grads)
{
    int64_t V = m->config.vocab_size;
    llama_forward(m, tokens, targets, 1, T);
    float *logits = (float *)malloc_check((size_t)(T * V) * sizeof(float), "logits");
    memcpy(logits, m->acts.logits, (size_t)(T * V) * sizeof(float));
    llama_zero_grad(m);
    llama_backward(m, 1.0f);
    for (int64_t i = 0; i < m->layout.total; i++)
        grads[i] += m->grads[i];
    return logits;
}

/* --doc-mask (issue 16): a row packing several documents, each attending only to itself with RoPE positions from 0,
 * must give what each document gives alone: the same logits at each token, and gradients of the summed loss that
 * add up to the documents' own. The row starts inside a document (7 tokens before the first BOS), holds one of 10
 * tokens, one of a single BOS, and one of 6. Tolerance 1e-5 relative: the same sums, grouped differently by the
 * matmul's row tiles. Without the mask they must differ. (Positions running on across the row would not change
 * them: under the mask each score depends on the distance between two tokens of one document only, RoPE's
 * relative form; restarting them follows HF's position_ids and keeps the angles, and their rounding, small.) */
static void test_packed_documents(void)
{
    Llama m;
    LlamaConfig config = random_model(&m, "nano", 300, 11);
    enum { T = 24, BOS = 1 };
    int starts[5] = {0, 7, 17, 18, T}, tokens[T], targets[T];
    uint64_t r = 12345;
    for (int t = 0; t < T; t++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        tokens[t] = 3 + (int)((r >> 33) % 297);
    }
    for (int d = 1; d < 4; d++)
        tokens[starts[d]] = BOS;
    for (int t = 0; t < T; t++)
        targets[t] = t + 1 < T ? tokens[t + 1] : 7;
    int64_t V = config.vocab_size, P = m.layout.total;
    float *g_packed = (float *)calloc_check((size_t)P, sizeof(float), "grads"),
          *g_docs = (float *)calloc_check((size_t)P, sizeof(float), "grads"),
          *scratch = (float *)calloc_check((size_t)P, sizeof(float), "grads");
    m.doc_bos = BOS;
    m.doc_positions = 1;
    float *packed = row_logits_and_grads(&m, tokens, targets, T, g_packed);
    double worst = 0.0;
    for (int d = 0; d < 4; d++) {
        int s = starts[d], n = starts[d + 1] - s;
        m.doc_bos = -1; /* the document alone, as its own row */
        float *alone = row_logits_and_grads(&m, tokens + s, targets + s, n, g_docs);
        double e = max_rel_error(packed + (int64_t)s * V, alone, (int64_t)n * V, NULL);
        worst = e > worst ? e : worst;
        free(alone);
    }
    check(worst <= 1e-5, "packed documents: every token's logits as its document alone (max rel %.2e)", worst);
    double normwise = 0.0;
    max_rel_error(g_packed, g_docs, P, &normwise);
    check(normwise <= 1e-5, "packed documents: gradients the sum of the documents' own (normwise %.2e)", normwise);
    m.doc_bos = -1;
    float *unmasked = row_logits_and_grads(&m, tokens, targets, T, scratch);
    double e_unmasked = max_rel_error(unmasked + 7 * V, packed + 7 * V, (T - 7) * V, NULL);
    check(e_unmasked > 1e-3, "packed documents: without the mask the later documents differ (%.2e)", e_unmasked);
    free(packed), free(unmasked), free(g_packed), free(g_docs), free(scratch);
    llama_free(&m);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < (argc > 1 ? argc : N_DEFAULT_DUMPS + 1); i++)
        test_dump(argc > 1 ? argv[i] : DEFAULT_DUMPS[i - 1]);
    if (argc == 1) { /* packed documents (--doc-mask), which test_llama checks on the GPU too, and the families */
        test_dump("testdata/packed_docs_gqa.dump.llmt");
        for (int i = 0; i < N_FAMILY_DUMPS; i++)
            test_dump(FAMILY_DUMPS[i]);
    }
    test_schedule_and_init();
    test_greedy_sample(DEFAULT_DUMPS[0]);
    test_nan_step_skipped();
    test_packed_documents();
    printf("max relative error per category:\n");
    for (int k = 0; k < N_CATS; k++)
        printf("  %-44s %.2e\n", cat_names[k], cat_max[k]);
    return check_summary();
}
