"""Where results live: outputs/<bench>/<model-slug>/run-<K>/{infer.jsonl,judge.jsonl,score.json}."""

import re
from pathlib import Path

DEFAULT_ROOT = Path("outputs")
PROJECT = Path(__file__).resolve().parent.parent  # where data/ with the bundled samples lives


def slug(model: str) -> str:
    """A safe folder name for a model name such as `org/model:tag` or `../../x`."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._-")
    return s or "model"


def run_dir(root: Path, bench: str, model: str, run: int) -> Path:
    return root / bench / slug(model) / f"run-{run}"


def error_analysis_path(judge_path: Path, name: str) -> Path:
    """error_analysis.jsonl beside judge.jsonl; <stem>_error_analysis.jsonl beside any other judge file."""
    if judge_path.name == "judge.jsonl":
        return judge_path.with_name(f"{name}.jsonl")
    return judge_path.with_name(f"{judge_path.stem}_{name}.jsonl")


def bench_dir(root: Path, bench: str) -> Path:
    return root / bench
