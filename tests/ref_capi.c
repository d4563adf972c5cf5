/* ref_capi.c: see ref_capi.h. */
/* the trainer's own functions (train_step, sampling) are not called from here */
#pragma GCC diagnostic ignored "-Wunused-function"
#define TESTING
#include "train_llama_ref.c"
#include "tests/ref_capi.h"

float ref_loss_and_grads(const char *weights_path, const int *tokens, const int *targets, int B, int T, int fp8,
                         float *grads, long long n_params)
{
    Llama m;
    llama_load(&m, weights_path);
    if (m.layout.total != n_params)
        FAIL("ref_loss_and_grads: '%s' has %lld parameters, the caller expects %lld", weights_path,
             (long long)m.layout.total, n_params);
    m.fp8 = fp8;
    llama_forward(&m, tokens, targets, B, T);
    if (m.n_counted == 0)
        FAIL("ref_loss_and_grads: no target is counted");
    llama_zero_grad(&m);
    llama_backward(&m, 1.0f / (float)m.n_counted);
    memcpy(grads, m.grads, (size_t)n_params * sizeof(float));
    float loss = m.mean_loss;
    llama_free(&m);
    return loss;
}

void ref_fp8_linear(float *out, float *dinp, float *dweight, const float *x, const float *w, const float *dout, int N,
                    int IC, int OC, int recipe)
{
    Llama m; /* only its FP8 recipe and scratch are read */
    memset(&m, 0, sizeof(m));
    m.fp8 = recipe;
    m.fp8_in = (float *)malloc_check((size_t)N * IC * sizeof(float), "FP8 emulation: inputs");
    m.fp8_out = (float *)malloc_check((size_t)N * OC * sizeof(float), "FP8 emulation: gradients");
    m.fp8_w = (float *)malloc_check((size_t)OC * IC * sizeof(float), "FP8 emulation: weights");
    linear_forward(&m, out, x, w, N, IC, OC);
    memset(dinp, 0, (size_t)N * IC * sizeof(float)); /* matmul_backward accumulates */
    memset(dweight, 0, (size_t)OC * IC * sizeof(float));
    linear_backward(&m, dinp, dweight, dout, x, w, N, IC, OC);
    free(m.fp8_in), free(m.fp8_out), free(m.fp8_w);
}
