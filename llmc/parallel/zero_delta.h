/*
 * zero_delta.h: the new weights after AdamW gathered as their changes
 * (ZeroOptions.update, --update-gather delta, issue 28): AdamW writes each
 * weight's change of bf16 bits as a one-byte code (llmc/kernels/delta_codec.h,
 * into Zero.change at each bucket's state_at), the rare weight whose change does
 * not fit goes on its bucket's escape list, and each bucket's codes and escapes
 * are all-gathered and added to the old weights every rank of the group holds:
 * the same bits as the bf16 gather in about half the bytes. Where most changes
 * are small, a bucket's codes travel packed (delta_codec.h: a nibble a weight,
 * the wider codes in a stream beside them), about three eighths of bf16's
 * bytes. Flat, stages 1 and 2 so gather over all ranks; over hosts, stages 1 to
 * 3 so gather over the replica group (the network), and stages 1 and 2 then
 * gather the group shares inside the host in bf16 as before (zero.h's
 * zero_params_changed).
 *
 * The escape lists' gather is sized by the largest count over all ranks, and the
 * packed messages' wide streams by the largest count of wide codes, which the
 * host reads once a step (its one wait; every rank then chooses alike); a
 * bucket whose escapes overflow their room (a ZERO_DELTA_ESCAPES-th of its
 * share) is gathered in bf16 instead, and a bucket packs only where its message
 * is smaller than its codes.
 *
 * Memory (zero.h's zero_allocate): a byte per weight this rank updates and per
 * weight of the largest bucket (its codes or the packed messages of every
 * rank); the escape lists, 8 bytes per 16 weights of each; 4 bytes per 4,096
 * weights this rank updates (the packed offsets); two 8-byte counts per bucket
 * on the device and on the host. Included at the end of zero.h, whose Zero it
 * extends.
 */
#ifndef LLMC_ZERO_DELTA_H
#define LLMC_ZERO_DELTA_H

#include "llmc/kernels/delta_codec.h"

/* Where AdamW writes bucket b's change codes (--update-gather delta), or NULL. */
static inline int8_t *zero_change_codes(const Zero *z, int b)
{
    return z->change ? z->change + z->state_at[b] : NULL;
}

/* --update-gather delta: every bucket's escape list and packed offsets from AdamW's codes, then the largest count
 * of escapes and of wide codes of each over the ranks, on the host (the host's one wait of the step: the gathers'
 * sizes are its to give, and every rank then chooses alike). */
static inline void zero_delta_counts_(Zero *z)
{
    int n = z->plan.n_buckets;
    profile_comm_begin(z->comm, "sizes", n); /* --profile-step's timeline */
    for (int b = 0; b < n; b++) {
        unsigned long long *list = z->escapes + z->escape_at[b];
        delta_escapes(zero_change_codes(z, b), zero_update_weights(z, b), z->update_count[b], list, z->escape_room[b],
                      z->comm);
        CUDA_CHECK(cudaMemcpyAsync(z->delta_counts + b, list, sizeof(*list), cudaMemcpyDeviceToDevice, z->comm));
        delta_wide_offsets(zero_change_codes(z, b), z->update_count[b], z->wide_offsets + z->wide_at[b],
                           z->delta_counts + n + b, z->comm);
    }
    dist_all_reduce_max(&z->dist->all, z->delta_counts, 2 * n, 8, z->comm);
    CUDA_CHECK(cudaMemcpyAsync(z->h_delta_counts, z->delta_counts, sizeof(unsigned long long) * 2 * n,
                               cudaMemcpyDeviceToHost, z->comm));
    profile_comm_end(z->comm);
    CUDA_CHECK(cudaStreamSynchronize(z->comm));
}

/* Bucket b's new weights at dst [g->size pieces of its update count] from the changes and escapes of group g's
 * ranks, this rank's piece (self) new already (see the top): packed where that is fewer bytes than the codes (the
 * largest wide count decides, alike on every rank). Returns the bytes each rank sent; *packed whether packed. */
static inline int64_t zero_gather_changes_(Zero *z, int b, const DistGroup *g, bf16 *dst, int self, int *packed)
{
    int64_t piece = z->update_count[b], stride = 1 + (int64_t)z->h_delta_counts[b];
    int64_t msg = delta_packed_bytes(piece, (int64_t)z->h_delta_counts[z->plan.n_buckets + b]);
    *packed = msg < piece;
    if (*packed) { /* gathered in place: this rank's message in its own slot */
        int8_t *mine = z->change_all + (int64_t)self * msg;
        delta_pack(zero_change_codes(z, b), piece, z->wide_offsets + z->wide_at[b], mine, z->comm);
        dist_all_gather(g, mine, z->change_all, msg, 1, z->comm);
    } else {
        dist_all_gather(g, zero_change_codes(z, b), z->change_all, piece, 1, z->comm);
    }
    dist_all_gather(g, z->escapes + z->escape_at[b], z->escapes_all, stride, 8, z->comm);
    if (*packed)
        delta_unpack(dst, z->change_all, msg, z->escapes_all, stride, piece, g->size, self, z->comm);
    else
        delta_decode(dst, z->change_all, z->escapes_all, stride, piece, g->size, self, z->comm);
    return (*packed ? msg : piece) + stride * 8;
}

#endif /* LLMC_ZERO_DELTA_H */
