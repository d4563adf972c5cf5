"""Write a token shard of random tokens for the shell tests, through data/prepare.py's
own writer, so the tests and the data pipeline share one shard format.

    python3 tests/make_random_shard.py PATH VOCAB_SIZE N_TOKENS SEED BOS EOS
"""
import os
import random
import sys
import types
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
import prepare  # noqa: E402

path, vocab, count, seed, bos, eos = sys.argv[1], *map(int, sys.argv[2:7])
random.seed(seed)
tokens = array("I", (random.randrange(vocab) for _ in range(count)))  # uint32, whatever the vocab
prepare.write_shard(path, tokens, types.SimpleNamespace(vocab_size=vocab, bos_id=bos, eos_id=eos))
