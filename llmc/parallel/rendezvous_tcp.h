/*
 * rendezvous_tcp.h: the tcp://HOST:PORT rendezvous (rendezvous.h).
 *
 * Rank 0 listens on PORT on every interface (HOST is for the others). Every
 * other rank connects, retrying until the deadline (rank 0 may start late, its
 * name may not resolve yet), and sends the 24-byte header of
 * rendezvous_wire.h: its rank, the world size and the blob size. Once all
 * world-1 ranks have checked in, rank 0 answers each with a header of the same
 * layout (a status in place of the rank) and the blob, so no rank goes on
 * before the whole world is there. A peer whose world or blob size differs
 * from rank 0's, or a rank that checks in twice, fails the rendezvous: rank 0
 * and every rank connected so far get an error that says why. Connections that
 * do not open with the magic are dropped.
 *
 * Rank 0: rendezvous_tcp_root_ = listen, rendezvous_accept_all_ (which vets
 * each peer's header), rendezvous_answer_all_. The others: rendezvous_tcp_peer_
 * = rendezvous_dial_, rendezvous_check_in_, the blob or rendezvous_refusal_.
 * Reads the network. Writes the network, the blob (ranks other than 0) and err.
 * Prints nothing.
 */
#ifndef LLMC_RENDEZVOUS_TCP_H
#define LLMC_RENDEZVOUS_TCP_H

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "llmc/parallel/rendezvous_spec.h"
#include "llmc/parallel/rendezvous_wire.h"

/* ----------------------------------------------------------------------------
 * Sockets */

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
 * Rank 0 */

/* Rank 0's answer to one peer; best effort, since the peer may be gone. */
static inline void rendezvous_answer_(int fd, uint32_t status, int world, uint64_t blob_bytes)
{
    unsigned char h[RENDEZVOUS_HEADER_BYTES];
    char why[128];
    rendezvous_encode_(h, status, (uint32_t)world, blob_bytes);
    (void)rendezvous_io_(fd, h, sizeof(h), 1, rendezvous_now_() + 2.0, why, sizeof(why));
}

/* The deadline's message in err: how many ranks checked in, and the first 8 of
 * those missing (fds[r] < 0). */
static inline void rendezvous_missing_(const RendezvousSpec_ *s, const char *spec, int world, const int *fds,
                                       int joined, int dropped, double timeout_s, char *err, size_t errlen)
{
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
}

/* The header a new connection opens with, in r, w and b: 0, or -1 for a
 * stranger (no header within 5 s, or no magic), which the caller drops. */
static inline int rendezvous_read_hello_(int fd, double deadline, uint32_t *r, uint32_t *w, uint64_t *b)
{
    unsigned char h[RENDEZVOUS_HEADER_BYTES];
    char why[256];
    /* Our peers send the header at once; a silent stranger must not hold up the others. */
    double header_deadline = rendezvous_now_() + 5.0 < deadline ? rendezvous_now_() + 5.0 : deadline;
    if (rendezvous_prepare_fd_(fd) != 0 ||
        rendezvous_io_(fd, h, sizeof(h), 0, header_deadline, why, sizeof(why)) != 0 ||
        rendezvous_decode_(h, r, w, b) != 0)
        return -1;
    return 0;
}

/* Vets the header of one peer (rank r, world w, blob size b) against this run
 * and the ranks in fds so far: 0 if it may join, or -1 after telling the peer
 * why not, with rank 0's message in err. */
static inline int rendezvous_vet_(int fd, uint32_t r, uint32_t w, uint64_t b, const int *fds, const char *spec,
                                  int world, size_t blob_bytes, char *err, size_t errlen)
{
    if (w != (uint32_t)world) {
        rendezvous_answer_(fd, RENDEZVOUS_WORLD_MISMATCH, world, blob_bytes);
        snprintf(err, errlen,
                 "rank 0: a process checked in at %s as rank %u of a world of %u, but this run has %d "
                 "processes; hint: start every rank with the same world size, and give each run its own port",
                 spec, r, w, world);
        return -1;
    }
    if (b != (uint64_t)blob_bytes) {
        rendezvous_answer_(fd, RENDEZVOUS_SIZE_MISMATCH, world, blob_bytes);
        snprintf(err, errlen,
                 "rank 0: rank %u checked in at %s expecting %llu bytes, but rank 0 shares %zu; hint: "
                 "run the same build on every rank",
                 r, spec, (unsigned long long)b, blob_bytes);
        return -1;
    }
    if (r < 1 || r >= (uint32_t)world || fds[r] >= 0) {
        rendezvous_answer_(fd, RENDEZVOUS_BAD_RANK, world, blob_bytes);
        snprintf(err, errlen,
                 "rank 0: a process checked in at %s as rank %u %s; hint: give every process its own "
                 "rank from 1 to %d (rank 0 is this one)",
                 spec, r, r >= 1 && r < (uint32_t)world ? "twice" : "(out of range)", world - 1);
        return -1;
    }
    return 0;
}

/* Accepts connections on lfd until ranks 1..world-1 have each checked in,
 * keeping rank r's connection in fds[r] (all -1 on entry); strangers are
 * dropped. 0, or -1 with the reason in err: the deadline, a failed poll or
 * accept, or the first peer refused (whose connection is closed). */
static inline int rendezvous_accept_all_(int lfd, const RendezvousSpec_ *s, const char *spec, int world, int *fds,
                                         size_t blob_bytes, double deadline, double timeout_s, char *err, size_t errlen)
{
    int joined = 0, dropped = 0;
    while (joined < world - 1) {
        int ms = rendezvous_ms_left_(deadline);
        if (ms == 0) {
            rendezvous_missing_(s, spec, world, fds, joined, dropped, timeout_s, err, errlen);
            return -1;
        }
        struct pollfd pfd = {lfd, POLLIN, 0};
        int pr = poll(&pfd, 1, ms);
        if (pr < 0 && errno != EINTR) {
            snprintf(err, errlen, "rank 0: poll on port %s (%s): %s", s->port, spec, strerror(errno));
            return -1;
        }
        if (pr <= 0)
            continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            /* The peer gave up between poll and accept, or a signal came: try again. */
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED)
                continue;
            snprintf(err, errlen, "rank 0: accept on port %s (%s): %s", s->port, spec, strerror(errno));
            return -1;
        }
        uint32_t r, w;
        uint64_t b;
        if (rendezvous_read_hello_(fd, deadline, &r, &w, &b) != 0) {
            rendezvous_close_(fd);
            dropped++;
            continue;
        }
        if (rendezvous_vet_(fd, r, w, b, fds, spec, world, blob_bytes, err, errlen) != 0) {
            rendezvous_close_(fd);
            return -1;
        }
        fds[r] = fd;
        joined++;
    }
    return 0;
}

/* Answers every rank connected in fds and closes its connection: the blob, or
 * RENDEZVOUS_ABORTED once the rendezvous has failed (failed on entry, with err
 * set by the caller, or a rank the blob could not be sent to: err says which,
 * and the ranks after it are told RENDEZVOUS_ABORTED). 0, or -1 if failed. */
static inline int rendezvous_answer_all_(const int *fds, const char *spec, int world, void *blob, size_t blob_bytes,
                                         int failed, char *err, size_t errlen)
{
    char why[256];
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
    return failed ? -1 : 0;
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
    int failed = rendezvous_accept_all_(lfd, s, spec, world, fds, blob_bytes, deadline, timeout_s, err, errlen) != 0;
    rendezvous_close_(lfd);
    int rc = rendezvous_answer_all_(fds, spec, world, blob, blob_bytes, failed, err, errlen);
    free(fds);
    return rc;
}

/* ----------------------------------------------------------------------------
 * The other ranks */

/* Connects to rank 0, retrying with a growing pause until the deadline: the
 * socket, or -1 with the reason in err. */
static inline int rendezvous_dial_(const RendezvousSpec_ *s, const char *spec, int rank, double deadline,
                                   double timeout_s, char *err, size_t errlen)
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
    if (fd < 0)
        snprintf(err, errlen,
                 "rank %d: could not connect to %s within %g s: %s; hint: start rank 0, check "
                 "MASTER_ADDR/MASTER_PORT and the firewall",
                 rank, spec, timeout_s, why);
    return fd;
}

/* Sends this rank's header on fd and waits for rank 0's answer header, which
 * goes to h: 0, or -1 with fd closed and the reason in err. */
static inline int rendezvous_check_in_(int fd, const char *spec, int rank, int world, size_t blob_bytes,
                                       double deadline, double timeout_s, unsigned char *h, char *err, size_t errlen)
{
    char why[256];
    rendezvous_encode_(h, (uint32_t)rank, (uint32_t)world, blob_bytes);
    if (rendezvous_io_(fd, h, RENDEZVOUS_HEADER_BYTES, 1, deadline, why, sizeof(why)) != 0) {
        rendezvous_close_(fd);
        snprintf(err, errlen, "rank %d: connected to %s but could not check in: %s; hint: see rank 0's error", rank,
                 spec, why);
        return -1;
    }
    if (rendezvous_io_(fd, h, RENDEZVOUS_HEADER_BYTES, 0, deadline, why, sizeof(why)) != 0) {
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
    return 0;
}

/* The message in err for a status other than RENDEZVOUS_OK in rank 0's answer
 * (world w, blob size b). */
static inline void rendezvous_refusal_(uint32_t status, const char *spec, int rank, int world, uint32_t w, uint64_t b,
                                       size_t blob_bytes, char *err, size_t errlen)
{
    switch (status) {
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
}

static inline int rendezvous_tcp_peer_(const RendezvousSpec_ *s, const char *spec, int rank, int world, void *blob,
                                       size_t blob_bytes, double deadline, double timeout_s, char *err, size_t errlen)
{
    int fd = rendezvous_dial_(s, spec, rank, deadline, timeout_s, err, errlen);
    if (fd < 0)
        return -1;
    unsigned char h[RENDEZVOUS_HEADER_BYTES];
    if (rendezvous_check_in_(fd, spec, rank, world, blob_bytes, deadline, timeout_s, h, err, errlen) != 0)
        return -1;
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
    char why[256];
    if (status == RENDEZVOUS_OK &&
        rendezvous_io_(fd, blob, blob_bytes, 0, rendezvous_now_() + 10.0, why, sizeof(why)) != 0) {
        rendezvous_close_(fd);
        snprintf(err, errlen, "rank %d: the id from rank 0 at %s broke off: %s", rank, spec, why);
        return -1;
    }
    rendezvous_close_(fd);
    if (status == RENDEZVOUS_OK)
        return 0;
    rendezvous_refusal_(status, spec, rank, world, w, b, blob_bytes, err, errlen);
    return -1;
}

#endif /* LLMC_RENDEZVOUS_TCP_H */
