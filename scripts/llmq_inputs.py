#!/usr/bin/env python3
"""The inputs llmq (github.com/IST-DASLab/llmq, a benchmark peer built by scripts/build_llmq.sh) trains on, for
the GPU machine, which cannot download them: a model directory with only config.json (llmq's --from-scratch
takes its shape from it) and llmq's token files, from this project's shards or random tokens.

  python3 scripts/llmq_inputs.py OUT --model qwen2.5-1.5b --random-tokens 4000000
  python3 scripts/llmq_inputs.py OUT --model llama3.1-8b --layers 8 --random-tokens 4000000
  python3 scripts/llmq_inputs.py OUT --model llama3.2-1b --train 'data/shards/corpus_train_*.bin' \\
      --val 'data/shards/corpus_val_*.bin'

writes OUT/model/config.json, OUT/train.bin and OUT/eval.bin. llmq's token file (src/training/dataloader.cpp):
a header of 256 int32 (1024 bytes): the magic "BIN.TOK\\n" in the first two, then version 2, bytes per token
(4), the number of tokens, the vocabulary size, whether loss masks follow (0 here); then the tokens as int32.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))

MAGIC = b"BIN.TOK\n"
HEADER_INTS = 256

# config.json of the published models (their HF directories), as llmq reads them
LLAMA3 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
          "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
          "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": False,
          "mlp_bias": False, "initializer_range": 0.02, "torch_dtype": "bfloat16", "bos_token_id": 128000,
          "eos_token_id": 128001}


def llama3(hidden, ffn, layers, head_dim, rope_factor, tied):
    """A Llama 3 config.json: the family's fields and these sizes."""
    return dict(LLAMA3, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers, head_dim=head_dim,
                rope_scaling={"rope_type": "llama3", "factor": rope_factor, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                tie_word_embeddings=tied)


MODELS = {
    "llama3.2-1b": llama3(hidden=2048, ffn=8192, layers=16, head_dim=64, rope_factor=32.0, tied=True),
    "llama3.1-8b": llama3(hidden=4096, ffn=14336, layers=32, head_dim=128, rope_factor=8.0, tied=False),
    "qwen2.5-1.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
        "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": None,
        "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02,
        "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151643},
}


def write_token_file(path, tokens, vocab_size):
    """tokens (any integer array) as llmq's version-2 token file."""
    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise SystemExit(f"error: token ids outside [0, {vocab_size}) for {path}")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:2] = np.frombuffer(MAGIC, dtype=np.int32)
    header[2:7] = (2, 4, tokens.size, vocab_size, 0)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    os.replace(path + ".tmp", path)


def read_token_file(path):
    """(version, bytes per token, vocab size, tokens) of a token file written above (for the tests)."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(4 * HEADER_INTS), dtype=np.int32)
        if header[:2].tobytes() != MAGIC:
            raise ValueError(f"{path}: not an llmq token file")
        tokens = np.frombuffer(f.read(), dtype=np.int32)
    return int(header[2]), int(header[3]), int(header[5]), tokens[:int(header[4])]


def shard_tokens(pattern):
    import prepare
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise SystemExit(f"error: no shard matches {pattern}")
    return np.concatenate([np.asarray(prepare.read_shard(p)[1], dtype=np.int64) for p in paths])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="output folder")
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--train", metavar="GLOB", help="this project's train shards (data/prepare.py)")
    p.add_argument("--val", metavar="GLOB", help="and its val shards")
    p.add_argument("--random-tokens", type=int, metavar="N", help="instead: N random tokens each (a throughput run)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--layers", type=int, metavar="L", help="the model cut to its first L layers (the 8B cut to 8)")
    args = p.parse_args(argv)
    if (args.random_tokens is None) == (args.train is None):
        p.error("give --train (and --val) or --random-tokens")
    config = dict(MODELS[args.model])
    if args.layers is not None:
        if not 1 <= args.layers <= config["num_hidden_layers"]:
            p.error(f"--layers {args.layers}: {args.model} has 1 to {config['num_hidden_layers']}")
        config["num_hidden_layers"] = args.layers
    vocab = config["vocab_size"]
    os.makedirs(os.path.join(args.out, "model"), exist_ok=True)
    with open(os.path.join(args.out, "model", "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if args.random_tokens is not None:
        rng = np.random.default_rng(args.seed)
        train, val = (rng.integers(0, vocab, args.random_tokens) for _ in range(2))
    else:
        train = shard_tokens(args.train)
        val = shard_tokens(args.val) if args.val else train[:max(1, train.size // 100)]
    write_token_file(os.path.join(args.out, "train.bin"), train, vocab)
    write_token_file(os.path.join(args.out, "eval.bin"), val, vocab)
    print(f"{args.out}: model/config.json ({args.model}), train.bin {train.size:,} tokens, eval.bin {val.size:,}")


if __name__ == "__main__":
    main()
