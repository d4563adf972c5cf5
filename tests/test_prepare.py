"""Tests of data/prepare.py: python3 -m pytest tests/test_prepare.py

The tokenizer tests need `pip install tiktoken` and `pip install --no-deps llama-models`
(and openai-whisper for the gpt2 ones); they are skipped only when those are missing.
"""

import importlib.util
import os
import struct
import subprocess
import sys
import time

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


@pytest.fixture
def bigger_corpus(corpus):
    """The corpus and 16 more text files of random words: some 5,000 tokens, several shards of the least
    --shard-tokens (1,000)."""
    import random
    rng = random.Random(11)
    words = ["shard", "token", "header", "the", "of", "and", "naïve", "café", "1234", "!", "\n", "emoji 🎉"]
    for i in range(16):
        path = corpus / "more" / f"{i:02d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(" ".join(rng.choice(words) for _ in range(rng.randint(100, 300))) + "\n")
    return corpus


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
def test_shard_splitting(bigger_corpus, tmp_path):
    corpus = bigger_corpus
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_ok(corpus, "--out-dir", whole, "--val-tokens", 0)
    run_ok(corpus, "--out-dir", split, "--val-tokens", 0, "--shard-tokens", 1000)
    paths = shards(split, "train")
    counts = [prepare.read_shard_header(p)["num_tokens"] for p in paths]
    assert len(paths) >= 3
    assert all(c == 1000 for c in counts[:-1]) and 1 <= counts[-1] <= 1000
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
def test_stale_shards_of_a_longer_run_are_removed(bigger_corpus, tmp_path):
    corpus = bigger_corpus
    out = tmp_path / "out"
    run_ok(corpus, "--out-dir", out, "--val-tokens", 0, "--shard-tokens", 1000)
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


@needs_llama3
def test_invalid_utf8_is_replaced_and_counted_or_with_strict_an_error(tmp_path, llama3):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    out = tmp_path / "out"
    result = run_ok(bad, "--out-dir", out, "--val-tokens", 0)
    assert f"invalid UTF-8: 2 byte sequence(s) replaced with U+FFFD (first in {bad})" in result.stdout
    assert decoded_docs(all_tokens(shards(out, "train")), llama3) == ["caf\ufffd cr\ufffdme\n"]
    result = run(bad, "--out-dir", tmp_path / "strict", "--strict")
    assert result.returncode == 1
    assert f"{bad}: not UTF-8 (invalid continuation byte at byte 3 of a document)" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not list((tmp_path / "strict").glob("*.bin"))


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
        result = run("--format", fmt, src, "--out-dir", tmp_path / "out", "--strict")
        assert result.returncode == 1 and f"{src}:3:" in result.stderr and needle in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        # without --strict the example is skipped, and counted with its place in the summary
        result = run("--format", fmt, src, "--out-dir", tmp_path / "out", "--val-tokens", 0)
        assert result.returncode == 0 and "documents: 2 " in result.stdout, result.stderr
        assert "skipped 1 record(s)" in result.stdout and f"(first: {src}:3:" in result.stdout
        assert needle in result.stdout
    result = run("--format", "pairs", "--out-dir", tmp_path / "out")
    assert result.returncode == 1 and "needs JSON lines files" in result.stderr


# ------------------------------------------------------- streaming, input formats, bad input, resume (issue 17)

needs_parquet = pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="needs pip install pyarrow")
needs_zstd = pytest.mark.skipif(importlib.util.find_spec("zstandard") is None, reason="needs pip install zstandard")


def write_records(path, records):
    """records as JSON lines (path ending .jsonl/.json, maybe .gz/.zst) or as a parquet file."""
    import gzip
    import json
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=2)
        return path
    data = ("\n".join(json.dumps(r) for r in records) + "\n").encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        import zstandard
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def write_text_files(folder, texts, suffix=""):
    """One text file per text in folder, named 000.txt..., compressed if suffix is .gz or .zst."""
    import gzip
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        data = text.encode()
        if suffix == ".gz":
            data = gzip.compress(data)
        elif suffix == ".zst":
            import zstandard
            data = zstandard.ZstdCompressor().compress(data)
        (folder / f"{i:03d}.txt{suffix}").write_bytes(data)
    return folder


FORMATS = {
    "txt folder": lambda d: write_text_files(d / "in", DOCS.values()),
    "txt.gz folder": lambda d: write_text_files(d / "in", DOCS.values(), ".gz"),
    "txt.zst folder": lambda d: write_text_files(d / "in", DOCS.values(), ".zst"),
    "jsonl": lambda d: write_records(d / "in.jsonl", [{"text": t, "id": i} for i, t in enumerate(DOCS.values())]),
    "json.gz": lambda d: write_records(d / "in.json.gz", [{"text": t} for t in DOCS.values()]),
    "jsonl.zst": lambda d: write_records(d / "in.jsonl.zst", [{"text": t} for t in DOCS.values()]),
    "parquet": lambda d: write_records(d / "in.parquet", [{"text": t, "n": 1} for t in DOCS.values()]),
}


@needs_llama3
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_input_format_gives_the_documents(fmt, tmp_path, llama3):
    if "zst" in fmt and importlib.util.find_spec("zstandard") is None:
        pytest.skip("needs pip install zstandard")
    if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        pytest.skip("needs pip install pyarrow")
    src = FORMATS[fmt](tmp_path)
    out = tmp_path / "out"
    result = run_ok(src, "--out-dir", out, "--val-tokens", 0, "--workers", 2)
    assert decoded_docs(all_tokens(shards(out, "train")), llama3) == sorted(DOCS.values())
    assert "skipped" not in result.stdout and "invalid UTF-8" not in result.stdout


@needs_llama3
@needs_parquet
@needs_zstd
def test_a_folder_of_mixed_formats_and_text_field(tmp_path, llama3):
    texts = list(DOCS.values())
    folder = tmp_path / "in"
    write_text_files(folder / "plain", texts[:1])
    write_text_files(folder / "gz", texts[1:2], ".gz")
    write_records(folder / "a.jsonl.zst", [{"body": texts[2]}])
    write_records(folder / "b.json", [{"body": texts[3]}])
    write_records(folder / "c.parquet", [{"body": texts[4]}])
    out = tmp_path / "out"
    run_ok(folder, "--out-dir", out, "--val-tokens", 0, "--text-field", "body")
    assert decoded_docs(all_tokens(shards(out, "train")), llama3) == sorted(texts)


def reference_streams(docs, tokenizer, val_tokens, seed=1337):
    """The val and train token streams of the rule prepare.py has always had: shuffle all documents with
    random.Random(seed), then whole documents to val until it holds val_tokens."""
    order = list(range(len(docs)))
    import random
    random.Random(seed).shuffle(order)
    streams = {"val": [], "train": []}
    for i in order:
        tokens = [tokenizer.bos_id] + tokenizer.encoding.encode_ordinary(docs[i])
        streams["val" if len(streams["val"]) < val_tokens else "train"].extend(tokens)
    return streams


@needs_llama3
def test_a_corpus_within_the_buffer_is_shuffled_whole_as_before(bigger_corpus, tmp_path, llama3):
    corpus = bigger_corpus
    out = tmp_path / "out"
    run_ok(corpus, "--out-dir", out, "--val-tokens", 30, "--shard-tokens", 1000)
    assert len(shards(out, "train")) >= 3
    docs = [open(path, encoding="utf-8", newline="").read() for path in prepare.find_input_files([str(corpus)])]
    want = reference_streams(docs, llama3, 30)
    assert all_tokens(shards(out, "val")) == want["val"] and all_tokens(shards(out, "train")) == want["train"]


def many_documents(tmp_path):
    """Text files for the streaming tests: many documents over several --buffer-mb 0.01 blocks (10,485 bytes),
    one too long to hold in one (over a quarter of that) and one long enough to be cut into pieces for tiktoken
    (over 400,000 characters); one with invalid UTF-8 (the text in the list has U+FFFD), and a JSON lines file
    with two more documents and two bad records."""
    import random
    rng = random.Random(7)
    words = ["the", "shard", "of", "Ünïcödé", "tokens", "1234", "!!", "\t", "\r\n", "\n", "emoji 🎉"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 400))) for _ in range(120)]
    texts[30] = "long document " * 600  # 8,400 bytes
    texts[60] = "very long line of words " * 18_000 + "\n" + "x" * 30_000
    folder = write_text_files(tmp_path / "many", texts)
    # past the 8 KiB that decide whether a file in a folder is text
    (folder / "030.txt").write_bytes(texts[30].encode() + b"caf\xe9")
    texts[30] += "caf\ufffd"
    (folder / "records.jsonl").write_text('{"text": "one record"}\nnot JSON\n{"no": "text"}\n{"text": "two"}\n')
    return folder, texts + ["one record", "two"]


def file_hashes(folder):
    import hashlib
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@needs_llama3
def test_the_shards_are_the_same_for_any_number_of_workers(tmp_path, llama3):
    src, texts = many_documents(tmp_path)
    args = ("--buffer-mb", 0.01, "--shard-tokens", 20_000, "--val-tokens", 5_000)
    hashes = []
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}"
        run_ok(src, "--out-dir", out, "--workers", workers, *args)
        hashes.append(file_hashes(out))
    assert hashes[0] == hashes[1] == hashes[2]
    assert len([name for name in hashes[0] if name.startswith("corpus_train_")]) >= 5
    out = tmp_path / "w1"
    tokens = all_tokens(shards(out, "val")) + all_tokens(shards(out, "train"))
    assert decoded_docs(tokens, llama3) == sorted(texts)
    # the shuffle is within blocks: not the order of the files, nor the order of one whole-corpus shuffle
    run_ok(src, "--out-dir", tmp_path / "whole", "--val-tokens", 5_000)
    assert all_tokens(shards(tmp_path / "whole", "train")) != all_tokens(shards(out, "train"))


class _SleepingEncoder:
    """A stand-in for TaskEncoder in the pool's workers: a task (kinds, [seconds, number]) sleeps that long and
    gives (the worker's pid, number); seconds < 0 makes the worker die."""

    def encode(self, kinds, items):
        seconds, number = items
        if seconds < 0:
            os._exit(3)
        time.sleep(seconds)
        return os.getpid(), number


def test_the_pool_gives_results_in_task_order_and_slow_workers_fewer_tasks():
    pool = prepare.WorkerPool(3, _SleepingEncoder())
    try:
        # the first task holds its worker for a second, the others take 10 ms: dealt round-robin, that worker would
        # get every third task; sent to the least busy worker, it gets only the TASKS_PER_WORKER it was first given
        tasks = 30
        for number in range(tasks):
            pool.send((b"", [1.0 if number == 0 else 0.01, number]))
        results = [pool.receive() for _ in range(tasks)]
    finally:
        pool.close()
    assert [number for _, number in results] == list(range(tasks))
    slow_pid = results[0][0]
    assert sum(pid == slow_pid for pid, _ in results) <= prepare.TASKS_PER_WORKER < tasks // 3


def test_tasks_ahead_keep_the_workers_fed_and_memory_bounded():
    for workers in (1, 2, 16, 64, 128, 1000):
        ahead = prepare.tasks_ahead(workers)
        assert ahead >= prepare.TASKS_PER_WORKER * workers  # every worker can have its tasks in flight
        assert (ahead - prepare.TASKS_PER_WORKER * workers) * prepare.TASK_BYTES <= prepare.TASKS_AHEAD_BYTES
    assert prepare.tasks_ahead(16) == prepare.TASKS_AHEAD_PER_WORKER * 16


def test_a_dead_worker_is_a_resumable_error():
    pool = prepare.WorkerPool(2, _SleepingEncoder())
    try:
        with pytest.raises(prepare.ResumableError, match="worker process died"):
            # its result never comes, or its pipe breaks under a later task
            for number in range(20):
                pool.send((b"", [-1 if number == 1 else 0.0, number]))
            for number in range(20):
                pool.receive()
    finally:
        pool.close()


def test_streamed_splitting_finds_the_documents_of_split_documents():
    import random
    rng = random.Random(3)
    alphabet = ["a", "b", " ", "\t", "\r", "\n", "\n", "\r\n", "\n\n", "é", "\u3000", "\x1c"]
    for case in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
        data = text.encode()
        for separator in ("file", "blank", "line"):
            splitter = prepare.DocumentSplitter(separator, huge_bytes=rng.choice([5, 40, 10**9]))
            events, pos = [], 0
            while pos < len(data):
                step = rng.randint(1, 30)
                events += splitter.feed(data[pos:pos + step])
                pos += step
            events += splitter.finish()
            docs, parts = [], []
            for kind, piece in events:
                if kind == "doc":
                    docs.append(piece.decode())
                else:
                    parts.append(piece)
                    if kind == "end":
                        # a document handed on in parts is written even when it is only whitespace
                        if b"".join(parts).decode().strip():
                            docs.append(b"".join(parts).decode())
                        parts = []
            assert docs == prepare.split_documents(text, separator), (case, separator, text)


def test_cut_pieces_do_not_depend_on_how_the_text_is_read():
    import random
    rng = random.Random(5)
    text = "".join(rng.choice(["word ", "x" * 1000, "\n", " " * 300, "y" * 200_000]) for _ in range(400))
    assert len(text) > 3 * prepare.TIKTOKEN_MAX_ENCODE_CHARS
    whole = list(prepare.cut_pieces([text]))
    assert "".join(whole) == text and max(map(len, whole)) <= prepare.TIKTOKEN_MAX_ENCODE_CHARS
    cuts = sorted(rng.sample(range(len(text)), 50))
    segments = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    assert list(prepare.cut_pieces(segments)) == whole


def test_the_long_run_probe_misses_no_run():
    import random
    rng = random.Random(9)
    limit = prepare.MAX_NO_WHITESPACES_CHARS
    for case in range(60):
        run_chars = rng.choice([" ", "x", "\u3000"]) * rng.randint(limit - 2, limit + 3)
        filler = rng.choice(["ab ", " c\n"])
        text = filler * rng.randint(0, 20_000) + run_chars + filler * rng.randint(0, 5)
        has_run = prepare._LONG_RUN.search(text) is not None
        assert prepare._may_have_long_run(text) or not has_run, case
        assert prepare._split_long_runs(text) == ([text] if not has_run else prepare._split_long_runs(text))
        assert "".join(prepare._split_long_runs(text)) == text


@needs_llama3
def test_bad_json_lines_are_counted_and_named_or_with_strict_an_error(tmp_path, llama3):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "one"}\nnot json\n\n{"body": "x"}\n["a list"]\n{"text": "two"}\n{"text": 3}\n')
    out = tmp_path / "out"
    result = run_ok(src, "--out-dir", out, "--val-tokens", 0)
    assert decoded_docs(all_tokens(shards(out, "train")), llama3) == ["one", "two"]
    assert f"skipped 1 record(s) that are not JSON (first: {src}:2: not JSON: Expecting value" in result.stdout
    assert (f"skipped 3 record(s) without a string \"text\" (first: {src}:4: no string \"text\"; the keys are "
            f"['body'])") in result.stdout
    result = run(src, "--out-dir", tmp_path / "strict", "--strict")
    assert result.returncode == 1 and f"{src}:2: not JSON" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "strict").exists() or not list((tmp_path / "strict").iterdir())


@needs_llama3
@needs_parquet
def test_records_without_text_are_an_error_that_names_them(tmp_path):
    src = write_records(tmp_path / "in.parquet", [{"body": "x"}, {"body": "y"}])
    result = run(src, "--out-dir", tmp_path / "out")
    assert result.returncode == 1 and "the inputs hold no text" in result.stderr
    assert f'skipped 2 record(s) without a string "text" (first: {src} row 1: no column "text"' in result.stderr
    assert "Traceback" not in result.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n")
    result = run(empty, "--out-dir", tmp_path / "out")
    assert result.returncode == 1 and "the inputs hold no text" in result.stderr and "Traceback" not in result.stderr


@needs_llama3
def test_a_corrupt_file_is_an_error_that_leaves_no_shards(tmp_path):
    import gzip
    src, texts = many_documents(tmp_path)
    long_text = "\n".join([texts[60]] * (3 * prepare.READ_BYTES // len(texts[60])))
    compressed = gzip.compress(long_text.encode())
    # its start reads as text (past the buffer that checking it reads), its end is missing
    cut_short = compressed[:len(compressed) // 2]
    (src / "999.txt.gz").write_bytes(cut_short)
    out = tmp_path / "out"
    result = run(src, "--out-dir", out, "--shard-tokens", 5_000, "--val-tokens", 0, "--buffer-mb", 0.01)
    assert result.returncode == 1, result.stderr
    assert f"cannot read {src / '999.txt.gz'}: Compressed file ended" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert list(out.iterdir()) == []  # shards were written before the error, and removed
    (src / "999.txt.gz").write_bytes(b"this is no gzip stream")
    result = run(src, "--out-dir", out)
    assert result.returncode == 1 and f"cannot read {src / '999.txt.gz'}: Not a gzipped file" in result.stderr


@pytest.mark.parametrize("isal", ["isal", "no isal"])
def test_gzip_is_read_with_or_without_isal(isal, tmp_path, monkeypatch):
    import gzip
    if isal == "isal":
        pytest.importorskip("isal.igzip")
    else:
        monkeypatch.setitem(sys.modules, "isal", None)  # import isal fails: the standard library's gzip reads
    data = b"".join(b'{"text": "record %d"}\n' % i for i in range(20_000))
    good, corrupt = tmp_path / "good.jsonl.gz", tmp_path / "corrupt.jsonl.gz"
    compressed = gzip.compress(data) + gzip.compress(data)  # two members, as concatenated .gz files are
    good.write_bytes(compressed)
    corrupt.write_bytes(compressed[:100] + bytes(200) + compressed[300:])
    with prepare.opened_input(str(good), ".gz") as (stream, raw):
        assert type(stream.raw).__name__ == ("IGzipFile" if isal == "isal" else "GzipFile")
        assert stream.read() == data + data and raw.tell() == len(compressed)
    with pytest.raises(prepare.read_errors()):
        with prepare.opened_input(str(corrupt), ".gz") as (stream, raw):
            stream.read()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads unreadable files")
def test_an_unreadable_file_is_a_clear_error(corpus, tmp_path):
    os.chmod(corpus / "a.txt", 0)
    result = run(corpus / "a.txt", "--out-dir", tmp_path / "out")
    assert result.returncode == 1 and f"cannot read {corpus / 'a.txt'}: Permission denied" in result.stderr


@needs_llama3
@needs_parquet
def test_a_corrupt_parquet_file_is_a_clear_error(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    result = run(tmp_path / "bad.parquet", "--out-dir", tmp_path / "out")
    assert result.returncode == 1 and f"cannot read {tmp_path / 'bad.parquet'}" in result.stderr
    assert "Traceback" not in result.stderr


STREAM_ARGS = ("--buffer-mb", 0.01, "--shard-tokens", 6_000, "--val-tokens", 10_000)


@needs_llama3
@pytest.mark.parametrize("signal_name", ["KILL", "INT"])
def test_an_interrupted_run_resumes_to_the_same_shards(signal_name, tmp_path):
    src, _ = many_documents(tmp_path)
    whole = tmp_path / "whole"
    whole_run = run_ok(src, "--out-dir", whole, *STREAM_ARGS)
    out = tmp_path / "out"
    # stopped once 4 shards are complete and another one is half written
    env = dict(os.environ, PREPARE_TEST_KILL=f"4:{signal_name}")
    result = run(src, "--out-dir", out, *STREAM_ARGS, env=env)
    if signal_name == "KILL":
        assert result.returncode == -9
        assert len(list(out.glob("*.tmp"))) == 1
    else:
        assert result.returncode == 130 and "--resume continues" in result.stderr and "Traceback" not in result.stderr
        assert list(out.glob("*.tmp")) == []
    complete = sorted(p.name for p in out.glob("*.bin"))
    assert 4 <= len(complete) < len(list(whole.glob("*.bin")))
    for name in complete:  # every *.bin a glob finds is a complete shard of the uninterrupted run
        assert (out / name).read_bytes() == (whole / name).read_bytes()
    result = run_ok(src, "--out-dir", out, *STREAM_ARGS, "--resume", "--workers", 1)
    assert "(resumed)" in result.stdout
    assert file_hashes(out) == file_hashes(whole)
    # the input problems of the whole input are counted, once
    summary = [line for line in result.stdout.splitlines() if line.startswith(("  invalid", "  skipped", "doc"))]
    assert summary == [line for line in whole_run.stdout.splitlines()
                       if line.startswith(("  invalid", "  skipped", "doc"))]
    assert len(summary) == 4 and "invalid UTF-8: 1 byte sequence(s)" in summary[0]


@needs_llama3
def test_resume_says_why_it_cannot(bigger_corpus, tmp_path):
    corpus = bigger_corpus
    out = tmp_path / "out"
    args = (corpus, "--out-dir", out, "--shard-tokens", 1000, "--val-tokens", 0)
    result = run(*args, "--resume")
    assert result.returncode == 1 and "nothing to resume" in result.stderr
    assert run(*args, env=dict(os.environ, PREPARE_TEST_KILL="2")).returncode == -9
    result = run(*args, "--resume", "--seed", 2)
    assert result.returncode == 1 and "--seed was 1337, now 2" in result.stderr, result.stderr
    (corpus / "a.txt").write_text("changed")
    result = run(*args, "--resume")
    assert result.returncode == 1 and f"{corpus / 'a.txt'}: changed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    run_ok(*args)  # without --resume: starts over
    assert not (out / "corpus_prepare_state.json").exists() and list(out.glob("*.tmp")) == []


@needs_llama3
def test_progress_goes_to_stderr_as_plain_lines(corpus, tmp_path):
    result = run_ok(corpus, "--out-dir", tmp_path / "out", "--val-tokens", 0)
    assert "prepare: 100.0% of " in result.stderr and "tokens/s" in result.stderr and "\r" not in result.stderr


# ------------------------------------------------------- the audit of prepare.py (issue 32)

def jsonl_corpus(folder, files=3, lines=2_500, seed=1):
    """files JSON lines files of lines records of 1-30 random words each: text that tokenizes fast."""
    import json
    import random
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 8))) for _ in range(2000)]
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(folder / f"{f}.jsonl", "w") as out:
            for _ in range(lines):
                out.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))}) + "\n")
    return folder


def state_of(out, name="corpus"):
    import json
    path = out / f"{name}_prepare_state.json"
    return json.loads(path.read_text()) if path.exists() else None


# The repro of issue 32 (three 25k-line files, 300,000-token shards, --buffer-mb 2), scaled down by 10.
RESUME_ARGS = ("--shard-tokens", 30_000, "--val-tokens", 5_000, "--buffer-mb", 0.2, "--workers", 2, "--name", "k")


@needs_llama3
def test_a_resumed_run_killed_before_it_completes_a_shard_keeps_its_position(tmp_path):
    src = jsonl_corpus(tmp_path / "in")
    whole = tmp_path / "whole"
    run_ok(src, "--out-dir", whole, *RESUME_ARGS)
    assert len(shards(whole, "train", "k")) >= 6
    out = tmp_path / "out"
    kill = dict(os.environ, PREPARE_TEST_KILL="3")
    assert run(src, "--out-dir", out, *RESUME_ARGS, env=kill).returncode == -9
    first = state_of(out, "k")
    assert first["item"] >= 0 and sum(map(len, first["shards"].values())) == 3
    # killed again at once: 3 shards are complete already, and it has begun the next
    assert run(src, "--out-dir", out, *RESUME_ARGS, "--resume", env=kill).returncode == -9
    second = state_of(out, "k")
    result = run_ok(src, "--out-dir", out, *RESUME_ARGS, "--resume")
    assert "(resumed)" in result.stdout
    assert file_hashes(out) == file_hashes(whole)
    assert second == first  # the position it resumed from, not "item -1, split null"


# The kill loop: runs stopped by PREPARE_TEST_KILL at random shard counts (at or below the complete shards too: then a
# resumed run is stopped before it completes one) with SIGKILL, SIGINT or SIGTERM, each resumed, until a run finishes;
# its output must be byte-identical to an uninterrupted run's. About 25 s on 2 CPUs.
KILL_LOOP_TRIALS = 8
KILL_LOOP_MAX_KILLS = 6  # per trial; then a run without kills finishes it
KILL_LOOP_SEED = 32
KILL_LOOP_SIGNALS = {"KILL": -9, "INT": 130, "TERM": 143}


def kill_loop_configs(tmp_path):
    """name -> (input, options): JSON lines over several --buffer-mb blocks; text files with a document streamed in
    parts and invalid UTF-8; pairs (masked shards)."""
    import json
    import random
    text, _ = many_documents(tmp_path)
    rng = random.Random(5)
    pairs = tmp_path / "pairs.jsonl"
    with open(pairs, "w") as f:
        for i in range(3_000):
            f.write(json.dumps({"prompt": f"Q{i}: " + "why " * rng.randint(1, 20),
                                "completion": " because" * rng.randint(1, 30)}) + "\n")
    return {
        "jsonl": (jsonl_corpus(tmp_path / "jsonl", lines=1_500), ("--shard-tokens", 8_000, "--val-tokens", 3_000,
                                                                  "--buffer-mb", 0.1)),
        "text": (text, ("--shard-tokens", 8_000, "--val-tokens", 10_000, "--buffer-mb", 0.01)),
        "pairs": (pairs, ("--format", "pairs", "--shard-tokens", 10_000, "--val-tokens", 2_000, "--buffer-mb", 0.1)),
    }


@needs_llama3
def test_kill_and_resume_loop_gives_the_shards_of_an_uninterrupted_run(tmp_path):
    import random
    rng = random.Random(KILL_LOOP_SEED)
    start = time.monotonic()
    configs = kill_loop_configs(tmp_path)
    wholes = {}
    for name, (src, options) in configs.items():
        wholes[name] = tmp_path / f"whole_{name}"
        run_ok(src, "--out-dir", wholes[name], *options)
    kills = {signal_name: 0 for signal_name in KILL_LOOP_SIGNALS}
    kills_before_a_shard = runs = compared = 0
    for trial in range(KILL_LOOP_TRIALS):
        name = list(configs)[trial % len(configs)]
        src, options = configs[name]
        whole = file_hashes(wholes[name])
        out = tmp_path / f"trial{trial}"
        options = (*options, "--workers", 1 + trial % 2)
        for attempt in range(KILL_LOOP_MAX_KILLS + 1):
            state = state_of(out)
            complete = sum(map(len, state["shards"].values())) if state else 0
            resume = ("--resume",) if state else ()
            if attempt == KILL_LOOP_MAX_KILLS:
                result = run(src, "--out-dir", out, *options, *resume)
            else:
                # once per trial (its second kill), and at random after, at or below the complete shards: a resumed
                # run stopped at its first token
                before_a_shard = attempt == 1 or rng.random() < 0.25
                at = complete if before_a_shard else complete + rng.randint(1, 3)
                signal_name = rng.choice(["KILL", "KILL", "INT", "TERM"])
                env = dict(os.environ, PREPARE_TEST_KILL=f"{at}:{signal_name}")
                result = run(src, "--out-dir", out, *options, *resume, env=env)
            runs += 1
            if attempt == KILL_LOOP_MAX_KILLS or result.returncode == 0:
                assert result.returncode == 0, (trial, attempt, result.stderr)
                assert "(resumed)" in result.stdout or not resume
                break
            assert result.returncode == KILL_LOOP_SIGNALS[signal_name], (trial, attempt, result.stderr)
            kills[signal_name] += 1
            kills_before_a_shard += before_a_shard and complete > 0
            if signal_name != "KILL":
                assert "--resume continues" in result.stderr and "Traceback" not in result.stderr, result.stderr
                assert list(out.glob("*.tmp")) == []
            # every complete shard is the uninterrupted run's, whatever happened before
            done = file_hashes(out)
            for shard in (n for n in done if n.endswith(".bin")):
                assert done[shard] == whole[shard], (trial, attempt, shard)
                compared += 1
        assert file_hashes(out) == whole, (trial, name)
        compared += sum(n.endswith(".bin") for n in whole)
    seconds = time.monotonic() - start
    total = sum(kills.values())
    print(f"\nkill loop: {KILL_LOOP_TRIALS} trials, {runs} runs, {total} kills "
          f"({', '.join(f'{n} SIG{s}' for s, n in kills.items())}; {kills_before_a_shard} of resumed runs before "
          f"they completed a shard), {compared} shards compared byte for byte, {seconds:.1f} s")
    assert total >= 2 * KILL_LOOP_TRIALS and kills["KILL"] > 0 and kills["INT"] + kills["TERM"] > 0
    assert kills_before_a_shard >= KILL_LOOP_TRIALS // 2 and compared > 0


@needs_llama3
def test_a_lone_surrogate_in_json_is_replaced_and_counted_or_with_strict_an_error(tmp_path, llama3):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "fine"}\n'
                   '{"text": "a\\ud800b"}\n'                  # a lone high surrogate
                   '{"text": "\\udc00 low"}\n'                # a lone low one
                   '{"text": "pair \\ud83c\\udf89 emoji"}\n'  # a pair: one character, U+1F389
                   '{"text": "not one: \\\\ud800"}\n'         # an escaped backslash, then text
                   '{"te\\udfffxt": "no text field"}\n')      # in a key: skipped, and named in the summary
    out = tmp_path / "out"
    result = run(src, "--out-dir", out, "--val-tokens", 0)
    assert result.returncode == 0, result.stderr
    assert f"lone surrogates: 3 in JSON strings replaced with U+FFFD (first: {src}:2)" in result.stdout
    assert f"skipped 1 record(s) without a string \"text\" (first: {src}:6: no string \"text\"; the keys are " \
           f"['te\ufffdxt'])" in result.stdout
    assert decoded_docs(all_tokens(shards(out, "train")), llama3) == sorted(
        ["fine", "a\ufffdb", "\ufffd low", "pair \U0001f389 emoji", "not one: \\ud800"])
    # pairs and chat examples too
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "Q\\ud800", "completion": " A"}\n{"prompt": "Q", "completion": " B"}\n')
    result = run("--format", "pairs", pairs, "--out-dir", tmp_path / "pairs", "--val-tokens", 0)
    assert result.returncode == 0 and "lone surrogates: 1 in JSON strings" in result.stdout, result.stderr
    for strict_src, line in ((src, 2), (pairs, 1)):
        strict = tmp_path / "strict"
        fmt = "pairs" if strict_src == pairs else "text"
        result = run(strict_src, "--out-dir", strict, "--strict", "--format", fmt)
        assert result.returncode == 1, result.stderr
        assert f"error: {strict_src}:{line}: a lone surrogate (\\ud800) in a JSON string" in result.stderr
        assert "drop --strict" in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not strict.exists() or list(strict.iterdir()) == []


def zstd_variants():
    """name -> (.zst bytes, what they decompress to): one frame, with a checksum, streamed (no content size), several
    frames with a skippable one between, highly compressed runs (RLE blocks)."""
    import zstandard
    data = b"".join(b'{"text": "record %d %s"}\n' % (i, b"x" * (i % 50)) for i in range(20_000))
    streamed = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    skippable = (0x184D2A53).to_bytes(4, "little") + (7).to_bytes(4, "little") + b"skipped"
    one = zstandard.ZstdCompressor().compress(data)
    return {
        "one frame": (one, data),
        "checksum": (zstandard.ZstdCompressor(write_checksum=True, level=9).compress(data), data),
        "streamed": (streamed.compress(data) + streamed.flush(), data),
        "frames": (one + skippable + zstandard.ZstdCompressor(write_checksum=True).compress(data[:999]),
                   data + data[:999]),
        "runs": (zstandard.ZstdCompressor().compress(b"a" * 300_000 + data[:5000]), b"a" * 300_000 + data[:5000]),
    }


@needs_zstd
def test_a_truncated_zst_stream_is_a_read_error(tmp_path):
    import random
    rng = random.Random(4)
    path = str(tmp_path / "t.jsonl.zst")
    refused = 0
    for name, (compressed, data) in zstd_variants().items():
        with open(path, "wb") as f:
            f.write(compressed)
        with prepare.opened_input(path, ".zst") as (stream, raw):
            assert stream.read() == data, name
        # cut anywhere but between frames: in a header, a block, a checksum
        ends = [len(compressed)] if name != "frames" else [len(zstd_variants()["one frame"][0]), len(compressed)]
        cuts = {1, 4, 7, len(compressed) - 1, len(compressed) - 3}
        cuts |= {rng.randrange(1, len(compressed)) for _ in range(30)}
        for cut in sorted(cuts - set(ends) - {ends[0] + 15}):
            with open(path, "wb") as f:
                f.write(compressed[:cut])
            with pytest.raises(prepare.read_errors()):
                with prepare.opened_input(path, ".zst") as (stream, raw):
                    stream.read()
            refused += 1
    assert refused > 100


@needs_llama3
@needs_zstd
def test_a_truncated_zst_file_is_an_error_like_a_truncated_gz(tmp_path):
    import gzip
    import zstandard
    records = "".join('{"text": "record %d of a file cut short"}\n' % i for i in range(20_000)).encode()
    for name, compress in (("in.jsonl.gz", gzip.compress), ("in.jsonl.zst", zstandard.ZstdCompressor().compress),
                           ("in.txt.zst", zstandard.ZstdCompressor().compress)):
        src = tmp_path / name
        whole = compress(records)
        src.write_bytes(whole[:len(whole) // 2])
        out = tmp_path / "out"
        result = run(src, "--out-dir", out, "--val-tokens", 0, "--shard-tokens", 1000)
        assert result.returncode == 1, (name, result.stdout)
        assert f"error: cannot read {src}: Compressed file ended before the end-of-stream marker was reached" \
            in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert list(out.iterdir()) == []  # shards were written before the error, and removed
        src.unlink()


DISK_ARGS = ("--shard-tokens", 20_000, "--val-tokens", 5_000, "--buffer-mb", 0.2, "--workers", 2)


def check_full_disk(result, out, whole):
    """A run that found the disk full: one error, named; the complete shards and the state left valid for --resume,
    no temporary file."""
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], result.stderr
    assert "complete shard(s) stay; --resume continues once this is fixed" in result.stderr
    assert "Traceback" not in result.stderr and "another exception" not in result.stderr, result.stderr
    assert [p.name for p in out.iterdir() if ".tmp" in p.name] == []
    state = state_of(out)
    for shard, _ in state["shards"]["val"] + state["shards"]["train"]:
        assert (out / shard).read_bytes() == (whole / shard).read_bytes()
    return sum(map(len, state["shards"].values()))


@needs_llama3
def test_a_full_disk_is_one_clear_error_and_resume_finishes_the_shards(tmp_path):
    src = jsonl_corpus(tmp_path / "in", lines=2_000)
    whole = tmp_path / "whole"
    run_ok(src, "--out-dir", whole, *DISK_ARGS)
    shard_bytes = sorted(p.stat().st_size for p in whole.glob("*.bin"))
    assert len(shard_bytes) >= 5
    # the disk is full: in the first shard; a few shards on (the next shard's buffer, or a state file, fails to be
    # written, and again as the shard is dropped); with every shard written, in the copy of the tokenizer file
    for budget in (shard_bytes[0] // 2, 3 * shard_bytes[-1] + 5_000, sum(shard_bytes) + 100_000):
        out = tmp_path / f"out{budget}"
        result = run(src, "--out-dir", out, *DISK_ARGS, env=dict(os.environ, PREPARE_TEST_DISK_BYTES=str(budget)))
        check_full_disk(result, out, whole)
        result = run_ok(src, "--out-dir", out, *DISK_ARGS, "--resume")  # space freed
        assert "(resumed)" in result.stdout
        assert file_hashes(out) == file_hashes(whole)


def _can_mount_tmpfs():
    """Whether this user may mount a tmpfs in a mount namespace of its own (unshare -rm: as root, or where user
    namespaces are allowed)."""
    import shutil
    import tempfile
    if sys.platform != "linux" or not shutil.which("unshare"):
        return False
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$0"', d],
                               capture_output=True)
    return probe.returncode == 0


@needs_llama3
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs a tmpfs mounted in a user namespace (unshare -rm)")
def test_a_really_full_disk_is_one_clear_error_and_resume_finishes_the_shards(tmp_path):
    """As the test above, on a small tmpfs that really fills up (mounted in a namespace of this test's own), which
    then grows, as when space is freed."""
    src = jsonl_corpus(tmp_path / "in", lines=2_000)
    whole = tmp_path / "whole"
    run_ok(src, "--out-dir", whole, *DISK_ARGS)
    disk, saved = tmp_path / "disk", tmp_path / "saved"
    for d in (disk, saved / "failed", saved / "resumed"):
        d.mkdir(parents=True)
    import shlex
    disk, saved, prepare_py, src = (shlex.quote(str(p)) for p in (disk, saved, PREPARE, src))
    cmd = f"{shlex.quote(sys.executable)} {prepare_py} {src} --out-dir {disk} {' '.join(map(str, DISK_ARGS))}"
    script = (f"mount -t tmpfs -o size=200k tmpfs {disk} && "
              f"{cmd} > {saved}/failed.out 2> {saved}/failed.err; echo $? > {saved}/failed.rc; "
              f"cp -a {disk}/. {saved}/failed/ && mount -o remount,size=64m {disk} && "
              f"{cmd} --resume > {saved}/resumed.out && cp -a {disk}/. {saved}/resumed/")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    saved = tmp_path / "saved"
    failed = subprocess.CompletedProcess([], int((saved / "failed.rc").read_text()), "",
                                         (saved / "failed.err").read_text())
    assert check_full_disk(failed, saved / "failed", whole) >= 1
    assert "(resumed)" in (saved / "resumed.out").read_text()
    assert file_hashes(saved / "resumed") == file_hashes(whole)


@pytest.mark.parametrize("flag,value", [("--shard-tokens", 1), ("--shard-tokens", 999), ("--shard-tokens", 10**13),
                                        ("--buffer-mb", 0), ("--buffer-mb", 0.001), ("--buffer-mb", "nan"),
                                        ("--workers", 0), ("--workers", 100_000), ("--val-tokens", -1)])
def test_size_flags_refuse_values_that_make_no_sense(flag, value, corpus, tmp_path):
    result = run(corpus, "--out-dir", tmp_path / "out", flag, value)
    assert result.returncode == 2, result.stdout
    assert f"error: {flag} {value:,} is out of range: it takes values in [" in result.stderr \
        if isinstance(value, int) else f"error: {flag} {value} is out of range" in result.stderr, result.stderr
    assert "\n  hint: " in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@needs_llama3
def test_size_flags_take_their_least_values(corpus, tmp_path):
    run_ok(corpus, "--out-dir", tmp_path / "out", "--shard-tokens", 1000, "--buffer-mb", 0.01, "--workers", 1,
           "--val-tokens", 0)


needs_hf_tokenizers = pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                                         reason="needs pip install tokenizers")


def make_hf_tokenizer_dir(d, bos=True):
    """An HF model directory's tokenizer: a byte-level BPE trained here on the test corpus (tokenizer.json), its
    special tokens named in tokenizer_config.json as Qwen names them (no BOS) or Llama does (bos=True)."""
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|bos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(DOCS.values()) * 20, trainer)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "bos_token": "<|bos|>" if bos else None}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


@needs_hf_tokenizers
@pytest.mark.parametrize("bos", [True, False])
def test_an_hf_tokenizer_json(corpus, tmp_path, bos):
    """--tokenizer hf --tokenizer-model DIR: the shards hold what the tokenizers package encodes of each document
    (a special token's text in it stays text), each document after the BOS, or after the EOS where the tokenizer
    has no BOS (Qwen's); the header names the vocabulary and both ids."""
    tok = make_hf_tokenizer_dir(tmp_path / "hf", bos)
    texts = list(DOCS.values()) + ["the specials' text <|endoftext|> and <|bos|> is text here\n"]
    (corpus / "specials.txt").write_text(texts[-1])
    out = tmp_path / "out"
    run_ok(corpus, "--out-dir", out, "--val-tokens", 0, "--tokenizer", "hf", "--tokenizer-model", tmp_path / "hf")
    tokens = all_tokens(shards(out, "train"))
    eos, start = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|bos|>" if bos else "<|endoftext|>")
    header = prepare.read_shard(shards(out, "train")[0])[0]
    assert tokens.count(start) == len(texts)  # one per document: no special id comes from the text
    docs = sorted(tok.decode(doc) for doc in split_at_bos(tokens, start))
    assert docs == sorted(texts)
    tok.encode_special_tokens = True
    assert sorted(split_at_bos(tokens, start)) == sorted(tok.encode(t, add_special_tokens=False).ids for t in texts)
    assert (header["vocab_size"], header["bos_id"], header["eos_id"]) == (tok.get_vocab_size(), start, eos)


@needs_hf_tokenizers
def test_an_hf_tokenizer_refused_with_a_message(corpus, tmp_path):
    r = run(corpus, "--out-dir", tmp_path / "o", "--tokenizer", "hf")
    assert r.returncode != 0 and "--tokenizer hf needs --tokenizer-model" in r.stderr
    r = run(corpus, "--out-dir", tmp_path / "o", "--tokenizer", "hf", "--tokenizer-model", tmp_path / "nothing")
    assert r.returncode != 0 and "no tokenizer.json at" in r.stderr
    make_hf_tokenizer_dir(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")
    r = run(corpus, "--out-dir", tmp_path / "o", "--tokenizer", "hf", "--tokenizer-model", tmp_path / "hf")
    assert r.returncode != 0 and "names an EOS token" in r.stderr
