"""The tokenizers: their files, found in PyPI packages and pinned by sha256 (TOKENIZERS), loaded into tiktoken
(load_tokenizer), or an HF model directory's tokenizer.json through the tokenizers package (kind "hf": Qwen's,
Mistral's, any); and text cut into the pieces that tiktoken can encode (cut_pieces, encodable_pieces,
encode_text). Reads the tokenizer file; writes nothing.
"""

import base64
import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass

from .errors import PrepareError


# tiktoken panics on very long inputs and very long runs of (non-)whitespace
# (https://github.com/openai/tiktoken/issues/195); these are the limits that
# llama_models/llama3/tokenizer.py uses.
TIKTOKEN_MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACES_CHARS = 25_000
_LONG_RUN = re.compile(r"\S{%d,}|\s{%d,}" % (MAX_NO_WHITESPACES_CHARS + 1, MAX_NO_WHITESPACES_CHARS + 1))

LLAMA3_PAT_STR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def llama3_special_tokens(num_base_tokens):
    """The 256 special tokens in the order of llama_models/llama3/tokenizer.py."""
    named = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        "<|image|>",
    ]
    reserved = [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]
    return {token: num_base_tokens + i for i, token in enumerate(named + reserved)}


# The tokenizer files are taken from PyPI packages because nothing else can be
# downloaded at run time here; the hash pins the exact ranks the shards encode.
TOKENIZERS = {
    "llama3": {
        "package": "llama_models",
        "pip": "llama-models",
        "file": "llama3/tokenizer.model",
        "sha256": "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
        "pat_str": LLAMA3_PAT_STR,
        "specials": llama3_special_tokens,
        "bos": "<|begin_of_text|>",
        "eos": "<|end_of_text|>",
    },
    # openai-whisper ships GPT-2's BPE ranks (identical to tiktoken's r50k_base).
    "gpt2": {
        "package": "whisper",
        "pip": "openai-whisper",
        "file": "assets/gpt2.tiktoken",
        "sha256": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        "pat_str": GPT2_PAT_STR,
        "specials": lambda n: {"<|endoftext|>": n},
        "bos": "<|endoftext|>",
        "eos": "<|endoftext|>",
    },
}


@dataclass
class Tokenizer:
    name: str
    encoding: object  # tiktoken.Encoding
    vocab_size: int
    bos_id: int
    eos_id: int
    path: str = ""  # the tiktoken file, copied beside the shards for the trainers' samples and exports
    specials: dict = None  # special token -> id


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_tokenizer_path(kind):
    info = TOKENIZERS[kind]
    spec = importlib.util.find_spec(info["package"])
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"the {kind} tokenizer file comes from the PyPI package {info['pip']}, which is not installed\n"
            f"  fix: pip install --no-deps {info['pip']}   (or pass --tokenizer-model PATH)")
    return os.path.join(spec.submodule_search_locations[0], info["file"])


class HfEncoding:
    """An HF tokenizer.json (the tokenizers package) behind the calls the pipeline makes of a tiktoken Encoding.
    Text is encoded as text: a special token's string in it is not that token (as tiktoken's encode_ordinary),
    and no BOS or EOS is added (the pipeline adds the documents' own)."""

    def __init__(self, tok):
        self.tok = tok
        self.tok.encode_special_tokens = True
        self.n_vocab = tok.get_vocab_size(with_added_tokens=True)

    def encode_ordinary(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_to_numpy(self, text, disallowed_special=()):
        import numpy as np
        return np.asarray(self.encode_ordinary(text), dtype=np.uint32)


def _special_token(value):
    """A tokenizer_config.json token entry: a string, {"content": string}, or null."""
    return value.get("content") if isinstance(value, dict) else value


def load_hf_tokenizer(path):
    """The tokenizer.json of an HF model directory (or that file), its BOS and EOS from tokenizer_config.json, else
    from config.json's ids. A family without BOS (Qwen's) starts documents with its EOS, as GPT-2's <|endoftext|>."""
    if path is None:
        raise PrepareError("--tokenizer hf needs --tokenizer-model: an HF model directory or its tokenizer.json")
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise PrepareError(f"no tokenizer.json at {file}\n  fix: pass the HF model directory that holds it")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the worker pool forks after the first encodes
    try:
        import tokenizers
    except ImportError:
        raise PrepareError("the Python package tokenizers is not installed\n  fix: pip install tokenizers") from None
    try:
        tok = tokenizers.Tokenizer.from_file(file)
    except Exception as e:  # noqa: BLE001 - the package raises its own types
        raise PrepareError(f"{file} is not a tokenizer the tokenizers package reads: {e}") from None
    import json
    names = {}
    for meta, keys in (("tokenizer_config.json", ("bos_token", "eos_token")), ("config.json", ("bos_token_id",
                                                                                              "eos_token_id"))):
        meta_path = os.path.join(directory, meta)
        if not os.path.isfile(meta_path):
            continue
        try:
            values = json.load(open(meta_path, encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PrepareError(f"{meta_path} is not valid JSON: {e}") from None
        for role, key in zip(("bos", "eos"), keys):
            value = values.get(key)
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None and role not in names:
                names[role] = value if isinstance(value, int) else tok.token_to_id(_special_token(value) or "")
    if names.get("eos") is None:
        raise PrepareError(f"neither tokenizer_config.json nor config.json beside {file} names an EOS token\n"
                           "  fix: pass the whole HF model directory")
    bos = names.get("bos") if names.get("bos") is not None else names["eos"]
    encoding = HfEncoding(tok)
    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return Tokenizer("hf", encoding, encoding.n_vocab, int(bos), int(names["eos"]), "", specials)


def load_tokenizer(kind="llama3", path=None):
    if kind == "hf":
        return load_hf_tokenizer(path)
    info = TOKENIZERS[kind]
    path = path or default_tokenizer_path(kind)
    if not os.path.isfile(path):
        raise PrepareError(
            f"tokenizer file not found: {path}\n"
            f"  fix: pip install --force-reinstall --no-deps {info['pip']}, or pass --tokenizer-model PATH")
    found = sha256_of(path)
    if found != info["sha256"]:
        raise PrepareError(
            f"tokenizer file {path} is not the {kind} tokenizer\n"
            f"  expected sha256 {info['sha256']}\n"
            f"  found    sha256 {found}\n"
            f"  fix: pip install --force-reinstall --no-deps {info['pip']}, "
            f"or pass --tokenizer-model with the file from that package")
    try:
        import tiktoken
    except ImportError:
        raise PrepareError("the Python package tiktoken is not installed\n  fix: pip install tiktoken") from None
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    specials = info["specials"](len(ranks))
    encoding = tiktoken.Encoding(name=f"{kind}:{os.path.basename(path)}", pat_str=info["pat_str"],
                                 mergeable_ranks=ranks, special_tokens=specials)
    return Tokenizer(kind, encoding, encoding.n_vocab, specials[info["bos"]], specials[info["eos"]], path, specials)


# A run of more than MAX_NO_WHITESPACES_CHARS (non-)whitespace characters holds a whole aligned block of half as
# many; looking at those blocks first spares the slow regex search in almost every text.
_RUN_PROBE = MAX_NO_WHITESPACES_CHARS // 2


def _may_have_long_run(text):
    for start in range(0, len(text) - _RUN_PROBE + 1, _RUN_PROBE):
        block = text[start:start + _RUN_PROBE]
        if block.isspace() or len(block.split(None, 1)[0]) == _RUN_PROBE:
            return True
    return False


def _split_long_runs(text):
    if not _may_have_long_run(text) or not _LONG_RUN.search(text):
        return [text]
    pieces, start = [], 0
    for run in _LONG_RUN.finditer(text):
        for cut in range(run.start() + MAX_NO_WHITESPACES_CHARS, run.end(), MAX_NO_WHITESPACES_CHARS):
            pieces.append(text[start:cut])
            start = cut
    pieces.append(text[start:])
    return pieces


def cut_pieces(segments):
    """The text of one document, given as consecutive segments, cut into pieces of at most TIKTOKEN_MAX_ENCODE_CHARS
    where the token stream is least affected. Each cut depends only on the text up to it, so a document read in
    parts is cut as if it were read whole."""
    text = ""
    for segment in segments:
        text += segment
        start = 0
        while len(text) - start > TIKTOKEN_MAX_ENCODE_CHARS:
            end = start + TIKTOKEN_MAX_ENCODE_CHARS
            cut = text.rfind("\n", start, end) + 1  # after a newline: a pre-token boundary
            if cut <= start:
                cut = text.rfind(" ", start + 1, end)  # before a space, which belongs to the next word
            if cut <= start:
                cut = end
            yield text[start:cut]
            start = cut
        text = text[start:]
    yield text


def encodable_pieces(text):
    """Split text into pieces tiktoken can encode, cutting where the token stream is least affected."""
    return [piece for window in cut_pieces((text,)) for piece in _split_long_runs(window)]


def encode_text(tokenizer, text):
    tokens = []
    for piece in encodable_pieces(text):
        tokens.extend(tokenizer.encoding.encode_ordinary(piece))
    return tokens
