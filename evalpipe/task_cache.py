"""The selected tasks of a large dataset as infer and score read them (their ids in order, and the codes of
their projections on the fields the benchmark's figures read), kept on disk: made by the first of them to read
the dataset, read back by the others instead of the dataset. A million CoinFlip tasks take 2 s of CPU to read
and check, their entry 0.1 s, and the runs and models of one benchmark share one dataset.

An entry is used only when everything that made it is the same: the dataset's bytes (sha256), the benchmark
and its options, the prefix, and evalpipe's code (sha256 of its sources). It is written while the dataset is
read, to a temporary file renamed when the last task has passed, so that a reader finds a whole entry or none;
an entry that is damaged, or that cannot be written, only means reading the dataset.

The dataset's sha256 is remembered beside its size, times and inode, and hashed again only when one of them
differs (as git tells a changed file), or when the file was changed too short a time before it was hashed
for its times to tell a later change.

Where: $EVALPIPE_CACHE_DIR, else .cache/ in the project (git-ignored); one file per benchmark, dataset path and
prefix, replaced when the dataset or the code changes."""

import contextlib
import dataclasses
import functools
import hashlib
import os
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import orjson

from . import jsonl, manifest
from .benchmarks import Benchmark
from .errors import BadInput, OutputUnwritable
from .paths import PROJECT
from .projections import Projections

# (ids, codes of their projections, the projections first seen in the chunk): as `selected_chunks` gives
Chunk = tuple[list, Sequence[int], list[dict]]
CHUNK = 4096  # tasks per chunk

FORMAT = 1
# Smaller datasets are read again: reading them costs less than keeping them.
KEEP_ABOVE_BYTES = 1 << 20


def keeps(bench: Benchmark, data: Path) -> bool:
    """Whether the selection of this benchmark from this dataset is kept (not where the figures read whole
    task rows: `task_fields` None)."""
    return bench.task_fields is not None and os.path.getsize(data) > KEEP_ABOVE_BYTES


def selected_chunks(bench: Benchmark, data: Path, max_samples: int | None) -> Iterator[Chunk]:
    """The selected tasks, a chunk at a time: their ids, and the codes of their rows' projections on the fields
    the benchmark's figures read, with the projections first seen in the chunk (see `Projections`)."""
    projections = Projections(bench.task_fields)
    ids: list = []
    rows: list[dict] = []
    for task in bench.selected(data, max_samples):
        ids.append(task.id)
        rows.append(task.row)
        if len(ids) == CHUNK:
            yield ids, *projections.codes(rows)
            ids, rows = [], []
    if ids:
        yield ids, *projections.codes(rows)


def cache_dir() -> Path:
    return Path(os.environ.get("EVALPIPE_CACHE_DIR") or PROJECT / ".cache")


@functools.cache
def code_sha256() -> str:
    """sha256 of evalpipe's sources: a change to how tasks are read or named makes new entries."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()


# A file changed less than this before it was hashed may change again with the same times: not remembered.
_SETTLED_NS = 2 * 10**9


def dataset_sha256(data: Path) -> str:
    """The sha256 of the dataset's bytes, remembered (see the module's note)."""
    try:
        stat = os.stat(data)
        if stat.st_size <= KEEP_ABOVE_BYTES:
            return manifest.sha256_file(data)
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", data) from None
    signature = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]
    remembered = _where(data, "sha256", ".json")
    with contextlib.suppress(OSError, orjson.JSONDecodeError, TypeError, KeyError):
        known = orjson.loads(remembered.read_bytes())
        if known["stat"] == signature and isinstance(known["sha256"], str):
            return known["sha256"]
    hashed_at = time.time_ns()
    sha256 = manifest.sha256_file(data)
    if hashed_at - max(stat.st_mtime_ns, stat.st_ctime_ns) > _SETTLED_NS and os.stat(data) == stat:
        with contextlib.suppress(OSError, OutputUnwritable):
            record = {"dataset": str(data), "stat": signature, "sha256": sha256}
            jsonl.atomic_write(remembered, orjson.dumps(record) + b"\n")
    return sha256


def _where(data: Path, kind: str, suffix: str, *more) -> Path:
    """The cache's file of `kind` for the dataset at this path (and `more` that tells it apart)."""
    name = hashlib.sha256(orjson.dumps([os.path.realpath(data), *more])).hexdigest()[:20]
    return cache_dir() / kind / f"{name}{suffix}"


class Entry:
    """The entry of one benchmark's selection from one dataset (`data_sha256`: the dataset's bytes)."""

    def __init__(self, bench: Benchmark, data: Path, max_samples: int | None, data_sha256: str):
        self.key = {
            "format": FORMAT,
            "benchmark": bench.name,
            "options": dataclasses.asdict(bench.options),
            "max_samples": max_samples,
            "dataset_sha256": data_sha256,
            "code_sha256": code_sha256(),
        }
        self._header = orjson.dumps(self.key, default=str)
        self.path = _where(data, "tasks", f"-{bench.name}.jsonl", bench.name, max_samples)

    def read(self) -> Iterator[Chunk] | None:
        """The chunks the entry holds, read as they are asked for; None when there is no whole entry of this key
        (its first line is the key, its last the number of tasks and the checksum of the lines before)."""
        try:
            source = open(self.path, "rb")
        except OSError:
            return None
        with contextlib.suppress(OSError, orjson.JSONDecodeError, TypeError, KeyError):
            whole = source.read()
            end = whole.rfind(b"\n", 0, len(whole) - 1) + 1  # where the last line starts
            last = orjson.loads(whole[end:])
            if whole.startswith(self._header + b"\n") and zlib.crc32(memoryview(whole)[:end]) == last["crc32"]:
                del whole
                return _chunks(source, len(self._header) + 1, end)
        source.close()
        return None

    def recorded(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        """The chunks, written to the entry as they pass. The entry is in place once the last has passed; not
        when the reader stops early, or the disk fails (the chunks still pass)."""
        out = _Writer(self.path)
        try:
            out.write(self._header + b"\n")
            tasks = 0
            for chunk in chunks:
                yield chunk
                out.write(_line(chunk))
                tasks += len(chunk[0])
            out.finish(tasks)
        finally:
            out.abandon()


def _chunks(source, start: int, end: int) -> Iterator[Chunk]:
    """The chunks of an entry checked whole, a line at a time from `start` to `end`."""
    with source:
        source.seek(start)
        while start < end:
            line = source.readline()
            start += len(line)
            ids, codes, first_seen = orjson.loads(line)
            yield ids, codes, first_seen


def _line(chunk: Chunk) -> bytes | None:
    """The chunk as a line of the entry; None when it would not read back the same (the entry is then not made)."""
    ids, codes, first_seen = chunk
    try:
        line = orjson.dumps([ids, list(codes), first_seen])
    except orjson.JSONEncodeError:
        return None
    # ids are compared with the judge rows' ids, projections with their values (NaN, tuples: not JSON)
    if not set(map(type, ids)) <= {str, int} or orjson.loads(orjson.dumps(first_seen)) != first_seen:
        return None
    return line + b"\n"


# A temporary file of an entry not written to for this long was left by a writer that was killed.
_LEFT_AFTER_S = 3600


class _Writer:
    """An entry's lines, written to a temporary file that `finish` puts in place; a line that cannot be written
    (None: not representable, or the disk fails) abandons the entry, and the work goes on without it."""

    def __init__(self, path: Path):
        self.path, self.tmp = path, path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.crc32 = 0
        self.out = None
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            self.out = open(self.tmp, "wb")
        for left in path.parent.glob(f".{path.name}.*.tmp"):  # by writers killed while writing
            with contextlib.suppress(OSError):
                if time.time() - left.stat().st_mtime > _LEFT_AFTER_S:
                    left.unlink()

    def write(self, line: bytes | None) -> None:
        if self.out is None:
            return
        if line is None:
            self.abandon()
            return
        try:
            self.out.write(line)
        except OSError:
            self.abandon()
            return
        self.crc32 = zlib.crc32(line, self.crc32)

    def finish(self, tasks: int) -> None:
        self.write(orjson.dumps({"tasks": tasks, "crc32": self.crc32}) + b"\n")
        if self.out is not None:
            with contextlib.suppress(OSError):
                self.out.close()
                os.replace(self.tmp, self.path)

    def abandon(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)
