"""One writer per output file: an advisory lock the kernel drops when the process dies."""

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from .errors import Locked


@contextmanager
def exclusive(output: str | os.PathLike):
    """Hold `<output>.lock` for the duration; raise Locked at once if another run holds it.

    The lock file is left in place on exit: removing it would let two runs lock two
    different files of the same name.
    """
    lock_path = Path(f"{output}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise Locked(
                f"{output} is being written by another run (pid {holder}); "
                "this run exits without touching it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
