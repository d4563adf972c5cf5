/*
 * rendezvous.h: lets the N processes of a multi-GPU run agree on one opaque
 * blob made by rank 0 (NCCL's 128-byte ncclUniqueId) without MPI, for
 * schedulers that start the processes themselves. A spec string picks how:
 *
 *   tcp://HOST:PORT  every rank connects to rank 0 on HOST:PORT and checks in;
 *                    once the whole world is there, rank 0 answers each with
 *                    the blob (rendezvous_tcp.h)
 *   file:PATH        rank 0 writes the blob to PATH, on a file system all hosts
 *                    share, and the others poll for it; PATH must be fresh per
 *                    run (rendezvous_file.h)
 *
 * The parts:
 *   rendezvous_spec.h  the spec: rendezvous_check_spec, and
 *                      rendezvous_spec_from_env for torchrun's
 *                      MASTER_ADDR/MASTER_PORT (through launch.h's EnvLookup)
 *   rendezvous_wire.h  the 24-byte header and its RENDEZVOUS_* constants,
 *                      clocks and deadlines, deadline-bounded socket I/O
 *   rendezvous_tcp.h   tcp://: rank 0 and the others
 *   rendezvous_file.h  file:: rank 0 and the others
 * This file: rendezvous_share, the entry point; including it alone gives the
 * whole API.
 * Reads: those variables, the network or PATH. Writes: the blob on ranks other
 * than 0, PATH and PATH.tmp.<pid> on rank 0, and err. Prints nothing.
 * Every function returns 0, or -1 with a message in err that names the rank,
 * the spec and what to do.
 */
#ifndef LLMC_RENDEZVOUS_H
#define LLMC_RENDEZVOUS_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/parallel/rendezvous_spec.h"
#include "llmc/parallel/rendezvous_wire.h"
#include "llmc/parallel/rendezvous_tcp.h"
#include "llmc/parallel/rendezvous_file.h"

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
