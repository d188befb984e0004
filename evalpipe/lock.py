"""One writer per output file: an advisory lock the kernel drops when the process dies."""

import fcntl
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from . import jsonl
from .errors import Locked, writing


@contextmanager
def exclusive(output: str | os.PathLike):
    """Hold `<output>.lock` for the duration; raise Locked at once if another run holds it.

    Holding it, first add to the output the rows an earlier run could not write (jsonl.rescue_path),
    so that what follows sees them as done.

    The lock file is left in place on exit: removing it would let two runs lock two
    different files of the same name.
    """
    lock_path = Path(f"{output}.lock")
    with writing(lock_path):
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise Locked(
                f"{output} is being written by another run (pid {holder}); this run exits without touching it"
            ) from None
        with writing(lock_path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        recovered = jsonl.recover_rescued(output)
        if recovered:
            print(
                f"{output}: recovered {recovered} rows that an earlier run could not write, "
                f"from {jsonl.rescue_path(output)}",
                file=sys.stderr,
            )
        yield
    finally:
        os.close(fd)
