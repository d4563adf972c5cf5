/*
 * flags.h: command-line flags from a table. Each entry names a flag, its type,
 * where its value goes in the caller's options struct (offsetof) and one line
 * of help; headings group the --help list. flags_parse fills the struct from
 * argv (values the table does not name keep what the caller set: the defaults),
 * flags_usage prints the list with those defaults.
 *
 * A numeric flag (FLAG_NUM) has its allowed range in the table, an interval
 * whose ends are closed or open: a value outside it is refused at parsing, before
 * any work, and --help shows it. Errors (an unknown flag, a missing value, a
 * value that is not a number or is out of range) print the flag, the value and
 * the range or a hint, and exit(1). Reads argv,
 * writes only the struct. Plain C; also compiles as CUDA/C++.
 */
#ifndef LLMC_FLAGS_H
#define LLMC_FLAGS_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/common/utils.h"

/* An int flag's value before parsing that means "not given" (the defaults hold it
 * where a flag must know that, e.g. shape flags over a preset). */
#define FLAG_INT_UNSET INT_MIN

typedef enum {
    FLAG_INT,     /* int */
    FLAG_FLOAT,   /* float */
    FLAG_DOUBLE,  /* double */
    FLAG_STRING,  /* const char *, pointing into argv */
    FLAG_SWITCH,  /* int set to 1, takes no value */
    FLAG_HEADING, /* not a flag: a title in the --help list */
} FlagType;

/* Which ends of a numeric flag's range [lo, hi] are excluded. */
enum { FLAG_CLOSED = 0, FLAG_LO_OPEN = 1, FLAG_HI_OPEN = 2 };

typedef struct {
    const char *name;
    FlagType type;
    size_t offset; /* in the options struct */
    const char *help;
    double lo, hi; /* FLAG_NUM: the allowed values (an int flag's too) */
    int open;      /* FLAG_LO_OPEN | FLAG_HI_OPEN: ends excluded */
    int has_range;
} Flag;

/* A string or switch flag. */
#define FLAG(name, type, Options, field, help)                                                                         \
    {                                                                                                                  \
        name, type, offsetof(Options, field), help, 0.0, 0.0, 0, 0                                                     \
    }
/* A numeric flag (FLAG_INT, FLAG_FLOAT, FLAG_DOUBLE) with its range. */
#define FLAG_NUM(name, type, Options, field, lo, hi, open, help)                                                       \
    {                                                                                                                  \
        name, type, offsetof(Options, field), help, (double)(lo), (double)(hi), open, 1                                \
    }
#define FLAG_SECTION(title)                                                                                            \
    {                                                                                                                  \
        NULL, FLAG_HEADING, 0, title, 0.0, 0.0, 0, 0                                                                   \
    }

/* f's range in interval notation, "[1, 1024]" or "(0, 10]", into out. */
static inline void flag_range_text(const Flag *f, char *out, size_t n)
{
    snprintf(out, n, "%c%.10g, %.10g%c", f->open & FLAG_LO_OPEN ? '(' : '[', f->lo, f->hi,
             f->open & FLAG_HI_OPEN ? ')' : ']');
}

/* Whether v lies in f's range. */
static inline int flag_in_range(const Flag *f, double v)
{
    int above_lo = f->open & FLAG_LO_OPEN ? v > f->lo : v >= f->lo;
    int below_hi = f->open & FLAG_HI_OPEN ? v < f->hi : v <= f->hi;
    return !f->has_range || (above_lo && below_hi);
}

/* The flag list for --help; defaults (the options struct before parsing) adds
 * "(default X)" to numbers above 0 and to set strings. */
static inline void flags_usage(FILE *out, const Flag *flags, int n_flags, const void *defaults)
{
    for (int i = 0; i < n_flags; i++) {
        const Flag *f = &flags[i];
        if (f->type == FLAG_HEADING) {
            fprintf(out, "%s:\n", f->help);
            continue;
        }
        const char *field = (const char *)defaults + f->offset;
        char def[96] = "";
        if (f->type == FLAG_INT && *(const int *)field > 0)
            snprintf(def, sizeof(def), " (default %d)", *(const int *)field);
        if (f->type == FLAG_FLOAT && *(const float *)field > 0)
            snprintf(def, sizeof(def), " (default %g)", *(const float *)field);
        if (f->type == FLAG_DOUBLE && *(const double *)field > 0)
            snprintf(def, sizeof(def), " (default %g)", *(const double *)field);
        if (f->type == FLAG_STRING && *(const char *const *)field && **(const char *const *)field)
            snprintf(def, sizeof(def), " (default %s)", *(const char *const *)field);
        const char *value = f->type == FLAG_SWITCH ? "" : f->type == FLAG_STRING ? " S" : " N";
        char left[64], range[80] = "";
        snprintf(left, sizeof(left), "%s%s", f->name, value);
        if (f->has_range && f->type == FLAG_INT && f->hi >= INT_MAX) { /* no upper bound but int's */
            snprintf(range, sizeof(range), ", >= %.10g", f->lo);
        } else if (f->has_range) {
            char r[64];
            flag_range_text(f, r, sizeof(r));
            snprintf(range, sizeof(range), ", in %s", r);
        }
        fprintf(out, "  %-22s %s%s%s\n", left, f->help, range, def);
    }
}

static inline void flag_out_of_range_(const Flag *f, const char *value)
{
    char range[96] = "those of its type (finite, and within an int's range for integers)";
    if (f->has_range)
        flag_range_text(f, range, sizeof(range));
    FAIL("%s %s is out of range: it takes values in %s (%s)", f->name, value, range, f->help);
}

/* Fills options from argv[1..]; -h/--help calls help() (which should exit). */
static inline void flags_parse(const Flag *flags, int n_flags, int argc, char **argv, void *options, void (*help)(void))
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            help();
        const Flag *f = NULL;
        for (int k = 0; k < n_flags && !f; k++) {
            if (flags[k].type != FLAG_HEADING && strcmp(argv[i], flags[k].name) == 0)
                f = &flags[k];
        }
        if (f == NULL)
            FAIL("unknown flag '%s'\n  hint: %s --help lists them", argv[i], argv[0]);
        char *field = (char *)options + f->offset;
        if (f->type == FLAG_SWITCH) {
            *(int *)field = 1;
            continue;
        }
        if (i + 1 >= argc)
            FAIL("flag %s needs a value\n  hint: %s --help", argv[i], argv[0]);
        const char *value = argv[++i];
        char *end;
        errno = 0;
        if (f->type == FLAG_STRING) {
            *(const char **)field = value;
        } else if (f->type == FLAG_INT) {
            long v = strtol(value, &end, 10);
            if (*value == '\0' || *end != '\0')
                FAIL("%s needs an integer, got '%s'\n  hint: %s --help", f->name, value, argv[0]);
            if (errno != 0 || v < INT_MIN || v > INT_MAX || !flag_in_range(f, (double)v))
                flag_out_of_range_(f, value);
            *(int *)field = (int)v;
        } else {
            double v = strtod(value, &end);
            if (*value == '\0' || *end != '\0')
                FAIL("%s needs a number, got '%s'\n  hint: %s --help", f->name, value, argv[0]);
            if (errno != 0 || !isfinite(v) || (f->type == FLAG_FLOAT && !isfinite((float)v)) || !flag_in_range(f, v))
                flag_out_of_range_(f, value);
            if (f->type == FLAG_FLOAT)
                *(float *)field = (float)v;
            else
                *(double *)field = v;
        }
    }
}

/* A string flag's value as its index among choices ("a|b|c"); NULL (not given) is
 * the first. Any other value fails, naming the flag and its choices. */
static inline int flag_choice(const char *flag, const char *value, const char *choices)
{
    if (!value)
        return 0;
    size_t len = strlen(value);
    int index = 0;
    for (const char *c = choices; *c; index++) {
        const char *end = strchr(c, '|');
        size_t n = end ? (size_t)(end - c) : strlen(c);
        if (n == len && strncmp(c, value, n) == 0)
            return index;
        c += n + (end ? 1 : 0);
    }
    char listed[256] = ""; /* "a, b or c" */
    size_t at = 0;
    for (int i = 0; i < index && at < sizeof(listed); i++) {
        const char *c = choices;
        for (int k = 0; k < i; k++)
            c = strchr(c, '|') + 1;
        const char *end = strchr(c, '|');
        at += (size_t)snprintf(listed + at, sizeof(listed) - at, "%s%.*s",
                               i == 0           ? ""
                               : i == index - 1 ? " or "
                                                : ", ",
                               (int)(end ? end - c : (long)strlen(c)), c);
    }
    FAIL("%s takes %s (got '%s')", flag, listed, value);
    return -1;
}

#endif /* LLMC_FLAGS_H */
