"""scripts/llmq_inputs.py: llmq's token files (the header its dataloader.cpp checks: magic, version 2, 4 bytes per
token, the token count, the vocabulary) and config.json, from random tokens and from this project's shards."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("llmq_inputs", os.path.join(ROOT, "scripts", "llmq_inputs.py"))
llmq_inputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llmq_inputs)
sys.path.insert(0, os.path.join(ROOT, "data"))
import prepare  # noqa: E402


def test_random_tokens(tmp_path):
    llmq_inputs.main([str(tmp_path), "--model", "qwen2.5-1.5b", "--random-tokens", "5000"])
    raw = open(tmp_path / "train.bin", "rb").read()
    assert raw[:8] == b"BIN.TOK\n" and len(raw) == 1024 + 4 * 5000
    version, bpt, vocab, tokens = llmq_inputs.read_token_file(str(tmp_path / "train.bin"))
    assert (version, bpt, vocab, tokens.size) == (2, 4, 151936, 5000) and tokens.max() < 151936
    config = json.load(open(tmp_path / "model" / "config.json"))
    assert config["model_type"] == "qwen2" and config["hidden_size"] == 1536


def test_from_shards(tmp_path):
    shard = tmp_path / "s_train_000000.bin"
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "make_random_shard.py"), str(shard), "300", "4000",
                    "4", "1", "2"], check=True)
    llmq_inputs.main([str(tmp_path / "out"), "--model", "llama3.2-1b", "--train", str(tmp_path / "s_train_*.bin")])
    _, _, vocab, tokens = llmq_inputs.read_token_file(str(tmp_path / "out" / "train.bin"))
    assert vocab == 128256 and np.array_equal(tokens, np.asarray(prepare.read_shard(str(shard))[1]))


def test_cut_model(tmp_path):
    # the 8B cut to 8 layers, as bench_e2e's llama3.1-8b-cut: untied, the rest of the published config kept
    llmq_inputs.main([str(tmp_path), "--model", "llama3.1-8b", "--layers", "8", "--random-tokens", "100"])
    config = json.load(open(tmp_path / "model" / "config.json"))
    assert config["num_hidden_layers"] == 8 and config["hidden_size"] == 4096 and not config["tie_word_embeddings"]
    assert llmq_inputs.MODELS["llama3.1-8b"]["num_hidden_layers"] == 32  # the table itself is not changed
    with pytest.raises(SystemExit):
        llmq_inputs.main([str(tmp_path), "--model", "llama3.2-1b", "--layers", "17", "--random-tokens", "100"])
