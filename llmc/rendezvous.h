/*
 * rendezvous.h: lets the N processes of a multi-GPU run agree on one opaque
 * blob made by rank 0 (NCCL's 128-byte ncclUniqueId) without MPI, for
 * schedulers that start the processes themselves. A spec string picks how:
 *
 *   tcp://HOST:PORT  Rank 0 listens on PORT on every interface (HOST is for
 *                    the others; an IPv6 address goes in brackets). Every other
 *                    rank connects, retrying until the timeout (rank 0 may
 *                    start late, its name may not resolve yet), and sends a
 *                    24-byte header: magic, its rank, the world size and the
 *                    blob size, big-endian. Once all world-1 ranks have checked
 *                    in, rank 0 answers each with a header of the same layout
 *                    (a status in place of the rank) and the blob, so no rank
 *                    goes on before the whole world is there. A peer whose
 *                    world or blob size differs from rank 0's, or a rank that
 *                    checks in twice, fails the rendezvous: rank 0 and every
 *                    rank connected so far get an error that says why.
 *                    Connections that do not open with the magic are dropped.
 *   file:PATH        Rank 0 removes a stale PATH, writes the header (rank 0,
 *                    world, blob size) and the blob to PATH.tmp.<pid>, fsyncs
 *                    it and renames it to PATH, so a reader sees all of it or
 *                    nothing. The other ranks poll for PATH until the timeout
 *                    and reject a file whose world or blob size differs. PATH
 *                    must be on a file system all hosts share.
 *                    Limitation: a reader may find a stale PATH from an earlier
 *                    run before rank 0 removes it, and nothing in the file can
 *                    tell the runs apart when their world sizes are equal; the
 *                    reader then takes the old blob and NCCL hangs or fails.
 *                    So PATH must be fresh per run: put the job id in it. The
 *                    file stays behind: rank 0 cannot know when all have read it.
 *
 * rendezvous_spec_from_env builds tcp://MASTER_ADDR:MASTER_PORT (torchrun's
 * variables) through a caller-supplied EnvLookup, as launch.h does.
 * Reads: those variables, the network or PATH. Writes: the blob on ranks other
 * than 0, PATH and PATH.tmp.<pid> on rank 0, and err. Prints nothing.
 * Every function returns 0, or -1 with a message in err that names the rank,
 * the spec and what to do.
 */
#ifndef LLMC_RENDEZVOUS_H
#define LLMC_RENDEZVOUS_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "launch.h" /* EnvLookup */

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* non-Linux: the caller must ignore SIGPIPE itself */
#endif

/* "llmcRdz1": bump the last byte whenever the header changes, so mixed builds
 * are told apart instead of misreading each other. */
#define RENDEZVOUS_MAGIC 0x6c6c6d6352647a31ULL
#define RENDEZVOUS_HEADER_BYTES 24

/* What rank 0 answers in the rank field of its header. */
enum {
    RENDEZVOUS_OK = 0,
    RENDEZVOUS_WORLD_MISMATCH = 1,
    RENDEZVOUS_BAD_RANK = 2,
    RENDEZVOUS_SIZE_MISMATCH = 3,
    RENDEZVOUS_ABORTED = 4, /* rank 0 gave up because of another rank, or timed out */
};

typedef struct {
    int is_tcp;
    char host[256];   /* tcp: without the brackets of an IPv6 address */
    char port[6];     /* tcp: decimal, validated */
    const char *path; /* file: points into the spec */
} RendezvousSpec_;

/* ----------------------------------------------------------------------------
 * Spec parsing */

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

/* ----------------------------------------------------------------------------
 * Time, headers, sockets */

static inline double rendezvous_now_(void)
{
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0)
        return (double)time(NULL);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Milliseconds to the deadline, for poll(): 0 once it has passed. */
static inline int rendezvous_ms_left_(double deadline)
{
    double ms = (deadline - rendezvous_now_()) * 1000.0;
    if (ms <= 0)
        return 0;
    if (ms > (double)INT_MAX)
        return INT_MAX;
    return (int)ms + 1;
}

static inline void rendezvous_sleep_(double seconds, double deadline)
{
    double left = deadline - rendezvous_now_();
    if (seconds > left)
        seconds = left;
    if (seconds <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Close errors on sockets and read-only files lose nothing; EINTR must not be
 * retried on Linux, where the descriptor is already gone. errno is kept, so
 * callers can close before they report. */
static inline void rendezvous_close_(int fd)
{
    int saved = errno;
    if (close(fd) != 0 && errno != EINTR) {
    }
    errno = saved;
}

static inline void rendezvous_put_(unsigned char *p, uint64_t x, int n)
{
    for (int i = n - 1; i >= 0; i--, x >>= 8)
        p[i] = (unsigned char)(x & 0xff);
}

static inline uint64_t rendezvous_get_(const unsigned char *p, int n)
{
    uint64_t x = 0;
    for (int i = 0; i < n; i++)
        x = x << 8 | p[i];
    return x;
}

static inline void rendezvous_encode_(unsigned char *h, uint32_t rank_or_status, uint32_t world, uint64_t blob_bytes)
{
    rendezvous_put_(h, RENDEZVOUS_MAGIC, 8);
    rendezvous_put_(h + 8, rank_or_status, 4);
    rendezvous_put_(h + 12, world, 4);
    rendezvous_put_(h + 16, blob_bytes, 8);
}

/* -1 if h does not start with the magic. */
static inline int rendezvous_decode_(const unsigned char *h, uint32_t *rank_or_status, uint32_t *world,
                                     uint64_t *blob_bytes)
{
    if (rendezvous_get_(h, 8) != RENDEZVOUS_MAGIC)
        return -1;
    *rank_or_status = (uint32_t)rendezvous_get_(h + 8, 4);
    *world = (uint32_t)rendezvous_get_(h + 12, 4);
    *blob_bytes = rendezvous_get_(h + 16, 8);
    return 0;
}

/* Non-blocking, so that no read or write can outlive the deadline; close on exec,
 * so that programs the trainer starts do not hold the port. */
static inline int rendezvous_prepare_fd_(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        return -1;
    return 0;
}

/* Sends or receives all n bytes on a non-blocking socket before the deadline,
 * across partial transfers and signals; 0, or -1 with the reason in why. */
static inline int rendezvous_io_(int fd, void *buf, size_t n, int sending, double deadline, char *why, size_t whylen)
{
    unsigned char *p = (unsigned char *)buf;
    size_t done = 0;
    while (done < n) {
        ssize_t k = sending ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0 && !sending) {
            snprintf(why, whylen, "the connection was closed after %zu of %zu bytes", done, n);
            return -1;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(why, whylen, "%s", strerror(errno));
            return -1;
        }
        int ms = rendezvous_ms_left_(deadline);
        if (ms == 0) {
            snprintf(why, whylen, "timed out after %zu of %zu bytes", done, n);
            return -1;
        }
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) {
            snprintf(why, whylen, "poll: %s", strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* A socket listening on port on every interface: dual-stack IPv6 first, so
 * peers may come over either protocol; plain IPv4 where the host has no IPv6. */
static inline int rendezvous_listen_(const char *port, char *why, size_t whylen)
{
    int portnum = atoi(port);
    for (int v6 = 1; v6 >= 0; v6--) {
        int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
        if (fd < 0) {
            snprintf(why, whylen, "socket: %s", strerror(errno));
            continue;
        }
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        memset(&a6, 0, sizeof(a6));
        memset(&a4, 0, sizeof(a4));
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)portnum);
        a4.sin_family = AF_INET;
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        a4.sin_port = htons((uint16_t)portnum);
        int one = 1, zero = 0;
        /* SO_REUSEADDR: a run restarted at once must not wait out TIME_WAIT of the last one. */
        int ok =
            rendezvous_prepare_fd_(fd) == 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            (!v6 || setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) == 0) &&
            (v6 ? bind(fd, (struct sockaddr *)&a6, sizeof(a6)) : bind(fd, (struct sockaddr *)&a4, sizeof(a4))) == 0 &&
            listen(fd, SOMAXCONN) == 0;
        if (ok)
            return fd;
        int e = errno;
        snprintf(why, whylen, "%s", strerror(e));
        rendezvous_close_(fd);
        if (e == EADDRINUSE || e == EACCES)
            return -1; /* IPv4 would fail the same way */
    }
    return -1;
}

/* One attempt at every address HOST resolves to; the connected socket, or -1
 * with the reason in why. Resolving again on each attempt lets a HOST whose
 * name appears only once its container starts be found. */
static inline int rendezvous_connect_(const RendezvousSpec_ *s, double deadline, char *why, size_t whylen)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(s->host, s->port, &hints, &res);
    if (g != 0) {
        snprintf(why, whylen, "cannot resolve the host: %s", g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            snprintf(why, whylen, "socket: %s", strerror(errno));
            continue;
        }
        int rc = rendezvous_prepare_fd_(fd);
        if (rc == 0)
            rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
            /* An interrupted connect goes on in the background, like a non-blocking one. */
            struct pollfd pfd = {fd, POLLOUT, 0};
            int pr, e = 0;
            do {
                int ms = rendezvous_ms_left_(deadline);
                pr = ms > 0 ? poll(&pfd, 1, ms) : 0;
            } while (pr < 0 && errno == EINTR);
            socklen_t len = sizeof(e);
            if (pr < 0)
                e = errno;
            else if (pr == 0)
                e = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
                e = errno;
            rc = e ? -1 : 0;
            errno = e;
        }
        if (rc != 0) {
            snprintf(why, whylen, "%s", strerror(errno));
            rendezvous_close_(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

/* ----------------------------------------------------------------------------
 * tcp:// */

/* Rank 0's answer to one peer; best effort, since the peer may be gone. */
static inline void rendezvous_answer_(int fd, uint32_t status, int world, uint64_t blob_bytes)
{
    unsigned char h[RENDEZVOUS_HEADER_BYTES];
    char why[128];
    rendezvous_encode_(h, status, (uint32_t)world, blob_bytes);
    (void)rendezvous_io_(fd, h, sizeof(h), 1, rendezvous_now_() + 2.0, why, sizeof(why));
}

static inline int rendezvous_tcp_root_(const RendezvousSpec_ *s, const char *spec, int world, void *blob,
                                       size_t blob_bytes, double deadline, double timeout_s, char *err, size_t errlen)
{
    char why[256];
    int lfd = rendezvous_listen_(s->port, why, sizeof(why));
    if (lfd < 0) {
        snprintf(err, errlen,
                 "rank 0: could not listen on port %s for %s: %s; hint: another process (an earlier run?) "
                 "may hold the port: pick another MASTER_PORT",
                 s->port, spec, why);
        return -1;
    }
    int *fds = (int *)malloc((size_t)world * sizeof(int));
    if (!fds) {
        rendezvous_close_(lfd);
        snprintf(err, errlen, "rank 0: out of memory for %d connections (%s)", world, spec);
        return -1;
    }
    for (int r = 0; r < world; r++)
        fds[r] = -1;
    int joined = 0, dropped = 0, failed = 0;
    while (joined < world - 1 && !failed) {
        int ms = rendezvous_ms_left_(deadline);
        if (ms == 0) {
            char missing[96] = "";
            size_t off = 0;
            int listed = 0;
            for (int r = 1; r < world; r++) {
                if (fds[r] >= 0)
                    continue;
                if (listed < 8)
                    off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%d", listed ? ", " : "", r);
                listed++;
            }
            if (listed > 8)
                snprintf(missing + off, sizeof(missing) - off, ", ...");
            snprintf(err, errlen,
                     "rank 0: only %d of the %d other ranks checked in at %s within %g s (missing: %s)%s; "
                     "hint: check that every rank started, with the same MASTER_ADDR/MASTER_PORT and world size, and "
                     "that the firewall lets them reach port %s",
                     joined, world - 1, spec, timeout_s, missing,
                     dropped ? "; connections that did not speak this protocol were dropped" : "", s->port);
            failed = 1;
            break;
        }
        struct pollfd pfd = {lfd, POLLIN, 0};
        int pr = poll(&pfd, 1, ms);
        if (pr < 0 && errno != EINTR) {
            snprintf(err, errlen, "rank 0: poll on port %s (%s): %s", s->port, spec, strerror(errno));
            failed = 1;
            break;
        }
        if (pr <= 0)
            continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            /* The peer gave up between poll and accept, or a signal came: try again. */
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED)
                continue;
            snprintf(err, errlen, "rank 0: accept on port %s (%s): %s", s->port, spec, strerror(errno));
            failed = 1;
            break;
        }
        unsigned char h[RENDEZVOUS_HEADER_BYTES];
        uint32_t r, w;
        uint64_t b;
        /* Our peers send the header at once; a silent stranger must not hold up the others. */
        double header_deadline = rendezvous_now_() + 5.0 < deadline ? rendezvous_now_() + 5.0 : deadline;
        if (rendezvous_prepare_fd_(fd) != 0 ||
            rendezvous_io_(fd, h, sizeof(h), 0, header_deadline, why, sizeof(why)) != 0 ||
            rendezvous_decode_(h, &r, &w, &b) != 0) {
            rendezvous_close_(fd);
            dropped++;
            continue;
        }
        if (w != (uint32_t)world) {
            rendezvous_answer_(fd, RENDEZVOUS_WORLD_MISMATCH, world, blob_bytes);
            snprintf(err, errlen,
                     "rank 0: a process checked in at %s as rank %u of a world of %u, but this run has %d "
                     "processes; hint: start every rank with the same world size, and give each run its own port",
                     spec, r, w, world);
            failed = 1;
        } else if (b != (uint64_t)blob_bytes) {
            rendezvous_answer_(fd, RENDEZVOUS_SIZE_MISMATCH, world, blob_bytes);
            snprintf(err, errlen,
                     "rank 0: rank %u checked in at %s expecting %llu bytes, but rank 0 shares %zu; hint: "
                     "run the same build on every rank",
                     r, spec, (unsigned long long)b, blob_bytes);
            failed = 1;
        } else if (r < 1 || r >= (uint32_t)world || fds[r] >= 0) {
            rendezvous_answer_(fd, RENDEZVOUS_BAD_RANK, world, blob_bytes);
            snprintf(err, errlen,
                     "rank 0: a process checked in at %s as rank %u %s; hint: give every process its own "
                     "rank from 1 to %d (rank 0 is this one)",
                     spec, r, r >= 1 && r < (uint32_t)world ? "twice" : "(out of range)", world - 1);
            failed = 1;
        }
        if (failed) {
            rendezvous_close_(fd);
            break;
        }
        fds[r] = fd;
        joined++;
    }
    rendezvous_close_(lfd);
    for (int r = 1; r < world; r++) {
        if (fds[r] < 0)
            continue;
        if (failed) {
            rendezvous_answer_(fds[r], RENDEZVOUS_ABORTED, world, blob_bytes);
        } else {
            unsigned char h[RENDEZVOUS_HEADER_BYTES];
            rendezvous_encode_(h, RENDEZVOUS_OK, (uint32_t)world, blob_bytes);
            /* The peers are connected and waiting, so a few seconds are plenty even
             * when the deadline itself has nearly passed. */
            double send_deadline = rendezvous_now_() + 10.0;
            if (rendezvous_io_(fds[r], h, sizeof(h), 1, send_deadline, why, sizeof(why)) != 0 ||
                rendezvous_io_(fds[r], blob, blob_bytes, 1, send_deadline, why, sizeof(why)) != 0) {
                snprintf(err, errlen,
                         "rank 0: could not send the id to rank %d over %s: %s; hint: that rank may have "
                         "died: see its log",
                         r, spec, why);
                failed = 1;
            }
        }
        rendezvous_close_(fds[r]);
    }
    free(fds);
    return failed ? -1 : 0;
}

static inline int rendezvous_tcp_peer_(const RendezvousSpec_ *s, const char *spec, int rank, int world, void *blob,
                                       size_t blob_bytes, double deadline, double timeout_s, char *err, size_t errlen)
{
    char why[256] = "no attempt";
    int fd = -1;
    for (double pause = 0.02;; pause = pause * 2 < 0.5 ? pause * 2 : 0.5) {
        fd = rendezvous_connect_(s, deadline, why, sizeof(why));
        if (fd >= 0)
            break;
        rendezvous_sleep_(pause, deadline);
        /* No attempt after the deadline: its "timed out" would hide the real reason. */
        if (rendezvous_ms_left_(deadline) == 0)
            break;
    }
    if (fd < 0) {
        snprintf(err, errlen,
                 "rank %d: could not connect to %s within %g s: %s; hint: start rank 0, check "
                 "MASTER_ADDR/MASTER_PORT and the firewall",
                 rank, spec, timeout_s, why);
        return -1;
    }
    unsigned char h[RENDEZVOUS_HEADER_BYTES];
    rendezvous_encode_(h, (uint32_t)rank, (uint32_t)world, blob_bytes);
    if (rendezvous_io_(fd, h, sizeof(h), 1, deadline, why, sizeof(why)) != 0) {
        rendezvous_close_(fd);
        snprintf(err, errlen, "rank %d: connected to %s but could not check in: %s; hint: see rank 0's error", rank,
                 spec, why);
        return -1;
    }
    if (rendezvous_io_(fd, h, sizeof(h), 0, deadline, why, sizeof(why)) != 0) {
        rendezvous_close_(fd);
        if (rendezvous_ms_left_(deadline) == 0)
            snprintf(err, errlen,
                     "rank %d: checked in at %s, but not all %d ranks did within %g s; hint: rank 0's "
                     "error lists the missing ranks",
                     rank, spec, world, timeout_s);
        else
            snprintf(err, errlen, "rank %d: rank 0 at %s gave no answer (%s); hint: see rank 0's error", rank, spec,
                     why);
        return -1;
    }
    uint32_t status, w;
    uint64_t b;
    if (rendezvous_decode_(h, &status, &w, &b) != 0) {
        rendezvous_close_(fd);
        snprintf(err, errlen,
                 "rank %d: %s answered, but not in this program's protocol; hint: another program may "
                 "listen on that port: pick another MASTER_PORT",
                 rank, spec);
        return -1;
    }
    if (status == RENDEZVOUS_OK && (w != (uint32_t)world || b != (uint64_t)blob_bytes))
        status = RENDEZVOUS_ABORTED;
    if (status == RENDEZVOUS_OK &&
        rendezvous_io_(fd, blob, blob_bytes, 0, rendezvous_now_() + 10.0, why, sizeof(why)) != 0) {
        rendezvous_close_(fd);
        snprintf(err, errlen, "rank %d: the id from rank 0 at %s broke off: %s", rank, spec, why);
        return -1;
    }
    rendezvous_close_(fd);
    switch (status) {
    case RENDEZVOUS_OK:
        return 0;
    case RENDEZVOUS_WORLD_MISMATCH:
        snprintf(err, errlen,
                 "rank %d: rank 0 at %s runs a world of %u processes, but this one was started with %d; "
                 "hint: start every rank with the same world size",
                 rank, spec, w, world);
        break;
    case RENDEZVOUS_SIZE_MISMATCH:
        snprintf(err, errlen,
                 "rank %d: rank 0 at %s shares %llu bytes, but this process expects %zu; hint: run the "
                 "same build on every rank",
                 rank, spec, (unsigned long long)b, blob_bytes);
        break;
    case RENDEZVOUS_BAD_RANK:
        snprintf(err, errlen,
                 "rank %d: rank 0 at %s refused this rank: another process checked in as rank %d; hint: "
                 "give every process its own rank",
                 rank, spec, rank);
        break;
    default:
        snprintf(err, errlen,
                 "rank %d: rank 0 at %s gave up (status %u: a rank missing or refused); hint: see rank 0's error", rank,
                 spec, status);
        break;
    }
    return -1;
}

/* ----------------------------------------------------------------------------
 * file: */

static inline int rendezvous_file_root_(const char *path, const char *spec, int world, const void *blob,
                                        size_t blob_bytes, char *err, size_t errlen)
{
    if (unlink(path) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "rank 0: could not remove the stale %s (%s): %s; hint: use a fresh path per run", path,
                 spec, strerror(errno));
        return -1;
    }
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    size_t total = RENDEZVOUS_HEADER_BYTES + blob_bytes;
    unsigned char *buf = (unsigned char *)malloc(total);
    if (!buf) {
        snprintf(err, errlen, "rank 0: out of memory for %zu bytes (%s)", total, spec);
        return -1;
    }
    rendezvous_encode_(buf, 0, (uint32_t)world, blob_bytes);
    memcpy(buf + RENDEZVOUS_HEADER_BYTES, blob, blob_bytes);
    const char *step = "open";
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), ok = fd >= 0, e = errno;
    for (size_t done = 0; ok && done < total;) {
        ssize_t k = write(fd, buf + done, total - done);
        if (k > 0) {
            done += (size_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else {
            step = "write";
            e = k == 0 ? EIO : errno;
            ok = 0;
        }
    }
    /* fsync, and a checked close (network file systems report write errors
     * there), before the rename makes the file visible to other hosts. */
    if (ok && fsync(fd) != 0) {
        step = "fsync";
        e = errno;
        ok = 0;
    }
    if (fd >= 0 && close(fd) != 0 && ok && errno != EINTR) {
        step = "close";
        e = errno;
        ok = 0;
    }
    if (ok && rename(tmp, path) != 0) {
        step = "rename";
        e = errno;
        ok = 0;
    }
    free(buf);
    if (!ok) {
        /* Best effort: a leftover PATH.tmp.<pid> is never read. */
        if (fd >= 0)
            (void)unlink(tmp);
        snprintf(err, errlen,
                 "rank 0: could not write %s (%s): %s: %s; hint: the directory must exist, be writable "
                 "and be on a file system every host shares",
                 path, spec, step, strerror(e));
        return -1;
    }
    return 0;
}

static inline int rendezvous_file_peer_(const char *path, const char *spec, int rank, int world, void *blob,
                                        size_t blob_bytes, double deadline, double timeout_s, char *err, size_t errlen)
{
    int fd;
    for (double pause = 0.01;; pause = pause * 2 < 0.2 ? pause * 2 : 0.2) {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            break;
        if (errno != ENOENT && errno != EINTR) {
            snprintf(err, errlen, "rank %d: could not open %s (%s): %s; hint: every rank must be able to read it", rank,
                     path, spec, strerror(errno));
            return -1;
        }
        if (rendezvous_ms_left_(deadline) == 0) {
            snprintf(err, errlen,
                     "rank %d: %s did not appear within %g s; hint: start rank 0, and give every rank the "
                     "same path on a file system all hosts share",
                     rank, spec, timeout_s);
            return -1;
        }
        rendezvous_sleep_(pause, deadline);
    }
    /* One byte more than expected, to notice a longer file. */
    size_t want = RENDEZVOUS_HEADER_BYTES + blob_bytes, got = 0;
    unsigned char *buf = (unsigned char *)malloc(want + 1);
    if (!buf) {
        rendezvous_close_(fd);
        snprintf(err, errlen, "rank %d: out of memory for %zu bytes (%s)", rank, want, spec);
        return -1;
    }
    while (got < want + 1) {
        ssize_t k = read(fd, buf + got, want + 1 - got);
        if (k > 0)
            got += (size_t)k;
        else if (k == 0)
            break;
        else if (errno != EINTR) {
            snprintf(err, errlen, "rank %d: could not read %s (%s): %s", rank, path, spec, strerror(errno));
            rendezvous_close_(fd);
            free(buf);
            return -1;
        }
    }
    rendezvous_close_(fd);
    uint32_t r, w;
    uint64_t b;
    int rc = -1;
    if (got < RENDEZVOUS_HEADER_BYTES || rendezvous_decode_(buf, &r, &w, &b) != 0)
        snprintf(err, errlen, "rank %d: %s is not a rendezvous file (%zu bytes); hint: use a fresh path per run", rank,
                 spec, got);
    else if (w != (uint32_t)world)
        snprintf(err, errlen,
                 "rank %d: %s was written for a world of %u processes, but this run has %d: a stale file "
                 "from an earlier run, or ranks started with different world sizes; hint: use a fresh path per run "
                 "(put the job id in it) and the same world size on every rank",
                 rank, spec, w, world);
    else if (b != (uint64_t)blob_bytes || got != want)
        snprintf(err, errlen,
                 "rank %d: %s holds %llu bytes (file of %zu), but this process expects %zu; hint: run the "
                 "same build on every rank, with a fresh path per run",
                 rank, spec, (unsigned long long)b, got, blob_bytes);
    else {
        memcpy(blob, buf + RENDEZVOUS_HEADER_BYTES, blob_bytes);
        rc = 0;
    }
    free(buf);
    return rc;
}

/* ----------------------------------------------------------------------------
 * The entry point */

/*
 * Rank 0 shares blob[0..blob_bytes) with every other rank, which receive it in
 * their blob. timeout_s (> 0) bounds the whole call, from its start: waiting for
 * late ranks included. A world of 1 checks the spec and returns at once.
 */
static inline int rendezvous_share(const char *spec, int rank, int world, void *blob, size_t blob_bytes,
                                   double timeout_s, char *err, size_t errlen)
{
    double deadline = rendezvous_now_() + timeout_s;
    RendezvousSpec_ s;
    char why[160];
    if (rendezvous_parse_(spec, &s, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "rank %d: bad rendezvous '%s': %s; use tcp://HOST:PORT or file:PATH", rank,
                 spec ? spec : "(null)", why);
        return -1;
    }
    if (world < 1 || rank < 0 || rank >= world || !blob || blob_bytes == 0 || !(timeout_s > 0)) {
        snprintf(err, errlen,
                 "rank %d: rendezvous %s called with world %d, %zu bytes and a timeout of %g s: needs "
                 "0 <= rank < world, a blob and a timeout > 0",
                 rank, spec, world, blob_bytes, timeout_s);
        return -1;
    }
    if (world == 1)
        return 0;
    if (s.is_tcp)
        return rank == 0
                   ? rendezvous_tcp_root_(&s, spec, world, blob, blob_bytes, deadline, timeout_s, err, errlen)
                   : rendezvous_tcp_peer_(&s, spec, rank, world, blob, blob_bytes, deadline, timeout_s, err, errlen);
    return rank == 0
               ? rendezvous_file_root_(s.path, spec, world, blob, blob_bytes, err, errlen)
               : rendezvous_file_peer_(s.path, spec, rank, world, blob, blob_bytes, deadline, timeout_s, err, errlen);
}

#endif /* LLMC_RENDEZVOUS_H */
