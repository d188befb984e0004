"""aggregate: every model's runs of one benchmark → leaderboards, comparisons and plots under outputs/<bench>/, with
warnings when runs do not line up (docs/results.md#leaderboards-and-plots)."""

import argparse
import itertools
import sys
from collections import Counter
from pathlib import Path

import orjson

from .. import cli
from ..benchmarks import Benchmark, ErrorAnalysis
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput
from ..results import figures, items, plots, render, stats
from ..results.agreement import NOTE as AGREEMENT_NOTE
from ..store import jsonl, manifest, paths
from . import agreement


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument(
        "--runs", type=cli.whole_number, help="use runs 1..N of each model (default: every run that has a score.json)"
    )
    parser.add_argument(
        "--models", nargs="+", help="model folder names to include (default: all under outputs/<bench>/)"
    )
    parser.add_argument(
        "--std",
        choices=("sample", "population"),
        default="sample",
        help="std over runs shown in the tables: sample (ddof 1, default) or population (ddof 0); the JSON has both",
    )
    parser.add_argument(
        "--runs-ci",
        action="store_true",
        help="also show the t-interval over runs (conditional on the task set: it leaves out which tasks were drawn)",
    )
    parser.add_argument(
        "--bootstrap",
        type=cli.whole_number,
        default=0,
        metavar="B",
        help="cross-check every item-level figure and comparison with B bootstrap replicates that resample "
        "clusters (or tasks), percentile intervals (default 0: off)",
    )
    parser.add_argument("--seed", type=cli.whole_number, default=0, help="the bootstrap's random seed (default 0)")
    parser.add_argument("--no-plots", action="store_true", help="write the tables only")


def _fingerprints(run_dir: Path) -> dict:
    """The infer and judge fingerprints a run's manifests recorded, and the judge's learned response_format."""
    out = {}
    for stage in ("infer", "judge"):
        recorded = manifest.read_run(run_dir / f"{stage}.jsonl")
        if recorded and recorded.get("fingerprint") is not None:
            out[stage] = recorded["fingerprint"]
            learned = (recorded.get("learned") or {}).get("judge_format") or {}
            modes = sorted({v["mode"] for v in learned.values() if isinstance(v, dict) and v.get("mode")})
            if stage == "judge" and modes:
                out["judge_response_format"] = modes
    return out


SETTINGS = ("temperature", "top_p", "max_tokens", "reasoning_effort")


def settings(fingerprints: dict[int, dict]) -> dict:
    """The model's and the judge's generation settings in the first run (runs that differ get a warning)."""
    first = fingerprints[min(fingerprints)] if fingerprints else {}
    out = {}
    for stage, who in (("infer", "model"), ("judge", "judge")):
        fp = first.get(stage)
        if fp:
            out[who] = {k: fp.get(k) for k in SETTINGS if fp.get(k) is not None}
    if "judge" in out:
        judge = first["judge"]
        out["judge"] = {"model": judge.get("judge_model"), **out["judge"]}
        if judge.get("judge_format"):
            out["judge"]["response_format"] = judge["judge_format"]
            if first.get("judge_response_format"):
                out["judge"]["response_format"] += f" ({', '.join(first['judge_response_format'])})"
    return out


def served(runs: list[dict]) -> tuple[dict, bool]:
    """score.json's `served` summed over a model's runs, and whether more than one model answered or judged."""
    summed: dict[str, Counter] = {}
    for metrics in runs:
        for who, counts in (metrics.get("served") or {}).items():
            summed.setdefault(who, Counter()).update(counts)
    total = {who: dict(sorted(counts.items())) for who, counts in sorted(summed.items())}
    return total, any(len(total.get(who, {})) > 1 for who in ("model", "judge"))


def thinking(runs: list[dict], served_models: dict) -> dict | None:
    """What a model's thinking cost over its runs, from score.json's infer cost and coverage (None: no reasoning)."""
    reasoning = tasks = truncated = 0
    completion, reasoning_cost, bill = 0, 0.0, 0.0
    priced = True
    for metrics in runs:
        cost = metrics.get("cost") or {}
        infer = (cost.get("stages") or {}).get("infer") or {}
        tokens = infer.get("tokens") or {}
        reasoning += tokens.get("reasoning_tokens", 0)
        completion += tokens.get("completion_tokens", 0)
        tasks += (metrics.get("coverage") or {}).get("expected", 0)
        truncated += (metrics.get("coverage") or {}).get("thinking_truncated", 0)
        priced = priced and cost.get("cost_usd") is not None  # else the share is of the completion tokens
        reasoning_cost += infer.get("reasoning_cost_usd", 0.0)
        bill += cost.get("cost_usd") or 0.0
    if not reasoning and not truncated:
        return None
    share: float | None
    if priced and bill:
        share, of = reasoning_cost / bill, "bill"
    else:
        share, of = (reasoning / completion if completion else None), "completion tokens"
    return {
        "reasoning_tokens_per_task": reasoning / tasks if tasks else None,
        "reasoning_share": share,
        "share_of": of,
        "thinking_truncated": truncated,
        "effort_applied": served_models.get("reasoning_effort", {}),
    }


def collect(
    bench: Benchmark, root: Path, runs: int | None, models: list[str] | None
) -> tuple[list[dict], list[str], list[str]]:
    """Per model its runs' metrics, items and fingerprints; warnings about runs that do not line up; notes."""
    found, warnings, notes = [], [], []
    base = root / bench.name
    wanted = (p for p in base.iterdir() if p.is_dir() and (not models or p.name in models)) if base.is_dir() else ()
    for model_dir in sorted(wanted):
        entry = _read_model(model_dir, runs)
        if entry is None:
            continue
        found.append(entry)
        warnings += _run_warnings(entry, runs)
        without = sorted(set(entry["runs"]) - set(entry.pop("runs_with_items")))
        if without:
            notes.append(
                f"{entry['model']}: run(s) {without} have no items.json (scored by an older version): their tasks are "
                "left out of the item-level figures; run score again"
            )
    configs = [next((fp["judge"] for fp in e["fingerprints"].values() if "judge" in fp), None) for e in found]
    if len({orjson.dumps(config) for config in configs if config}) > 1:
        warnings.append(
            "models were judged under different judge configurations (judge model, parameters or prompt): "
            "their figures are not comparable"
        )
    return found, warnings, notes


def _read_model(model_dir: Path, runs: int | None) -> dict | None:
    """A model's runs 1..runs (all without `runs`) that have a score.json: metrics, fingerprints, items."""
    per_run, fingerprints, per_run_items = {}, {}, {}
    for run_dir in model_dir.iterdir():
        match = paths.RUN_DIR.match(run_dir.name)
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
        items_file = paths.items_path(run_dir / "score.json")
        if items_file.exists():
            per_run_items[k] = items.read(items_file)
    if not per_run:
        return None
    model_items = None
    if per_run_items:
        clusters = {cluster for cluster, _ in per_run_items.values()}
        model_items = items.ModelItems([columns for _, columns in per_run_items.values()], clusters.pop())
    return {
        "model": model_dir.name,
        "runs": dict(sorted(per_run.items())),
        "fingerprints": fingerprints,
        "items": model_items,
        "runs_with_items": list(per_run_items),
    }


def _run_warnings(entry: dict, runs: int | None) -> list[str]:
    """Runs of one model that do not line up: absent, missing tasks, other task sets, other configurations."""
    name, per_run = entry["model"], entry["runs"]
    warnings = []
    if runs is not None and len(per_run) < runs:
        absent = sorted(set(range(1, runs + 1)) - set(per_run))
        warnings.append(f"{name}: no score.json for run(s) {absent}")
    for k, metrics in per_run.items():
        cov = metrics.get("coverage", {})
        if cov.get("missing"):
            warnings.append(f"{name} run-{k}: {cov['missing']} of {cov['expected']} tasks missing (counted as 0)")
    expected = {k: m.get("coverage", {}).get("expected") for k, m in per_run.items()}
    if len(set(expected.values())) > 1:
        warnings.append(f"{name}: runs cover different task sets (expected tasks per run: {expected})")
    for stage in ("infer", "judge"):
        seen = {k: fp[stage] for k, fp in sorted(entry["fingerprints"].items()) if stage in fp}
        if len(seen) < 2:
            continue
        (first_run, first), *rest = seen.items()
        for k, fp in rest:
            if changes := manifest.differences(first, fp):
                warnings.append(
                    f"{name}: run-{k} {stage} configuration differs from run-{first_run} ({'; '.join(changes)})"
                )
    return warnings


def _figures(per_run_values: list[dict[str, float | None]]) -> dict:
    """Run-to-run figures: mean and std over runs (the papers' table), and the t-interval over runs."""
    figures = {}
    for name in dict.fromkeys(name for values in per_run_values for name in values):
        series = [value for values in per_run_values if (value := values.get(name)) is not None]
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


def summarize(bench: Benchmark, found: list[dict], boot: items.Bootstrap | None = None) -> list[dict]:
    models = []
    for entry in found:
        runs = list(entry["runs"].values())
        headlines = []
        extra: dict[str, list] = {}
        for metrics in runs:
            shown = figures.tables(bench.figures, metrics)
            headlines.append(shown.pop(figures.HEADLINE))
            if isinstance(bench, ErrorAnalysis):
                shown |= bench.error_analysis_tables(metrics)
            for title, values in shown.items():
                extra.setdefault(title, []).append(values)
        costs = [m.get("cost", {}).get("cost_usd") for m in runs]
        served_models, mixed = served(runs)
        model = {
            "model": entry["model"],
            "runs": list(entry["runs"]),
            "figures": _figures(headlines),
            "flagged": bool(bench.flagged(runs)),
            "extra_tables": {title: _figures(values) for title, values in extra.items()},
            "coverage": {f"run-{k}": m.get("coverage", {}) for k, m in entry["runs"].items()},
            "cost_usd_per_run": stats.mean(costs) if costs and None not in costs else None,
            "fingerprints": {f"run-{k}": fp for k, fp in entry["fingerprints"].items()},
            "settings": settings(entry["fingerprints"]),
            "served": served_models,
            "mixed_served_models": mixed,
            "thinking": thinking(runs, served_models),
        }
        model_items = entry["items"]
        for figure in bench.figures if model_items is not None else ():  # each figure's item-level estimate
            target = model["figures"] if not figure.table else model["extra_tables"].setdefault(figure.table, {})
            for name, label in model_items.subsets(figure):
                target.setdefault(name, {})["items"] = items.estimate(model_items, figure, label, boot)
        models.append(model)
    models.sort(key=_sort_value, reverse=True)
    return models


def _sort_value(model: dict) -> float:
    """The first headline figure, the overall one: its mean over runs, else its item-level mean."""
    figure: dict = next(iter(model["figures"].values()), {})
    return figure.get("mean", (figure.get("items") or {}).get("mean")) or 0.0


def compare_models(
    bench: Benchmark, models: list[dict], found: list[dict], boot: items.Bootstrap | None = None
) -> list[dict]:
    """Every pair of models, the higher-ranked one as `model` and the other as `baseline`, per item figure."""
    by_name = {entry["model"]: entry["items"] for entry in found}
    out = []
    for first, second in itertools.combinations(models, 2):
        mine, theirs = by_name[first["model"]], by_name[second["model"]]
        if mine is None or theirs is None:
            continue
        pair = {"model": first["model"], "baseline": second["model"]}
        for figure in bench.figures:
            for name, _ in mine.subsets(figure):
                result = items.compare(mine, theirs, figure, name, boot)
                if result is not None:
                    out.append({**pair, "table": figure.table, "figure": name, **result})
    return out


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for(
        "aggregate", "A leaderboard with item-level error bars, per model.", _add_args, argv, per_run=False
    )
    out_dir = args.outputs_dir / bench.name
    found, warnings, notes = collect(bench, args.outputs_dir, args.runs, args.models)
    if not found:
        raise BadInput(f"no score.json under {out_dir}/*/run-*/ (run score first)")
    boot = items.Bootstrap(args.bootstrap, args.seed) if args.bootstrap > 0 else None
    models = summarize(bench, found, boot)
    for model in models:  # judge agreement with the second opinions (judge-<label>.jsonl), pooled over the runs
        if section := agreement.pooled(bench, [out_dir / model["model"] / f"run-{k}" for k in model["runs"]]):
            model["agreement"] = section
    comparisons = compare_models(bench, models, found, boot)
    flag_note = next(filter(None, (bench.flagged(list(entry["runs"].values())) for entry in found)), "")
    out = render.render(bench, models, comparisons, args.std, args.runs_ci, flag_note)
    summary = {
        "benchmark": bench.name,
        "methods": {
            "items": render.ITEMS_NOTE,
            "runs": render.RUNS_NOTE.format(std="std (std_sample: ddof 1; std_population: ddof 0)"),
            "ci95": render.RUNS_CI_NOTE,  # each figure's `ci95`; its `items.ci95` is the item-level interval
            "power": render.POWER_NOTE,
            "comparisons": render.COMPARE_NOTE,
            "agreement": AGREEMENT_NOTE + " " + render.AGREEMENT_POOLED,
        },
        "std_shown": args.std,
        "bootstrap": {"replicates": args.bootstrap, "seed": args.seed, "method": "percentile"} if boot else None,
        "warnings": warnings,
        "notes": notes,
        "models": models,
        "comparisons": comparisons,
    }
    jsonl.write_json(out_dir / "aggregate.json", summary)
    for name, text in (("aggregate.md", out.markdown), ("aggregate.csv", out.csv), ("aggregate.tex", out.latex)):
        jsonl.atomic_write(out_dir / name, text.encode())
    jsonl.atomic_write(out_dir / "aggregate_comparisons.csv", out.comparisons_csv.encode())
    print(out.markdown)
    for w in warnings:
        print(f"aggregate: warning: {w}", file=sys.stderr)
    for n in notes:
        print(f"aggregate: note: {n}", file=sys.stderr)
    print(f"aggregate: wrote {out_dir}/aggregate.{{md,csv,json,tex}} and aggregate_comparisons.csv", file=sys.stderr)
    if not args.no_plots:
        written = plots.write_all(bench, models, out_dir, args.std)
        if written is None:
            print(f"aggregate: no plots: {plots.MISSING}", file=sys.stderr)
        else:
            print(f"aggregate: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return EXIT_INCOMPLETE if warnings else EXIT_OK
