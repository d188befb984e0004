"""Where results live: outputs/<bench>/<model-slug>/run-<K>/{infer.jsonl,judge.jsonl,score.json}; and what may
stand where an output goes."""

import os
import re
import stat
from pathlib import Path

from ..errors import BadInput, writing
from . import shards

DEFAULT_ROOT = Path("outputs")
PROJECT = Path(__file__).resolve().parents[2]  # where data/ with the bundled samples lives


def slug(model: str) -> str:
    """A safe folder name for a model name such as `org/model:tag` or `../../x`."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._-")
    return s or "model"


MAX_DIR_NAME = 200  # bytes of a model's folder name: file systems take 255, the rest is kept for what is derived


def model_dir_name(model: str, label: str | None = None) -> str:
    """The folder (and leaderboard row) of a model, or of a labelled variant of it: `<model>@<label>`."""
    name = slug(model) + (f"@{slug(label)}" if label else "")
    if len(name.encode()) > MAX_DIR_NAME:
        what = "--model and --label (MODEL, LABEL)" if label else "--model (MODEL)"
        raise BadInput(
            f"{what} give a folder name of {len(name.encode()):,} bytes ({name[:40]}...): too long for a file name "
            f"(at most {MAX_DIR_NAME}); use a shorter name"
        )
    return name


RUN_DIR = re.compile(r"run-(\d+)$")  # a run's folder name; the group is its number


def run_dir(root: Path, bench: str, model: str, run: int, label: str | None = None) -> Path:
    return root / bench / model_dir_name(model, label) / f"run-{run}"


def error_analysis_path(judge_path: Path, name: str) -> Path:
    """error_analysis.jsonl beside judge.jsonl; <stem>_error_analysis.jsonl beside any other judge file."""
    if judge_path.name == "judge.jsonl":
        return judge_path.with_name(f"{name}.jsonl")
    return judge_path.with_name(f"{judge_path.stem}_{name}.jsonl")


def items_path(score_path: Path) -> Path:
    """items.json beside score.json (aggregate's item-level input); <stem>_items.json beside <stem>_score.json."""
    name = score_path.name
    if name == "score.json":
        return score_path.with_name("items.json")
    stem = name[: -len("score.json")].rstrip("_.-") if name.endswith("score.json") else score_path.stem
    return score_path.with_name(f"{stem}_items.json")


# A second opinion's judge file: judge-<label>.jsonl beside judge.jsonl (judge.py --judge-label).
JUDGE_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")
_LABELLED_JUDGE = re.compile(rf"judge-({JUDGE_LABEL.pattern})\.jsonl")


def check_judge_label(label: str | None) -> None:
    """Refuse a --judge-label that would not be a plain file name part."""
    if label is not None and not JUDGE_LABEL.fullmatch(label):
        raise BadInput(f"--judge-label {label!r}: use letters, digits, '.' and '-' (not starting with '.' or '-')")


def judge_file_name(label: str | None = None) -> str:
    return f"judge-{label}.jsonl" if label else "judge.jsonl"


def labelled_judge_files(folder: Path) -> dict[str, Path]:
    """A run folder's labelled judge files by label (also where only their shard files are; not their analyses)."""
    wholes = sorted({shards.whole(path) for path in folder.glob("judge-*.jsonl")})
    return {m.group(1): path for path in wholes if (m := _LABELLED_JUDGE.fullmatch(path.name))}


_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def not_a_file(mode: int) -> str | None:
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def refuse_unsafe_output(path: str | os.PathLike) -> None:
    """BadInput when a link (on a shared folder it may point at anyone's file), a folder, a pipe or a device is
    where an output file goes; nothing there is fine."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # absent (or unreadable: the write itself says so)
    if stat.S_ISLNK(mode):
        raise BadInput(
            f"a symbolic link (to {os.readlink(os.fspath(path))}) where an output file goes: evalpipe never writes "
            "through a link; put the file itself there, or remove the link",
            path,
        )
    kind = not_a_file(mode)
    if kind is not None:
        raise BadInput(f"{kind} where an output file goes: move it away, or choose another output", path)


def open_output(path: Path, flags: int) -> int:
    """An output file opened with `flags`, made if missing (and its folder), after `refuse_unsafe_output`."""
    refuse_unsafe_output(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)  # nor a link made meanwhile
