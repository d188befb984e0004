"""Where results live: outputs/<bench>/<model-slug>/run-<K>/{infer.jsonl,judge.jsonl,score.json}."""

import re
from pathlib import Path

from ..errors import BadInput
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


def bench_dir(root: Path, bench: str) -> Path:
    return root / bench


# A second opinion's judge file: judge-<label>.jsonl beside judge.jsonl (judge.py --judge-label).
JUDGE_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")
_LABELLED_JUDGE = re.compile(rf"judge-({JUDGE_LABEL.pattern})\.jsonl")


def judge_file_name(label: str | None = None) -> str:
    return f"judge-{label}.jsonl" if label else "judge.jsonl"


def labelled_judge_files(folder: Path) -> dict[str, Path]:
    """The labelled judge files in a run folder, by label (also where only their shard files are; not their
    analyses)."""
    wholes = sorted({shards.whole(path) for path in folder.glob("judge-*.jsonl")})
    return {m.group(1): path for path in wholes if (m := _LABELLED_JUDGE.fullmatch(path.name))}
