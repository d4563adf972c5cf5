"""Writes the binary seed corpora of the fuzz targets (tests/fuzz/corpus/{llmt,shard,train_state}) with the
project's own writers, so the seeds are valid files the fuzzer then mutates: small .llmt weights files
(reference/tensorfile.py), token shards behind fuzz_shard's settings and data position (data/prepare.py), and
train_state files of one rank and of two (the layout of llmc/formats/train_state.h). The seeds are committed; run this
again only when a format changes.   python3 tests/fuzz/make_seeds.py"""
import os
import struct
import sys
import types
from array import array

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "reference"))
sys.path.insert(0, os.path.join(ROOT, "data"))
import prepare  # noqa: E402
import tensorfile  # noqa: E402


def corpus(name):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    return d


def llmt_seeds():
    rng = np.random.default_rng(0)
    for name, tie, rope in (("tiny_tied.llmt", 1, "none"), ("tiny_untied_llama3.llmt", 0, "llama3")):
        V, C, L, H, KV, D, F = 16, 8, 1, 2, 1, 4, 8
        meta = {"kind": "weights", "config.vocab_size": V, "config.d_model": C, "config.n_layer": L,
                "config.n_head": H, "config.n_kv_head": KV, "config.head_dim": D, "config.ffn_dim": F,
                "config.max_seq_len": 32, "config.rope_theta": 10000.0, "config.rope_scaling": rope,
                "config.rope_factor": 8.0 if rope == "llama3" else 0, "config.rope_low_freq_factor": 1.0,
                "config.rope_high_freq_factor": 4.0, "config.rope_original_max_pos": 16, "config.norm_eps": 1e-5,
                "config.tie_embeddings": tie, "config.init_std": 0.02}
        shapes = [("model.embed_tokens.weight", (V, C))]
        for layer in range(L):
            p = f"model.layers.{layer}."
            shapes += [(p + "self_attn.q_proj.weight", (H * D, C)), (p + "self_attn.k_proj.weight", (KV * D, C)),
                       (p + "self_attn.v_proj.weight", (KV * D, C)), (p + "self_attn.o_proj.weight", (C, H * D)),
                       (p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                       (p + "mlp.down_proj.weight", (C, F)), (p + "input_layernorm.weight", (C,)),
                       (p + "post_attention_layernorm.weight", (C,))]
        shapes.append(("model.norm.weight", (C,)))
        if not tie:
            shapes.append(("lm_head.weight", (V, C)))
        tensors = [(n, rng.standard_normal(s).astype(np.float32)) for n, s in shapes]
        tensorfile.write(os.path.join(corpus("llmt"), name), meta, tensors)
    # a dump-like file: an int32 tensor beside float ones, no config
    tensorfile.write(os.path.join(corpus("llmt"), "dump_like.llmt"), {"kind": "dump"},
                     [("input_tokens", np.arange(12, dtype=np.int32).reshape(2, 6)),
                      ("logits", rng.standard_normal((2, 6, 4)).astype(np.float32))])


def shard_seeds():
    """fuzz_shard's input: B-1, T-1, flags (1 shuffle, 2 the loader's own layout, 4 a model vocab of 300),
    a data position (epoch, shard, window, seed, layout), then the shard."""
    d = corpus("shard")
    rng = np.random.default_rng(1)
    for name, vocab, n, typecode, bos, eos, settings, position in (
            ("u16_shuffled.bin", 300, 200, "H", 1, 2, (1, 7, 1 | 2 | 4), (0, 0, 3, 1234, 0)),
            ("u16_in_order.bin", 300, 120, "H", 0, -1, (0, 15, 2), (1, 0, 1, 1234, 0)),
            ("u32_big_vocab.bin", 100000, 90, "I", 99998, 99999, (3, 3, 1 | 2), (0, 0, 0, 7, 0)),
            ("u16_loss_mask.bin", 300, 150, "H", 1, 2, (1, 7, 2 | 4), (0, 0, 2, 99, 0))):
        tokens = array(typecode, rng.integers(0, vocab, n).tolist())
        tmp = os.path.join(d, name + ".shard")
        mask = bytes(int(i % 4 != 0) for i in range(n)) if "mask" in name else None  # a version 2 shard
        prepare.write_shard(tmp, tokens, types.SimpleNamespace(vocab_size=vocab, bos_id=bos, eos_id=eos), mask)
        with open(tmp, "rb") as f:
            shard = f.read()
        os.remove(tmp)
        with open(os.path.join(d, name), "wb") as f:
            f.write(bytes(settings) + struct.pack("<5Q", *position) + shard)


def state_file(step, rank, world, total, ranges, version=2):
    count = sum(c for _, c in ranges)
    h = bytearray(128)
    h[0:8] = b"LLMCKPT\0"
    struct.pack_into("<IIQQQiiq", h, 8, version, 128, step, step, 42, rank, world, total)
    if version == 1:
        struct.pack_into("<qq", h, 56, ranges[0][0], count)
    else:
        struct.pack_into("<qq", h, 56, len(ranges), count)
    struct.pack_into("<5Q", h, 72, 0, 0, 3, 1337, 0xABCDEF)
    table = b"".join(struct.pack("<qq", o, c) for o, c in ranges) if version == 2 else b""
    moments = np.arange(2 * count, dtype=np.float32).tobytes()
    return bytes(h) + table + moments


def train_state_seeds():
    d = corpus("train_state")
    with open(os.path.join(d, "one_rank.bin"), "wb") as f:
        f.write(state_file(5, 0, 1, 40, [(0, 40)]))
    with open(os.path.join(d, "one_rank_v1.bin"), "wb") as f:
        f.write(state_file(5, 0, 1, 24, [(0, 24)], version=1))
    # two ranks with interleaved per-bucket slices, as ZeRO writes them
    with open(os.path.join(d, "two_ranks.bin"), "wb") as f:
        f.write(state_file(9, 0, 2, 48, [(0, 8), (16, 8), (32, 8)]) + b"=NEXTFILE=" +
                state_file(9, 1, 2, 48, [(8, 8), (24, 8), (40, 8)]))


if __name__ == "__main__":
    llmt_seeds()
    shard_seeds()
    train_state_seeds()
    for name in ("llmt", "shard", "train_state"):
        d = corpus(name)
        print(f"{d}: {', '.join(f'{f} ({os.path.getsize(os.path.join(d, f))} B)' for f in sorted(os.listdir(d)))}")
