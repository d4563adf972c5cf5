"""Tests of data/prepare.py: python3 -m pytest tests/test_prepare.py

The tokenizer tests need `pip install tiktoken` and `pip install --no-deps llama-models`
(and openai-whisper for the gpt2 ones); they are skipped only when those are missing.
"""

import importlib.util
import os
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE = os.path.join(ROOT, "data", "prepare.py")

_spec = importlib.util.spec_from_file_location("prepare", PREPARE)
prepare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prepare)

HAVE_TIKTOKEN = importlib.util.find_spec("tiktoken") is not None
needs_llama3 = pytest.mark.skipif(not HAVE_TIKTOKEN or importlib.util.find_spec("llama_models") is None,
                                  reason="needs pip install tiktoken && pip install --no-deps llama-models")
needs_gpt2 = pytest.mark.skipif(not HAVE_TIKTOKEN or importlib.util.find_spec("whisper") is None,
                                reason="needs pip install tiktoken && pip install --no-deps openai-whisper")

DOCS = {
    "a.txt": "In the beginning was the shard.\nIt had a header.\n",
    "b.txt": "Ünïcödé text: naïve café, 日本語, emoji 🎉 and tabs\tend\n\n\nwith blank lines.",
    "sub/c.txt": "Numbers 1234567 and punctuation!!! ... 'quoted' it's we'll\r\nCRLF line\r\n",
    "sub/deeper/d.md": "# A markdown file\n\nAlso a text file, found by walking the folder.\n",
    "e.txt": "<|begin_of_text|> in the text is plain text, not the special token.\n",
}


@pytest.fixture(scope="module")
def llama3():
    return prepare.load_tokenizer("llama3")


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    for name, text in DOCS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    (root / ".hidden.txt").write_text("never read")
    (root / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    return root


def run(*args, env=None):
    return subprocess.run([sys.executable, PREPARE, *map(str, args)], capture_output=True, text=True, env=env)


def run_ok(*args):
    result = run(*args)
    assert result.returncode == 0, result.stderr
    return result


def shards(out_dir, split, name="corpus"):
    return sorted(str(p) for p in out_dir.glob(f"{name}_{split}_*.bin"))


def all_tokens(paths):
    tokens = []
    for path in paths:
        tokens.extend(prepare.read_shard(path)[1])
    return tokens


def split_at_bos(tokens, bos):
    assert tokens and tokens[0] == bos, "the stream must start with BOS"
    docs, current = [], []
    for t in tokens[1:]:
        if t == bos:
            docs.append(current)
            current = []
        else:
            current.append(t)
    docs.append(current)
    return docs


def decoded_docs(tokens, tokenizer):
    return sorted(tokenizer.encoding.decode(doc) for doc in split_at_bos(tokens, tokenizer.bos_id))


@needs_llama3
def test_header_dtype_and_round_trip(corpus, tmp_path, llama3):
    out = tmp_path / "out"
    run_ok(corpus, "--out-dir", out, "--val-tokens", 0)
    [path] = shards(out, "train")
    assert shards(out, "val") == []
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, bpt, vocab, count, bos, eos = struct.unpack_from("<iiiiQii", raw)
    assert (magic, version, bpt, vocab, bos, eos) == (0x4C4C5453, 1, 4, 128256, 128000, 128001)
    assert raw[32:1024] == bytes(992)
    assert len(raw) == 1024 + 4 * count
    header, tokens, _ = prepare.read_shard(path)
    assert tokens.itemsize == 4 and header["num_tokens"] == count == len(tokens)
    assert max(tokens) < 128256
    assert decoded_docs(tokens, llama3) == sorted(DOCS.values())
    assert list(out.glob("*.tmp")) == []
    # the tokenizer beside the shards, for the trainers' samples and exports
    copy = out / "corpus_tokenizer.model"
    assert copy.read_bytes() == open(prepare.default_tokenizer_path("llama3"), "rb").read()


@needs_llama3
def test_special_token_text_is_encoded_as_text(corpus, tmp_path, llama3):
    out = tmp_path / "out"
    run_ok(corpus / "e.txt", "--out-dir", out, "--val-tokens", 0)
    tokens = all_tokens(shards(out, "train"))
    assert tokens.count(llama3.bos_id) == 1 and tokens[0] == llama3.bos_id
    assert llama3.encoding.decode(tokens[1:]) == DOCS["e.txt"]


@needs_llama3
def test_shard_splitting(corpus, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_ok(corpus, "--out-dir", whole, "--val-tokens", 0)
    run_ok(corpus, "--out-dir", split, "--val-tokens", 0, "--shard-tokens", 25)
    paths = shards(split, "train")
    counts = [prepare.read_shard_header(p)["num_tokens"] for p in paths]
    assert len(paths) >= 3
    assert all(c == 25 for c in counts[:-1]) and 1 <= counts[-1] <= 25
    assert [os.path.basename(p) for p in paths] == [f"corpus_train_{i:06d}.bin" for i in range(len(paths))]
    assert all_tokens(paths) == all_tokens(shards(whole, "train"))


@needs_llama3
def test_val_shard_takes_whole_documents(corpus, tmp_path, llama3):
    out = tmp_path / "out"
    result = run_ok(corpus, "--out-dir", out, "--val-tokens", 1, "--name", "x")
    [val] = shards(out, "val", "x")
    assert os.path.basename(val) == "x_val_000000.bin"
    val_docs = decoded_docs(prepare.read_shard(val)[1], llama3)
    train_docs = decoded_docs(all_tokens(shards(out, "train", "x")), llama3)
    assert len(val_docs) == 1
    assert sorted(val_docs + train_docs) == sorted(DOCS.values())
    assert "1 val" in result.stdout and "tokens/s" in result.stdout


@needs_llama3
def test_seed_decides_the_document_order(corpus, tmp_path):
    outs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        out = tmp_path / name
        run_ok(corpus, "--out-dir", out, "--val-tokens", 0, "--seed", seed)
        outs[name] = all_tokens(shards(out, "train"))
    assert outs["a"] == outs["b"]
    assert outs["a"] != outs["c"] and sorted(outs["a"]) == sorted(outs["c"])


@needs_llama3
def test_doc_separators(tmp_path, llama3):
    text = "first paragraph\nstill first\n\nsecond\n \nthird\n%\nfourth"
    (tmp_path / "t.txt").write_text(text)
    cases = {
        "blank": ["first paragraph\nstill first", "second", "third\n%\nfourth"],
        "line": ["first paragraph", "still first", "second", "third", "%", "fourth"],
        "regex:^%\\n": ["first paragraph\nstill first\n\nsecond\n \nthird\n", "fourth"],
        "file": [text],
    }
    for separator, expected in cases.items():
        out = tmp_path / separator.replace(":", "_").replace("\\", "").replace("^", "").replace("%", "")
        run_ok(tmp_path / "t.txt", "--out-dir", out, "--val-tokens", 0, "--doc-separator", separator)
        assert decoded_docs(all_tokens(shards(out, "train")), llama3) == sorted(expected), separator
    (tmp_path / "crlf.txt").write_bytes(b"one\r\n\r\ntwo\r\nthree\r\n")
    run_ok(tmp_path / "crlf.txt", "--out-dir", tmp_path / "crlf", "--val-tokens", 0, "--doc-separator", "blank")
    assert decoded_docs(all_tokens(shards(tmp_path / "crlf", "train")), llama3) == ["one", "two\r\nthree\r\n"]


@needs_llama3
def test_long_documents_do_not_panic_tiktoken(tmp_path, llama3):
    long_doc = ("word " * 90_000) + "\n" + ("x" * 60_000) + " " + (" " * 30_000) + "end\n" + "line\n" * 80_000
    assert len(long_doc) > 2 * prepare.TIKTOKEN_MAX_ENCODE_CHARS
    (tmp_path / "long.txt").write_text(long_doc)
    out = tmp_path / "out"
    run_ok(tmp_path / "long.txt", "--out-dir", out, "--val-tokens", 0)
    assert decoded_docs(all_tokens(shards(out, "train")), llama3) == [long_doc]


@needs_llama3
def test_stale_shards_of_a_longer_run_are_removed(corpus, tmp_path):
    out = tmp_path / "out"
    run_ok(corpus, "--out-dir", out, "--val-tokens", 0, "--shard-tokens", 25)
    assert len(shards(out, "train")) >= 3
    other = out / "other_train_000005.bin"
    other.write_bytes(b"not ours")
    result = run_ok(corpus, "--out-dir", out, "--val-tokens", 0)
    assert len(shards(out, "train")) == 1
    assert other.exists()
    assert "stale" in result.stdout


@needs_llama3
def test_check_reports_good_and_bad_shards(corpus, tmp_path):
    out = tmp_path / "out"
    run_ok(corpus, "--out-dir", out, "--val-tokens", 0)
    [path] = shards(out, "train")
    good = run("--check", path)
    assert good.returncode == 0 and "ok" in good.stdout and "uint32" in good.stdout
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)
    bad = run("--check", path)
    assert bad.returncode == 1 and "BAD" in bad.stdout and path in bad.stdout


@needs_llama3
def test_all_documents_in_val_is_an_error(corpus, tmp_path):
    result = run(corpus, "--out-dir", tmp_path / "out", "--val-tokens", 10**9)
    assert result.returncode == 1
    assert "--val-tokens" in result.stderr and "Traceback" not in result.stderr


@needs_gpt2
def test_gpt2_shards_are_uint16(corpus, tmp_path):
    gpt2 = prepare.load_tokenizer("gpt2")
    out = tmp_path / "out"
    run_ok(corpus, "--out-dir", out, "--val-tokens", 0, "--tokenizer", "gpt2")
    [path] = shards(out, "train")
    header, tokens, _ = prepare.read_shard(path)
    assert (header["bytes_per_token"], header["vocab_size"], header["bos_id"]) == (2, 50257, 50256)
    assert os.path.getsize(path) == 1024 + 2 * len(tokens)
    assert decoded_docs(tokens, gpt2) == sorted(DOCS.values())


def test_wrong_tokenizer_hash_is_a_clear_error(corpus, tmp_path):
    fake = tmp_path / "tokenizer.model"
    fake.write_bytes(b"IQ== 0\nIg== 1\n")
    result = run(corpus, "--out-dir", tmp_path / "out", "--tokenizer-model", fake)
    assert result.returncode != 0
    assert prepare.TOKENIZERS["llama3"]["sha256"] in result.stderr
    assert prepare.sha256_of(fake) in result.stderr
    assert "pip install --force-reinstall --no-deps llama-models" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_input_is_a_clear_error(corpus, tmp_path):
    missing = tmp_path / "no_such_dir"
    result = run(corpus, missing, "--out-dir", tmp_path / "out")
    assert result.returncode != 0
    assert f"input path not found: {missing}" in result.stderr
    assert "Traceback" not in result.stderr


def test_non_utf8_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    result = run(bad, "--out-dir", tmp_path / "out")
    assert result.returncode != 0
    assert str(bad) in result.stderr and "UTF-8" in result.stderr and "Traceback" not in result.stderr


def test_folder_without_text_files_is_a_clear_error(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "blob.bin").write_bytes(b"\x00\x00")
    result = run(tmp_path / "in", "--out-dir", tmp_path / "out")
    assert result.returncode != 0 and "no text files" in result.stderr


def test_missing_bible_command_names_the_package(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))
    result = run("--out-dir", tmp_path / "out", env=env)
    assert result.returncode != 0
    assert "apt-get install bible-kjv fortunes" in result.stderr and "Traceback" not in result.stderr


def test_bible_output_is_split_into_books():
    text = ("\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n"
            "  2 And the earth was without form, and void; and darkness was upon the face of\n"
            "the deep. And the Spirit of God moved upon the face of the waters.\n"
            "\nGenesis 2\n\n  1 Thus the heavens 2\n\n1 Samuel 1\n\n  1 Now there was a certain man\n")
    assert prepare.bible_books(text) == [
        "Genesis 1\n\n1 In the beginning God created the heaven and the earth.\n"
        "2 And the earth was without form, and void; and darkness was upon the face of the deep. "
        "And the Spirit of God moved upon the face of the waters.\n\n"
        "Genesis 2\n\n1 Thus the heavens 2\n",
        "1 Samuel 1\n\n1 Now there was a certain man\n",
    ]


def test_fortunes_are_split_and_overstrikes_removed(tmp_path):
    (tmp_path / "jokes").write_text("one\n%\n_\b_\bt_\bw_\bo lines\nsecond line\n%\nB\bBo\bol\bld\bd ___\b\b\bAAA\n%\n")
    (tmp_path / "jokes.dat").write_bytes(b"index")
    (tmp_path / "unindexed").write_text("skipped\n")
    os.symlink("jokes", tmp_path / "jokes.u8")
    assert prepare.fortune_documents(str(tmp_path)) == ["one\n", "two lines\nsecond line\n", "Bold AAA\n"]


@pytest.mark.skipif(not os.path.exists("/usr/bin/bible"), reason="needs apt-get install bible-kjv")
def test_default_corpus_has_the_66_books_first():
    docs = prepare.default_corpus_documents()
    assert docs[0].startswith("Genesis 1\n\n1 In the beginning God created the heaven and the earth.\n")
    assert docs[65].startswith("Revelation 1\n") and docs[65].endswith("be with you all. Amen.\n")
    assert sum(d.startswith("Psalms 1\n") for d in docs[:66]) == 1
    if prepare.fortune_documents():
        assert len(docs) > 1000


# ---------------------------------------------------------------- fine-tuning data: masked shards (issue 16)

PAIRS = [{"prompt": "Q: Who built the ark?\nA:", "completion": " Noah."},
         {"prompt": "Q: First book?\nA:", "completion": " Genesis."}]
CHATS = [{"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Ark?"},
                       {"role": "assistant", "content": "Noah."}]},
         {"messages": [{"role": "user", "content": "First?"}, {"role": "assistant", "content": "Genesis."},
                       {"role": "user", "content": "Last?"}, {"role": "assistant", "content": "Revelation."}]}]


def write_jsonl(path, records, extra=""):
    import json
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n" + extra)
    return path


def examples_in(path):
    """(tokens, mask) per example of a masked shard, cut at BOS."""
    header, tokens, mask = prepare.read_shard(path)
    assert header["version"] == prepare.VERSION_MASKED and len(mask) == len(tokens)
    out = []
    for t, m in zip(tokens, mask):
        if t == header["bos_id"]:
            out.append(([], []))
        out[-1][0].append(t)
        out[-1][1].append(m)
    return out


@needs_llama3
def test_pairs_count_only_the_completion(tmp_path, llama3):
    src = write_jsonl(tmp_path / "qa.jsonl", PAIRS)
    out = tmp_path / "out"
    result = run_ok("--format", "pairs", src, "--out-dir", out, "--name", "qa", "--val-tokens", 0)
    assert "the loss counts" in result.stdout
    got = sorted(examples_in(shards(out, "train", "qa")[0]))
    want = []
    for r in PAIRS:
        p, c = llama3.encoding.encode_ordinary(r["prompt"]), llama3.encoding.encode_ordinary(r["completion"])
        want.append(([llama3.bos_id] + p + c + [llama3.eos_id], [0] * (1 + len(p)) + [1] * (len(c) + 1)))
    assert got == sorted(want)
    assert "loss on" in run_ok("--check", shards(out, "train", "qa")[0]).stdout


@needs_llama3
def test_chat_counts_only_the_assistant_with_special_tokens(tmp_path, llama3):
    src = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    out = tmp_path / "out"
    run_ok("--format", "chat", src, "--out-dir", out, "--name", "chat", "--val-tokens", 0)
    sp = llama3.specials
    for tokens, mask in examples_in(shards(out, "train", "chat")[0]):
        text = llama3.encoding.decode(tokens)
        assert text.startswith("<|begin_of_text|><|start_header_id|>")
        assert tokens.count(sp["<|start_header_id|>"]) == tokens.count(sp["<|eot_id|>"]) >= 2  # special, not text
        counted = llama3.encoding.decode([t for t, m in zip(tokens, mask) if m])
        assert counted in ("Noah.<|eot_id|>", "Genesis.<|eot_id|>Revelation.<|eot_id|>"), counted


def test_bad_example_lines_name_the_file_and_line(tmp_path):
    cases = [("pairs", '{"prompt": "x"}', "needs a string \"completion\""),
             ("pairs", "not json", "not JSON"),
             ("chat", '{"messages": [{"role": "user", "content": "hi"}]}', "no \"assistant\" message"),
             ("chat", '{"messages": [{"role": "user"}]}', "message 0 needs a string")]
    for fmt, line, needle in cases:
        src = write_jsonl(tmp_path / "bad.jsonl", PAIRS if fmt == "pairs" else CHATS, line + "\n")
        result = run("--format", fmt, src, "--out-dir", tmp_path / "out")
        assert result.returncode == 1 and f"{src}:3:" in result.stderr and needle in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    result = run("--format", "pairs", "--out-dir", tmp_path / "out")
    assert result.returncode == 1 and "needs JSON lines files" in result.stderr
