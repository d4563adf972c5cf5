/*
 * rendezvous_wire.h: what the rendezvous (rendezvous.h) puts on the wire and
 * in its file, and the deadline-bounded I/O under it.
 *
 * The header, 24 bytes, big-endian: the 8-byte magic, a 4-byte rank (from a
 * peer or in the file) or status (in rank 0's answer), the 4-byte world size
 * and the 8-byte blob size. Time is CLOCK_MONOTONIC seconds; every wait is
 * bounded by an absolute deadline in those seconds. Sockets are made
 * non-blocking and close-on-exec, and rendezvous_io_ moves all n bytes before
 * the deadline, across partial transfers and signals.
 * Reads and writes the buffers and descriptors it is given; writes the reason
 * for a failure to why. Prints nothing.
 */
#ifndef LLMC_RENDEZVOUS_WIRE_H
#define LLMC_RENDEZVOUS_WIRE_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

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

/* ----------------------------------------------------------------------------
 * Time */

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

/* ----------------------------------------------------------------------------
 * The header */

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

/* ----------------------------------------------------------------------------
 * Descriptors */

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

#endif /* LLMC_RENDEZVOUS_WIRE_H */
