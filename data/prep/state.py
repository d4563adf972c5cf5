"""The resume state: NAME_prepare_state.json in the output folder. A run rewrites it after each complete shard (where
the token stream stands, the options and inputs that decide it, the complete shards) and removes it when it
finishes; --resume reads it back (read_state), checked against its own options, inputs and the shards on disk.
Reads and writes that file, always whole: written to NAME.tmp and renamed.
"""

import json
import os

from .errors import PrepareError
from .shards import HEADER_BYTES, output_file, remove_quietly

STATE_VERSION = 1


def state_path(out_dir, name):
    return os.path.join(out_dir, f"{name}_prepare_state.json")


def write_state(path, state):
    """Write state (a dict) to path whole, or not at all: on an error (a full disk) the state before stays, valid,
    and no half-written one is left beside it."""
    try:
        with output_file(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)
    except BaseException:
        remove_quietly(path + ".tmp")
        raise


def read_state(path, options, inputs, out_dir, item_bytes):
    """The state in path of the interrupted run to resume, once its options and inputs are found the same as these,
    and the shards it completed (in out_dir, item_bytes a token with its mask byte if any) still there; else
    PrepareError, saying why not."""
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise PrepareError(f"nothing to resume: there is no {path}\n  (a run writes it as it goes and removes "
                           f"it when it finishes)\n  fix: run without --resume") from None
    except (OSError, ValueError) as e:
        raise PrepareError(f"cannot resume: {path} is unreadable ({e})\n  fix: run without --resume") from None
    if state.get("version") != STATE_VERSION:
        raise PrepareError(f"cannot resume: {path} is of another version of prepare.py\n"
                           f"  fix: run without --resume")
    changed = [f"--{key.replace('_', '-')} was {state['options'].get(key)!r}, now {value!r}"
               for key, value in options.items() if state["options"].get(key) != value]
    if changed:
        raise PrepareError("cannot resume: the options differ from the interrupted run's:\n  "
                           + "\n  ".join(changed) + "\n  fix: give the same options, or run without --resume")
    if state["inputs"] != inputs:
        before = {entry[0]: entry[1:] for entry in state["inputs"]}
        now = {entry[0]: entry[1:] for entry in inputs}
        what = ([f"{p}: new" for p in now if p not in before] + [f"{p}: gone" for p in before if p not in now]
                + [f"{p}: changed (size or time)" for p in now if p in before and now[p] != before[p]])
        raise PrepareError("cannot resume: the inputs changed since the interrupted run:\n  "
                           + "\n  ".join(what[:10]) + ("\n  ..." if len(what) > 10 else "")
                           + "\n  fix: run without --resume")
    for split, shards in state["shards"].items():
        for name, count in shards:
            shard = os.path.join(out_dir, name)
            if not os.path.isfile(shard) or os.path.getsize(shard) != HEADER_BYTES + count * item_bytes:
                raise PrepareError(f"cannot resume: {shard}, which the interrupted run completed, is missing "
                                   f"or changed\n  fix: run without --resume")
    return state
