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
