"""Work done by a forked child process on another core, its results read back as they come.

score reads the dataset and parts of the judge file at once this way: each part is a generator
whose items are pickled through a pipe. Where there is no fork (Windows), the generator runs here.
"""

import collections
import contextlib
import io
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from .errors import BadInput, StageError


class Items(Protocol):
    """What `in_child` returns (and a generator is): items to read, and `close` for when they are not all read."""

    def __iter__(self) -> Iterator[Any]: ...

    def close(self) -> None: ...


class Child:
    """The items a forked child makes, read in order; `close` stops a child whose items are not all read."""

    def __init__(self, produce: Callable[[], Iterable[Any]], read_ahead: bool):
        read_end, write_end = os.pipe()
        with contextlib.suppress(ImportError, AttributeError, OSError):  # a larger pipe: the child runs ahead
            import fcntl

            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_end)
            os._exit(_send(produce, write_end))
        os.close(write_end)
        self._source = io.BufferedReader(_ReadAhead(read_end), 1 << 16) if read_ahead else os.fdopen(read_end, "rb")
        self._running = True

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                try:
                    kind, item = pickle.load(self._source)
                except EOFError:
                    raise RuntimeError("a child process stopped before its end (killed?)") from None
                if kind == "item":
                    yield item
                    continue
                self._reap(kill=False)
                if kind == "error":
                    raise item
                return
        finally:
            self.close()

    def close(self) -> None:
        if self._running:
            self._reap(kill=True)

    def _reap(self, kill: bool) -> None:
        self._running = False
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self._source.close()
        os.waitpid(self.pid, 0)


class _ReadAhead(io.RawIOBase):
    """A pipe's bytes, taken by a thread as they come (so that the writer never waits for a full pipe) and
    kept, as the bytes they are, until read from here."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        self._blocks: collections.deque[memoryview] = collections.deque()
        self._more = threading.Condition()
        self._ended = False
        self._taker = threading.Thread(target=self._take, name=f"read-ahead-{fd}", daemon=True)
        self._taker.start()

    def _take(self) -> None:
        while True:
            try:
                block = os.read(self._fd, 1 << 20)
            except OSError:
                block = b""
            with self._more:
                if block:
                    self._blocks.append(memoryview(block))
                else:
                    self._ended = True
                self._more.notify()
            if not block:
                return

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with self._more:
            while not self._blocks and not self._ended:
                self._more.wait()
            if not self._blocks:
                return 0
            block = self._blocks[0]
            size = min(len(buffer), len(block))
            buffer[:size] = block[:size]
            if size == len(block):
                self._blocks.popleft()
            else:
                self._blocks[0] = block[size:]
            return size

    def close(self) -> None:
        if not self.closed:
            self._taker.join()  # it stops at the end of the pipe, which the child's exit closes
            os.close(self._fd)
        super().close()


def in_child(produce: Callable[[], Iterable[Any]], *, read_ahead: bool = False) -> Items:
    """The items of `produce()`, made by a child forked now. Its BadInput is raised here as it was, another
    StageError as one with the same message and exit code, any other error as a RuntimeError naming it. Call
    `close()` on what is returned if it is not read to its end.

    `read_ahead`: a thread here takes the items as they come, for a reader that gets to them only later (a
    pipe holds about a megabyte: a child writing to it would wait for the reader instead of working)."""
    if not hasattr(os, "fork"):
        return _Here(produce)
    return Child(produce, read_ahead)


def call_in_child(call: Callable[[], Any]) -> Callable[[], Any]:
    """Start `call()` in a child forked now; what is returned waits for it and gives its result (or raises its
    error as `in_child` does)."""
    child = in_child(lambda: [call()])

    def result() -> Any:
        (value,) = list(child)
        return value

    return result


class _Here:
    """`produce()` run in this process when it is read (no fork here)."""

    def __init__(self, produce: Callable[[], Iterable[Any]]):
        self._items = iter(produce())

    def __iter__(self) -> Iterator[Any]:
        return self._items

    def close(self) -> None:
        close = getattr(self._items, "close", None)
        if close is not None:
            close()


def _send(produce: Callable[[], Iterable[Any]], fd: int) -> int:
    """Send the items, then the end or the error; the exit status (the child leaves without cleanup)."""
    try:
        with os.fdopen(fd, "wb") as pipe:
            try:
                for item in produce():
                    pickle.dump(("item", item), pipe, pickle.HIGHEST_PROTOCOL)
                pickle.dump(("end", None), pipe)
            except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
                pickle.dump(("error", _portable(exc)), pipe)
    except BaseException:  # noqa: BLE001 - the parent stopped reading
        return 1
    return 0


def _portable(exc: Exception) -> Exception:
    """The error to raise in the parent, made of what pickles for certain."""
    if isinstance(exc, BadInput):
        return exc
    if isinstance(exc, StageError):
        error = StageError(str(exc))
        error.exit_code = exc.exit_code
        return error
    return RuntimeError(f"in a child process: {exc!r}")
