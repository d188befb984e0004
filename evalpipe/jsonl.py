"""JSONL files: tolerant reading of our own outputs, strict reading of inputs, safe writing.

Rows are appended with one write() each and flushed at once, so a process killed at any
instant leaves at most one torn last line. Readers of our own outputs ignore that line and
writers cut it off before appending, so the file stays valid JSONL.
"""

import itertools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from .errors import BadInput

BOM = b"\xef\xbb\xbf"


def dumps(row: Any) -> bytes:
    return orjson.dumps(row)


def _describe_json_error(exc: Exception, raw: bytes) -> str:
    if raw.lstrip().startswith(b"[") and raw.rstrip().endswith(b"]"):
        return "a JSON array, expected one JSON object per line (JSONL)"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not valid UTF-8 (byte {err.start})"
    return f"invalid JSON ({exc})"


def iter_rows(path: str | os.PathLike, *, torn_tail_ok: bool = False) -> Iterator[tuple[int, dict]]:
    """Yield (line number, row) for each non-blank line.

    A line that is not a JSON object is a BadInput error naming the file and line, except a
    last line without a newline when torn_tail_ok (a write cut short): it is skipped.
    """
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path) from None
    with f:
        first = f.readline()
        if first.startswith(BOM):
            first = first[len(BOM):]
        loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
        for lineno, raw in enumerate(itertools.chain((first,), f), 1):
            try:
                row = loads(raw)
            except JSONDecodeError as exc:
                if not raw.strip():
                    continue  # a blank line
                if torn_tail_ok and not raw.endswith(b"\n"):
                    return
                raise BadInput(_describe_json_error(exc, raw), path, lineno) from None
            if type(row) is not dict:
                if torn_tail_ok and not raw.endswith(b"\n"):
                    return
                if isinstance(row, list):
                    msg = "a JSON array, expected one JSON object per line (JSONL)"
                else:
                    msg = f"expected a JSON object, got {type(row).__name__}"
                raise BadInput(msg, path, lineno)
            yield lineno, row


def latest_rows(
    path: str | os.PathLike, key: Callable[[dict], Any], keep: Callable[[dict], Any] | None = None
) -> dict[Any, Any]:
    """The last row per id in one of our output files (missing file: no rows).

    `keep` maps each row to what is kept of it, so a large file need not be held whole.
    """
    if not os.path.exists(path):
        return {}
    rows: dict[Any, Any] = {}
    for _, row in iter_rows(path, torn_tail_ok=True):
        rows[key(row)] = row if keep is None else keep(row)
    return rows


_FAST_ID = b'{"idx":"'


def ids_in(path: str | os.PathLike, key: Callable[[dict], Any]) -> set:
    """The ids that have a complete row in one of our output files (missing file: none).

    Our rows start with {"idx":"<id>", so for them the id is sliced from the line without
    parsing it; other lines (upstream rows, escaped ids, a last line without newline) are
    parsed, and a torn last line does not count. Holds ids only, never rows.
    """
    ids: set = set()
    if not os.path.exists(path):
        return ids
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.startswith(_FAST_ID) and raw.endswith(b"}\n"):
                end = raw.find(b'"', 8)
                if end > 0 and b"\\" not in raw[8:end]:
                    ids.add(raw[8:end].decode("utf-8"))
                    continue
            if not raw.strip():
                continue
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError:
                if raw.endswith(b"\n"):
                    raise BadInput("invalid JSON in an output file", path, lineno) from None
                continue  # a torn last line
            ids.add(key(row))
    return ids


def repair_tail(path: str | os.PathLike) -> str | None:
    """Make the file end with a newline before we append to it.

    A last line that is a complete JSON object (killed between the row and its newline) gets
    its newline; any other unterminated tail is cut off. Returns what was done, or None.
    """
    if not os.path.exists(path):
        return None
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        start = size
        chunk = 1 << 16
        while start > 0:
            step = min(chunk, start)
            f.seek(start - step)
            block = f.read(step)
            cut = block.rfind(b"\n")
            if cut >= 0:
                start = start - step + cut + 1
                break
            start -= step
        f.seek(start)
        tail = f.read()
        try:
            complete = isinstance(orjson.loads(tail), dict)
        except orjson.JSONDecodeError:
            complete = False
        if complete:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
            return "added the missing newline after the last row"
        f.truncate(start)
        return f"removed a torn last line ({len(tail)} bytes) left by an interrupted write"


class Appender:
    """Appends rows to one JSONL file, one write and one flush per row."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        note = repair_tail(self.path)
        if note:
            print(f"{self.path}: {note}", file=sys.stderr)
        self._f = open(self.path, "ab")

    def append(self, row: dict) -> None:
        self._f.write(dumps(row) + b"\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write a whole file so that readers see the old or the new content, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
