"""A run cut into shards (`--shard K/N`), and a run's files however it was cut, read over `parts` (docs/scale.md)."""

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput

_SPEC = re.compile(r"([0-9]+)/([0-9]+)")  # ASCII digits (\d would take other scripts' digits too)
_NAME = re.compile(r"(?P<stem>.+)\.shard-(?P<k>[0-9]+)-of-(?P<n>[0-9]+)(?P<suffix>\.[^.]+)")
# The most shards a run may be cut into: ten times Slurm's default MaxArraySize (1,001), far more machines than
# a run of calls to an endpoint can use. score.json lists a run's unfinished shards: this keeps that list short.
MAX_SHARDS = 10_000


@dataclass(frozen=True)
class Shard:
    k: int  # 0 <= k < n
    n: int

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"

    def takes(self, key: object) -> bool:
        """Whether a task with this key (its id, or its prefix group) is this shard's."""
        return index(key, self.n) == self.k

    def path(self, whole: Path) -> Path:
        """This shard's file of the run file `whole` (infer.jsonl → infer.shard-K-of-N.jsonl); refused (exit 2)
        where the run is cut into another count of shards."""
        present = count(whole)
        if present is not None and present != self.n:
            raise BadInput(
                f"this run is cut into {present} shards, not {self.n}: rerun its shards with --shard K/{present} "
                "(or start a new run with --run N)",
                whole,
            )
        return whole.with_name(f"{whole.stem}.shard-{self.k}-of-{self.n}{whole.suffix}")


def index(key: object, n: int) -> int:
    """The shard (0..n-1) of a task key: a hash that is the same in every process, on every machine."""
    text = key if isinstance(key, str) else repr(key)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n


def parse(spec: str) -> Shard:
    match = _SPEC.fullmatch(spec.strip())
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise BadInput(f"--shard {spec!r}: expected K/N with 0 <= K < N (shards are counted from 0), or all")
    return Shard(int(match.group(1)), _count(int(match.group(2)), f"--shard {spec}"))


def _count(n: int, source: str) -> int:
    if n > MAX_SHARDS:
        raise BadInput(f"{source}: {n:,} shards; at most {MAX_SHARDS:,}")
    return n


def chosen(flag: str | None, count: int | None, env: Mapping[str, str] = os.environ) -> Shard | None:
    """This invocation's shard: --shard K/N, else a Slurm array task (K counted from its first index), else a
    Kubernetes JOB_COMPLETION_INDEX with --shards N. None (also `--shard all`): the whole run."""
    if flag == "all":
        return None
    if flag is not None:
        shard = parse(flag)
        if count is not None and count != shard.n:
            raise BadInput(f"--shard {flag} and --shards {count} disagree on the count")
        return shard
    if count is not None and count < 1:
        raise BadInput(f"--shards {count}: expected 1 or more")
    if count is not None:
        _count(count, f"--shards {count}")
    if env.get("SLURM_ARRAY_TASK_ID"):
        return _slurm(env, count)
    if env.get("JOB_COMPLETION_INDEX"):
        if count is None:
            raise BadInput(
                "JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job): give the number of shards once, "
                "--shards N (SHARDS=N), or --shard K/N"
            )
        return _checked(env["JOB_COMPLETION_INDEX"], count, "JOB_COMPLETION_INDEX")
    if count is not None:
        raise BadInput(
            "--shards N needs JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID to say which shard; or --shard K/N"
        )
    return None


def _slurm(env: Mapping[str, str], count: int | None) -> Shard:
    names = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT")
    for name in names:
        if env.get(name) and not _WHOLE.fullmatch(env[name]):
            raise BadInput(f"{name}={env[name]}: expected a whole number (digits 0-9)")
    task = int(env["SLURM_ARRAY_TASK_ID"])
    first = int(env.get("SLURM_ARRAY_TASK_MIN") or "0")
    last = int(env["SLURM_ARRAY_TASK_MAX"]) if env.get("SLURM_ARRAY_TASK_MAX") else None
    tasks = int(env["SLURM_ARRAY_TASK_COUNT"]) if env.get("SLURM_ARRAY_TASK_COUNT") else None
    span = None if last is None else last - first + 1
    n = tasks or span or count
    if n is None:
        raise BadInput("SLURM_ARRAY_TASK_ID is set without SLURM_ARRAY_TASK_COUNT or MAX: give --shard K/N")
    if span is not None and span != n or count is not None and count != n:
        raise BadInput(
            f"the Slurm array is not one contiguous range of {n} tasks (indexes {first}..{last}, "
            f"{tasks} tasks{'' if count is None else f', --shards {count}'}): use --array=0-{n - 1}, or --shard K/N"
        )
    return _checked(str(task - first), _count(n, "the Slurm array"), "SLURM_ARRAY_TASK_ID")


_WHOLE = re.compile(r"[0-9]+")


def _checked(k: str, n: int, source: str) -> Shard:
    if not _WHOLE.fullmatch(k) or not int(k) < n:
        raise BadInput(f"{source}: shard {k} of {n}: expected 0 to {n - 1} (digits 0-9)")
    return Shard(int(k), n)


def whole(path: Path) -> Path:
    """The run file a shard file is part of (a file that is no shard file: itself)."""
    match = _NAME.fullmatch(path.name)
    return path.with_name(match["stem"] + match["suffix"]) if match else path


def shard_files(path: Path) -> dict[Shard, Path]:
    """The shard files of the run file `path` (`path` may be one of them), in shard order."""
    path = whole(path)
    found = {}
    try:
        names = os.listdir(path.parent)
    except OSError:
        return {}
    prefix = f"{path.stem}.shard-"
    for name in names:
        if name.startswith(prefix):
            match = _NAME.fullmatch(name)
            if match and match["stem"] == path.stem and match["suffix"] == path.suffix:
                k, n = int(match["k"]), int(match["n"])
                if not k < n <= MAX_SHARDS:
                    raise BadInput(
                        f"a shard file of no run: shard {k} of {n:,} (at most {MAX_SHARDS:,})", path.parent / name
                    )
                found[Shard(k, n)] = path.with_name(name)
    counts = {shard.n for shard in found}
    if len(counts) > 1:
        raise BadInput(
            f"shard files of {' and of '.join(map(str, sorted(counts)))} shards beside each other: one run is cut "
            "one way (move the others to another run)",
            path,
        )
    return dict(sorted(found.items(), key=lambda item: item[0].k))


def count(path: Path) -> int | None:
    found = shard_files(path)
    return next(iter(found)).n if found else None


def parts(path: Path) -> list[Path]:
    """The files that hold the run file `path`, in reading order: itself where it exists, then its shard files."""
    path = whole(path)
    return ([path] if path.exists() else []) + list(shard_files(path).values())


def exists(path: Path) -> bool:
    """Whether any part of the run file exists (the folder is listed only when the whole file does not)."""
    path = whole(path)
    return path.exists() or bool(shard_files(path))


def missing(path: Path, expected: int) -> list[int]:
    present = {shard.k for shard in shard_files(path)}
    return [k for k in range(expected) if k not in present]
