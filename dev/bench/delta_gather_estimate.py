#!/usr/bin/env python3
"""How many bytes an exact delta gather of the updated weights would move (issue 28's lever for ZeRO 1 and 2).

After AdamW each rank all-gathers its share of the new bf16 weights (2 bytes a weight). Every rank still holds the
old weights bit for bit, so a share could travel as the change of each weight's bf16 bit pattern, new - old, in one
signed byte, and exactly as its new bf16 value (with a 4-byte index: 8 bytes in all, packed) where the change does
not fit in [-127, 127]. This estimates the share of such escapes, and so the bytes a weight, for AdamW steps of
typical size on weights of typical spread: an Adam step is lr x m / sqrt(v), between about 0.1 lr and lr in size
(uniform here) and of either sign, plus decoupled weight decay (0.1). Weights near zero, whose bf16 ulp is below
lr / 127, escape; the smaller the weights and the larger lr, the more.

Packed (llmc/kernels/delta_codec.h), a change in [-7, 7] travels as a nibble and a wider one as the nibble's marker
and its byte in a stream beside them (an escape as well, beside its entry): half a byte a weight, a byte per wide
change, 4 bytes per 4,096 weights, and the escapes' 8; zero.h packs a bucket where that is less than the byte codes.
The entropy of the changes (bits a weight) bounds what any code of them could send.

  python3 dev/bench/delta_gather_estimate.py
  python3 dev/bench/delta_gather_estimate.py --lr 3e-4 --std 0.02 0.008
"""
import argparse

import numpy as np


def bf16_bits(x):
    """fp32 to bf16 bit patterns, rounded to nearest, ties to even (finite values)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def changes(lr, std, n, rng, decay=0.1):
    """The fractions of weights whose bf16 bit change after one AdamW step does not fit a signed byte (escapes) and
    does not fit a nibble's [-7, 7] (wide, the escapes among them), and the entropy of the changes in bits a weight
    (the escapes one symbol): what no code of the changes alone can go below."""
    w = rng.normal(0.0, std, n).astype(np.float32)
    step = lr * rng.uniform(0.1, 1.0, n) * rng.choice([-1.0, 1.0], n) + lr * decay * w
    change = bf16_bits(w - step).astype(np.int32) - bf16_bits(w).astype(np.int32)
    _, counts = np.unique(np.where(np.abs(change) > 127, 128, change), return_counts=True)
    p = counts / n
    return float(np.mean(np.abs(change) > 127)), float(np.mean(np.abs(change) > 7)), float(-(p * np.log2(p)).sum())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lr", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    p.add_argument("--std", type=float, nargs="+", default=[0.02, 0.005], help="the weights' standard deviation")
    p.add_argument("-n", type=int, default=2_000_000, help="weights drawn per setting")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    print("lr        weight std  escapes  wide     entropy  bytes a weight: codes  packed  sent  of bf16's 2")
    for lr in args.lr:
        for std in args.std:
            e, wide, bits = changes(lr, std, args.n, rng)
            codes = 1.0 + 8.0 * e
            packed = 0.5 + wide + 4.0 / 4096 + 8.0 * e
            sent = min(codes, packed)
            print("%-9g %-11g %6.2f%%  %6.2f%%  %4.2f b   %5.3f                  %5.3f   %5.3f %.2fx" %
                  (lr, std, 100 * e, 100 * wide, bits, codes, packed, sent, sent / 2))


if __name__ == "__main__":
    main()
