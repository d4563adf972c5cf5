/*
 * linear_shapes.h: the shapes of a layer's four Linear maps (y = x W^T, W
 * [out, in]: qkv, o, gate_up, down) from the model's description, and the room
 * their operands take: what the FP8 codes' scratch and the GEMMs are sized by.
 * Pure arithmetic.
 */
#ifndef LLMC_LINEAR_SHAPES_H
#define LLMC_LINEAR_SHAPES_H

#include <stdint.h>

#include "llmc/model/llama_config.h"

/* A layer's four Linear maps y = x W^T, in this order (with FP8, each layer's map has its own slot, linear.h), and
 * their shapes: W is [out, in]. */
enum { LINEAR_QKV, LINEAR_O, LINEAR_GATE_UP, LINEAR_DOWN, LINEAR_MAPS };
typedef struct {
    int64_t in, out;
} LinearShape;

static inline LinearShape llama_linear_shape(const LlamaConfig *c, int map)
{
    int64_t C = c->d_model, F = c->ffn_dim, HD = (int64_t)c->n_head * c->head_dim;
    int64_t QKV = (int64_t)(c->n_head + 2 * c->n_kv_head) * c->head_dim;
    LinearShape shapes[LINEAR_MAPS] = {{C, QKV}, {HD, C}, {C, 2 * F}, {F, C}};
    return shapes[map];
}

/* What room for the operands of any of n maps of these shapes takes: the widest input and output row, the largest
 * W. */
typedef struct {
    int64_t widest_in, widest_out, largest_w;
} LinearExtents;

static inline LinearExtents linear_extents(const LinearShape *shapes, int n)
{
    LinearExtents e = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        LinearShape s = shapes[i];
        e.widest_in = s.in > e.widest_in ? s.in : e.widest_in;
        e.widest_out = s.out > e.widest_out ? s.out : e.widest_out;
        e.largest_w = s.in * s.out > e.largest_w ? s.in * s.out : e.largest_w;
    }
    return e;
}

/* The extents of a layer's four maps. */
static inline LinearExtents llama_linear_extents(const LlamaConfig *c)
{
    LinearShape shapes[LINEAR_MAPS];
    for (int map = 0; map < LINEAR_MAPS; map++)
        shapes[map] = llama_linear_shape(c, map);
    return linear_extents(shapes, LINEAR_MAPS);
}

/* Whether every input and output dimension of the four maps is a multiple of m (FP8 block scaling: whole 128-blocks
 * along whatever a GEMM sums over). */
static inline int llama_linear_dims_multiple_of(const LlamaConfig *c, int64_t m)
{
    for (int map = 0; map < LINEAR_MAPS; map++) {
        LinearShape s = llama_linear_shape(c, map);
        if (s.in % m != 0 || s.out % m != 0)
            return 0;
    }
    return 1;
}

#endif /* LLMC_LINEAR_SHAPES_H */
