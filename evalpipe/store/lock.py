"""One writer per output file: an advisory lock the kernel drops when the process dies."""

import errno
import fcntl
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from ..errors import Locked, LocksUnsupported, writing
from . import jsonl, paths, shards


@contextmanager
def exclusive(output: str | os.PathLike):
    """Hold `<output>.lock` (Locked at once if another run holds it), then add the rows an earlier run rescued.

    A shard's output also holds its run file's lock shared: shards write side by side, never beside an uncut run.
    The lock file stays on exit: removing it would let two runs lock two different files of the same name.
    """
    lock_path = Path(f"{output}.lock")
    whole = shards.whole(Path(output))
    paths.refuse_unsafe_output(output)  # a link or a pipe there: refused before anything is read or written
    fd = paths.open_output(lock_path, os.O_RDWR)  # never through a link: the pid is written into it
    run_fd = None
    try:
        if whole == Path(output):
            _take(fd, fcntl.LOCK_EX, output, lambda: "another run" + (" or its shards" if shards.count(whole) else ""))
        else:
            _take(fd, fcntl.LOCK_EX, output, lambda: "another run")
            run_fd = paths.open_output(Path(f"{whole}.lock"), os.O_RDWR)
            _take(run_fd, fcntl.LOCK_SH, output, lambda: f"an uncut run on {whole.name}")
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
        if run_fd is not None:
            os.close(run_fd)


def _take(fd: int, kind: int, output: str | os.PathLike, by: Callable[[], str]) -> None:
    """flock `fd` at once, or raise Locked naming the holder (`by()`, asked only then: it may list the folder)."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        raise Locked(
            f"{output} is being written by {by()} (pid {holder}); this run exits without touching it"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # a file system without locks
            raise
        raise LocksUnsupported(
            f"cannot lock {output}.lock: {exc.strerror} (the file system holding it has no file locks, e.g. NFS "
            "without lockd): without a lock two runs could write one file; put the outputs on a file system with "
            "locks (--outputs-dir, make's OUTPUTS=)"
        ) from None
