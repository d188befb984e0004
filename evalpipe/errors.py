"""Errors a stage can end with, each carrying the exit code a cron job can act on."""

import errno
import os
import signal
import sys
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from . import redact

EXIT_OK = 0
EXIT_INCOMPLETE = 3  # some selected tasks are not done yet: rerun the same command
EXIT_BAD_INPUT = 2  # bad flags or bad input file (argparse also exits 2)
EXIT_ENDPOINT_REFUSED = 4  # 401/403/404/quota: rerunning will not help until fixed
EXIT_LOCKED = 5  # another run is writing the same output
EXIT_SPENDING_CAP = 6  # --max-cost: the next call could pass the cap; rows kept (raise the cap, or run again later)
EXIT_CHANGED = 8  # watch: tonight's results moved beyond noise, or what answered (model, judge, dataset) changed
EXIT_UNREACHABLE = 69  # EX_UNAVAILABLE: the endpoint never answered (nothing listening, DNS, TLS, no API at that path)
EXIT_LOCAL_SERVER_DIED = 70  # EX_SOFTWARE: make demo / serve-local: the local model server died or never got ready
EXIT_UNWRITABLE = 74  # EX_IOERR: an output cannot be written (disk full, read-only, permission denied)
EXIT_WAITING = 75  # --backend batch: batches submitted, still waiting (EX_TEMPFAIL: run again later)
EXIT_INTERRUPTED = 130  # SIGINT or SIGTERM


class StageError(Exception):
    """An error that ends a stage with a one-line reason and a specific exit code."""

    exit_code = 1


class BadInput(StageError):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, path=None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.message, self.path, self.line = message, path, line

    def __reduce__(self):
        return type(self), (self.message, self.path, self.line)


class Locked(StageError):
    exit_code = EXIT_LOCKED


class LocksUnsupported(StageError):
    """The output's file system cannot lock files (flock: ENOLCK, EOPNOTSUPP): it cannot be written safely."""

    exit_code = EXIT_UNWRITABLE


class EndpointRefused(StageError):
    exit_code = EXIT_ENDPOINT_REFUSED


class EndpointUnreachable(EndpointRefused):
    exit_code = EXIT_UNREACHABLE


class RetryLater(EndpointRefused):
    """The endpoint asks us to wait past --max-retry-seconds: the run stops, to be run again after then."""

    exit_code = EXIT_INCOMPLETE


# OS errors that mean an output cannot be written: no space, then no permission.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
UNWRITABLE_ERRNOS = NO_SPACE_ERRNOS | {errno.EROFS, errno.EACCES, errno.EPERM}


class OutputUnwritable(StageError):
    """An output cannot be written (disk full, quota, read-only, permission denied); `note` follows the hint."""

    exit_code = EXIT_UNWRITABLE

    def __init__(self, path, error: OSError, note: str = ""):
        super().__init__(path, error)
        self.path, self.error, self.note = path, error, note
        self.folder = _existing(Path(path).parent)  # the one to point df or chmod at

    def __str__(self) -> str:
        if self.error.errno in NO_SPACE_ERRNOS:
            hint = (
                f"free space on the file system holding {self.folder} (e.g. df -h {self.folder}), "
                "then rerun the same command: rows already written are kept"
            )
        else:
            hint = (
                f"the folder {self.folder} is read-only or not writable by this user: fix its permissions "
                "or choose another output folder (--outputs-dir, make's OUTPUTS=)"
            )
        note = f"; {self.note}" if self.note else ""
        return f"cannot write {self.path}: {self.error.strerror or self.error}; {hint}{note}"


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def as_unwritable(exc: OSError, path) -> Exception:
    """OutputUnwritable naming `path` when `exc` means it cannot be written; else `exc`, naming `path`."""
    if exc.errno in UNWRITABLE_ERRNOS:
        return OutputUnwritable(path, exc)
    if exc.filename is None:
        exc.filename = str(path)
    return exc


@contextmanager
def writing(path):
    """Raise OutputUnwritable naming `path` if the writes in the block fail for want of space or permission."""
    try:
        yield
    except OSError as exc:
        raise as_unwritable(exc, path) from None


class CallFailed(Exception):
    """A model call did not succeed in this run; the task stays pending for the next run."""


class ContextTooLong(Exception):
    """The request does not fit the model's context: final, retrying cannot help."""


def sigterm_as_interrupt() -> None:
    """Make SIGTERM end a process as Ctrl-C does (cleanup in `finally`, exit 130)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def run_stage(name: str, main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Run a stage's main and map every way it can end to one exit code and one line."""
    os.umask(os.umask(0) | 0o002)  # the user's umask, but never a world-writable output
    try:
        return main(sys.argv[1:] if argv is None else argv)
    except StageError as exc:
        return _error_line(name, exc)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        known = _unwrapped(exc)
        if known is not None:
            return _error_line(name, known)
        print(redact.redact(traceback.format_exc()), file=sys.stderr, end="")
        return 1


def _unwrapped(exc: Exception) -> StageError | None:
    """An OSError no library code wrapped (a plot's write, a path no check named first) as the one line it means."""
    if not isinstance(exc, OSError) or exc.filename is None:
        return None
    if exc.errno in UNWRITABLE_ERRNOS:
        return OutputUnwritable(exc.filename, exc)
    if isinstance(exc, IsADirectoryError):
        return BadInput("a folder where a file goes: move it away, or choose another output", exc.filename)
    if isinstance(exc, NotADirectoryError) or isinstance(exc, FileExistsError) and not os.path.isdir(exc.filename):
        # the file is the path's first part that exists
        return BadInput(
            "a file where a folder goes: move it away, or choose another output", _existing(Path(exc.filename))
        )
    return None


def _error_line(stage: str, exc: StageError) -> int:
    print(f"{stage}: error: {redact.printable(redact.redact(str(exc)))}", file=sys.stderr)
    return exc.exit_code
