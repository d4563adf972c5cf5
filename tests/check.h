/*
 * check.h: what every C and CUDA test of the project shares (tests/,
 * test_llama_ref.c, test_llama.cu, dev/cuda/):
 *   check()         one "PASS ..." or "FAIL ..." line per assertion, counted;
 *   check_summary() "N passed, M failed" and the exit status;
 *   check_rel()     a tensor against its reference: the max relative error
 *                   max|got - ref| / max|ref| (the largest error seen relative
 *                   to the tensor's scale; a per-element relative error means
 *                   nothing for entries near zero) against a tolerance, with
 *                   the normwise ||got - ref|| / ||ref|| printed beside it; a
 *                   NaN or infinity in got fails;
 *   bf16 on the host, as raw bits (round to nearest even), so that a reference
 *                   reads exactly the values a kernel reads;
 *   run_child()     a function in a child process, its stderr and exit status
 *                   collected, for code that ends the process instead of returning.
 * Writes only stdout, its two counters and the caller's buffers.
 */
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int check_passed = 0, check_failed = 0;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline int
check(int ok, const char *fmt, ...)
{
    va_list args;
    printf("%s ", ok ? "PASS" : "FAIL");
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
    printf("\n");
    ok ? check_passed++ : check_failed++;
    return ok;
}

/* The exit status: 0 when every check passed. */
static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

/* Normwise relative error ||got - ref|| / ||ref|| (absolute where ref is all zero); NaN or inf where got has one. */
static inline double normwise_error(const float *got, const float *ref, int64_t n)
{
    double ss_diff = 0.0, ss_ref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        ss_diff += isfinite(got[i]) ? d * d : NAN;
        ss_ref += (double)ref[i] * ref[i];
    }
    return ss_ref > 0.0 ? sqrt(ss_diff / ss_ref) : sqrt(ss_diff);
}

/* Max relative error of got against ref (see the top); *normwise (may be NULL)
 * gets the normwise one. A non-finite value in got makes the error NaN. */
static inline double max_rel_error(const float *got, const float *ref, int64_t n, double *normwise)
{
    double max_diff = 0.0, max_ref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!isfinite(got[i]))
            d = NAN;
        if (!(d <= max_diff)) /* so that a NaN becomes the error */
            max_diff = d;
        max_ref = fmax(max_ref, fabs((double)ref[i]));
    }
    if (normwise)
        *normwise = normwise_error(got, ref, n);
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

/* One check of got against ref within tol (max relative error); *worst (may be
 * NULL) keeps the largest error seen. */
static inline int check_rel(const char *what, const float *got, const float *ref, int64_t n, double tol, double *worst)
{
    double normwise, err = max_rel_error(got, ref, n, &normwise);
    if (worst && !(err <= *worst))
        *worst = err;
    return check(err <= tol, "%-56s max rel %.3e (tol %.0e), normwise %.3e", what, err, tol, normwise);
}

/* ---- bf16 on the host, as raw bits ---- */

static inline uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);         /* round to nearest even */
    return (uint16_t)(u >> 16);
}
static inline float bf16_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float bf16_round(float f)
{
    return bf16_float(bf16_bits(f));
}
static inline void bf16_to_float(float *out, const uint16_t *bits, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = bf16_float(bits[i]);
}

/* Runs fn(arg) in a child process, its stderr into msg (NUL-terminated, cut to
 * msg_size - 1 bytes); returns the child's exit code, or -1 if it did not exit
 * (a signal). A child whose fn returns exits with 0. */
static inline int run_child(void (*fn)(void *), void *arg, char *msg, size_t msg_size)
{
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        exit(2);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn(arg);
        fflush(stderr);
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < msg_size && (got = read(fds[0], msg + len, msg_size - 1 - len)) != 0) {
        if (got < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        len += (size_t)got;
    }
    msg[len] = '\0';
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif /* TESTS_CHECK_H */
