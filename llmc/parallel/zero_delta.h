/*
 * zero_delta.h: the new weights after AdamW gathered as their changes
 * (ZeroOptions.update, --update-gather delta, issue 28): AdamW writes each
 * weight's change of bf16 bits as a one-byte code (llmc/kernels/delta_codec.h,
 * into Zero.change at each bucket's state_at), the rare weight whose change does
 * not fit goes on its bucket's escape list, and each bucket's codes and escapes
 * are all-gathered and added to the old weights every rank of the group holds:
 * the same bits as the bf16 gather in about half the bytes. Flat, stages 1 and 2
 * so gather over all ranks; over hosts, stages 1 to 3 so gather over the replica
 * group (the network), and stages 1 and 2 then gather the group shares inside
 * the host in bf16 as before (zero.h's zero_params_changed).
 *
 * The escape lists' gather is sized by the largest count over all ranks, which
 * the host reads once a step (its one wait; every rank then chooses alike); a
 * bucket whose escapes overflow their room (a ZERO_DELTA_ESCAPES-th of its
 * share) is gathered in bf16 instead.
 *
 * Memory (zero.h's zero_allocate): a byte per weight this rank updates and per
 * weight of the largest bucket; the escape lists, 8 bytes per 16 weights of
 * each; a float per bucket on the device and on the host. Included at the end
 * of zero.h, whose Zero it extends.
 */
#ifndef LLMC_ZERO_DELTA_H
#define LLMC_ZERO_DELTA_H

#include "llmc/kernels/delta_codec.h"

/* Where AdamW writes bucket b's change codes (--update-gather delta), or NULL. */
static inline int8_t *zero_change_codes(const Zero *z, int b)
{
    return z->change ? z->change + z->state_at[b] : NULL;
}

/* count[0] = an escape list's count, as a float for the all-reduce's max (exact below 2^24: a share of 268M weights
 * has room for 16.8M escapes). */
__global__ void zero_escape_count_kernel(float *count, const unsigned long long *list)
{
    count[0] = (float)list[0];
}

/* --update-gather delta: every bucket's escape list from AdamW's codes, then the largest count of each over the
 * ranks, on the host (the host's one wait of the step: the escape gathers' sizes are its to give). */
static inline void zero_escape_counts_(Zero *z)
{
    int n = z->plan.n_buckets;
    for (int b = 0; b < n; b++) {
        delta_escapes(zero_change_codes(z, b), zero_update_weights(z, b), z->update_count[b],
                      z->escapes + z->escape_at[b], z->escape_room[b], z->comm);
        zero_escape_count_kernel<<<1, 1, 0, z->comm>>>(z->escape_count + b, z->escapes + z->escape_at[b]);
        CUDA_CHECK_LAST();
    }
    dist_all_reduce_max(&z->dist->all, z->escape_count, n, z->comm); /* every rank then chooses the same way */
    CUDA_CHECK(cudaMemcpyAsync(z->h_escape_count, z->escape_count, sizeof(float) * n, cudaMemcpyDeviceToHost, z->comm));
    CUDA_CHECK(cudaStreamSynchronize(z->comm));
}

/* Bucket b's new weights at dst [g->size pieces of its update count] from the change codes and escapes of group g's
 * ranks, this rank's piece (self) new already (see the top). */
static inline void zero_gather_changes_(Zero *z, int b, const DistGroup *g, bf16 *dst, int self)
{
    int64_t piece = z->update_count[b], stride = 1 + (int64_t)z->h_escape_count[b];
    dist_all_gather(g, zero_change_codes(z, b), z->change_all, piece, 1, z->comm);
    dist_all_gather(g, z->escapes + z->escape_at[b], z->escapes_all, stride, 8, z->comm);
    delta_decode(dst, z->change_all, z->escapes_all, stride, piece, g->size, self, z->comm);
}

#endif /* LLMC_ZERO_DELTA_H */
