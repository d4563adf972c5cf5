"""HuggingFace model directories into the trainers' shared loader (llmc/formats/hf_model.h, run through tests/hf_tool):
every dtype, single files and shards with an index, both spellings of the rope settings, every refused case
with its message; the export and --init-from round trip through train_llama_ref; and the C tokenizer
(llmc/formats/tokenizer.h) against tiktoken.

The directories are written here the way save_pretrained writes them: with the safetensors library where it
can (F32, F16), and by hand for BF16 (numpy has no bfloat16) and for the corrupt cases."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tests", "hf_tool")
REF = os.path.join(ROOT, "train_llama_ref")
sys.path.insert(0, os.path.join(ROOT, "data"))

pytestmark = pytest.mark.skipif(not os.path.exists(TOOL), reason="make tests/hf_tool first (make test does)")


def hf_config(**over):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300, "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "rope_scaling": None, "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
         "mlp_bias": False, "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2}
    c.update(over)
    return {k: v for k, v in c.items() if v != "ABSENT"}


def shapes(c):
    """The tensors of the layout, in its order (llmc/model/param_layout.h)."""
    C, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, D = c["num_attention_heads"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    KV = c.get("num_key_value_heads", H)
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,)), (p + "self_attn.q_proj.weight", (H * D, C)),
                (p + "self_attn.k_proj.weight", (KV * D, C)), (p + "self_attn.v_proj.weight", (KV * D, C))]
        if c.get("model_type") == "qwen2":  # q, k, v biases
            out += [(p + "self_attn.q_proj.bias", (H * D,)), (p + "self_attn.k_proj.bias", (KV * D,)),
                    (p + "self_attn.v_proj.bias", (KV * D,))]
        if c.get("model_type") == "qwen3":  # an RMSNorm of each q and k head
            out += [(p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,))]
        out += [(p + "self_attn.o_proj.weight", (C, H * D)), (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F))]
    out.append(("model.norm.weight", (C,)))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, C)))
    return out


def random_tensors(c, seed=0):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * 0.5).astype(np.float32) for name, shape in shapes(c)}


def to_bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def stored(x, dtype):
    """x as the file stores it, read back as fp32 (what the loader must give)."""
    if dtype == "BF16":
        return (to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    return x


def raw_bytes(x, dtype):
    if dtype == "BF16":
        return to_bf16_bits(x).tobytes()
    return x.astype(np.float16 if dtype == "F16" else np.float32).tobytes()


def write_safetensors(path, named, dtype="F32", header_edit=None, data_edit=None):
    """A safetensors file by hand: every tensor in dtype, in the given order."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, x in named.items():
        b = raw_bytes(x, dtype)
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    if header_edit:
        header_edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = b"".join(blobs)
    if data_edit:
        data = data_edit(data)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def write_dir(d, c, named, dtype="F32", shards=1, library=False, config_text=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(config_text if config_text is not None else json.dumps(c, indent=2))
    if shards == 1 and library:
        from safetensors.numpy import save_file
        save_file({k: v.astype(np.float16 if dtype == "F16" else np.float32) for k, v in named.items()},
                  os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    elif shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), named, dtype)
    else:
        names, weight_map = list(named), {}
        for k in range(shards):
            part = names[k::shards]
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(os.path.join(d, file), {n: named[n] for n in part}, dtype)
            weight_map.update({n: file for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    return d


def load(d, tmp_path):
    out = tmp_path / "weights.f32"
    r = subprocess.run([TOOL, "load", str(d), str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, r.stderr
    config = dict(line.split("=", 1) for line in r.stdout.split())
    return config, np.fromfile(out, dtype=np.float32), r.stderr


def expected(c, named, dtype):
    return np.concatenate([stored(named[name], dtype).ravel() for name, _ in shapes(c)])


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("tied", [True, False])
def test_every_dtype_loads_exactly(tmp_path, dtype, tied):
    c = hf_config(tie_word_embeddings=tied)
    named = random_tensors(c)
    config, w, err = load(write_dir(tmp_path / "m", c, named, dtype), tmp_path)
    assert w is not None, err
    assert np.array_equal(w, expected(c, named, dtype)), "the fp32 weights differ from the file's values"
    assert config["tie_embeddings"] == str(int(tied)) and config["vocab_size"] == "300"


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_the_safetensors_library_files_load(tmp_path, dtype):
    c = hf_config(tie_word_embeddings=False)
    named = random_tensors(c, seed=3)
    _, w, err = load(write_dir(tmp_path / "m", c, named, dtype, library=True), tmp_path)
    assert w is not None, err
    assert np.array_equal(w, expected(c, named, dtype))


def test_shards_with_an_index(tmp_path):
    c = hf_config(tie_word_embeddings=False, num_hidden_layers=3)
    named = random_tensors(c, seed=1)
    _, w, err = load(write_dir(tmp_path / "m", c, named, "BF16", shards=4), tmp_path)
    assert w is not None, err
    assert np.array_equal(w, expected(c, named, "BF16"))


def test_config_spellings(tmp_path):
    rope = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    variants = {
        "rope_scaling": hf_config(rope_scaling=dict(rope, rope_type="llama3"), rope_theta=500000.0),
        "old type key": hf_config(rope_scaling=dict(rope, type="llama3"), rope_theta=500000.0),
        "rope_parameters": hf_config(rope_scaling="ABSENT", rope_theta="ABSENT",
                                     rope_parameters=dict(rope, rope_type="llama3", rope_theta=500000.0)),
    }
    for name, c in variants.items():
        config, w, err = load(write_dir(tmp_path / name.replace(" ", "_"), c, random_tensors(c)), tmp_path)
        assert w is not None, f"{name}: {err}"
        assert config["rope_scaling_llama3"] == "1" and config["rope_theta"] == "500000", name
        assert config["rope_factor"] == "32" and config["rope_original_max_pos"] == "64", name
    # absent head_dim, num_key_value_heads and tie_word_embeddings take HF's defaults; eos may be a list
    c = hf_config(head_dim="ABSENT", num_key_value_heads="ABSENT", tie_word_embeddings="ABSENT",
                  eos_token_id=[2, 7, 9], rope_scaling={"rope_type": "default"})
    config, w, err = load(write_dir(tmp_path / "defaults", c, random_tensors(c)), tmp_path)
    assert w is not None, err
    assert (config["head_dim"], config["n_kv_head"], config["tie_embeddings"]) == ("8", "4", "0")
    assert config["n_eos"] == "3" and config["rope_scaling_llama3"] == "0"


FAMILIES = {  # model_type: (architecture, what the loader reports, an odd config the family allows)
    "qwen2": ("Qwen2ForCausalLM", dict(qkv_bias="1", qk_norm="0"), dict(attention_bias="ABSENT", head_dim="ABSENT")),
    "qwen3": ("Qwen3ForCausalLM", dict(qkv_bias="0", qk_norm="1"), dict(head_dim=16)),  # 4 x 16 heads for C = 32
    "mistral": ("MistralForCausalLM", dict(qkv_bias="0", qk_norm="0"), dict(sliding_window=None)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_families_load_and_round_trip(tmp_path, family):
    """A directory of each family loads with its options and its extra tensors (Qwen2's q, k, v biases, Qwen3's
    q and k norms), trains a step in train_llama_ref, and its export is the same family with the trained
    weights (the model's computation against HF: test_llama_ref's family dumps)."""
    arch, options, extra = FAMILIES[family]
    c = hf_config(model_type=family, architectures=[arch], tie_word_embeddings=family == "qwen2", **extra)
    named = random_tensors(c, seed=3)
    config, w, err = load(write_dir(tmp_path / "hf", c, named), tmp_path)
    assert w is not None, err
    assert config["family"] == family and all(config[k] == v for k, v in options.items()), config
    assert np.array_equal(w, np.concatenate([named[n].ravel() for n, _ in shapes(c)]))
    if not os.path.exists(REF):
        pytest.skip("make train_llama_ref first")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "make_random_shard.py"),
                    str(tmp_path / "d_train_000000.bin"), "300", "4000", "4", "1", "2"], check=True)
    r = run_ref("--init-from", tmp_path / "hf", "-B", 2, "-T", 16, "--steps", 2, "--val", "", "--train",
                tmp_path / "d_train_*.bin", "--log", "", "--export", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    out = json.load(open(tmp_path / "out" / "config.json"))
    assert out["model_type"] == family and out["architectures"] == [arch]
    config2, w2, err = load(tmp_path / "out", tmp_path)
    assert w2 is not None, err
    assert config2 == config and not np.array_equal(w2, w)  # the same model, trained


def test_llama_3_2_1b_config():
    """The config.json of meta-llama/Llama-3.2-1B as published (tests/fuzz/corpus/hf_config/)."""
    path = os.path.join(ROOT, "tests", "fuzz", "corpus", "hf_config", "config_llama32_1b.json")
    r = subprocess.run([TOOL, "config", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.split())
    want = {"vocab_size": "128256", "d_model": "2048", "n_layer": "16", "n_head": "32", "n_kv_head": "8",
            "head_dim": "64", "ffn_dim": "8192", "max_seq_len": "131072", "rope_theta": "500000",
            "rope_scaling_llama3": "1", "rope_factor": "32", "rope_low_freq_factor": "1",
            "rope_high_freq_factor": "4", "rope_original_max_pos": "8192", "tie_embeddings": "1",
            "bos_id": "128000", "n_eos": "3"}
    assert {k: got[k] for k in want} == want
    assert float(got["norm_eps"]) == np.float32(1e-5)


def corrupt(header_edit=None, data_edit=None):
    def make(d, c, named):
        write_dir(d, c, named)
        write_safetensors(os.path.join(d, "model.safetensors"), named, "F32", header_edit, data_edit)
    return make


def first_layer_tensor(named):
    return "model.layers.0.self_attn.q_proj.weight"


def overlap(h):
    names = [k for k in h if k != "__metadata__"]
    h[names[1]]["data_offsets"] = [h[names[1]]["data_offsets"][0] - 4, h[names[1]]["data_offsets"][1] - 4]


def index_naming(file):
    def make(d, c, named):
        write_dir(d, c, named, shards=2)
        p = os.path.join(d, "model.safetensors.index.json")
        idx = json.load(open(p))
        idx["weight_map"]["model.norm.weight"] = file
        json.dump(idx, open(p, "w"))
    return make


def tensors_edit(edit, **over):
    def make(d, c, named):
        c = dict(c, **over)
        named = random_tensors(c)
        edit(named)
        write_dir(d, c, named)
    return make


def wrong_dtype(d, c, named):
    write_dir(d, c, named)
    raw = {k: v for k, v in named.items()}
    write_safetensors(os.path.join(d, "model.safetensors"), raw, "F32",
                      header_edit=lambda h: h["model.norm.weight"].update(dtype="I32"))


REFUSED = {
    "another model_type": (hf_config(model_type="qwen2_moe"), None,
                           "model_type is \"qwen2_moe\": this trainer computes the dense models llama, qwen2, qwen3"),
    "the family's architecture": (hf_config(model_type="qwen3"), None,
                                  "architectures holds \"LlamaForCausalLM\", not Qwen3ForCausalLM"),
    "a sliding window (qwen2)": (hf_config(model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                                           use_sliding_window=True), None, "use_sliding_window = true"),
    "a sliding window (mistral)": (hf_config(model_type="mistral", architectures=["MistralForCausalLM"],
                                             sliding_window=4096), None, "sliding_window is set"),
    "sliding layers (qwen3)": (hf_config(model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                                         layer_types=["full_attention", "sliding_attention"]), None,
                               "layer_types holds sliding_attention"),
    "another architecture": (hf_config(architectures=["MistralForCausalLM"]), None,
                             "architectures holds \"MistralForCausalLM\", not LlamaForCausalLM"),
    "attention_bias": (hf_config(attention_bias=True), None, "attention_bias = true"),
    "mlp_bias": (hf_config(mlp_bias=True), None, "mlp_bias = true"),
    "hidden_act": (hf_config(hidden_act="gelu"), None, "hidden_act is gelu, not \"silu\""),
    "another rope type": (hf_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}), None,
                          "rope_scaling.rope_type = \"yarn\""),
    "attention dropout": (hf_config(attention_dropout=0.1), None, "attention_dropout must be 0"),
    "absurd layer count": (hf_config(num_hidden_layers=477218589), None,
                           "'num_hidden_layers' = 4.77219e+08 must be an integer in [1, 1024]"),
    "a size as a string": (hf_config(hidden_size="32"), None, "'hidden_size' must be an integer in [1, 65536], not a string"),
    "a missing size": (hf_config(vocab_size="ABSENT"), None, "has no 'vocab_size'"),
    "heads not dividing": (hf_config(num_key_value_heads=3), None, "n_head 4 is not a multiple of n_kv_head 3"),
    "rope_theta twice, different": (hf_config(rope_parameters={"rope_type": "default", "rope_theta": 20000.0}), None,
                                    "rope_theta 10000 and rope_parameters.rope_theta 20000 disagree"),
    "a missing tensor": (hf_config(), tensors_edit(lambda n: n.pop("model.layers.1.mlp.down_proj.weight")),
                         "has no tensor 'model.layers.1.mlp.down_proj.weight'"),
    "a misshapen tensor": (hf_config(), tensors_edit(
        lambda n: n.update({"model.layers.0.mlp.up_proj.weight": np.zeros((48, 31), np.float32)})),
        "tensor 'model.layers.0.mlp.up_proj.weight' has 2 dimensions [48, 31], config.json makes it [48, 32]"),
    "an unknown tensor": (hf_config(), tensors_edit(
        lambda n: n.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)})),
        "holds tensor 'model.layers.0.self_attn.q_proj.bias', which this Llama model has no place for"),
    "a tied lm_head unlike the embedding": (hf_config(), tensors_edit(
        lambda n: n.update({"lm_head.weight": np.ones((300, 32), np.float32)})),
        "holds an lm_head.weight unlike the embedding"),
    "a dtype it does not read": (hf_config(), wrong_dtype, "tensor 'model.norm.weight' is I32"),
    "overlapping tensors": (hf_config(), corrupt(header_edit=overlap), "(overlapping or with a hole: corrupt)"),
    "a tensor past the end": (hf_config(), corrupt(data_edit=lambda d: d[:-8]), "bytes but its header describes"),
    "a name twice": (hf_config(), corrupt(header_edit=lambda h: None), None),  # replaced below
    "an index naming a missing shard": (hf_config(), index_naming("model-00009-of-00009.safetensors"),
                                        "names 'model-00009-of-00009.safetensors' for tensor 'model.norm.weight', "
                                        "but there is no such file"),
    "an index naming a path outside": (hf_config(), index_naming("../elsewhere.safetensors"),
                                       "not a file name in the directory"),
    "no weights at all": (hf_config(), lambda d, c, n: write_dir(d, c, n) and os.remove(
        os.path.join(d, "model.safetensors")), "holds neither model.safetensors nor model.safetensors.index.json"),
    "config.json that is not JSON": (hf_config(), lambda d, c, n: write_dir(d, c, n, config_text="{\"vocab_size\": 300,"),
                                     "is not valid JSON"),
}
del REFUSED["a name twice"]


def duplicate_name(d, c, named):
    write_dir(d, c, named)
    p = os.path.join(d, "model.safetensors")
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    text = raw[8:8 + n].decode().rstrip()
    # the same key twice: json.dumps cannot write it, so splice the text
    text = text[:-1] + ', "model.norm.weight": ' + json.dumps(json.loads(text)["model.norm.weight"]) + "}"
    text = text.encode() + b" " * (-len(text) % 8)
    open(p, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


REFUSED["a tensor name twice"] = (hf_config(), duplicate_name, "names tensor 'model.norm.weight' twice")


def huge_offset(number):
    """The audit's 1e9999: a number past double's range where an offset belongs (it was cast to int64), or one
    that a double holds but an int64 does not."""
    return lambda d, c, named: huge_offset_(d, c, named, number)


def huge_offset_(d, c, named, number):
    write_dir(d, c, named)
    p = os.path.join(d, "model.safetensors")
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    end = h["model.norm.weight"]["data_offsets"][1]
    text = raw[8:8 + n].decode().replace(f"{end}]", f"{number}]", 1)
    text = text.encode() + b" " * (-len(text) % 8)
    open(p, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


REFUSED["an offset of 1e9999"] = (hf_config(), huge_offset("1e9999"), "number too large for a double")
REFUSED["an offset of 1e300"] = (hf_config(), huge_offset("1e300"), "data_offsets")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_a_message(tmp_path, case):
    c, make, message = REFUSED[case]
    d = tmp_path / "m"
    if make is None:
        write_dir(d, c, random_tensors(hf_config()))
    else:
        make(str(d), c, random_tensors(c))
    config, w, err = load(d, tmp_path)
    assert w is None, f"{case}: loaded, but must be refused"
    assert message in err, f"{case}: expected {message!r} in the error, got {err!r}"
    assert str(d) in err, f"{case}: the error must name the directory or file: {err!r}"


def run_ref(*args, cwd=ROOT):
    return subprocess.run([REF, *map(str, args)], capture_output=True, text=True, cwd=cwd)


@pytest.mark.skipif(not os.path.exists(REF), reason="make train_llama_ref first")
def test_init_from_export_and_checkpoint_round_trip(tmp_path):
    """An HF directory trains in train_llama_ref; the run's checkpoint and its fp32 and bf16 exports are HF
    directories again, with the final weights (bf16: rounded), and --init-from takes the checkpoint."""
    c = hf_config(tie_word_embeddings=False)
    src = write_dir(tmp_path / "hf", c, random_tensors(c, seed=5), "BF16", shards=2)
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "make_random_shard.py"),
                    str(tmp_path / "d_train_000000.bin"), "300", "4000", "4", "1", "2"], check=True)
    common = ["-B", 2, "-T", 16, "--steps", 3, "--val", "", "--train", tmp_path / "d_train_*.bin", "--log", ""]
    for dtype in ("fp32", "bf16"):
        r = run_ref("--init-from", src, *common, "--checkpoint-dir", tmp_path / f"ck_{dtype}", "--export",
                    tmp_path / f"out_{dtype}", "--export-dtype", dtype)
        assert r.returncode == 0, r.stderr
    ck_config, ck, err = load(tmp_path / "ck_fp32" / "step_00000003", tmp_path)
    assert ck is not None, err
    for dtype in ("fp32", "bf16"):
        config, w, err = load(tmp_path / f"out_{dtype}", tmp_path)
        assert w is not None, err
        assert config == ck_config
        assert np.array_equal(w, ck if dtype == "fp32" else stored(ck, "BF16")), dtype
        cfg = json.load(open(tmp_path / f"out_{dtype}" / "config.json"))
        assert cfg["torch_dtype"] == ("float32" if dtype == "fp32" else "bfloat16")
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)  # the shard's
        gen = json.load(open(tmp_path / f"out_{dtype}" / "generation_config.json"))
        assert (gen["bos_token_id"], gen["eos_token_id"]) == (1, 2)
    r = run_ref("--init-from", tmp_path / "ck_fp32" / "step_00000003", *common)
    assert r.returncode == 0, r.stderr
    r = run_ref("--init-from", src, *common, "--export", tmp_path / "out_fp32")
    assert r.returncode != 0 and "exists and is not an empty directory" in r.stderr
    r = run_ref("--init-from", src, "--preset", "nano", *common)
    assert r.returncode != 0 and "--init-from takes the model shape from" in r.stderr


def tokenizer_file(kind):
    from prepare import TOKENIZERS, default_tokenizer_path
    try:
        return default_tokenizer_path(kind), TOKENIZERS[kind]
    except Exception as e:  # noqa: BLE001 - the package is optional
        pytest.skip(f"no {kind} tokenizer file: {e}")


TEXTS_ASCII = [
    "In the beginning God created the heaven and the earth.",
    "It's 12:45 -- we'll see; they've 1234567 reasons, don't they?\n\nNew paragraph.\r\n\tTabbed   spaces  ",
    "x=f(a,b)+[1,2,3]//{'k':\"v\"}  ;;;\n\n\n   trailing    ",
    "   leading spaces and CAPS: I'M HERE'S WE'D THEY'LL\n",
    "numbers 1 22 333 4444 55555 3.14159 1e10 0x1F",
]
TEXTS_OTHER = ["naïve café — ÿ, 日本語のテキスト, emoji 🙂🚀, Ελληνικά", "<|begin_of_text|>Hello<|end_of_text|> world",
               "<|endoftext|>GPT<|endoftext|>"]


@pytest.mark.parametrize("kind", ["llama3", "gpt2"])
def test_tokenizer_matches_tiktoken_and_round_trips(tmp_path, kind):
    path, info = tokenizer_file(kind)
    import base64
    import tiktoken
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    specials = info["specials"](len(ranks))
    enc = tiktoken.Encoding(name=kind, pat_str=info["pat_str"], mergeable_ranks=ranks, special_tokens=specials)
    for i, text in enumerate(TEXTS_ASCII + TEXTS_OTHER):
        f = tmp_path / f"t{i}.txt"
        f.write_bytes(text.encode())
        r = subprocess.run([TOOL, "encode", path, str(f)], capture_output=True, text=True)
        assert r.returncode == 0, f"{kind}: {text!r} does not round-trip: {r.stderr}"
        ids = [int(x) for x in r.stdout.split()]
        if text in TEXTS_ASCII:  # the pattern is followed exactly for ASCII
            assert ids == enc.encode(text, allowed_special="all"), f"{kind}: {text!r}"
        assert enc.decode(ids) == text, f"{kind}: tiktoken decodes the ids to something else"
