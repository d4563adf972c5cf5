/*
 * profile.h: where one training step's GPU time goes, by kernel class.
 *
 * While a step is profiled, every region of work is bracketed by two CUDA
 * events on the step's stream; afterwards the elapsed times are summed per
 * class, and the step's wall time minus their sum is the time the GPU sat idle
 * (launch gaps, host work, synchronisation). The events cost a few
 * microseconds each, so only the profiled step pays for them. Reads and writes
 * only its own event pool.
 */
#ifndef LLMC_PROFILE_H
#define LLMC_PROFILE_H

#include <stdio.h>

#include "cuda_common.h"

typedef enum {
    PROF_GEMM,
    PROF_ATTENTION,
    PROF_NORM,
    PROF_ROPE,
    PROF_SWIGLU,
    PROF_EMBEDDING,
    PROF_LOSS,
    PROF_OPTIMIZER,
    PROF_COMM,
    PROF_OTHER,
    PROF_CLASSES
} ProfileClass;

static const char *PROFILE_CLASS_NAMES[PROF_CLASSES] = {"GEMMs",
                                                        "attention",
                                                        "norms",
                                                        "RoPE",
                                                        "SwiGLU",
                                                        "embedding",
                                                        "loss (lm_head GEMMs + CE)",
                                                        "optimizer",
                                                        "communication (NCCL)",
                                                        "other"};

#define PROFILE_MAX_REGIONS 4096

typedef struct {
    int enabled;
    int n;
    int open_class;
    cudaStream_t stream;
    cudaEvent_t start[PROFILE_MAX_REGIONS], stop[PROFILE_MAX_REGIONS];
    int region_class[PROFILE_MAX_REGIONS];
} Profiler;

static Profiler profiler;

static inline void profile_begin_step(cudaStream_t stream)
{
    if (profiler.start[0] == NULL) {
        for (int i = 0; i < PROFILE_MAX_REGIONS; i++) {
            CUDA_CHECK(cudaEventCreate(&profiler.start[i]));
            CUDA_CHECK(cudaEventCreate(&profiler.stop[i]));
        }
    }
    profiler.enabled = 1;
    profiler.n = 0;
    profiler.stream = stream;
}

/* Brackets one region; regions do not nest. */
static inline void profile_push(ProfileClass c)
{
    if (!profiler.enabled)
        return;
    if (profiler.n >= PROFILE_MAX_REGIONS)
        FAIL("profile: more than %d regions in one step", PROFILE_MAX_REGIONS);
    profiler.region_class[profiler.n] = c;
    CUDA_CHECK(cudaEventRecord(profiler.start[profiler.n], profiler.stream));
}

static inline void profile_pop(void)
{
    if (!profiler.enabled)
        return;
    CUDA_CHECK(cudaEventRecord(profiler.stop[profiler.n], profiler.stream));
    profiler.n++;
}

#define PROFILED(cls, ...)                                                                                             \
    do {                                                                                                               \
        profile_push(cls);                                                                                             \
        __VA_ARGS__;                                                                                                   \
        profile_pop();                                                                                                 \
    } while (0)

/* After the step's stream has been synchronised: per-class milliseconds into
 * ms[PROF_CLASSES]; returns their sum. */
static inline float profile_end_step(float *ms)
{
    float total = 0.0f;
    for (int c = 0; c < PROF_CLASSES; c++)
        ms[c] = 0.0f;
    for (int i = 0; i < profiler.n; i++) {
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, profiler.start[i], profiler.stop[i]));
        ms[profiler.region_class[i]] += t;
        total += t;
    }
    profiler.enabled = 0;
    return total;
}

#endif /* LLMC_PROFILE_H */
