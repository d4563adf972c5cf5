/*
 * test_watchdog.c: llmc/parallel/watchdog.h, each case in its own child process (the
 * watchdog ends the process it watches):
 *   - a loop that keeps making progress is never stopped, and watchdog_stop
 *     returns at once;
 *   - a loop stuck past the timeout (a sleep standing in for a collective that
 *     never returns) is ended with WATCHDOG_EXIT_CODE, between the timeout and
 *     the timeout plus a second, with a message naming the rank, the timeout
 *     and the last phase;
 *   - a probe that reports an error ends the process within a second even with
 *     no timeout, and its message is printed;
 *   - with no timeout and no probe no thread starts and nothing ends.
 *
 * Build: make tests/test_watchdog; run from anywhere: ./tests/test_watchdog
 */
#include <string.h>

#include "llmc/parallel/watchdog.h"
#include "tests/check.h"

static double seconds(void)
{
    return watchdog_now_ns() * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void progressing(void *arg)
{
    (void)arg;
    Watchdog w;
    watchdog_start(&w, 3, 0.5, NULL, NULL, "start");
    for (int i = 0; i < 15; i++) {
        sleep_s(0.1);
        watchdog_progress(&w, "step");
    }
    double t0 = seconds();
    watchdog_stop(&w);
    if (seconds() - t0 > 1.0) {
        fprintf(stderr, "watchdog_stop took %.2f s\n", seconds() - t0);
        _exit(1);
    }
}

static void stuck(void *arg)
{
    (void)arg;
    Watchdog w;
    watchdog_start(&w, 7, 1.0, NULL, NULL, "start");
    watchdog_progress(&w, "step 12 done");
    sleep_s(10.0); /* the watchdog must end this before it returns */
}

static int probe_calls = 0;
static int failing_probe(void *ctx, char *msg, size_t msg_size)
{
    (void)ctx;
    if (++probe_calls < 3)
        return 0;
    snprintf(msg, msg_size, "NCCL reports unhandled system error");
    return 1;
}

static void probed(void *arg)
{
    (void)arg;
    Watchdog w;
    watchdog_start(&w, 1, 0.0, failing_probe, NULL, "checkpoint step 40: written");
    sleep_s(10.0);
}

static void unwatched(void *arg)
{
    (void)arg;
    Watchdog w;
    watchdog_start(&w, 0, 0.0, NULL, NULL, "start");
    if (w.running) {
        fprintf(stderr, "a watchdog thread started with nothing to watch\n");
        _exit(1);
    }
    sleep_s(0.6);
    watchdog_progress(&w, "step");
    watchdog_stop(&w);
}

int main(void)
{
    char msg[2048];
    int code = run_child(progressing, NULL, msg, sizeof(msg));
    check(code == 0, "progress every 0.1 s under a 0.5 s timeout: never stopped, stop prompt (exit %d%s%s)", code,
          msg[0] ? ": " : "", msg);

    double t0 = seconds();
    code = run_child(stuck, NULL, msg, sizeof(msg));
    double took = seconds() - t0;
    check(code == WATCHDOG_EXIT_CODE, "stuck past a 1 s timeout: exit code %d (want %d)", code, WATCHDOG_EXIT_CODE);
    check(took >= 1.0 && took < 2.0, "stuck: ended after %.2f s (want 1 to 2 s)", took);
    check(strstr(msg, "rank 7") && strstr(msg, "no progress for 1 s") && strstr(msg, "step 12 done") &&
              strstr(msg, "hint:"),
          "stuck: the message names the rank, the timeout, the last phase and a hint: %.*s", (int)strcspn(msg, "\n"),
          msg);

    t0 = seconds();
    code = run_child(probed, NULL, msg, sizeof(msg));
    took = seconds() - t0;
    check(code == WATCHDOG_EXIT_CODE && took < 1.5, "a failing probe ends the process: exit %d after %.2f s", code,
          took);
    check(strstr(msg, "rank 1") && strstr(msg, "NCCL reports unhandled system error") &&
              strstr(msg, "checkpoint step 40"),
          "probe: the message carries the probe's words and the phase: %.*s", (int)strcspn(msg, "\n"), msg);

    code = run_child(unwatched, NULL, msg, sizeof(msg));
    check(code == 0, "no timeout and no probe: no thread, nothing ends (exit %d%s%s)", code, msg[0] ? ": " : "", msg);
    return check_summary();
}
