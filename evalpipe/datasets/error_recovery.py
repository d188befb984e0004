"""Convert BIG-Bench Mistake into the Error Recovery eval rows of OpenAI Evals, byte-identical to its data files:
the problems with a mistake (not in the last step) and a wrong answer, with the reference's seven keys.

    python -m evalpipe.datasets.error_recovery --bbm-dir <BIG-Bench-Mistake folder> --out data/error_recovery
"""

import argparse
import contextlib
import json
from pathlib import Path

from ..errors import BadInput
from ..store import jsonl

TASKS = ("multistep_arithmetic", "tracking_shuffled_objects", "word_sorting", "logical_deduction", "dyck_languages")
QUESTION_PREFIX = {
    "dyck_languages": "Given the following sequence of opening and closing brackets, provide the minimal "
    "sequence of additional brackets that would balance the original sequence:\n",
    "word_sorting": "Sort the following list of words alphabetically:\n",
}
VARIANTS = {"main": None, "medium": 50, "small": 2}  # rows per task (None: all)


def encode(rows: list[dict]) -> bytes:
    """The reference files' encoding: pandas' to_json (compact, ASCII-only, `/` escaped)."""
    lines = (json.dumps(r, ensure_ascii=True, separators=(",", ":")).replace("/", "\\/") for r in rows)
    return "".join(line + "\n" for line in lines).encode()


def convert_task(path: Path, task: str) -> list[dict]:
    rows = []
    for line, src in jsonl.iter_rows(path):
        missing = [k for k in ("input", "steps", "answer", "target", "mistake_index") if k not in src]
        if missing:
            raise BadInput(f"missing keys {missing}", path, line)
        steps, index = src["steps"], src["mistake_index"]
        if index is None or src["answer"] == src["target"]:
            continue
        if not isinstance(steps, list) or not isinstance(index, int) or not 0 <= index < len(steps):
            raise BadInput("'mistake_index' must index into 'steps'", path, line)
        if index == len(steps) - 1:  # the mistake is the last step: nothing left to recover
            continue
        target = src["target"]
        if task == "multistep_arithmetic":
            with contextlib.suppress(TypeError, ValueError):
                target = int(target)
        rows.append(
            {
                "question": QUESTION_PREFIX.get(task, "") + src["input"],
                "correct_steps": steps[:index],
                "incorrect_step": steps[index],
                "mistake_index": float(index),
                "num_ground_truth_steps": len(steps),
                "target": target,
                "task": task,
            }
        )
    return rows


def convert(bbm_dir: Path, variants: tuple[str, ...] = tuple(VARIANTS)) -> dict[str, list[dict]]:
    per_task = {}
    for task in TASKS:
        path = bbm_dir / f"{task}.jsonl"
        if not path.exists():
            raise BadInput(f"no {task}.jsonl in the BIG-Bench Mistake folder", bbm_dir)
        per_task[task] = convert_task(path, task)
    out = {}
    for name in variants:
        count = VARIANTS[name]
        short = [f"{t} has {len(rows)}" for t, rows in per_task.items() if count is not None and len(rows) < count]
        if short:
            raise BadInput(f"the {name} variant needs {count} rows per task; {', '.join(short)}", bbm_dir)
        out[name] = [row for task in TASKS for row in per_task[task][:count]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the Error Recovery rows from BIG-Bench Mistake.")
    parser.add_argument("--bbm-dir", type=Path, required=True, help="folder with BIG-Bench Mistake's five JSONL files")
    parser.add_argument("--out", type=Path, default=Path("data/error_recovery"), help="folder for the rows")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), help="files to write")
    args = parser.parse_args()
    try:
        variants = convert(args.bbm_dir, tuple(args.variants))
    except BadInput as exc:
        raise SystemExit(f"error-recovery-data: error: {exc}") from None
    for name, rows in variants.items():
        jsonl.atomic_write(args.out / f"{name}.jsonl", encode(rows))
        counts = ", ".join(f"{t} {sum(r['task'] == t for r in rows)}" for t in TASKS)
        print(f"{name}: {len(rows)} rows ({counts}) → {args.out / (name + '.jsonl')}")


if __name__ == "__main__":
    main()
