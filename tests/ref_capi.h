/*
 * ref_capi.h: the CPU reference (train_llama_ref.c) behind one plain C
 * function, so that test_llama can check the GPU against it where no HF dump
 * exists: FP8 training, which only the reference emulates (train_llama_ref
 * --fp8), whole or one Linear map at a time. Built from tests/ref_capi.c by the C compiler, linked into test_llama.
 */
#ifndef TESTS_REF_CAPI_H
#define TESTS_REF_CAPI_H

#ifdef __cplusplus
extern "C" {
#endif

/* The model of weights_path (an .llmt weights file), one forward and backward in
 * fp32 on tokens and targets [B * T], with the layers' GEMMs on FP8 values when
 * fp8 (an Fp8Recipe, llmc/kernels/fp8.h): returns the mean loss and writes every gradient of the mean loss into
 * grads, in llama_param_layout's order (n_params floats, checked). */
float ref_loss_and_grads(const char *weights_path, const int *tokens, const int *targets, int B, int T, int fp8,
                         float *grads, long long n_params);

/* One Linear map on FP8 values, as train_llama_ref --fp8-recipe runs it (recipe: an Fp8Recipe): out[N, OC] =
 * x[N, IC] @ w[OC, IC]^T, then, for the output gradient dout[N, OC], dinp[N, IC] and dweight[OC, IC] (both
 * overwritten). */
void ref_fp8_linear(float *out, float *dinp, float *dweight, const float *x, const float *w, const float *dout, int N,
                    int IC, int OC, int recipe);

#ifdef __cplusplus
}
#endif

#endif /* TESTS_REF_CAPI_H */
