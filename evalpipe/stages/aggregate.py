"""aggregate: every model's runs of one benchmark → mean ± std per figure, side by side."""

import argparse
import re
import sys
from pathlib import Path

import orjson

from .. import cli, jsonl, paths, report, stats
from ..benchmarks import Benchmark
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput

_RUN_DIR = re.compile(r"run-(\d+)$")


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--runs", type=int, help="use runs 1..N of each model (default: every run that has a score.json)")
    parser.add_argument("--models", nargs="+", help="model folder names to include (default: all under outputs/<bench>/)")
    parser.add_argument(
        "--std",
        choices=("sample", "population"),
        default="sample",
        help="std shown in the tables: sample (n−1, default) or population (n); the JSON has both",
    )


def collect(bench: Benchmark, root: Path, runs: int | None, models: list[str] | None) -> tuple[list[dict], list[str]]:
    """Per model: its figures per run. Also warnings about missing runs and incomplete coverage."""
    warnings, found = [], []
    base = paths.bench_dir(root, bench.name)
    model_dirs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    for model_dir in model_dirs:
        if models and model_dir.name not in models:
            continue
        per_run = {}
        for run_dir in model_dir.iterdir():
            match = _RUN_DIR.match(run_dir.name)
            if not match or not (run_dir / "score.json").exists():
                continue
            k = int(match.group(1))
            if runs is not None and k > runs:
                continue
            try:
                per_run[k] = orjson.loads((run_dir / "score.json").read_bytes())
            except orjson.JSONDecodeError as exc:
                raise BadInput(f"not valid JSON ({exc})", run_dir / "score.json") from None
        if not per_run:
            continue
        if runs is not None and len(per_run) < runs:
            absent = sorted(set(range(1, runs + 1)) - set(per_run))
            warnings.append(f"{model_dir.name}: no score.json for run(s) {absent}")
        for k, metrics in sorted(per_run.items()):
            cov = metrics.get("coverage", {})
            if cov.get("missing"):
                warnings.append(f"{model_dir.name} run-{k}: {cov['missing']} of {cov['expected']} tasks missing (counted as 0)")
        found.append({"model": model_dir.name, "runs": dict(sorted(per_run.items()))})
    return found, warnings


def summarize(bench: Benchmark, found: list[dict]) -> list[dict]:
    models = []
    for entry in found:
        per_figure: dict[str, list[float]] = {}
        for metrics in entry["runs"].values():
            for name, value in bench.headline(metrics).items():
                per_figure.setdefault(name, [])
                if value is not None:
                    per_figure[name].append(value)
        figures = {}
        for name, values in per_figure.items():
            if not values:
                continue
            figures[name] = {
                "mean": stats.mean(values),
                "std_sample": stats.std(values, "sample"),
                "std_population": stats.std(values, "population"),
                "stderr": stats.stderr(values),
                "n": len(values),
                "values": values,
            }
        models.append(
            {
                "model": entry["model"],
                "runs": list(entry["runs"]),
                "figures": figures,
                "coverage": {f"run-{k}": m.get("coverage", {}) for k, m in entry["runs"].items()},
            }
        )
    # headline() lists the overall figure first: sort by it, best first
    models.sort(key=lambda m: -next(iter(m["figures"].values()), {"mean": 0.0})["mean"])
    return models


def tables(models: list[dict], std_kind: str) -> tuple[str, str]:
    names: list[str] = []
    for m in models:
        names += [n for n in m["figures"] if n not in names]
    key = f"std_{std_kind}"
    md_rows, csv_rows = [], []
    for m in models:
        cells, flat = [], []
        for n in names:
            f = m["figures"].get(n)
            cells.append(f"{100 * f['mean']:.1f} ± {100 * f[key]:.1f}" if f else "-")
            flat += [round(100 * f["mean"], 4), round(100 * f[key], 4)] if f else ["", ""]
        md_rows.append([m["model"], len(m["runs"]), *cells])
        csv_rows.append([m["model"], len(m["runs"]), *flat])
    md = report.markdown_table(["Model", "Runs", *names], md_rows)
    csv_headers = ["model", "runs"] + [f"{n} {part}" for n in names for part in ("mean %", f"std % ({std_kind})")]
    return md, report.csv_text(csv_headers, csv_rows)


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("aggregate", "Mean ± std over runs, per model.", _add_args, argv, per_run=False)
    found, warnings = collect(bench, args.outputs_dir, args.runs, args.models)
    if not found:
        raise BadInput(f"no score.json under {paths.bench_dir(args.outputs_dir, bench.name)}/*/run-*/ (run score first)")
    models = summarize(bench, found)
    md, csv_data = tables(models, args.std)
    std_note = "sample std (n − 1)" if args.std == "sample" else "population std (n)"
    md = (
        f"## {bench.name}: mean ± {std_note} over runs, in percent\n\n{md}\n{bench.aggregate_note}\n"
    )
    out_dir = paths.bench_dir(args.outputs_dir, bench.name)
    summary = {"benchmark": bench.name, "std_shown": args.std, "warnings": warnings, "models": models}
    jsonl.atomic_write(out_dir / "aggregate.json", orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    jsonl.atomic_write(out_dir / "aggregate.md", md.encode())
    jsonl.atomic_write(out_dir / "aggregate.csv", csv_data.encode())
    print(md)
    for w in warnings:
        print(f"aggregate: warning: {w}", file=sys.stderr)
    print(f"aggregate: wrote {out_dir}/aggregate.{{md,csv,json}}", file=sys.stderr)
    return EXIT_INCOMPLETE if warnings else EXIT_OK
