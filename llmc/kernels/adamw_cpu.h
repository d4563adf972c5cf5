/*
 * adamw_cpu.h: AdamW on the CPU over a range of fp32 master weights and
 * moments, on every core (OpenMP) and vectorised by the compiler, with
 * adamw_step.h's arithmetic: on the same inputs, the same bits as the GPU
 * kernel (adamw.h). The CPU reference (train_llama_ref.c) steps with it, and
 * so can anything that keeps the master weights and moments in host memory.
 *
 *   for i in [0, n): w[i] = adamw_element(w[i], &m[i], &v[i], grad[i], scale, decay, s)
 *   and, where hi is given, hi[i] = master_hi(w[i]): the new bf16 weight the
 *   GEMMs read, the bits the GPU's split master (master_weights.h) holds
 *
 * grad is fp32 (grad32) or bf16 bits (grad16): exactly one of them. decay is
 * s.decay for a range that decays, else 1. A scale that is not finite (the
 * clip coefficient of a non-finite gradient norm) skips the update: nothing is
 * written, as on the GPU.
 *
 * Memory: reads w, m, v (4 bytes each) and grad (4 or 2), writes w, m, v and
 * hi (2): 24 to 30 bytes per parameter, one pass.
 */
#ifndef LLMC_ADAMW_CPU_H
#define LLMC_ADAMW_CPU_H

#include <stdint.h>
#include <string.h>

#include "llmc/kernels/adamw_step.h"
#include "llmc/kernels/master_weights.h"

/* Elements per OpenMP chunk: long enough to vectorise and stream, short enough to spread a bucket over the cores. */
#define ADAMW_CPU_CHUNK 16384

ADAMW_HOST_BEGIN
static inline float adamw_cpu_bf16_float(uint16_t bits)
{
    return master_bits_float((uint32_t)bits << 16);
}

static inline void adamw_cpu_update(float *w, float *m, float *v, const float *grad32, const uint16_t *grad16,
                                    uint16_t *hi, int64_t n, float scale, float decay, AdamWScalars s)
{
    if (!isfinite(scale))
        return;
    int64_t chunks = (n + ADAMW_CPU_CHUNK - 1) / ADAMW_CPU_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t lo = c * ADAMW_CPU_CHUNK, end = lo + ADAMW_CPU_CHUNK < n ? lo + ADAMW_CPU_CHUNK : n;
        if (grad32 != NULL) {
#pragma omp simd
            for (int64_t i = lo; i < end; i++)
                w[i] = adamw_element(w[i], &m[i], &v[i], grad32[i], scale, decay, s);
        } else {
#pragma omp simd
            for (int64_t i = lo; i < end; i++)
                w[i] = adamw_element(w[i], &m[i], &v[i], adamw_cpu_bf16_float(grad16[i]), scale, decay, s);
        }
        if (hi != NULL) {
#pragma omp simd
            for (int64_t i = lo; i < end; i++)
                hi[i] = master_hi(w[i]);
        }
    }
}
ADAMW_HOST_END

#endif /* LLMC_ADAMW_CPU_H */
