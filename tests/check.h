/*
 * check.h: the pass/fail bookkeeping of the C tests in tests/: check() prints
 * one "PASS ..." or "FAIL ..." line per assertion and counts it; check_summary()
 * prints "N passed, M failed" and gives the exit status. run_child() runs a
 * function in a child process and collects its stderr and exit status, for code
 * that ends the process instead of returning. Writes only stdout, its two
 * counters and the caller's message buffer.
 */
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int check_passed = 0, check_failed = 0;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline int check(int ok, const char *fmt, ...)
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
