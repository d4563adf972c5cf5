/*
 * watchdog.h: a thread that ends the process when the training loop makes no
 * progress for too long, or when a probe reports an error.
 *
 * Why: with several ranks, a rank whose peer died waits inside an NCCL
 * collective, and over NVLink or shared memory NCCL never learns of the death,
 * so the wait lasts forever (a rank killed while checkpoints were written left
 * the others blocked in the commit barrier). The loop calls watchdog_progress at
 * every point where it has moved on (a step done, a checkpoint written); the
 * thread wakes every WATCHDOG_POLL_S, asks the probe (train_llama: NCCL's
 * asynchronous error state), and if the probe fails or the last progress is
 * older than the timeout it prints which rank, what it was doing and since when,
 * and exits with WATCHDOG_EXIT_CODE. Nothing is lost: checkpoints are committed
 * only once complete (checkpoint.h), so an exit leaves the newest complete one.
 *
 * Plain C with POSIX threads (the same header builds as C, for its test, and as
 * CUDA C++); one mutex guards what both threads touch. Reads and writes only
 * the Watchdog it is given.
 */
#ifndef LLMC_WATCHDOG_H
#define LLMC_WATCHDOG_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llmc/common/utils.h"

#define WATCHDOG_POLL_S 0.25
#define WATCHDOG_EXIT_CODE 3
#define WATCHDOG_PHASE_MAX 96

/* Returns 0 while all is well, else writes why into msg and returns non-zero. */
typedef int (*WatchdogProbe)(void *ctx, char *msg, size_t msg_size);

typedef struct {
    pthread_t thread;
    int running;
    int rank;
    double timeout_s; /* <= 0: no timeout (the probe still runs) */
    WatchdogProbe probe;
    void *probe_ctx;
    pthread_mutex_t lock; /* guards the three below */
    int stop;
    int64_t last_progress_ns;       /* monotonic clock */
    char phase[WATCHDOG_PHASE_MAX]; /* what the loop moved on to last */
} Watchdog;

static inline int64_t watchdog_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Ends the process from the watchdog thread: the main thread may be blocked in a
 * CUDA or NCCL call that never returns, so no clean shutdown is attempted. */
static inline void watchdog_fire(const Watchdog *w, const char *why, const char *phase, double idle_s, const char *hint)
{
    fprintf(stderr, "error: rank %d: %s (last progress: %s, %.0f s ago)\n  hint: %s\n", w->rank, why, phase, idle_s,
            hint);
    fflush(stderr);
    _exit(WATCHDOG_EXIT_CODE);
}

static void *watchdog_main(void *arg)
{
    Watchdog *w = (Watchdog *)arg;
    char msg[512], phase[WATCHDOG_PHASE_MAX];
    struct timespec nap = {0, (long)(WATCHDOG_POLL_S * 1e9)};
    for (;;) {
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&w->lock);
        int stop = w->stop;
        double idle_s = (watchdog_now_ns() - w->last_progress_ns) * 1e-9;
        memcpy(phase, w->phase, sizeof(phase));
        pthread_mutex_unlock(&w->lock);
        if (stop)
            return NULL;
        if (w->probe && w->probe(w->probe_ctx, msg, sizeof(msg)) != 0)
            watchdog_fire(w, msg, phase, idle_s,
                          "the first rank to fail says why; the others exit here instead of waiting forever");
        if (w->timeout_s > 0 && idle_s > w->timeout_s) {
            char why[128];
            snprintf(why, sizeof(why), "no progress for %.0f s (--comm-timeout)", w->timeout_s);
            watchdog_fire(w, why, phase, idle_s,
                          "another rank probably died or hangs (its own error, if any, says why); resume from the "
                          "newest complete checkpoint with --resume. A phase that legitimately takes longer (a "
                          "large checkpoint on a slow disk) needs a larger --comm-timeout");
        }
    }
}

/* The loop has moved on; phase_format (printf-style) says to what. Formats
 * nothing when no thread watches. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void
watchdog_progress(Watchdog *w, const char *phase_format, ...)
{
    if (!w->running)
        return;
    va_list args;
    va_start(args, phase_format);
    pthread_mutex_lock(&w->lock);
    vsnprintf(w->phase, sizeof(w->phase), phase_format, args);
    w->last_progress_ns = watchdog_now_ns();
    pthread_mutex_unlock(&w->lock);
    va_end(args);
}

/* Starts the thread unless there is nothing to watch (timeout_s <= 0 and no probe). */
static inline void watchdog_start(Watchdog *w, int rank, double timeout_s, WatchdogProbe probe, void *probe_ctx,
                                  const char *phase)
{
    memset(w, 0, sizeof(*w));
    w->rank = rank;
    w->timeout_s = timeout_s;
    w->probe = probe;
    w->probe_ctx = probe_ctx;
    if (timeout_s <= 0 && !probe)
        return;
    pthread_mutex_init(&w->lock, NULL);
    w->running = 1;
    watchdog_progress(w, "%s", phase);
    if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0)
        FAIL("rank %d: cannot start the watchdog thread", rank);
}

static inline void watchdog_stop(Watchdog *w)
{
    if (!w->running)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    w->running = 0;
}

#endif /* LLMC_WATCHDOG_H */
