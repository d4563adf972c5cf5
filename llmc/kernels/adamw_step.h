/*
 * adamw_step.h: AdamW's arithmetic for one parameter, and the scalars it takes,
 * shared by the GPU kernel (adamw.h), the CPU AdamW (adamw_cpu.h) and the CPU
 * reference, so that all three compute the same float operations in the same
 * order and, given the same inputs, the same bits.
 *
 * torch.optim.AdamW (foreach=False, fused=False), with g = grad * scale (the
 * clip coefficient) and its operations in torch's order:
 *   w = w * decay                           decay = 1 - lr * wd (1 off the matrices)
 *   m = m + (1 - b1) * (g - m)              exp_avg.lerp_(g, 1 - b1)
 *   v = v * b2 + ((1 - b2) * g) * g         exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
 *   w = w - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
 *       step_size = lr / (1 - b1^step), bc2_sqrt = sqrt(1 - b2^step)
 * The scalars are worked out in double from AdamWConfig's doubles (torch's
 * Python floats) and rounded to float once, as torch does.
 *
 * Every operation is one IEEE-rounded float operation: no fused multiply-add
 * (the GPU code calls the __f*_rn intrinsics, which the compiler never fuses;
 * the host code is compiled with contraction off, see ADAMW_HOST_BEGIN), so
 * the result does not depend on the compiler, the CPU's FMA units or the
 * vector width. sqrt and division are correctly rounded on both sides (nvcc's
 * defaults -prec-sqrt=true -prec-div=true; the __f*_rn intrinsics make it so
 * whatever the flags).
 *
 * Host and device code; plain C without nvcc. Reads and writes only its
 * arguments.
 */
#ifndef LLMC_ADAMW_STEP_H
#define LLMC_ADAMW_STEP_H

#include <math.h>

#include "llmc/common/utils.h"
#include "llmc/run/schedule.h"

typedef struct {
    float decay; /* 1 - lr * wd, for the parameters that decay */
    float beta2;
    float one_minus_beta1, one_minus_beta2;
    float step_size; /* lr / (1 - b1^step) */
    float bc2_sqrt;  /* sqrt(1 - b2^step) */
    float eps;
} AdamWScalars;

/* The scalars of AdamW step `step` (from 1) at learning rate lr. */
static inline AdamWScalars adamw_scalars(const AdamWConfig *cfg, double lr, int step)
{
    if (step < 1) /* 1 - b1^0 = 0: an infinite step size */
        FAIL("adamw_scalars: step %d must count from 1", step);
    AdamWScalars s;
    s.decay = (float)(1.0 - lr * cfg->weight_decay);
    s.beta2 = (float)cfg->beta2;
    s.one_minus_beta1 = (float)(1.0 - cfg->beta1);
    s.one_minus_beta2 = (float)(1.0 - cfg->beta2);
    s.step_size = (float)(lr / (1.0 - pow(cfg->beta1, step)));
    s.bc2_sqrt = (float)sqrt(1.0 - pow(cfg->beta2, step));
    s.eps = (float)cfg->eps;
    return s;
}

#ifdef __CUDACC__
#define ADAMW_HD __host__ __device__ __forceinline__
#else
#define ADAMW_HD static inline
#endif
#ifdef __CUDA_ARCH__
#define ADAMW_MUL(a, b) __fmul_rn(a, b)
#define ADAMW_ADD(a, b) __fadd_rn(a, b)
#define ADAMW_SUB(a, b) __fsub_rn(a, b)
#define ADAMW_DIV(a, b) __fdiv_rn(a, b)
#define ADAMW_SQRT(a) __fsqrt_rn(a)
#else
#define ADAMW_MUL(a, b) ((a) * (b))
#define ADAMW_ADD(a, b) ((a) + (b))
#define ADAMW_SUB(a, b) ((a) - (b))
#define ADAMW_DIV(a, b) ((a) / (b))
#define ADAMW_SQRT(a) sqrtf(a)
#endif

/* Host functions that call adamw_element sit between these: GCC fuses a * b + c
 * across statements under its default -ffp-contract=fast, which would change
 * the bits. (Vectorising sqrtf needs -fno-math-errno, which the Makefile sets
 * for all host code: an optimize pragma's no-math-errno does not reach it.) */
#if defined(__CUDA_ARCH__)
#define ADAMW_HOST_BEGIN
#define ADAMW_HOST_END
#elif defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__)
/* nvcc hands the pragmas on to the host compiler, warning that it does not know them itself */
#define ADAMW_HOST_BEGIN                                                                                               \
    _Pragma("nv_diagnostic push") _Pragma("nv_diag_suppress 1675") _Pragma("GCC push_options")                         \
        _Pragma("GCC optimize(\"fp-contract=off\")") _Pragma("nv_diagnostic pop")
#define ADAMW_HOST_END                                                                                                 \
    _Pragma("nv_diagnostic push") _Pragma("nv_diag_suppress 1675") _Pragma("GCC pop_options")                          \
        _Pragma("nv_diagnostic pop")
#elif defined(__GNUC__) && !defined(__clang__)
#define ADAMW_HOST_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define ADAMW_HOST_END _Pragma("GCC pop_options")
#elif defined(__clang__)
#define ADAMW_HOST_BEGIN _Pragma("clang fp contract(off)")
#define ADAMW_HOST_END
#else
#define ADAMW_HOST_BEGIN
#define ADAMW_HOST_END
#endif

/* One parameter: returns the updated weight w; *m and *v are updated in place.
 * decay: s.decay for the parameters that decay, else 1. */
ADAMW_HOST_BEGIN
ADAMW_HD float adamw_element(float w, float *m, float *v, float grad, float scale, float decay, AdamWScalars s)
{
    float g = ADAMW_MUL(grad, scale);
    w = ADAMW_MUL(w, decay);
    float mm = ADAMW_ADD(*m, ADAMW_MUL(s.one_minus_beta1, ADAMW_SUB(g, *m)));
    float vv = ADAMW_ADD(ADAMW_MUL(*v, s.beta2), ADAMW_MUL(ADAMW_MUL(s.one_minus_beta2, g), g));
    *m = mm;
    *v = vv;
    float denom = ADAMW_ADD(ADAMW_DIV(ADAMW_SQRT(vv), s.bc2_sqrt), s.eps);
    return ADAMW_SUB(w, ADAMW_MUL(s.step_size, ADAMW_DIV(mm, denom)));
}
ADAMW_HOST_END

#endif /* LLMC_ADAMW_STEP_H */
