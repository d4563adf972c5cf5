"""The Python side of scripts/hf_check.sh (a GPU machine with torch and transformers): HF model directories
made by transformers' save_pretrained go into train_llama, and what train_llama writes comes back out.

  make OUT     models with shapes unlike the presets, saved by save_pretrained in bf16: OUT/hf_tied (one
               file) and OUT/hf_untied (shards of at most 20 MB with an index), Llama's; OUT/hf_qwen2 (q, k, v
               biases, tied), OUT/hf_qwen3 (q/k norms, head_dim free of the width, untied) and OUT/hf_mistral;
               a shard of exactly one window
               (B=2 x T=256 + 1 tokens of real text, from the default corpus's val shard); transformers' loss of
               each model on that window (OUT/hf_losses.json)
  names        the models' names (no OUT), for the shell's loop
  compare OUT  train_llama's first-step loss from each directory against transformers' (OUT/train_*.jsonl);
               the bf16 export and the fp32 checkpoint of the trained models load with from_pretrained and give
               the same logits within bf16 tolerance; AutoTokenizer reads the exported tokenizer
  greedy OUT   the greedy sample train_llama logged (OUT/tiny.jsonl) against transformers' generate from the
               exported model (OUT/tiny): the same first 20 tokens
Prints PASS/FAIL lines; exits 1 if any failed."""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          Qwen2Config, Qwen3Config)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
import prepare  # noqa: E402

B, T = 2, 256
# Tolerances. train_llama keeps the weights in fp32 (master) but computes in bf16 (8 significant bits):
LOSS_TOL = 1e-2    # the mean of 512 token losses: bf16 rounding in every layer, mostly cancelling (test_llama: 5e-3)
LOGITS_TOL = 2.5e-2  # max|a - b| / max|b| of the logits: bf16-rounded weights against fp32 ones (test_llama's forward)
failed = 0
ONLY = os.environ.get("HF_MODELS", "").split()  # a subset of shapes()' names, as scripts/hf_check.sh takes them


def result(ok, what):
    global failed
    print(("PASS " if ok else "FAIL ") + what)
    failed += not ok


def shapes(only=None):
    """name: (config class, its arguments). Unlike every preset: 192 wide, 6 heads of 32 with 2 KV heads, 3
    layers, an FFN of 512; Qwen3's heads 48 wide (6 x 48 = 288, not 192), as its real ones are 128 at any width."""
    common = dict(vocab_size=128256, hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=2048,
                  rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001)
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    plain = {"rope_type": "default", "rope_theta": 1000000.0}
    every = {"tied": (LlamaConfig, dict(common, head_dim=32, rope_parameters=llama3, tie_word_embeddings=True)),
            "untied": (LlamaConfig, dict(common, head_dim=32, rope_parameters=llama3, tie_word_embeddings=False)),
            "qwen2": (Qwen2Config, dict(common, rope_parameters=plain, tie_word_embeddings=True,
                                        use_sliding_window=False)),
            "qwen3": (Qwen3Config, dict(common, head_dim=48, rope_parameters=plain, tie_word_embeddings=False,
                                        attention_bias=False, use_sliding_window=False)),
            "mistral": (MistralConfig, dict(common, head_dim=32, rope_parameters=plain, tie_word_embeddings=False,
                                            sliding_window=None))}
    unknown = [n for n in (only or []) if n not in every]
    if unknown:
        raise SystemExit(f"error: no model named {unknown} (the names: {' '.join(every)})")
    return {n: every[n] for n in only} if only else every


def window():
    val = os.path.join(ROOT, "data", "shards", "corpus_val_000000.bin")
    with open(val, "rb") as f:
        f.read(1024)
        return np.frombuffer(f.read((B * T + 1) * 4), dtype=np.uint32).astype(np.int64)


def hf_loss(model, tokens):
    inputs = torch.tensor(tokens[:B * T].reshape(B, T)).cuda()
    targets = torch.tensor(tokens[1:].reshape(B, T)).cuda()
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item(), logits


def make(out):
    torch.manual_seed(0)
    tokens = window()
    from array import array
    import types
    prepare.write_shard(os.path.join(out, "window_train_000000.bin"), array("I", tokens.tolist()),
                        types.SimpleNamespace(vocab_size=128256, bos_id=128000, eos_id=128001))
    losses = {}
    for name, (config_class, kw) in shapes(ONLY).items():
        model = AutoModelForCausalLM.from_config(config_class(**kw)).to(torch.bfloat16)
        if name == "qwen2":  # HF initialises the biases to zero: random ones, so that a dropped bias shows
            with torch.no_grad():
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                        proj.bias.normal_(0.0, 0.1)
        model.save_pretrained(os.path.join(out, f"hf_{name}"), max_shard_size="20MB" if name == "untied" else "10GB")
        files = sorted(os.listdir(os.path.join(out, f"hf_{name}")))
        print(f"{name}: {type(model).__name__} {files}")
        loaded = AutoModelForCausalLM.from_pretrained(os.path.join(out, f"hf_{name}"), dtype=torch.float32).cuda()
        losses[name] = hf_loss(loaded, tokens)[0]
    json.dump(losses, open(os.path.join(out, "hf_losses.json"), "w"))
    print("transformers' losses on the window:", losses)


def first_loss(path):
    return next(r["loss"] for r in map(json.loads, open(path)) if "loss" in r)


def compare(out):
    tokens = window()
    ref = json.load(open(os.path.join(out, "hf_losses.json")))
    for name, (_, kw) in shapes(ONLY).items():
        got = first_loss(os.path.join(out, f"train_{name}.jsonl"))
        rel = abs(got - ref[name]) / abs(ref[name])
        result(rel <= LOSS_TOL, f"{name}: train_llama's first-step loss from the HF directory {got:.6f}, "
               f"transformers' {ref[name]:.6f}: relative difference {rel:.2e} (tol {LOSS_TOL:g})")
        fp32 = AutoModelForCausalLM.from_pretrained(os.path.join(out, f"ck_{name}", "step_00000020"),
                                                    dtype=torch.float32).cuda()
        bf16 = AutoModelForCausalLM.from_pretrained(os.path.join(out, f"exp_{name}"), dtype=torch.float32).cuda()
        head_dim = getattr(bf16.config, "head_dim", None) or bf16.config.hidden_size // bf16.config.num_attention_heads
        result(type(bf16).__name__ == type(fp32).__name__ and kw.get("head_dim", 32) == head_dim,
               f"{name}: the export and the checkpoint load as {type(bf16).__name__}, head_dim {head_dim}")
        _, a = hf_loss(fp32, tokens)
        _, b = hf_loss(bf16, tokens)
        err = ((b - a).abs().max() / a.abs().max()).item()
        result(err <= LOGITS_TOL, f"{name}: the bf16 export's logits against the fp32 checkpoint's (both through "
               f"from_pretrained): max rel error {err:.2e} (tol {LOGITS_TOL:g})")
        cfg = json.load(open(os.path.join(out, f"exp_{name}", "config.json")))
        tied = kw["tie_word_embeddings"]
        result(cfg["torch_dtype"] == "bfloat16" and cfg["tie_word_embeddings"] == tied,
               f"{name}: the export's config.json says bfloat16 and tie_word_embeddings {tied}")
    if "untied" not in shapes(ONLY):
        return
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "exp_untied"))
    ids = tok.encode("In the beginning God created the heaven and the earth.")
    tiktoken_file = os.path.join(ROOT, "data", "shards", "corpus_tokenizer.model")  # the llama3 file, sha256-checked
    want = prepare.load_tokenizer("llama3", tiktoken_file).encoding.encode(
        "In the beginning God created the heaven and the earth.")
    result(ids == want and tok.bos_token_id == 128000,
           f"AutoTokenizer reads the exported tokenizer: {len(tok)} tokens, ids as tiktoken's")


def greedy(out):
    sample = [r for r in map(json.loads, open(os.path.join(out, "tiny.jsonl"))) if "sample" in r][-1]
    ours = sample["tokens"]
    model = LlamaForCausalLM.from_pretrained(os.path.join(out, "tiny"), dtype=torch.float32).cuda()
    with torch.no_grad():
        theirs = model.generate(torch.tensor([ours[:1]]).cuda(), max_new_tokens=20, do_sample=False)[0].tolist()
    n = min(len(ours), len(theirs), 21)
    same = next((i for i in range(1, n) if ours[i] != theirs[i]), n) - 1
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tiny"))
    print("train_llama:  ", repr(sample["sample"]))
    print("transformers: ", repr(tok.decode(theirs[1:])))
    result(ours[:21] == theirs[:21] or same >= 20, f"greedy samples of train_llama (bf16) and transformers' generate (fp32) from the same "
           f"weights agree on the first {same} tokens (want 20)")


if __name__ == "__main__":
    if sys.argv[1:] == ["names"]:
        print(" ".join(shapes(ONLY)))
        sys.exit(0)
    cmd, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    {"make": make, "compare": compare, "greedy": greedy}[cmd](out)
    sys.exit(1 if failed else 0)
