"""How far two judges agree: judge files of the same answers, compared task by task.

    python -m evalpipe.results.agreement FILE_A FILE_B [FILE ...] [--bench clbench] [--json]

Rows are keyed by task id (the last row per id counts) and only final judgments are compared: a
provisional row (the judge API failed; the next judge run does it again) is left out, on either
side. For the first file against each other one: raw agreement on the overall 0/1 score, Cohen's
κ, the 2×2 table, both judges' pass rates, the same per category (CL-bench's
metadata.context_category), agreement per rubric item where both requirement_status lists have
the rubric count, and the response_format mode (judge_format) of each side: a pair whose modes
differ is a format A/B. Files judged by one judge model (as their manifests record) are repeated
judgments: their flip rate (tasks not graded alike by all of them) and Fleiss' κ.

score.py calls `for_run` (judge.jsonl and the judge-<label>.jsonl beside it), aggregate
`pooled` (the same, pooled over a model's runs).
"""

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from .. import benchmarks
from ..benchmarks import Benchmark, row_id
from ..benchmarks.clbench import rubric_lines
from ..errors import EXIT_OK, BadInput, run_stage
from ..store import jsonl, manifest, paths, shards

NOTE = (
    "Judge agreement: the first judge file against each other one, on the tasks both graded finally "
    "(provisional rows left out). Raw agreement is the share of tasks given the same 0/1 score; Cohen's κ "
    "corrects it for the agreement expected by chance from the two pass rates (1: perfect, 0: chance, "
    "undefined when both judges give every task the same score). Flip rate and Fleiss' κ: files of one "
    "judge model, on the tasks all of them graded."
)

Rows = dict[Any, dict]


# ---------------------------------------------------------------- the figures


def cohen_kappa(table: dict[str, int]) -> float | None:
    """Cohen's κ of a 2×2 table {"1/1", "1/0", "0/1", "0/0"} (first judge / second): (po − pe) / (1 − pe)."""
    n = sum(table.values())
    if n == 0:
        return None
    po = (table["1/1"] + table["0/0"]) / n
    a1, b1 = (table["1/1"] + table["1/0"]) / n, (table["1/1"] + table["0/1"]) / n
    pe = a1 * b1 + (1 - a1) * (1 - b1)
    return None if pe >= 1 else (po - pe) / (1 - pe)


def fleiss_kappa(ratings: list[list[int]]) -> float | None:
    """Fleiss' κ of 0/1 ratings, one list per item with the same number (≥ 2) of raters each."""
    if not ratings or len(ratings[0]) < 2:
        return None
    m, n = len(ratings[0]), len(ratings)
    agreement = 0.0
    ones = 0
    for item in ratings:
        k1 = sum(item)
        ones += k1
        agreement += (k1 * k1 + (m - k1) * (m - k1) - m) / (m * (m - 1))
    p_bar = agreement / n
    p1 = ones / (n * m)
    pe = p1 * p1 + (1 - p1) * (1 - p1)
    return None if pe >= 1 else (p_bar - pe) / (1 - pe)


def _table_figures(pairs: Iterable[tuple[int, int]]) -> dict:
    table = {"1/1": 0, "1/0": 0, "0/1": 0, "0/0": 0}
    for a, b in pairs:
        table[f"{a}/{b}"] += 1
    n = sum(table.values())
    return {
        "n": n,
        "raw_agreement": (table["1/1"] + table["0/0"]) / n if n else None,
        "cohen_kappa": cohen_kappa(table),
        "pass_rate_a": (table["1/1"] + table["1/0"]) / n if n else None,
        "pass_rate_b": (table["1/1"] + table["0/1"]) / n if n else None,
        "table": table,
    }


# ---------------------------------------------------------------- the rows


def _binary(value: Any) -> int:
    """1 for a score of 1 (as a number or text), else 0 (the conservative rule of every fallback)."""
    if isinstance(value, str):
        value = value.strip()
    return int(value in (1, "1"))


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
        if bench.is_provisional(row):
            return None
        return {
            "score": _binary(row.get("score")),
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


# ---------------------------------------------------------------- the report


def _counts(values: Iterable[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        key = "(not recorded)" if v is None else str(v)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def compare(a: Rows, b: Rows) -> dict:
    """Two judges on the tasks both graded finally: overall, per category, per rubric item, and formats."""
    common = [k for k in a if k in b]
    overall = _table_figures((a[k]["score"], b[k]["score"]) for k in common)
    categories: dict[str, list] = {}
    for k in common:
        categories.setdefault(a[k]["category"], []).append((a[k]["score"], b[k]["score"]))
    rubric_pairs: list[tuple[int, int]] = []
    rubric_rows = 0
    for k in common:
        sa, sb = a[k]["statuses"], b[k]["statuses"]
        if sa is not None and sb is not None and len(sa) == len(sb):
            rubric_rows += 1
            rubric_pairs += zip(sa, sb)
    rubric = _table_figures(rubric_pairs) if rubric_pairs else None
    if rubric is not None:
        rubric["tasks"] = rubric_rows
    formats_a = _counts(a[k]["format"] for k in common)
    formats_b = _counts(b[k]["format"] for k in common)
    return {
        "overall": overall,
        "by_category": {c: _table_figures(p) for c, p in sorted(categories.items())},
        "rubric_items": rubric,
        "only_a": len(a) - len(common),
        "only_b": len(b) - len(common),
        "formats": {"a": formats_a, "b": formats_b},
        "format_ab": set(formats_a) != set(formats_b),
    }


def repeated(files: list[Rows]) -> dict:
    """Repeated judgments by one judge: on the tasks every file graded finally, the flip rate and Fleiss' κ."""
    common = [k for k in files[0] if all(k in f for f in files[1:])]
    ratings = [[f[k]["score"] for f in files] for k in common]
    flips = sum(1 for r in ratings if len(set(r)) > 1)
    return {
        "n": len(common),
        "flip_rate": flips / len(common) if common else None,
        "fleiss_kappa": fleiss_kappa(ratings),
        "pass_rate": sum(map(sum, ratings)) / (len(common) * len(files)) if common else None,
    }


def report(files: dict[str, tuple[Rows, int, str | None]]) -> dict:
    """Every file (name → final rows, provisional rows left out, judge model) against the first; and
    the repeated judgments of each judge model with two files or more."""
    names = list(files)
    first = names[0]
    pairs = []
    for name in names[1:]:
        pair = compare(files[first][0], files[name][0])
        pairs.append({"a": first, "b": name, "judge_model_a": files[first][2], "judge_model_b": files[name][2]} | pair)
    by_model: dict[str, list[str]] = {}
    for name, (_, _, model) in files.items():
        if model is not None:
            by_model.setdefault(model, []).append(name)
    repeats = [
        {"judge_model": model, "files": group} | repeated([files[n][0] for n in group])
        for model, group in sorted(by_model.items())
        if len(group) >= 2
    ]
    return {
        "files": {
            n: {"judge_model": m, "final_rows": len(rows), "provisional_left_out": p}
            for n, (rows, p, m) in files.items()
        },
        "pairs": pairs,
        "repeated": repeats,
        "note": NOTE,
    }


def for_run(bench: Benchmark, judge_path: Path) -> dict | None:
    """judge.jsonl against each judge-<label>.jsonl beside it (None when there is none)."""
    labelled = paths.labelled_judge_files(judge_path.parent)
    if not labelled:
        return None
    files = {}
    for path in [judge_path, *labelled.values()]:
        rows, provisional = load(bench, path)
        files[path.name] = (rows, provisional, judge_model(path))
    return report(files)


def pooled(bench: Benchmark, run_dirs: list[Path]) -> dict | None:
    """for_run over several runs of one model, pooled: a task of each run is an item of its own (keyed
    by run and id); a file name counts in the runs that have it. None when no run has a second opinion."""
    merged: dict[str, tuple[Rows, int, set]] = {}
    used = []
    for run_dir in run_dirs:
        labelled = paths.labelled_judge_files(run_dir)
        if not labelled or not shards.exists(run_dir / "judge.jsonl"):
            continue
        used.append(run_dir.name)
        for path in [run_dir / "judge.jsonl", *labelled.values()]:
            rows, provisional = load(bench, path, prefix=run_dir.name)
            old_rows, old_prov, models = merged.get(path.name, ({}, 0, set()))
            old_rows.update(rows)
            models.add(judge_model(path))
            merged[path.name] = (old_rows, old_prov + provisional, models)
    if not used:
        return None
    # a file name judged by different models across runs is no one judge's repeat
    files = {n: (rows, p, next(iter(m)) if len(m) == 1 else None) for n, (rows, p, m) in merged.items()}
    return {"pooled_over_runs": used} | report(files)


# ---------------------------------------------------------------- text


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _kappa(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def _line(f: dict) -> str:
    t = f["table"]
    return (
        f"{f['n']} tasks, raw {_pct(f['raw_agreement'])}, Cohen's κ {_kappa(f['cohen_kappa'])}, "
        f"pass rates {_pct(f['pass_rate_a'])} / {_pct(f['pass_rate_b'])}, "
        f"table (a/b) 1/1 {t['1/1']} · 1/0 {t['1/0']} · 0/1 {t['0/1']} · 0/0 {t['0/0']}"
    )


def format_report(section: dict) -> str:
    """The agreement section as text (score prints it; the CLI too)."""
    lines = [
        "Judge agreement"
        + (f" (pooled over {', '.join(section['pooled_over_runs'])})" if "pooled_over_runs" in section else "")
        + ":"
    ]
    for pair in section["pairs"]:
        lines.append(f"  {pair['a']} ({pair['judge_model_a'] or '?'}) vs {pair['b']} ({pair['judge_model_b'] or '?'}):")
        lines.append(f"    overall: {_line(pair['overall'])}")
        for cat, f in pair["by_category"].items():
            lines.append(f"    {cat}: {_line(f)}")
        rubric = pair["rubric_items"]
        if rubric is not None:
            lines.append(
                f"    rubric items ({rubric['tasks']} tasks): {_line(rubric).replace(' tasks,', ' items,', 1)}"
            )
        fa, fb = (", ".join(f"{k} {v}" for k, v in pair["formats"][s].items()) or "-" for s in ("a", "b"))
        lines.append(f"    judge_format: {fa} | {fb}" + ("  (format A/B)" if pair["format_ab"] else ""))
        if pair["only_a"] or pair["only_b"]:
            lines.append(f"    not compared: {pair['only_a']} tasks final in a only, {pair['only_b']} in b only")
    for r in section["repeated"]:
        lines.append(
            f"  repeated ({r['judge_model']}: {', '.join(r['files'])}): {r['n']} tasks, "
            f"flip rate {_pct(r['flip_rate'])}, Fleiss' κ {_kappa(r['fleiss_kappa'])}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.results.agreement", description=__doc__.split("\n\n")[0])
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
