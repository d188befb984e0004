"""aggregate: every model's runs of one benchmark → a leaderboard of mean ± std per figure.

Writes aggregate.{md,csv,json,tex} (and PNG bar charts when matplotlib is installed) under
outputs/<bench>/, and warns when runs are missing, incomplete, or were made under different
configurations.
"""

import argparse
import functools
import re
import sys
from pathlib import Path

import orjson

from .. import cli, jsonl, manifest, paths
from ..benchmarks import Benchmark
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput
from ..results import plots, stats, tables

_RUN_DIR = re.compile(r"run-(\d+)$")
MAIN = "main"  # the key of the headline table among a model's tables
FLAG, FLAG_TEX = "†", "\\textsuperscript{\\dag}"  # beside a headline figure the benchmark flags (see flag_note)
CI_NOTE = (
    "95% interval: mean ± t(n − 1) · s/√n over the runs (Student's t, sample std s; run-to-run variation only, "
    "not the choice of tasks; not clipped)."
)


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument(
        "--runs", type=int, help="use runs 1..N of each model (default: every run that has a score.json)"
    )
    parser.add_argument(
        "--models", nargs="+", help="model folder names to include (default: all under outputs/<bench>/)"
    )
    parser.add_argument(
        "--std",
        choices=("sample", "population"),
        default="sample",
        help="std shown in the tables: sample (n−1, default) or population (n); the JSON has both",
    )
    parser.add_argument("--no-plots", action="store_true", help="write the tables only")


def _fingerprints(run_dir: Path) -> dict:
    """The infer and judge fingerprints a run's manifests recorded."""
    out = {}
    for stage in ("infer", "judge"):
        recorded = manifest.read(run_dir / f"{stage}.jsonl")
        if recorded and recorded.get("fingerprint") is not None:
            out[stage] = recorded["fingerprint"]
    return out


def collect(bench: Benchmark, root: Path, runs: int | None, models: list[str] | None) -> tuple[list[dict], list[str]]:
    """Per model: its metrics and fingerprints per run. Also warnings about runs that do not line up."""
    warnings, found = [], []
    base = paths.bench_dir(root, bench.name)
    model_dirs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    for model_dir in model_dirs:
        if models and model_dir.name not in models:
            continue
        per_run, fingerprints = {}, {}
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
            fingerprints[k] = _fingerprints(run_dir)
        if not per_run:
            continue
        name = model_dir.name
        if runs is not None and len(per_run) < runs:
            absent = sorted(set(range(1, runs + 1)) - set(per_run))
            warnings.append(f"{name}: no score.json for run(s) {absent}")
        for k, metrics in sorted(per_run.items()):
            cov = metrics.get("coverage", {})
            if cov.get("missing"):
                warnings.append(f"{name} run-{k}: {cov['missing']} of {cov['expected']} tasks missing (counted as 0)")
        expected = {k: m.get("coverage", {}).get("expected") for k, m in per_run.items()}
        if len(set(expected.values())) > 1:
            warnings.append(
                f"{name}: runs cover different task sets (expected tasks per run: {dict(sorted(expected.items()))})"
            )
        warnings += _fingerprint_warnings(name, fingerprints)
        found.append({"model": name, "runs": dict(sorted(per_run.items())), "fingerprints": fingerprints})
    judges = {orjson.dumps(_judge_config(e)).decode() for e in found if _judge_config(e)}
    if len(judges) > 1:
        warnings.append(
            "models were judged under different judge configurations (judge model, parameters or prompt): "
            "their figures are not comparable"
        )
    return found, warnings


def _fingerprint_warnings(model: str, fingerprints: dict[int, dict]) -> list[str]:
    out = []
    for stage in ("infer", "judge"):
        seen = {k: fp[stage] for k, fp in sorted(fingerprints.items()) if stage in fp}
        if len(seen) < 2:
            continue
        (first_run, first), *rest = seen.items()
        for k, fp in rest:
            changes = manifest.differences(first, fp)
            if changes:
                out.append(
                    f"{model}: run-{k} {stage} configuration differs from run-{first_run} ({'; '.join(changes)})"
                )
    return out


def _judge_config(entry: dict) -> dict | None:
    return next((fp["judge"] for fp in entry["fingerprints"].values() if "judge" in fp), None)


def _figures(per_run_values: list[dict[str, float | None]]) -> dict:
    per_figure: dict[str, list[float]] = {}
    for values in per_run_values:
        for name, value in values.items():
            per_figure.setdefault(name, [])
            if value is not None:
                per_figure[name].append(value)
    figures = {}
    for name, series in per_figure.items():
        if not series:
            continue
        interval = stats.ci95(series)
        figures[name] = {
            "mean": stats.mean(series),
            "std_sample": stats.std(series, "sample"),
            "std_population": stats.std(series, "population"),
            "stderr": stats.stderr(series),
            "ci95": list(interval) if interval else None,
            "n": len(series),
            "values": series,
        }
    return figures


def summarize(bench: Benchmark, found: list[dict]) -> list[dict]:
    models = []
    for entry in found:
        runs = list(entry["runs"].values())
        extra: dict[str, list] = {}
        for metrics in runs:
            for title, values in bench.extra_tables(metrics).items():
                extra.setdefault(title, []).append(values)
        costs = [m.get("cost", {}).get("cost_usd") for m in runs]
        models.append(
            {
                "model": entry["model"],
                "runs": list(entry["runs"]),
                "figures": _figures([bench.headline(m) for m in runs]),
                "flagged": bench.flagged(runs),
                "extra_tables": {title: _figures(values) for title, values in extra.items()},
                "coverage": {f"run-{k}": m.get("coverage", {}) for k, m in entry["runs"].items()},
                "cost_usd_per_run": stats.mean(costs) if costs and None not in costs else None,
                "fingerprints": {f"run-{k}": fp for k, fp in entry["fingerprints"].items()},
            }
        )
    # headline() lists the overall figure first: sort by it, best first
    models.sort(key=lambda m: -next(iter(m["figures"].values()), {"mean": 0.0})["mean"])
    return models


def _table_figures(title: str, model: dict) -> dict:
    """A model's figures of one table: the headline table's, or an extra table's by title."""
    return model["figures"] if title == MAIN else model["extra_tables"].get(title, {})


def _table(models: list[dict], get_figures, std_kind: str) -> tuple[list[str], list[list], list[list], list[list]]:
    """Figure names and the rows of one table as Markdown cells, CSV values and LaTeX cells."""
    names: list[str] = []
    for m in models:
        names += [n for n in get_figures(m) if n not in names]
    key = f"std_{std_kind}"
    md_rows, csv_rows, tex_rows = [], [], []
    for m in models:
        figures = get_figures(m)
        cells: list[str] = []
        flat: list[float | str] = []
        tex: list[str] = []
        for n in names:
            f = figures.get(n)
            cells.append(f"{100 * f['mean']:.1f} ± {100 * f[key]:.1f}" if f else "-")
            tex.append(f"${100 * f['mean']:.1f} \\pm {100 * f[key]:.1f}$" if f else "--")
            ci = f["ci95"] if f and f["ci95"] else ["", ""]
            flat += (
                [round(100 * f["mean"], 4), round(100 * f[key], 4), round(100 * f["stderr"], 4)]
                + [round(100 * v, 4) if not isinstance(v, str) else "" for v in ci]
                if f
                else [""] * 5
            )
        md_rows.append([m["model"], len(m["runs"]), *cells])
        csv_rows.append([m["model"], len(m["runs"]), *flat])
        tex_rows.append([m["model"], len(m["runs"]), *tex])
    return names, md_rows, csv_rows, tex_rows


def _mark_flagged(bench: Benchmark, models: list[dict], md_rows: list[list], tex_rows: list[list]) -> str:
    """Put a † beside the headline figure of the models the benchmark flags; the note under the table, or ""."""
    flagged = [i for i, m in enumerate(models) if m["flagged"]]
    for i in flagged:
        md_rows[i][2] += f" {FLAG}"
        tex_rows[i][2] += FLAG_TEX
    return bench.flag_note if flagged else ""


def render(bench: Benchmark, models: list[dict], std_kind: str) -> tuple[str, str, str]:
    """The leaderboard as Markdown, CSV and LaTeX: the headline table, then any extra tables."""
    std_note = "sample std (n − 1)" if std_kind == "sample" else "population std (n)"
    titles = [MAIN] + [t for m in models for t in m["extra_tables"] if t]
    titles = list(dict.fromkeys(titles))
    md_parts, tex_parts, csv_headers, csv_rows = (
        [],
        [],
        ["model", "runs"],
        [[m["model"], len(m["runs"])] for m in models],
    )
    for title in titles:
        names, md_rows, flat_rows, tex_rows = _table(models, functools.partial(_table_figures, title), std_kind)
        if not names:
            continue
        heading = bench.name if title == MAIN else f"{bench.name}: {title}"
        flag_note = ""
        if title == MAIN:
            flag_note = _mark_flagged(bench, models, md_rows, tex_rows)
            first = names[0]
            md_headers = ["Model", "Runs", *names, f"{first} 95% CI", "Cost/run (USD)"]
            for m, row in zip(models, md_rows):
                ci = m["figures"].get(first, {}).get("ci95")
                row.append(f"{100 * ci[0]:.1f} – {100 * ci[1]:.1f}" if ci else "n/a (1 run)")
                row.append("-" if m["cost_usd_per_run"] is None else f"{m['cost_usd_per_run']:.4f}")
        else:
            md_headers = ["Model", "Runs", *names]
        md_parts.append(
            f"## {heading}: mean ± {std_note} over runs, in percent\n\n"
            + tables.markdown_table(md_headers, md_rows)
            + (f"\n{flag_note}\n" if flag_note else "")
        )
        tex_std = "sample std ($n-1$)" if std_kind == "sample" else "population std ($n$)"
        caption = f"{tables.latex_escape(heading)}: mean $\\pm$ {tex_std} over runs, in percent"
        if flag_note:
            caption += ". " + tables.latex_escape(flag_note).replace("†", FLAG_TEX)
        tex_parts.append(tables.latex_table(["Model", "Runs", *names], tex_rows, caption=caption))
        prefix = "" if title == MAIN else f"{title}: "
        csv_headers += [
            f"{prefix}{n} {part}"
            for n in names
            for part in ("mean %", f"std % ({std_kind})", "stderr %", "ci95 low %", "ci95 high %")
        ]
        for full, row in zip(csv_rows, flat_rows):
            full += row[2:]
    md = "\n".join(md_parts) + f"\n{bench.aggregate_note}\n\n{CI_NOTE}\n"
    csv_headers.append("cost_usd_per_run")
    for full, m in zip(csv_rows, models):
        full.append("" if m["cost_usd_per_run"] is None else round(m["cost_usd_per_run"], 6))
    return md, tables.csv_text(csv_headers, csv_rows), "\n".join(tex_parts)


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("aggregate", "Mean ± std over runs, per model.", _add_args, argv, per_run=False)
    found, warnings = collect(bench, args.outputs_dir, args.runs, args.models)
    if not found:
        raise BadInput(
            f"no score.json under {paths.bench_dir(args.outputs_dir, bench.name)}/*/run-*/ (run score first)"
        )
    models = summarize(bench, found)
    md, csv_data, tex = render(bench, models, args.std)
    out_dir = paths.bench_dir(args.outputs_dir, bench.name)
    summary = {"benchmark": bench.name, "std_shown": args.std, "ci95": CI_NOTE, "warnings": warnings, "models": models}
    jsonl.atomic_write(out_dir / "aggregate.json", orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    jsonl.atomic_write(out_dir / "aggregate.md", md.encode())
    jsonl.atomic_write(out_dir / "aggregate.csv", csv_data.encode())
    jsonl.atomic_write(out_dir / "aggregate.tex", tex.encode())
    print(md)
    for w in warnings:
        print(f"aggregate: warning: {w}", file=sys.stderr)
    print(f"aggregate: wrote {out_dir}/aggregate.{{md,csv,json,tex}}", file=sys.stderr)
    if not args.no_plots:
        written = plots.write_all(bench, models, out_dir, args.std)
        if written is None:
            print(f"aggregate: no plots: {plots.MISSING}", file=sys.stderr)
        else:
            print(f"aggregate: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return EXIT_INCOMPLETE if warnings else EXIT_OK
