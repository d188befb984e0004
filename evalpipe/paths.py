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


def bench_dir(root: Path, bench: str) -> Path:
    return root / bench
