"""The errors that prepare.py reports as one message, without a traceback (PrepareError; ResumableError keeps the
complete shards for --resume), a missing Python package among them (require_module), and SIGTERM, handled like
Ctrl-C (Interrupted). Reads and writes nothing.
"""

import importlib.util
import signal


class PrepareError(Exception):
    """A problem with the inputs or the environment: reported as one message, no traceback."""


class ResumableError(PrepareError):
    """A problem of the machine, not of the inputs (a full disk, a worker killed): the complete shards stay, and
    --resume continues once it is fixed."""


class Interrupted(Exception):
    """SIGTERM, raised in the main process like Ctrl-C's KeyboardInterrupt so that the same cleanup runs."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_interrupted(signum, frame):
    """The SIGTERM handler of the main process."""
    raise Interrupted(signum)


def require_module(module, pip, why):
    """PrepareError, naming the package to install, if module cannot be imported."""
    if importlib.util.find_spec(module) is None:
        raise PrepareError(f"{why} needs the Python package {module}, which is not installed\n  fix: pip install {pip}")
