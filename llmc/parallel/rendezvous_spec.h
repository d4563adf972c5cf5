/*
 * rendezvous_spec.h: the spec string of a rendezvous (rendezvous.h), parsed
 * into a RendezvousSpec_:
 *
 *   tcp://HOST:PORT  HOST is rank 0's name or address (an IPv6 address goes in
 *                    brackets, which the spec's host drops); PORT a decimal
 *                    number from 1 to 65535.
 *   file:PATH        PATH at most PATH_MAX - 32 bytes, leaving room for the
 *                    .tmp.<pid> that rank 0 writes first.
 *
 * rendezvous_check_spec lets a program reject a bad flag before it starts its
 * GPUs; rendezvous_spec_from_env builds tcp://MASTER_ADDR:MASTER_PORT
 * (torchrun's variables) through a caller-supplied EnvLookup, as launch.h does.
 * Reads the spec and those variables; writes only the struct, the spec buffer
 * and the message buffer it is given. Prints nothing.
 */
#ifndef LLMC_RENDEZVOUS_SPEC_H
#define LLMC_RENDEZVOUS_SPEC_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/parallel/launch.h" /* EnvLookup */

typedef struct {
    int is_tcp;
    char host[256];   /* tcp: without the brackets of an IPv6 address */
    char port[6];     /* tcp: decimal, validated */
    const char *path; /* file: points into the spec */
} RendezvousSpec_;

static inline int rendezvous_parse_(const char *spec, RendezvousSpec_ *s, char *why, size_t whylen)
{
    memset(s, 0, sizeof(*s));
    if (!spec || !*spec) {
        snprintf(why, whylen, "the spec is empty");
        return -1;
    }
    if (strncmp(spec, "file:", 5) == 0) {
        s->path = spec + 5;
        if (!*s->path) {
            snprintf(why, whylen, "file: needs a path");
            return -1;
        }
        if (strlen(s->path) > PATH_MAX - 32) { /* room for .tmp.<pid> */
            snprintf(why, whylen, "the path is longer than %d bytes", PATH_MAX - 32);
            return -1;
        }
        return 0;
    }
    if (strncmp(spec, "tcp://", 6) != 0) {
        snprintf(why, whylen, "unknown method");
        return -1;
    }
    const char *host = spec + 6, *colon;
    size_t hl;
    if (*host == '[') {
        const char *rb = strchr(host, ']');
        if (!rb) {
            snprintf(why, whylen, "'[' without ']'");
            return -1;
        }
        host++;
        hl = (size_t)(rb - host);
        colon = rb + 1;
        if (*colon != ':') {
            snprintf(why, whylen, "no :PORT after the host");
            return -1;
        }
    } else {
        colon = strrchr(host, ':');
        if (!colon) {
            snprintf(why, whylen, "no :PORT after the host");
            return -1;
        }
        hl = (size_t)(colon - host);
        if (memchr(host, ':', hl)) {
            snprintf(why, whylen, "an IPv6 address goes in brackets: tcp://[ADDRESS]:PORT");
            return -1;
        }
    }
    if (hl == 0) {
        snprintf(why, whylen, "no HOST");
        return -1;
    }
    if (hl >= sizeof(s->host)) {
        snprintf(why, whylen, "HOST is longer than %zu bytes", sizeof(s->host) - 1);
        return -1;
    }
    memcpy(s->host, host, hl);
    s->host[hl] = '\0';
    const char *p = colon + 1;
    size_t pl = strlen(p);
    long port = pl >= 1 && pl <= 5 && strspn(p, "0123456789") == pl ? strtol(p, NULL, 10) : -1;
    if (port < 1 || port > 65535) {
        snprintf(why, whylen, "PORT '%s' is not a number from 1 to 65535", p);
        return -1;
    }
    snprintf(s->port, sizeof(s->port), "%ld", port);
    s->is_tcp = 1;
    return 0;
}

/* 0 if spec is well formed; lets a program reject a bad flag before it starts
 * its GPUs. */
static inline int rendezvous_check_spec(const char *spec, char *err, size_t errlen)
{
    RendezvousSpec_ s;
    char why[160];
    if (rendezvous_parse_(spec, &s, why, sizeof(why)) == 0)
        return 0;
    snprintf(err, errlen, "bad rendezvous '%s': %s; use tcp://HOST:PORT or file:PATH", spec ? spec : "(null)", why);
    return -1;
}

/* Writes "tcp://MASTER_ADDR:MASTER_PORT" to spec; both variables must be set. */
static inline int rendezvous_spec_from_env(EnvLookup env, char *spec, size_t len, char *err, size_t errlen)
{
    const char *addr = env("MASTER_ADDR"), *port = env("MASTER_PORT");
    if (!addr && !port) {
        snprintf(err, errlen,
                 "no rendezvous given: set MASTER_ADDR and MASTER_PORT (torchrun style), or give "
                 "tcp://HOST:PORT or file:PATH");
        return -1;
    }
    if (!addr || !port) {
        snprintf(err, errlen, "%s is set but %s is not: set both (torchrun style)",
                 addr ? "MASTER_ADDR" : "MASTER_PORT", addr ? "MASTER_PORT" : "MASTER_ADDR");
        return -1;
    }
    /* torchrun takes a bare IPv6 address in MASTER_ADDR; the spec needs brackets. */
    int bracket = strchr(addr, ':') != NULL && addr[0] != '[';
    int n = snprintf(spec, len, "tcp://%s%s%s:%s", bracket ? "[" : "", addr, bracket ? "]" : "", port);
    if (n < 0 || (size_t)n >= len) {
        snprintf(err, errlen, "MASTER_ADDR='%s' and MASTER_PORT='%s' do not fit in %zu bytes", addr, port, len);
        return -1;
    }
    RendezvousSpec_ s;
    char why[160];
    if (rendezvous_parse_(spec, &s, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "MASTER_ADDR='%s' and MASTER_PORT='%s' do not make a rendezvous: %s", addr, port, why);
        return -1;
    }
    return 0;
}

#endif /* LLMC_RENDEZVOUS_SPEC_H */
