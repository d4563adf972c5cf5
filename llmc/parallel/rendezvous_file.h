/*
 * rendezvous_file.h: the file:PATH rendezvous (rendezvous.h).
 *
 * Rank 0 removes a stale PATH, writes the header (rank 0, world, blob size;
 * rendezvous_wire.h) and the blob to PATH.tmp.<pid>, fsyncs it and renames it
 * to PATH, so a reader sees all of it or nothing. The other ranks poll for PATH
 * until the deadline and reject a file whose world or blob size differs. PATH
 * must be on a file system all hosts share.
 * Limitation: a reader may find a stale PATH from an earlier run before rank 0
 * removes it, and nothing in the file can tell the runs apart when their world
 * sizes are equal; the reader then takes the old blob and NCCL hangs or fails.
 * So PATH must be fresh per run: put the job id in it. The file stays behind:
 * rank 0 cannot know when all have read it.
 * Reads PATH (ranks other than 0). Writes PATH and PATH.tmp.<pid> (rank 0), the
 * blob (the other ranks) and err. Prints nothing.
 */
#ifndef LLMC_RENDEZVOUS_FILE_H
#define LLMC_RENDEZVOUS_FILE_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/parallel/rendezvous_wire.h"

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

#endif /* LLMC_RENDEZVOUS_FILE_H */
