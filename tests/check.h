/*
 * check.h: the pass/fail bookkeeping of the C tests in tests/: check() prints
 * one "PASS ..." or "FAIL ..." line per assertion and counts it; check_summary()
 * prints "N passed, M failed" and gives the exit status. Writes only stdout and
 * its two counters.
 */
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int check_passed = 0, check_failed = 0;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int check(int ok, const char *fmt, ...)
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
static int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif /* TESTS_CHECK_H */
