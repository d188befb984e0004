"""How far two judges agree: judge files of the same answers, compared task by task.

What is compared and how: docs/results.md#judge-agreement (the figures: results/agreement.py)."""

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from .. import benchmarks
from ..benchmarks import Benchmark, row_id
from ..benchmarks.base import stand_in
from ..benchmarks.clbench import rubric_lines
from ..errors import EXIT_OK, BadInput, run_stage
from ..results.agreement import Rows, format_report, report
from ..store import jsonl, manifest, paths, shards


def _statuses(row: dict) -> list[int] | None:
    """The rubric verdicts as 0/1 when there is one yes/no per rubric; else None."""
    statuses = row.get("requirement_status")
    if not isinstance(statuses, list) or not statuses:
        return None
    if len(statuses) != len(rubric_lines(row.get("rubrics"))):
        return None
    out = []
    for s in statuses:
        word = str(s).strip().lower()
        if word not in ("yes", "no"):
            return None
        out.append(int(word == "yes"))
    return out


def load(bench: Benchmark, path: Path, prefix: Any = None) -> tuple[Rows, int]:
    """A judge file's final rows by id (`(prefix, id)` when pooling runs), and how many were provisional."""
    if not shards.exists(path):
        raise BadInput("no such judge file", path)

    def keep(row: dict) -> dict | None:
        if stand_in(row):
            return None
        score = row.get("score")  # 1 as a number or text, else 0 (the conservative rule of every fallback)
        return {
            "score": int((score.strip() if isinstance(score, str) else score) in (1, "1")),
            "statuses": _statuses(row),
            "category": str((row.get("metadata") or {}).get("context_category", "(none)")),
            "format": row.get("judge_format"),
        }

    latest = jsonl.latest_rows(path, row_id, keep=keep)
    final = {(k if prefix is None else (prefix, k)): r for k, r in latest.items() if r is not None}
    return final, len(latest) - len(final)


def judge_model(path: Path) -> str | None:
    """The judge model the file's manifest records (None: no manifest)."""
    return (manifest.read_run(path) or {}).get("judge_model")


def _beside(bench: Benchmark, judge_path: Path, prefix: Any = None) -> dict[str, tuple[Rows, int, str | None]]:
    """`judge_path` and each judge-<label>.jsonl beside it by file name: rows, provisional rows, judge model."""
    labelled = paths.labelled_judge_files(judge_path.parent)
    if not labelled:
        return {}
    return {p.name: (*load(bench, p, prefix), judge_model(p)) for p in [judge_path, *labelled.values()]}


def for_run(bench: Benchmark, judge_path: Path) -> dict | None:
    """judge.jsonl against each judge-<label>.jsonl beside it (None when there is none)."""
    files = _beside(bench, judge_path)
    return report(files) if files else None


def pooled(bench: Benchmark, run_dirs: list[Path]) -> dict | None:
    """for_run pooled over a model's runs: a task of each run is an item of its own (keyed by run and id)."""
    merged: dict[str, tuple[Rows, int, set]] = {}
    used = []
    for run_dir in run_dirs:
        judge_path = run_dir / "judge.jsonl"
        files = _beside(bench, judge_path, prefix=run_dir.name) if shards.exists(judge_path) else {}
        if files:
            used.append(run_dir.name)
        for name, (rows, provisional, model) in files.items():
            old_rows, old_prov, models = merged.get(name, ({}, 0, set()))
            old_rows.update(rows)
            models.add(model)
            merged[name] = (old_rows, old_prov + provisional, models)
    if not used:
        return None
    # a file name judged by different models across runs is no one judge's repeat
    files = {n: (rows, p, next(iter(m)) if len(m) == 1 else None) for n, (rows, p, m) in merged.items()}
    return {"pooled_over_runs": used} | report(files)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.stages.agreement", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="judge JSONL files of the same answers (the first is compared with each other one)",
    )
    parser.add_argument(
        "--bench", default=benchmarks.DEFAULT, choices=list(benchmarks.REGISTRY), help="benchmark (default %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if len(args.files) < 2:
        raise BadInput("give two judge files or more")
    bench = benchmarks.get(args.bench)
    files: dict[str, tuple[Rows, int, str | None]] = {}
    for path in args.files:
        rows, provisional = load(bench, path)
        name = str(path)
        files[name if name not in files else f"{name} ({len(files) + 1})"] = (rows, provisional, judge_model(path))
    section = report(files)
    if args.json:
        sys.stdout.write(orjson.dumps(section, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_report(section))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_stage("agreement", main))
