#!/usr/bin/env bash
# Checkpoints of ./train_llama_ref (llmc/formats/checkpoint.h): resumed runs give
# bit-identical losses and weights, keep-last-K, interrupted writes ignored and
# cleaned, corrupt files refused with messages naming them, and the safetensors
# / config.json output readable by Python's safetensors where it is installed.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python3 ] && echo .venv/bin/python3 || echo python3)}
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
. tests/lib.sh
export OMP_NUM_THREADS=2 # several threads: the trainer must still give the same bits in every run

# A shard of 5000 tokens of a 512-token vocabulary (docs/shard_format.md).
python3 tests/make_random_shard.py "$tmp/data_000000.bin" 512 5000 2 0 1
train() { ./train_llama_ref --preset nano --vocab 512 -B 2 -T 32 --warmup 2 --lr 3e-3 --seed 5 --train "$tmp/data_*.bin" "$@"; }
# losses LOG FIRST LAST: "step loss" lines of the JSON log (loss printed with %.9g: exact floats)
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" | awk -v a="$2" -v b="$3" '$1 >= a && $1 <= b'; }
complete_steps() { # the complete checkpoints in a directory, one per line
    for d in "$1"/step_*; do [ -f "$d/COMPLETE" ] && basename "$d"; done 2>/dev/null
}

# (a) cosine schedule: 6 steps straight, saving every 2; then resume from a copy of step 2
train --steps 6 --checkpoint-dir "$tmp/a" --save-every 2 --keep 0 --log "$tmp/a.jsonl" > "$tmp/a.out" 2>&1
check "uninterrupted run saves steps 2, 4, 6" \
    [ "$(complete_steps "$tmp/a" | tr '\n' ' ')" = "step_00000002 step_00000004 step_00000006 " ]
mkdir -p "$tmp/r1" && cp -r "$tmp/a/step_00000002" "$tmp/r1/"
train --steps 6 --checkpoint-dir "$tmp/r1" --resume --keep 0 --log "$tmp/r1.jsonl" > "$tmp/r1.out" 2>&1
check "resume says where it resumed" grep -q "resumed run [0-9a-f]\{16\} from '$tmp/r1/step_00000002' at step 2" "$tmp/r1.out"
run_id() { sed -n '1s/.*"run_id": "\([0-9a-f]*\)".*/\1/p' "$1"; }
check "the resumed run goes on under the run id of the run it resumes" \
    [ -n "$(run_id "$tmp/a.jsonl")" -a "$(run_id "$tmp/a.jsonl")" = "$(run_id "$tmp/r1.jsonl")" ]
check "resumed losses of steps 3..6 are bit-identical" \
    [ -n "$(losses "$tmp/a.jsonl" 3 6)" -a "$(losses "$tmp/a.jsonl" 3 6)" = "$(losses "$tmp/r1.jsonl" 1 6)" ]
check "resumed final weights are bit-identical" \
    cmp -s "$tmp/a/step_00000006/model.safetensors" "$tmp/r1/step_00000006/model.safetensors"
check "resumed final optimizer state is bit-identical" \
    cmp -s "$tmp/a/step_00000006/train_state.bin" "$tmp/r1/step_00000006/train_state.bin"

# (a') constant schedule: a 3-step run (saves at its end), resumed to 6
train --steps 6 --schedule constant --log "$tmp/c6.jsonl" > /dev/null 2>&1
train --steps 3 --schedule constant --checkpoint-dir "$tmp/c" > /dev/null 2>&1
check "a run with --save-every 0 saves at its end" [ "$(complete_steps "$tmp/c")" = "step_00000003" ]
train --steps 6 --schedule constant --checkpoint-dir "$tmp/c" --resume --log "$tmp/c3.jsonl" > /dev/null 2>&1
check "3 steps + resume to 6: losses of steps 4..6 are bit-identical" \
    [ -n "$(losses "$tmp/c6.jsonl" 4 6)" -a "$(losses "$tmp/c6.jsonl" 4 6)" = "$(losses "$tmp/c3.jsonl" 1 6)" ]

# --resume with nothing to resume from starts fresh
train --steps 1 --checkpoint-dir "$tmp/empty" --resume > "$tmp/empty.out" 2>&1
check "--resume without a checkpoint starts fresh" grep -q "no complete checkpoint" "$tmp/empty.out"

# (b) keep-last-K
train --steps 5 --checkpoint-dir "$tmp/k" --save-every 1 --keep 2 > /dev/null 2>&1
check "--keep 2 leaves exactly the newest 2" \
    [ "$(ls "$tmp/k" | tr '\n' ' ')" = "step_00000004 step_00000005 " ]
# ... of its own run: a checkpoint of another run among them (two runs started at once into one empty
# directory, or one copied in) is neither counted nor deleted
train --steps 4 --checkpoint-dir "$tmp/k2" --save-every 1 --keep 0 --seed 6 > /dev/null 2>&1
rm -r "$tmp/k2/step_00000002" && cp -r "$tmp/a/step_00000002" "$tmp/k2/"
train --steps 6 --checkpoint-dir "$tmp/k2" --seed 6 --resume --save-every 1 --keep 1 > "$tmp/k2.out" 2>&1
check "--keep 1 leaves its newest and another run's checkpoint" \
    [ "$(grep -c "from '$tmp/k2/step_00000004' at step 4" "$tmp/k2.out")" = 1 \
      -a "$(ls "$tmp/k2" | tr '\n' ' ')" = "step_00000002 step_00000006 " ]

# (c) an interrupted write: a .tmp directory and a step without COMPLETE
mkdir -p "$tmp/i"
cp -r "$tmp/a/step_00000002" "$tmp/i/"
cp -r "$tmp/a/step_00000004" "$tmp/i/step_00000004" && rm "$tmp/i/step_00000004/COMPLETE"
mkdir "$tmp/i/step_00000005.tmp12345" && echo junk > "$tmp/i/step_00000005.tmp12345/model.safetensors"
train --steps 6 --checkpoint-dir "$tmp/i" --resume --save-every 1 --keep 0 --log "$tmp/i.jsonl" > "$tmp/i.out" 2>&1
check "resume skips the unfinished checkpoints" grep -q "from '$tmp/i/step_00000002' at step 2" "$tmp/i.out"
check "the next save removed the leftovers; all checkpoints complete" \
    [ "$(ls "$tmp/i" | tr '\n' ' ')" = "step_00000002 step_00000003 step_00000004 step_00000005 step_00000006 " \
      -a "$(complete_steps "$tmp/i" | wc -l)" -eq 5 ]
check "losses after skipping the unfinished checkpoints are bit-identical" \
    [ "$(losses "$tmp/a.jsonl" 3 6)" = "$(losses "$tmp/i.jsonl" 1 6)" ]

# (d) corrupt checkpoints: clear errors naming the file, non-zero exit
mkdir -p "$tmp/d1" "$tmp/d2" "$tmp/d3"
cp -r "$tmp/a/step_00000006" "$tmp/d1/" && cp -r "$tmp/a/step_00000006" "$tmp/d2/" && cp -r "$tmp/a/step_00000006" "$tmp/d3/"
f=$tmp/d1/step_00000006/model.safetensors
head -c 100000 "$f" > "$f.cut" && mv "$f.cut" "$f"
expect "truncated model.safetensors" "'$f' is 100000 bytes" train --steps 8 --checkpoint-dir "$tmp/d1" --resume
f=$tmp/d2/step_00000006/train_state.bin
printf 'BADMAGIC' | dd of="$f" conv=notrunc status=none
expect "train_state.bin with a bad magic" "'$f' is not a train_state.bin (bad magic)" \
    train --steps 8 --checkpoint-dir "$tmp/d2" --resume
f=$tmp/d3/step_00000006/model.safetensors
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a":[1,2}     ' | dd of="$f" conv=notrunc status=none
expect "model.safetensors with a bad header" "'$f'" train --steps 8 --checkpoint-dir "$tmp/d3" --resume
expect "resume into another model shape" "config.json' has num_hidden_layers = 2" \
    train --steps 8 --checkpoint-dir "$tmp/a" --resume --n-layer 3
expect "--resume needs --checkpoint-dir" "--checkpoint-dir" train --steps 1 --resume

# (d') what the audit of be39022 found accepted
expect "a fresh run into another run's checkpoints is refused" "holds the checkpoints of an earlier run" \
    train --steps 8 --checkpoint-dir "$tmp/a" --save-every 1 --keep 2
check "... and deletes none of them" [ "$(complete_steps "$tmp/a" | wc -l)" -eq 3 ]
mkdir -p "$tmp/m1" && cp -r "$tmp/a/step_00000006" "$tmp/m1/" && cp "$tmp/a/step_00000004/train_state.bin" "$tmp/m1/step_00000006/"
expect "weights and state of different steps are refused" "mixes steps" train --steps 8 --checkpoint-dir "$tmp/m1" --resume
mkdir -p "$tmp/m2" && cp -r "$tmp/a/step_00000004" "$tmp/m2/step_00000009"
expect "a renamed checkpoint is refused" "mixes steps" train --steps 12 --checkpoint-dir "$tmp/m2" --resume
mkdir -p "$tmp/m3" && cp -r "$tmp/a/step_00000006" "$tmp/m3/"
expect "resuming at or past --steps is an error, not a silent success" "at or past --steps 6" \
    train --steps 6 --checkpoint-dir "$tmp/m3" --resume
expect "an uncreatable --checkpoint-dir fails before training" "cannot create --checkpoint-dir" \
    train --steps 2 --checkpoint-dir /dev/null/ckpt
expect "an empty --checkpoint-dir is refused" "--checkpoint-dir is empty" train --steps 2 --checkpoint-dir ''
expect "a --checkpoint-dir too long for its paths is refused" "at most" \
    train --steps 2 --checkpoint-dir "$tmp/$(printf 'd%.0s' $(seq 1000))"
mkdir -p "$tmp/m4" && cp -r "$tmp/a/step_00000006" "$tmp/m4/"
printf '\x01' | dd of="$tmp/m4/step_00000006/train_state.bin" bs=1 seek=104 conv=notrunc status=none
printf 'step 6\n' > "$tmp/m4/step_00000006/COMPLETE" # without checksums: the loader's check, not the manifest's
expect "a data position that does not fit names the checkpoint" "resuming from '$tmp/m4/step_00000006': its data position" \
    train --steps 8 --checkpoint-dir "$tmp/m4" --resume

# (f) checksums (issue 32): COMPLETE is a manifest of every file's XXH64 and size and the run id, checked
# on --resume and --init-from; a file changed since the save is refused, naming it, the expected and found
flip() { # FILE OFFSET: flips the lowest bit of the byte at OFFSET (negative: from the end)
    local at=$2 b
    [ "$at" -lt 0 ] && at=$(($(stat -c %s "$1") + at))
    b=$(od -An -tu1 -j "$at" -N1 "$1" | tr -d ' ')
    printf "$(printf '\\%03o' $((b ^ 1)))" | dd of="$1" bs=1 seek="$at" conv=notrunc status=none
}
copy_a6() { rm -rf "$tmp/$1" && mkdir -p "$tmp/$1" && cp -r "$tmp/a/step_00000006" "$tmp/$1/"; } # a copy of step 6 of run a
ck=$tmp/a/step_00000006
check "COMPLETE lists every file of the checkpoint with its size, and the run id of the log" "$PYTHON" - "$ck" \
    "$(run_id "$tmp/a.jsonl")" <<'PY'
import os, sys
d, run = sys.argv[1], sys.argv[2]
lines = open(f"{d}/COMPLETE").read().splitlines()
assert lines[0] == "step 6" and lines[1] == f"run {run}", lines[:2]
files = {}
for l in lines[2:-1]:
    kind, h, size, name = l.split(" ")
    assert kind == "xxh64" and len(h) == 16, l
    files[name] = int(size)
assert lines[-1].startswith("end xxh64 "), lines[-1]
want = {f: os.path.getsize(f"{d}/{f}") for f in os.listdir(d) if f != "COMPLETE"}
assert files == want, (files, want)
PY
if command -v xxh64sum > /dev/null; then # xxHash's own tool: the same hashes
    check "xxh64sum agrees with every checksum of COMPLETE" bash -c "cd '$ck' && sed -n \
        's/^xxh64 \([0-9a-f]*\) [0-9]* \(.*\)/\1  \2/p' COMPLETE | xxh64sum -c --quiet"
else
    echo "SKIP xxh64sum is not installed (apt install xxhash)"
fi
copy_a6 f1
f=$tmp/f1/step_00000006/model.safetensors
flip "$f" -1000
expect "a flipped bit in model.safetensors is refused on --resume, naming the file" \
    "'$f' does not match the checkpoint's manifest" train --steps 8 --checkpoint-dir "$tmp/f1" --resume
expect "... saying what was expected and found, with a hint" "the file changed since it was saved" \
    train --steps 8 --checkpoint-dir "$tmp/f1" --resume
init() { ./train_llama_ref -B 2 -T 32 --warmup 2 --lr 3e-3 --seed 5 --train "$tmp/data_*.bin" "$@"; }
expect "a flipped bit in model.safetensors is refused on --init-from, naming the file" \
    "'$f' does not match the checkpoint's manifest" init --steps 1 --init-from "$tmp/f1/step_00000006"
init --steps 1 --init-from "$ck" > "$tmp/f0.out" 2>&1
check "--init-from an intact checkpoint directory loads" [ $? -eq 0 ]
copy_a6 f0 && rm "$tmp/f0/step_00000006/COMPLETE" "$tmp/f0/step_00000006/train_state.bin" # a plain HF directory
init --steps 1 --init-from "$tmp/f0/step_00000006" > "$tmp/f0.out" 2>&1
check "--init-from an HF directory without a manifest (as transformers writes it) loads, without a warning" \
    [ $? -eq 0 -a -z "$(grep warning "$tmp/f0.out")" ]
# train_state.bin: header fields (AdamW step, RNG, data seed) and a moment edited, each refused naming the file
for edit in "24 its AdamW step" "32 its RNG state" "96 its data seed" "-4 a moment"; do
    copy_a6 f2
    f=$tmp/f2/step_00000006/train_state.bin
    flip "$f" "${edit%% *}"
    expect "train_state.bin with ${edit#* } edited is refused, naming the file" \
        "'$f' does not match the checkpoint's manifest" train --steps 8 --checkpoint-dir "$tmp/f2" --resume
done
# the state of another run at the same step, copied in
train --steps 6 --seed 6 --checkpoint-dir "$tmp/b" > /dev/null 2>&1
copy_a6 f3 && cp "$tmp/b/step_00000006/train_state.bin" "$tmp/f3/step_00000006/"
expect "a train_state.bin of another run at the same step is refused" \
    "'$tmp/f3/step_00000006/train_state.bin' belongs to run" train --steps 8 --checkpoint-dir "$tmp/f3" --resume
copy_a6 f4 && cp "$tmp/b/step_00000006/model.safetensors" "$tmp/f4/step_00000006/"
expect "a model.safetensors of another run at the same step is refused" \
    "'$tmp/f4/step_00000006/model.safetensors' does not match" train --steps 8 --checkpoint-dir "$tmp/f4" --resume
# config.json: an edited rope_theta (or rms_norm_eps) is refused
copy_a6 f5
f=$tmp/f5/step_00000006/config.json
sed -i 's/"rope_theta": 500000.0/"rope_theta": 10000.0/g' "$f"
expect "an edited rope_theta in config.json is refused, naming the file" \
    "'$f' does not match the checkpoint's manifest" train --steps 8 --checkpoint-dir "$tmp/f5" --resume
expect "... on --init-from too" "'$f' does not match the checkpoint's manifest" \
    init --steps 1 --init-from "$tmp/f5/step_00000006"
copy_a6 f6
sed -i 's/"rms_norm_eps": 1e-05/"rms_norm_eps": 1e-06/' "$tmp/f6/step_00000006/config.json"
expect "an edited rms_norm_eps in config.json is refused" "config.json' does not match the checkpoint's manifest" \
    train --steps 8 --checkpoint-dir "$tmp/f6" --resume
# the manifest itself: an edited line, a listed file that is missing
copy_a6 f7
sed -i '3s/^xxh64 \(.\)/xxh64 0\1/; 3s/^xxh64 0\(.\{16\}\)./xxh64 \1/' "$tmp/f7/step_00000006/COMPLETE"
expect "an edited manifest is refused, naming it" "'$tmp/f7/step_00000006/COMPLETE' is corrupt" \
    train --steps 8 --checkpoint-dir "$tmp/f7" --resume
copy_a6 f8 && rm "$tmp/f8/step_00000006/generation_config.json"
expect "a file of the manifest that is missing is refused, naming it" \
    "'$tmp/f8/step_00000006/generation_config.json' is in the checkpoint's manifest but" \
    train --steps 8 --checkpoint-dir "$tmp/f8" --resume

# (g) checkpoints of an older build (COMPLETE without checksums) resume, with a warning; a model flag that
# differs from the checkpoint's config.json is refused with or without checksums, naming the field and both values
copy_a6 g1 && printf 'step 6\n' > "$tmp/g1/step_00000006/COMPLETE"
train --steps 8 --checkpoint-dir "$tmp/g1" --resume --keep 0 > "$tmp/g1.out" 2>&1
rc=$?
check "a checkpoint without checksums resumes (exit $rc)" [ $rc -eq 0 ]
check "... with a warning that it is not verified" grep -q "warning: '$tmp/g1/step_00000006' has no checksums" "$tmp/g1.out"
check "... and its next checkpoint has them" grep -q '^end xxh64 ' "$tmp/g1/step_00000008/COMPLETE"
copy_a6 g2 && printf 'step 6\n' > "$tmp/g2/step_00000006/COMPLETE"
sed -i 's/"rope_theta": 500000.0/"rope_theta": 10000.0/g' "$tmp/g2/step_00000006/config.json"
expect "an edited rope_theta in a checkpoint without checksums is refused, naming the field and both values" \
    "config.json' has rope_theta = 10000 but this run's model has 500000" \
    train --steps 8 --checkpoint-dir "$tmp/g2" --resume
copy_a6 g3 && copy_a6 g4 && copy_a6 g5
expect "a resume with another preset of the same shape is refused, naming the rope scaling" \
    "config.json' has rope_scaling = none but this run's model has llama3" \
    train --steps 8 --checkpoint-dir "$tmp/g3" --resume --preset llama3.2-1b --vocab 512 --d-model 64 --n-layer 2 \
    --n-head 4 --n-kv-head 2 --head-dim 16 --ffn-dim 176
expect "a resume with a model of another rope_theta (--init-from) is refused, naming both values" \
    "config.json' has rope_theta = 500000 but this run's model has 10000" \
    init --steps 8 --checkpoint-dir "$tmp/g4" --resume --init-from "$tmp/g2/step_00000006"
expect "a resume with another shape flag is refused, naming the field and both values" \
    "config.json' has intermediate_size = 176 but this run's model has 192" \
    train --steps 8 --checkpoint-dir "$tmp/g5" --resume --ffn-dim 192

# (e) the format, read by Python: config.json (its BOS and EOS the shard's) always, safetensors where installed
ck=$tmp/a/step_00000006
check "config.json and the safetensors header are what HF expects" "$PYTHON" - "$ck" <<'PY'
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 1024, "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32", "bos_token_id": 0,
        "eos_token_id": 1, "rope_theta": 500000.0, "rope_scaling": None, "rms_norm_eps": 1e-5}
bad = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
assert not bad, bad
raw = open(f"{d}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
assert n % 8 == 0
hdr = json.loads(raw[8:8 + n])
assert hdr.pop("__metadata__") == {"format": "pt", "step": "6"}
assert "lm_head.weight" not in hdr and len(hdr) == 2 + 2 * 9, sorted(hdr)
assert hdr["model.embed_tokens.weight"]["shape"] == [512, 64]
assert hdr["model.layers.1.self_attn.k_proj.weight"]["shape"] == [32, 64]
assert hdr["model.layers.0.input_layernorm.weight"]["shape"] == [64]
assert all(t["dtype"] == "F32" for t in hdr.values())
ends = sorted(t["data_offsets"] for t in hdr.values())
assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:])) and ends[-1][1] == len(raw) - 8 - n
PY
if "$PYTHON" -c "import safetensors.numpy" 2> /dev/null; then
    check "safetensors.numpy loads the checkpoint" "$PYTHON" - "$ck" <<'PY'
import json, struct, sys
import numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
t = load_file(f"{d}/model.safetensors")
assert len(t) == 20 and all(v.dtype == np.float32 for v in t.values())
assert t["model.layers.0.mlp.gate_proj.weight"].shape == (176, 64)
assert t["model.norm.weight"].shape == (64,)
# the values: the first tensor's bytes straight from the file
raw = open(f"{d}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
b, e = json.loads(raw[8:8 + n])["model.embed_tokens.weight"]["data_offsets"]
ref = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<f4").reshape(512, 64)
assert np.array_equal(t["model.embed_tokens.weight"], ref) and np.isfinite(ref).all() and ref.std() > 0.01
PY
else
    echo "SKIP safetensors.numpy is not installed (pip install safetensors)"
fi

summary
