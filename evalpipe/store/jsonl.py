"""JSONL files: tolerant reading of our own outputs, strict reading of inputs, safe writing.

Rows are appended with one unbuffered write() each, so a kill leaves at most one torn last line, which readers
ignore and writers cut off before appending; a write that fails part-way is cut back at once.
"""

import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, count
from pathlib import Path
from typing import Any, BinaryIO, cast

import orjson

from ..errors import BadInput, OutputUnwritable, as_unwritable, writing
from . import shards
from .paths import not_a_file, open_output, refuse_unsafe_output

BOM = b"\xef\xbb\xbf"
dumps = orjson.dumps


def _not_a_row(value: Any, raw: bytes) -> str:
    """Why a line is no row: `value` is what it parsed to, or the JSONDecodeError."""
    if isinstance(value, list) or raw.lstrip().startswith(b"[") and raw.rstrip().endswith(b"]"):
        return "a JSON array, expected one JSON object per line (JSONL)"
    if not isinstance(value, orjson.JSONDecodeError):
        return f"expected a JSON object, got {type(value).__name__}"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not valid UTF-8 (byte {err.start})"
    return f"invalid JSON ({value})"


def open_input(path: str | os.PathLike, buffering: int = -1) -> BinaryIO:
    """Open a file to read, refusing (BadInput) what is no regular file: a pipe or /dev/zero would never end.
    Opened without blocking, so that a pipe without a writer is refused, not waited for."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path) from None
    try:
        kind = not_a_file(os.fstat(fd).st_mode)
        if kind is not None:
            why = "" if kind == "a folder" else ": write what it gives to a file, and give that"
            raise BadInput(f"{kind}, not a regular file{why}", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def require_regular_file(path: str | os.PathLike) -> None:
    open_input(path, buffering=0).close()


def iter_rows(path: str | os.PathLike, *, torn_tail_ok: bool = False) -> Iterator[tuple[int, dict]]:
    """(line number, row) for each non-blank line. A line that is not a JSON object is a BadInput naming the
    file and line, except a last line without a newline when torn_tail_ok (a write cut short): skipped."""
    chunks = iter_row_chunks(path, torn_tail_ok=torn_tail_ok)
    return chain.from_iterable(zip(count(first), rows) for first, rows in chunks)  # no generator step per row


def iter_row_chunks(path: str | os.PathLike, *, torn_tail_ok: bool = False) -> Iterator[tuple[int, list[dict]]]:
    """`iter_rows` a chunk at a time: (line number of the first row, rows of consecutive lines)."""
    with open_input(path, buffering=1 << 20) as f:  # fewer reads of the file
        loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
        before = 0  # lines read before this chunk
        while lines := f.readlines(1 << 16):  # parsed a chunk at a time: one call per chunk, not per line
            if before == 0 and lines[0].startswith(BOM):
                lines[0] = lines[0][len(BOM) :]
            try:
                rows = list(map(loads, lines))
            except JSONDecodeError:
                rows = None
            if rows is not None and set(map(type, rows)) == {dict}:
                yield before + 1, rows
            else:  # a blank line, or one that is no JSON object: line by line, to skip it or say which
                for lineno, raw in enumerate(lines, before + 1):
                    try:
                        row = loads(raw)
                    except JSONDecodeError as exc:
                        row = exc
                    if type(row) is dict:
                        yield lineno, [row]
                    elif raw.strip():  # not a blank line
                        if torn_tail_ok and not raw.endswith(b"\n"):
                            return
                        raise BadInput(_not_a_row(row, raw), path, lineno)
            before += len(lines)


def run_rows(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """`iter_rows` of one of our output files (torn last lines skipped) over all its parts (shards.py)."""
    return chain.from_iterable(iter_rows(part, torn_tail_ok=True) for part in shards.parts(Path(path)))


def latest_rows(
    path: str | os.PathLike, key: Callable[[dict], Any], keep: Callable[[dict], Any] | None = None
) -> dict[Any, Any]:
    """The last row per id over a run file's parts (missing: none); `keep` maps each row to what is kept."""
    return {key(row): row if keep is None else keep(row) for _, row in run_rows(path)}


def ids_in(path: str | os.PathLike, key: Callable[[dict], Any]) -> set:
    """The ids with a complete row over a run file's parts (missing: none); a torn last line does not count."""
    return set(iter_ids(path, key))


def fast_id(raw: bytes) -> str | None:
    """The id of one of our rows (`{"idx": "..."` first), sliced from the line without parsing it; None: it cannot."""
    if raw.startswith(b'{"idx":"'):
        end = raw.find(b'"', 8)
        if end > 0 and b"\\" not in raw[8:end]:
            try:
                return raw[8:end].decode("utf-8")
            except UnicodeDecodeError:
                pass  # parsed, so that the damage is named
    return None


def iter_ids(path: str | os.PathLike, key: Callable[[dict], Any]) -> Iterator[Any]:
    """The id of every complete row of one of our output files, over its parts, in order (see `ids_in`)."""
    for part in shards.parts(Path(path)):
        with open_input(part) as f:
            for lineno, raw in enumerate(f, 1):
                fast = fast_id(raw) if raw.endswith(b"}\n") else None
                if fast is not None:
                    yield fast
                elif raw.strip():
                    try:
                        row = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        if raw.endswith(b"\n"):
                            raise BadInput("invalid JSON in an output file", part, lineno) from None
                        continue  # a torn last line
                    yield key(row)


def repair_tail(path: str | os.PathLike) -> str | None:
    """End the file with a newline before appending: a complete last row (killed before its newline) gets one,
    any other unterminated tail is cut off. Returns what was done, or None."""
    if not os.path.exists(path):
        return None
    refuse_unsafe_output(path)
    with writing(path), open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        start, cut = size, -1  # where the last line starts: found a block at a time from the end
        while start > 0 and cut < 0:
            step = min(1 << 16, start)
            start -= step
            f.seek(start)
            cut = f.read(step).rfind(b"\n")
        start += cut + 1
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
    """Appends rows to one JSONL file (its one writer: see lock.py), one unbuffered write per row. A failed
    append leaves the file as it was and raises OutputUnwritable or the OSError."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        note = repair_tail(self.path)
        self._fd = open_output(self.path, os.O_WRONLY | os.O_APPEND)
        if note:
            print(f"{self.path}: {note}", file=sys.stderr)
        self._size = os.fstat(self._fd).st_size  # where the last whole row ends
        self._error: Exception | None = None

    def append(self, row: dict) -> None:
        data = dumps(row) + b"\n"
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a short write: the disk filled up within this row
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            # fd < 0: an earlier failure could not be undone, nothing is written any more. (After close(), _error
            # may still be None, and an append then raises TypeError; the cast leaves that as it was.)
            if self._fd >= 0:
                try:
                    os.ftruncate(self._fd, self._size)  # cut off what was written of this row
                except OSError:
                    # appending after the torn row would bury it mid-file; the next run's repair_tail cuts it
                    os.close(self._fd)
                    self._fd = -1
                self._error = as_unwritable(exc, self.path)
            raise cast(Exception, self._error) from None
        self._size += len(data)

    def close(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            with writing(self.path):
                os.fsync(fd)
        finally:
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def atomic_write(path: str | os.PathLike, data: bytes | Iterable[bytes]) -> None:
    """Write a whole file so that readers see the old or the new content, never a mix; `data` may be pieces."""
    path = Path(path)
    if os.path.isdir(path) and not os.path.islink(path):  # a link is replaced, never followed
        raise BadInput("a folder where an output file goes: move it away, or choose another output", path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.writelines([data] if isinstance(data, bytes) else data)
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


def write_json(path: str | os.PathLike, value: Any) -> None:
    """`value` as indented JSON with a final newline, written whole (`atomic_write`)."""
    atomic_write(path, orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")


def rescue_path(output: str | os.PathLike) -> Path:
    """Where a run keeps the rows it could not append to `output`: outside its folder (often on the full disk)."""
    key = hashlib.sha256(os.path.abspath(output).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "evalpipe-rescue" / f"{key}.jsonl"


def open_rescue(output: str | os.PathLike) -> Appender:
    folder = rescue_path(output).parent
    with contextlib.suppress(FileExistsError):
        folder.mkdir()
        os.chmod(folder, 0o1777)  # shared like /tmp itself: every user's runs keep rows here
    return Appender(rescue_path(output))


def recover_rescued(output: str | os.PathLike) -> int:
    """Append the rows an earlier run rescued to `output` (hold its lock), delete the rescue file; how many."""
    rescue = rescue_path(output)
    if not rescue.exists():
        return 0
    if rescue.stat().st_uid != os.geteuid():
        print(f"{output}: ignoring {rescue}: it belongs to another user", file=sys.stderr)
        return 0
    rows = [row for _, row in iter_rows(rescue, torn_tail_ok=True)]
    with Appender(output) as out:
        for i, row in enumerate(rows):
            try:
                out.append(row)
            except OutputUnwritable:
                atomic_write(rescue, b"".join(dumps(r) + b"\n" for r in rows[i:]))  # no row twice next time
                raise
    os.unlink(rescue)
    return len(rows)
