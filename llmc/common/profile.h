/*
 * profile.h: where one training step's GPU time goes, by kernel class.
 *
 * While a step is profiled, every launcher of llmc/ brackets its work with
 * profile_push and profile_pop, which record two CUDA events on the step's
 * stream; afterwards the elapsed times are summed per class, and the step's
 * wall time minus their sum is the time the GPU sat idle (launch gaps, host
 * work, synchronisation), split into the time outside the first and last
 * region (the host before the first launch and after the last) and the gaps
 * between regions, summed per transition of classes so that a slow hand-over
 * (a library's host work before its kernel) shows by name. Because the
 * launchers mark themselves, no kernel of the step can be left out. A region
 * inside another (the lm_head GEMMs inside the classifier) counts as the outer
 * one's class; work on other streams (ZeRO's communication stream) overlaps
 * the step and is not counted, but the step's waits for it are: ZeRO marks each
 * wait of the step's stream for a reduction or a gather as a communication
 * region, which lasts as long as the stream was held. Where the communication
 * stream's own work lies, ZeRO marks too (profile_comm_begin and _end: each
 * bucket's sum, the update's gathers), and the report lists those marks and the
 * step's waits by their time from the step's first region, so that a wait can
 * be told apart as the link's time or a late start. The events cost a few
 * microseconds each, so only the profiled step pays for them.
 *
 * One profiler for the whole program (a C++17 inline variable: attention's
 * translation unit shares it). Reads and writes only its own event pool.
 */
#ifndef LLMC_PROFILE_H
#define LLMC_PROFILE_H

#include <stdio.h>
#include <string.h>

#include "llmc/common/cuda_common.h"

typedef enum {
    PROF_GEMM,
    PROF_ATTENTION,
    PROF_NORM,
    PROF_ROPE,
    PROF_SWIGLU,
    PROF_EMBEDDING,
    PROF_LOSS,
    PROF_OPTIMIZER,
    PROF_FP8,
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
                                                        "FP8 quantisation",
                                                        "communication (NCCL)",
                                                        "other"};

/* Regions the event pool holds at first; it doubles when a step needs more (a step of many micro-steps). */
#define PROFILE_FIRST_REGIONS 4096
/* Marks of another stream's work a profiled step keeps (the rest are counted, not timed). */
#define PROFILE_COMM_MARKS 256

typedef struct {
    int enabled;
    int n;        /* regions recorded */
    int depth;    /* regions open: only the outermost is recorded */
    int capacity; /* regions the pool holds */
    cudaStream_t stream;
    cudaEvent_t *start, *stop;
    int *region_class;
    /* after profile_end_step: the first region's start to the last one's stop, and the idle time between
     * regions summed per transition (the class that ended, the class that began) */
    float span_ms, gap_ms[PROF_CLASSES][PROF_CLASSES];
    int gap_count[PROF_CLASSES][PROF_CLASSES];
    /* the communication stream's marks: their events, labels and number (those past the pool only counted) */
    cudaEvent_t comm_start[PROFILE_COMM_MARKS], comm_stop[PROFILE_COMM_MARKS];
    char comm_label[PROFILE_COMM_MARKS][24];
    int comm_n, comm_made;
} Profiler;

inline Profiler profiler;

/* Room for capacity regions: the pool grows, keeping the events it has (some may be recorded already). */
static inline void profile_grow_(int capacity)
{
    profiler.start = (cudaEvent_t *)realloc_check(profiler.start, (size_t)capacity * sizeof(cudaEvent_t), "profile");
    profiler.stop = (cudaEvent_t *)realloc_check(profiler.stop, (size_t)capacity * sizeof(cudaEvent_t), "profile");
    profiler.region_class = (int *)realloc_check(profiler.region_class, (size_t)capacity * sizeof(int), "profile");
    for (int i = profiler.capacity; i < capacity; i++) {
        CUDA_CHECK(cudaEventCreate(&profiler.start[i]));
        CUDA_CHECK(cudaEventCreate(&profiler.stop[i]));
    }
    profiler.capacity = capacity;
}

/* The first event pool, made before the profiled step so that its thousands of cudaEventCreate calls do not
 * count as that step's idle time. */
static inline void profile_reserve(void)
{
    if (profiler.capacity == 0)
        profile_grow_(PROFILE_FIRST_REGIONS);
    for (; profiler.comm_made < PROFILE_COMM_MARKS; profiler.comm_made++) {
        CUDA_CHECK(cudaEventCreate(&profiler.comm_start[profiler.comm_made]));
        CUDA_CHECK(cudaEventCreate(&profiler.comm_stop[profiler.comm_made]));
    }
}

static inline void profile_begin_step(cudaStream_t stream)
{
    profile_reserve();
    profiler.enabled = 1;
    profiler.n = 0;
    profiler.depth = 0;
    profiler.comm_n = 0;
    profiler.stream = stream;
}

/* Opens a region of class c on stream s (ignored unless s is the profiled step's). */
static inline void profile_push(ProfileClass c, cudaStream_t s)
{
    if (!profiler.enabled || s != profiler.stream || profiler.depth++ > 0)
        return;
    if (profiler.n >= profiler.capacity)
        profile_grow_(2 * profiler.capacity);
    profiler.region_class[profiler.n] = c;
    CUDA_CHECK(cudaEventRecord(profiler.start[profiler.n], profiler.stream));
}

static inline void profile_pop(cudaStream_t s)
{
    if (!profiler.enabled || s != profiler.stream || --profiler.depth > 0)
        return;
    CUDA_CHECK(cudaEventRecord(profiler.stop[profiler.n], profiler.stream));
    profiler.n++;
}

/* Work on another stream than the step's (ZeRO's communication stream), labelled "what index": its start and
 * end for the report's timeline. Marks do not nest; ignored unless a step is profiled. */
static inline void profile_comm_begin(cudaStream_t s, const char *what, int index)
{
    if (!profiler.enabled)
        return;
    if (profiler.comm_n < PROFILE_COMM_MARKS) {
        snprintf(profiler.comm_label[profiler.comm_n], sizeof(profiler.comm_label[0]), "%s %d", what, index);
        CUDA_CHECK(cudaEventRecord(profiler.comm_start[profiler.comm_n], s));
    }
}

static inline void profile_comm_end(cudaStream_t s)
{
    if (!profiler.enabled)
        return;
    if (profiler.comm_n < PROFILE_COMM_MARKS)
        CUDA_CHECK(cudaEventRecord(profiler.comm_stop[profiler.comm_n], s));
    profiler.comm_n++;
}

/* Work that is no launcher of llmc/ (a memset, a wait for another stream) as one region. */
#define PROFILED(cls, stream, ...)                                                                                     \
    do {                                                                                                               \
        profile_push(cls, stream);                                                                                     \
        __VA_ARGS__;                                                                                                   \
        profile_pop(stream);                                                                                           \
    } while (0)

/* After the step's stream has been synchronised: per-class milliseconds into
 * ms[PROF_CLASSES]; returns their sum, and ends the profiling. */
static inline float profile_end_step(float *ms)
{
    float total = 0.0f;
    for (int c = 0; c < PROF_CLASSES; c++)
        ms[c] = 0.0f;
    memset(profiler.gap_ms, 0, sizeof(profiler.gap_ms));
    memset(profiler.gap_count, 0, sizeof(profiler.gap_count));
    profiler.span_ms = 0.0f;
    for (int i = 0; i < profiler.n; i++) {
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, profiler.start[i], profiler.stop[i]));
        ms[profiler.region_class[i]] += t;
        total += t;
        if (i > 0) {
            float gap;
            CUDA_CHECK(cudaEventElapsedTime(&gap, profiler.stop[i - 1], profiler.start[i]));
            profiler.gap_ms[profiler.region_class[i - 1]][profiler.region_class[i]] += gap;
            profiler.gap_count[profiler.region_class[i - 1]][profiler.region_class[i]]++;
        }
    }
    if (profiler.n > 0)
        CUDA_CHECK(cudaEventElapsedTime(&profiler.span_ms, profiler.start[0], profiler.stop[profiler.n - 1]));
    profiler.enabled = 0;
    return total;
}

/* Where the idle time lies: outside the regions (host work before the step's first launch and after its last:
 * the batch, the loss's copy, synchronisation) and between them, by the transitions that hold the most. */
static inline void profile_report_gaps(double wall_ms, float busy)
{
    int shown[PROF_CLASSES][PROF_CLASSES] = {{0}};
    printf("  idle outside the first and last region %.2f ms, between regions %.2f ms; the most between:\n",
           wall_ms - profiler.span_ms, profiler.span_ms - busy);
    for (int k = 0; k < 4; k++) {
        int bi = -1, bj = -1;
        for (int i = 0; i < PROF_CLASSES; i++)
            for (int j = 0; j < PROF_CLASSES; j++)
                if (!shown[i][j] && profiler.gap_count[i][j] &&
                    (bi < 0 || profiler.gap_ms[i][j] > profiler.gap_ms[bi][bj]))
                    bi = i, bj = j;
        if (bi < 0)
            break;
        shown[bi][bj] = 1;
        printf("    %-28s -> %-28s %8.2f ms over %d gaps\n", PROFILE_CLASS_NAMES[bi], PROFILE_CLASS_NAMES[bj],
               profiler.gap_ms[bi][bj], profiler.gap_count[bi][bj]);
    }
}

/* The step's waits for communication (its regions of that class, 1 ms or longer) and the communication stream's
 * marks, each as its start in ms from the step's first region and its length; the marks' events are waited for
 * (the update's gathers may still run when the step's stream is done). */
static inline void profile_report_comm_(void)
{
    if (profiler.n == 0 || profiler.comm_n == 0)
        return;
    printf("  the step's waits for communication, ms from its start (+ length):");
    for (int i = 0, shown = 0; i < profiler.n; i++) {
        float at, len;
        if (profiler.region_class[i] != PROF_COMM)
            continue;
        CUDA_CHECK(cudaEventElapsedTime(&len, profiler.start[i], profiler.stop[i]));
        if (len < 1.0f)
            continue;
        CUDA_CHECK(cudaEventElapsedTime(&at, profiler.start[0], profiler.start[i]));
        printf("%s %.1f +%.1f", shown++ % 6 ? "," : "\n   ", at, len);
    }
    int n = profiler.comm_n < PROFILE_COMM_MARKS ? profiler.comm_n : PROFILE_COMM_MARKS;
    printf("\n  the communication stream, ms from the step's start (+ length), %d marks%s:", profiler.comm_n,
           profiler.comm_n > n ? " (the first shown)" : "");
    for (int i = 0; i < n; i++) {
        float at, len;
        CUDA_CHECK(cudaEventSynchronize(profiler.comm_stop[i]));
        CUDA_CHECK(cudaEventElapsedTime(&at, profiler.start[0], profiler.comm_start[i]));
        CUDA_CHECK(cudaEventElapsedTime(&len, profiler.comm_start[i], profiler.comm_stop[i]));
        printf("%s %s %.1f +%.1f", i % 4 ? "," : "\n   ", profiler.comm_label[i], at, len);
    }
    printf("\n");
}

/* The profiled step's time per class (ms, busy: what profile_end_step gave)
 * on stdout, and as one JSON line {"step": N, "profile_ms": {...}} in json (may be NULL). */
static inline void profile_report(FILE *json, int step, double wall_ms, const float *ms, float busy)
{
    printf("profile of step %d: %.1f ms wall\n", step, wall_ms);
    for (int c = 0; c < PROF_CLASSES; c++)
        printf("  %-28s %8.2f ms %5.1f%%\n", PROFILE_CLASS_NAMES[c], ms[c], 100.0 * ms[c] / wall_ms);
    printf("  %-28s %8.2f ms %5.1f%%\n", "idle (gaps, host, sync)", wall_ms - busy, 100.0 * (wall_ms - busy) / wall_ms);
    profile_report_gaps(wall_ms, busy);
    profile_report_comm_();
    if (!json)
        return;
    fprintf(json, "{\"step\": %d, \"profile_ms\": {", step);
    for (int c = 0; c < PROF_CLASSES; c++)
        fprintf(json, "\"%s\": %.4f, ", PROFILE_CLASS_NAMES[c], ms[c]);
    fprintf(json, "\"idle\": %.4f, \"idle_outside\": %.4f, \"wall\": %.4f}}\n", wall_ms - busy,
            wall_ms - profiler.span_ms, wall_ms);
    fflush(json);
}

/* Destroys the event pool (if a step was profiled). */
static inline void profile_teardown(void)
{
    for (int i = 0; i < profiler.capacity; i++) {
        CUDA_CHECK(cudaEventDestroy(profiler.start[i]));
        CUDA_CHECK(cudaEventDestroy(profiler.stop[i]));
    }
    for (int i = 0; i < profiler.comm_made; i++) {
        CUDA_CHECK(cudaEventDestroy(profiler.comm_start[i]));
        CUDA_CHECK(cudaEventDestroy(profiler.comm_stop[i]));
    }
    profiler.comm_made = 0;
    free(profiler.start);
    free(profiler.stop);
    free(profiler.region_class);
    profiler.start = profiler.stop = NULL;
    profiler.region_class = NULL;
    profiler.capacity = 0;
}

#endif /* LLMC_PROFILE_H */
