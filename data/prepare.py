#!/usr/bin/env python3
"""Tokenize text into the token shards that llmc/formats/dataloader.h reads.

    python3 data/prepare.py                       # default corpus: KJV Bible + fortunes
    python3 data/prepare.py my_texts/ notes.txt   # your own files and folders
    python3 data/prepare.py web.jsonl.zst books/  # JSON lines and parquet too, gzip or zstd compressed or not
    python3 data/prepare.py my_texts/ --resume    # continue an interrupted run
    python3 data/prepare.py --check data/shards/corpus_val_000000.bin

It streams: memory is bounded by --buffer-mb, not by the corpus; --workers processes tokenize, and the shards are
the same for any number of them. The shard format and every option are described in docs/shard_format.md.
Needs `pip install tiktoken` and `pip install --no-deps llama-models` (the Llama 3 tokenizer file), and
`pip install zstandard pyarrow` for .zst and .parquet inputs; the default corpus needs
`apt-get install bible-kjv fortunes`.

The code is the package data/prep/, a module per concern (data/prep/__init__.py lists them); this file is its command
line, and keeps the names that scripts and tests import from prepare (load_tokenizer, write_shard, read_shard, ...).
"""

import os
import sys

# the package beside this file, whatever the working directory, and also when this file is loaded by its path
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from prep.cli import DEFAULT_OUT_DIR, FLAG_RANGES, default_workers, main, open_source, parse_args  # noqa: E402
from prep.compressed import (COMPRESSIONS, READ_BYTES, TRUNCATED, ZstdReader, gzip_reader,  # noqa: E402
                             opened_input, read_errors, zstd_frames_end)
from prep.default_corpus import (FORTUNES_DIR, DefaultCorpus, bible_books, default_corpus_documents,  # noqa: E402
                                 fortune_documents, strip_overstrike)
from prep.errors import Interrupted, PrepareError, ResumableError, require_module  # noqa: E402
from prep.examples import CHAT_TOKENS, chat_token_ids, encode_example, example_problem  # noqa: E402
from prep.order import DOC_OVERHEAD, prefetch, shuffled_blocks  # noqa: E402
from prep.pool import (TASK_BYTES, TASKS_AHEAD_BYTES, TASKS_AHEAD_PER_WORKER, TASKS_PER_WORKER,  # noqa: E402
                       WORKER_DIED, WorkerPool, tasks_ahead)
from prep.progress import Progress, format_bytes, format_seconds  # noqa: E402
from prep.readers import (ITEM_BYTES, ITEM_JSON, ITEM_PIECE, ITEM_TEXT, ITEM_VALUE, DocumentSplitter,  # noqa: E402
                          Source, check_input_files, find_input_files, input_format, split_documents)
from prep.run import Run  # noqa: E402
from prep.shards import (HEADER_BYTES, HEADER_STRUCT, MAGIC, VERSION, VERSION_MASKED, ShardFile,  # noqa: E402
                         SplitWriter, bytes_per_token, check_shards, copy_tokenizer, read_shard, read_shard_header,
                         read_shard_mask, remove_shards, shard_path, tokenizer_copy_path, write_shard)
from prep.state import STATE_VERSION, read_state, state_path, write_state  # noqa: E402
from prep.tasks import InputStats, TaskEncoder, may_hold_surrogates, replace_surrogates  # noqa: E402
from prep.tokenizers import (_LONG_RUN, MAX_NO_WHITESPACES_CHARS, TIKTOKEN_MAX_ENCODE_CHARS,  # noqa: E402
                             TOKENIZERS, Tokenizer, _may_have_long_run, _split_long_runs, cut_pieces,
                             default_tokenizer_path, encodable_pieces, encode_text, load_tokenizer, sha256_of)

__all__ = ["bible_books", "bytes_per_token", "chat_token_ids", "CHAT_TOKENS", "check_input_files", "check_shards",
           "COMPRESSIONS", "copy_tokenizer", "cut_pieces", "default_corpus_documents", "DEFAULT_OUT_DIR",
           "default_tokenizer_path", "default_workers", "DefaultCorpus", "DOC_OVERHEAD", "DocumentSplitter",
           "encodable_pieces", "encode_example", "encode_text", "example_problem", "find_input_files", "FLAG_RANGES",
           "format_bytes", "format_seconds", "fortune_documents", "FORTUNES_DIR", "gzip_reader", "HEADER_BYTES",
           "HEADER_STRUCT", "input_format", "InputStats", "Interrupted", "ITEM_BYTES", "ITEM_JSON", "ITEM_PIECE",
           "ITEM_TEXT", "ITEM_VALUE", "load_tokenizer", "_LONG_RUN", "MAGIC", "main", "MAX_NO_WHITESPACES_CHARS",
           "_may_have_long_run", "may_hold_surrogates", "open_source", "opened_input", "parse_args", "prefetch",
           "PrepareError", "Progress", "READ_BYTES", "read_errors", "read_shard", "read_shard_header",
           "read_shard_mask", "read_state", "remove_shards", "replace_surrogates", "require_module", "ResumableError",
           "Run", "sha256_of", "shard_path", "ShardFile", "shuffled_blocks", "Source", "split_documents",
           "_split_long_runs", "SplitWriter", "state_path", "STATE_VERSION", "strip_overstrike", "TASK_BYTES",
           "TaskEncoder", "tasks_ahead", "TASKS_AHEAD_BYTES", "TASKS_AHEAD_PER_WORKER", "TASKS_PER_WORKER",
           "TIKTOKEN_MAX_ENCODE_CHARS", "Tokenizer", "tokenizer_copy_path", "TOKENIZERS", "TRUNCATED", "VERSION",
           "VERSION_MASKED", "WORKER_DIED", "WorkerPool", "write_shard", "write_state", "zstd_frames_end",
           "ZstdReader"]

if __name__ == "__main__":
    sys.exit(main())
