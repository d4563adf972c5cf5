/*
 * schedule.h: the optimizer's settings, shared by both trainers: AdamW's
 * hyper-parameters, and the learning rate at each optimizer step.
 *
 * AdamWConfig holds doubles, as torch's Python floats are; the GPU kernels
 * take them as floats (the CPU reference derives its scalars in double first,
 * as torch does).
 *
 * Linear warmup from lr/warmup to lr over the first `warmup` steps, then one of
 *   cosine:   lr_min + (lr - lr_min) * (1 + cos(pi * p)) / 2
 *   linear:   lr - (lr - lr_min) * p
 *   constant: lr
 *   wsd:      lr until the last `decay_frac` of the steps, then linear to lr_min
 * where p in [0, 1] is the progress through the steps after warmup and
 * lr_min = lr * min_lr_frac. Pure arithmetic; reads and writes no memory.
 */
#ifndef LLMC_SCHEDULE_H
#define LLMC_SCHEDULE_H

#include <math.h>
#include <string.h>

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip; /* max global gradient L2 norm; 0: no clipping */
} AdamWConfig;

typedef enum { SCHEDULE_COSINE, SCHEDULE_LINEAR, SCHEDULE_CONSTANT, SCHEDULE_WSD } ScheduleKind;

typedef struct {
    ScheduleKind kind;
    float lr;
    float min_lr_frac;
    int warmup;
    int total_steps;
    float decay_frac; /* wsd only */
} LrSchedule;

/* 0 and the kind, or -1 for an unknown name. */
static inline int schedule_kind_from_name(const char *name, ScheduleKind *kind)
{
    static const char *names[] = {"cosine", "linear", "constant", "wsd"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, names[i]) == 0) {
            *kind = (ScheduleKind)i;
            return 0;
        }
    }
    return -1;
}

/* Learning rate of step (0-based). */
static inline float schedule_lr(const LrSchedule *s, int step)
{
    if (step < s->warmup)
        return s->lr * (float)(step + 1) / (float)s->warmup;
    float lr_min = s->lr * s->min_lr_frac;
    int decay_steps = s->total_steps - s->warmup;
    float p = decay_steps > 1 ? (float)(step - s->warmup) / (float)(decay_steps - 1) : 1.0f;
    if (p > 1.0f)
        p = 1.0f;
    switch (s->kind) {
    case SCHEDULE_COSINE:
        return lr_min + (s->lr - lr_min) * 0.5f * (1.0f + cosf((float)M_PI * p));
    case SCHEDULE_LINEAR:
        return s->lr - (s->lr - lr_min) * p;
    case SCHEDULE_WSD: {
        float stable = 1.0f - s->decay_frac;
        if (p <= stable)
            return s->lr;
        return s->lr - (s->lr - lr_min) * (p - stable) / s->decay_frac;
    }
    case SCHEDULE_CONSTANT:
    default:
        return s->lr;
    }
}

#endif /* LLMC_SCHEDULE_H */
