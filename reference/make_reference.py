"""Build a HuggingFace model (LlamaForCausalLM, or Qwen2, Qwen3 or Mistral's) from a config and a seed, and write the
ground truth that the C reference and the CUDA trainer are checked against:

  <out>/<name>.weights.llmt   the weights, HF names and layouts, float32
  <out>/<name>.dump.llmt      logits, loss, every gradient, every block output,
                              and the losses and grad norms of N AdamW steps

Format: docs/tensor_file_format.md. Everything runs in float32 on the CPU with
eager attention, so the dump does not depend on a GPU or its kernels. A config
with "docs" packs documents into each row (--doc-mask): HF gets position_ids
restarting at each document and a 4D block-causal mask, and the dump's metadata
names the document token (dump.doc_bos).

  python3 reference/make_reference.py                  # every test config
  python3 reference/make_reference.py --config tiny_gqa_tied --out-dir /tmp/x
  python3 reference/make_reference.py --from-hf DIR --name NAME --shard S -B 2 -T 64 --out-dir /tmp/x
      # the model of an HF directory (as from_pretrained loads it, in float32) on the
      # first B x (T + 1) tokens of shard S: checks train_llama's forward, backward and
      # steps against that model with ./test_llama /tmp/x/NAME.dump.llmt

Needs torch and transformers (the lent GPU machine has both; CPU mode is fine).
"""
import argparse
import datetime
import os
import platform
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensorfile  # noqa: E402

IGNORE_INDEX = -100

# The committed test configs. Between them they cover tied and untied
# embeddings, grouped-query (n_kv_head < n_head) and plain multi-head attention,
# RoPE with and without Llama 3.1 scaling (original_max_pos is small so that all
# three frequency bands of the scaling occur at head_dim 24), sequence lengths
# that are not powers of two and vocabularies that are not multiples of 64.
CONFIGS = {
    "tiny_gqa_tied": dict(
        vocab_size=1000, d_model=64, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=176,
        max_seq_len=64, rope_theta=10000.0, rope_scaling="none", norm_eps=1e-5,
        tie_embeddings=1, init_std=0.08, B=3, T=13),
    "small_mha_untied_rope31": dict(
        vocab_size=777, d_model=96, n_layer=3, n_head=4, n_kv_head=4, ffn_dim=256,
        max_seq_len=256, rope_theta=500000.0, rope_scaling="llama3", rope_factor=8.0,
        rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_pos=64,
        norm_eps=1e-6, tie_embeddings=0, init_std=0.06, B=2, T=40),
    # Packed documents (--doc-mask): rows cut into documents at token doc_bos, each attending only to itself with
    # positions from 0 (HF: position_ids and a 4D block-causal mask in eager attention). Row 0 begins inside a
    # document (no BOS at its start) and holds one of a single token; lengths per row in "docs".
    "packed_docs_gqa": dict(
        vocab_size=1000, d_model=64, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=176,
        max_seq_len=64, rope_theta=10000.0, rope_scaling="none", norm_eps=1e-5,
        tie_embeddings=1, init_std=0.08, B=2, T=40, doc_bos=1, docs=[[5, 12, 1, 22], [17, 23]]),
    # The other families (llmc/model/llama_config.h's family): Qwen2's q, k, v biases (tied, as its small sizes
    # are); Qwen3's RMSNorm of each q and k head before RoPE, with head_dim 24 so that n_head x head_dim (96) is not
    # d_model (64), untied; Mistral, Llama's layer with one KV head here and no sliding window.
    "qwen2_tiny_bias": dict(
        family="qwen2", vocab_size=1000, d_model=64, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=176,
        max_seq_len=64, rope_theta=1000000.0, rope_scaling="none", norm_eps=1e-6,
        tie_embeddings=1, init_std=0.08, B=2, T=17),
    "qwen3_tiny_qknorm": dict(
        family="qwen3", vocab_size=999, d_model=64, n_layer=2, n_head=4, n_kv_head=2, head_dim=24, ffn_dim=160,
        max_seq_len=64, rope_theta=1000000.0, rope_scaling="none", norm_eps=1e-6,
        tie_embeddings=0, init_std=0.08, B=2, T=19),
    "mistral_tiny": dict(
        family="mistral", vocab_size=1000, d_model=64, n_layer=2, n_head=4, n_kv_head=1, ffn_dim=160,
        max_seq_len=64, rope_theta=1000000.0, rope_scaling="none", norm_eps=1e-5,
        tie_embeddings=0, init_std=0.08, B=2, T=15),
}

# What each family computes besides Llama's layer (llmc/model/llama_config.h's qkv_bias, qk_norm).
FAMILY_OPTIONS = {"llama": dict(qkv_bias=0, qk_norm=0), "qwen2": dict(qkv_bias=1, qk_norm=0),
                  "qwen3": dict(qkv_bias=0, qk_norm=1), "mistral": dict(qkv_bias=0, qk_norm=0)}

OPTIM = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


def hf_config(cfg):
    rope = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    if cfg["rope_scaling"] == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": cfg["rope_theta"], "factor": cfg["rope_factor"],
                "low_freq_factor": cfg["rope_low_freq_factor"], "high_freq_factor": cfg["rope_high_freq_factor"],
                "original_max_position_embeddings": cfg["rope_original_max_pos"]}
    common = dict(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["ffn_dim"],
        num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
        num_key_value_heads=cfg["n_kv_head"], max_position_embeddings=cfg["max_seq_len"],
        rms_norm_eps=cfg["norm_eps"], initializer_range=cfg["init_std"],
        tie_word_embeddings=bool(cfg["tie_embeddings"]), rope_parameters=rope, hidden_act="silu",
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    head_dim = cfg.get("head_dim") or cfg["d_model"] // cfg["n_head"]
    family = cfg.get("family", "llama")
    if family == "qwen2":  # its head_dim is hidden_size / heads; q, k, v always have biases
        assert head_dim == cfg["d_model"] // cfg["n_head"]
        return Qwen2Config(**common, use_sliding_window=False)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=head_dim, attention_bias=False, use_sliding_window=False)
    if family == "mistral":
        return MistralConfig(**common, head_dim=head_dim, sliding_window=None)
    return LlamaConfig(**common, head_dim=head_dim, attention_bias=False, mlp_bias=False)


def init_weights(model, std, generator):
    # HF's init (normal(0, std) for matrices) but with RMSNorm weights drawn
    # around 1 instead of exactly 1, so that a kernel that ignores them fails.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
            elif name.endswith(".bias"):  # not HF's zeros either, for the same reason
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))


def make_batch(cfg, generator):
    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    seq = torch.randint(0, V, (B, T + 1), generator=generator)
    inputs, targets = seq[:, :T].clone(), seq[:, 1:].clone()
    ignored = torch.rand((B, T), generator=generator) < 0.15
    ignored[:, 0] = True  # every row has an ignored position, also at the row start
    ignored[:, -1] = False  # and a counted one
    targets[ignored] = IGNORE_INDEX
    return inputs, targets


def document_layout(cfg, inputs):
    """position_ids [B, T] restarting at each document, and the additive 4D mask [B, 1, T, T] letting a token see
    the tokens of its own document up to itself: what --doc-mask computes, in HF's terms."""
    B, T = inputs.shape
    first = torch.zeros((B, T), dtype=torch.long)
    for b in range(B):
        start = 0
        for t in range(T):
            if inputs[b, t] == cfg["doc_bos"]:
                start = t
            first[b, t] = start
    positions = torch.arange(T).unsqueeze(0) - first
    t_idx, u_idx = torch.arange(T).view(1, T, 1), torch.arange(T).view(1, 1, T)
    allowed = (u_idx <= t_idx) & (u_idx >= first.unsqueeze(2))
    mask = torch.zeros((B, 1, T, T), dtype=torch.float32)
    mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(torch.float32).min)
    return positions, mask


def make_doc_batch(cfg, generator):
    """A batch of packed documents: random tokens other than doc_bos, doc_bos at each document's start but the
    first of row 0 (which begins before the row); targets the next tokens, some ignored as in make_batch."""
    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    assert len(cfg["docs"]) == B and all(sum(d) == T for d in cfg["docs"])
    seq = torch.randint(2, V, (B, T + 1), generator=generator)
    for b, lengths in enumerate(cfg["docs"]):
        start = 0
        for i, n in enumerate(lengths):
            if b > 0 or i > 0:
                seq[b, start] = cfg["doc_bos"]
            start += n
    inputs, targets = seq[:, :T].clone(), seq[:, 1:].clone()
    ignored = torch.rand((B, T), generator=generator) < 0.15
    ignored[:, -1] = False
    targets[ignored] = IGNORE_INDEX
    return inputs, targets


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def meta_common(kind, cfg):
    meta = {"kind": kind, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "generator": "reference/make_reference.py", "torch_version": torch.__version__,
            "transformers_version": transformers.__version__, "python_version": platform.python_version()}
    keys = ["vocab_size", "d_model", "n_layer", "n_head", "n_kv_head", "ffn_dim", "max_seq_len", "rope_theta",
            "rope_scaling", "norm_eps", "tie_embeddings", "init_std"]
    for k in keys:
        meta[f"config.{k}"] = repr(cfg[k]) if not isinstance(cfg[k], str) else cfg[k]
    meta["config.head_dim"] = repr(cfg.get("head_dim") or cfg["d_model"] // cfg["n_head"])
    for k in ["rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_pos"]:
        meta[f"config.{k}"] = repr(cfg.get(k, 0))
    family = cfg.get("family", "llama")
    meta["config.family"] = family
    meta.update({f"config.{k}": repr(v) for k, v in FAMILY_OPTIONS[family].items()})
    return meta


def param_tensors(model):
    # named_parameters() lists a tied lm_head once, under the embedding's name.
    return [(name, p) for name, p in model.named_parameters()]


def cfg_from_hf(config, B, T):
    """The config dict of this file for a transformers LlamaConfig (either rope spelling)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if not rope:
        rope = dict(getattr(config, "rope_scaling", None) or {}, rope_theta=config.rope_theta)
    kind = rope.get("rope_type", rope.get("type", "default"))
    cfg = dict(vocab_size=config.vocab_size, d_model=config.hidden_size, n_layer=config.num_hidden_layers,
               n_head=config.num_attention_heads, n_kv_head=config.num_key_value_heads,
               head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
               ffn_dim=config.intermediate_size, max_seq_len=config.max_position_embeddings,
               rope_theta=float(rope["rope_theta"]), rope_scaling="llama3" if kind == "llama3" else "none",
               norm_eps=config.rms_norm_eps, tie_embeddings=int(bool(config.tie_word_embeddings)),
               init_std=config.initializer_range, B=B, T=T,
               family=config.model_type if config.model_type in FAMILY_OPTIONS else "llama")
    if kind == "llama3":
        cfg.update(rope_factor=rope["factor"], rope_low_freq_factor=rope["low_freq_factor"],
                   rope_high_freq_factor=rope["high_freq_factor"],
                   rope_original_max_pos=rope["original_max_position_embeddings"])
    return cfg


def shard_batch(path, B, T):
    """Inputs and targets [B, T] from the first B * T + 1 tokens of a shard (docs/shard_format.md), rows laid
    out as llmc/formats/dataloader.h lays them out."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        dtype = np.uint16 if header[2] == 2 else np.uint32
        tokens = np.frombuffer(f.read((B * T + 1) * header[2]), dtype=dtype).astype(np.int64)
    inputs = torch.tensor(tokens[:B * T].reshape(B, T))
    targets = torch.tensor(tokens[1:B * T + 1].reshape(B, T))
    return inputs, targets


def adamw_steps(model, params, inputs, targets, extra, n_steps, bf16=False):
    """N AdamW steps on the same batch, weight decay on matrices only: (losses, grad norms). bf16: under CPU autocast
    to bfloat16 (bf16 matmul inputs, fp32 sums), as a bf16 trainer computes."""
    decay = [p for _, p in params if p.ndim == 2]
    no_decay = [p for _, p in params if p.ndim != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=(OPTIM["beta1"], OPTIM["beta2"]), eps=OPTIM["eps"],
                            foreach=False, fused=False)
    losses, norms = [], []
    for _ in range(n_steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=inputs, **extra).logits
        step_loss = loss_fn(logits.float(), targets)
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], OPTIM["grad_clip"])
        opt.step()
        losses.append(step_loss.item())
        norms.append(norm.item())
    return losses, norms


def generate(name, cfg, seed, n_steps, out_dir, model=None, batch=None, bf16_noise=False):
    """The weights and the dump of a model: the one given (an HF directory's), or a new one of cfg from seed.
    bf16_noise: also the N steps under bf16 autocast (train.losses_bf16, train.grad_norms_bf16), how far bf16
    rounding alone moves them for this model, which test_llama's N-step tolerance then allows for."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    if model is None:
        config = hf_config(cfg)
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config).float()
        init_weights(model, cfg["init_std"], generator)
    assert model.config._attn_implementation == "eager"
    docs = "docs" in cfg
    inputs, targets = batch if batch is not None else (make_doc_batch if docs else make_batch)(cfg, generator)
    extra = {}
    if docs:
        positions, mask = document_layout(cfg, inputs)
        extra = dict(position_ids=positions, attention_mask=mask)
        # the mask must reach eager attention as given: each document of the packed row against itself alone
        with torch.no_grad():
            packed = model(input_ids=inputs, **extra).logits
            b, start = 1, cfg["docs"][1][0]
            alone = model(input_ids=inputs[b:b + 1, start:]).logits
            assert torch.allclose(packed[b, start:], alone[0], rtol=1e-4, atol=1e-5), "HF ignored the 4D mask"
    params = param_tensors(model)
    names = [n for n, _ in params]
    assert ("lm_head.weight" in names) == (not cfg["tie_embeddings"]), names

    weights_meta = meta_common("weights", cfg)
    weights_meta["dump.seed"] = repr(seed)
    tensorfile.write(os.path.join(out_dir, f"{name}.weights.llmt"), weights_meta,
                     [(n, p.detach().numpy().copy()) for n, p in params])

    block_outs = {}

    def hook(index):
        def save(module, args, output):
            block_outs[index] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        return save

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(model.model.layers)]
    final_norm = {}
    handles.append(model.model.norm.register_forward_hook(
        lambda m, a, out: final_norm.__setitem__("out", out.detach().clone())))
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=inputs, **extra).logits
    loss = loss_fn(logits, targets)
    loss.backward()
    for h in handles:
        h.remove()

    dump = [("input_tokens", inputs.numpy().astype(np.int32)), ("targets", targets.numpy().astype(np.int32)),
            ("logits", logits.detach().numpy()), ("loss", np.array([loss.item()], dtype=np.float32))]
    dump += [(f"block_out.{i}", block_outs[i].numpy()) for i in range(cfg["n_layer"])]
    dump.append(("final_norm_out", final_norm["out"].numpy()))
    dump += [(f"grad.{n}", p.grad.numpy().copy()) for n, p in params]

    # N AdamW steps on the same batch, weight decay on matrices only.
    start = {n: p.detach().clone() for n, p in params}
    losses, norms = adamw_steps(model, params, inputs, targets, extra, n_steps)
    dump += [("train.losses", np.array(losses, dtype=np.float32)),
             ("train.grad_norms", np.array(norms, dtype=np.float32))]
    if bf16_noise:
        with torch.no_grad():
            for n, p in params:
                p.copy_(start[n])
        losses16, norms16 = adamw_steps(model, params, inputs, targets, extra, n_steps, bf16=True)
        dump += [("train.losses_bf16", np.array(losses16, dtype=np.float32)),
                 ("train.grad_norms_bf16", np.array(norms16, dtype=np.float32))]
        print(f"{name}: under bf16 autocast, step losses {[round(x, 5) for x in losses16]}, grad norms "
              f"{[round(x, 4) for x in norms16]}")

    meta = meta_common("reference_dump", cfg)
    meta.update({"dump.seed": repr(seed), "dump.B": repr(cfg["B"]), "dump.T": repr(cfg["T"]),
                 "dump.ignore_index": repr(IGNORE_INDEX), "dump.n_steps": repr(n_steps)})
    meta.update({f"optim.{k}": repr(v) for k, v in OPTIM.items()})
    if docs:
        meta.update({"dump.doc_bos": repr(cfg["doc_bos"]), "dump.doc_positions": "1"})
    tensorfile.write(os.path.join(out_dir, f"{name}.dump.llmt"), meta, dump)
    counted = int((targets != IGNORE_INDEX).sum())
    print(f"{name}: loss {loss.item():.6f} over {counted}/{targets.numel()} targets, "
          f"step losses {[round(x, 5) for x in losses]}, grad norms {[round(x, 4) for x in norms]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), action="append",
                        help="config to generate (repeatable; default: all)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--steps", type=int, default=5, help="AdamW steps recorded in the dump")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata"))
    parser.add_argument("--from-hf", metavar="DIR", help="the model of an HF directory instead of the test configs")
    parser.add_argument("--name", help="with --from-hf: the files' name")
    parser.add_argument("--shard", help="with --from-hf: the token shard of the batch")
    parser.add_argument("-B", type=int, default=2)
    parser.add_argument("-T", type=int, default=64)
    parser.add_argument("--lr", type=float, default=OPTIM["lr"],
                        help="AdamW's lr for the recorded steps (a trained model wants the lr it trained with: "
                             "at 3e-3 the first step's sign-normalised updates of the tiny gradients of a 128K "
                             "vocabulary make the next gradient norm differ by 5%% between bf16 and fp32)")
    args = parser.parse_args()
    OPTIM["lr"] = args.lr
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}")
    if args.from_hf:
        model = AutoModelForCausalLM.from_pretrained(args.from_hf, dtype=torch.float32, attn_implementation="eager")
        cfg = cfg_from_hf(model.config, args.B, args.T)
        generate(args.name, cfg, args.seed, args.steps, args.out_dir, model, shard_batch(args.shard, args.B, args.T),
                 bf16_noise=True)
        return
    for name in args.config or sorted(CONFIGS):
        generate(name, CONFIGS[name], args.seed, args.steps, args.out_dir)


if __name__ == "__main__":
    main()
