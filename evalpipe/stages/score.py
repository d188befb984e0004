"""score: one run's metrics from its judge rows, with coverage against the selected tasks."""

import argparse
import gc
import sys
from pathlib import Path

import orjson

from .. import cli, cost, jsonl, manifest, paths
from ..benchmarks import Benchmark, Task, row_id
from ..benchmarks.base import ErrorAnalysis
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput
from ..results import agreement, items
from ..rows import Coverage


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--model", help="the model whose run is scored (for the default paths)")
    parser.add_argument("--input", type=Path, help="judge JSONL (default outputs/<bench>/<model>/run-<K>/judge.jsonl)")
    parser.add_argument("--output", type=Path, help="score JSON (default: score.json beside the judge file)")
    parser.add_argument(
        "--judge-label",
        metavar="NAME",
        help="score the second opinion judge-NAME.jsonl of the run instead (writes judge-NAME_score.json)",
    )
    parser.add_argument(
        "--data", type=Path, help="dataset the run was selected from (default: as recorded by infer beside the run)"
    )
    parser.add_argument("--max-samples", type=int, help="the prefix size used by infer (default: as recorded)")
    parser.add_argument(
        "--prices", type=Path, help="price table JSON (default $EVALPIPE_PRICES, else the bundled dated table)"
    )


def _judge_path(bench: Benchmark, args) -> Path:
    if args.input is not None:
        return args.input
    if not args.model:
        raise BadInput("give --input, or --model (and --run) to use the default output layout")
    if args.judge_label is not None and not paths.JUDGE_LABEL.fullmatch(args.judge_label):
        raise BadInput(f"--judge-label {args.judge_label!r}: use letters, digits, '.' and '-'")
    run_dir = paths.run_dir(args.outputs_dir, bench.name, args.model, args.run, args.label)
    return run_dir / paths.judge_file_name(args.judge_label)


def selected_tasks(bench: Benchmark, args, judge_path: Path, judged: dict) -> tuple[list[Task], str]:
    """The tasks the run should cover, and where that selection came from."""
    data, max_samples = args.data, args.max_samples
    recorded = manifest.read(judge_path.with_name("infer.jsonl"))
    if data is None and recorded is not None:
        data = Path(recorded["dataset"])
        if max_samples is None:
            max_samples = recorded.get("max_samples")
        if not data.exists():
            raise BadInput(f"the dataset recorded by infer is gone: {data} (pass --data)")
        if manifest.sha256_file(data) != recorded.get("dataset_sha256"):
            print(f"score: warning: {data} changed since infer ran (sha256 differs)", file=sys.stderr)
    if data is None:
        print(
            "score: warning: no dataset known (no --data, no infer manifest): coverage is counted "
            "against the judged rows only, so missing tasks cannot be seen",
            file=sys.stderr,
        )
        full = jsonl.latest_rows(judge_path, row_id)  # the rows must stand in for the dataset
        return [Task(id=k, row=row, line=0) for k, row in full.items()], "judged rows only"
    tasks = bench.select(bench.load(data), max_samples)
    return tasks, f"{data}" + (f" (first {max_samples})" if max_samples is not None else "")


def coverage(bench: Benchmark, tasks: list[Task], judged: dict) -> tuple[Coverage, dict[str, int]]:
    """How much of the selected tasks the judge rows cover, and the judge statuses among them."""
    missing: list = []
    statuses: dict[str, int] = {}
    to_rejudge = 0
    get = judged.get
    for task in tasks:
        row = get(task.id)
        if row is None:
            missing.append(task.id)
            continue
        status = row.get("judge_status", "ok")
        statuses[status] = statuses.get(status, 0) + 1
        to_rejudge += bench.is_provisional(row)
    graded = len(tasks) - len(missing)
    covered: Coverage = {
        "expected": len(tasks),
        "graded": graded,
        "missing": len(missing),
        "missing_ids": missing[:20],
        "extra_rows_ignored": len(judged) - graded,
        "to_rejudge": to_rejudge,
    }
    return covered, dict(sorted(statuses.items()))


def summarize(bench: Benchmark, tasks: list[Task], judged: dict) -> dict:
    """One run's metrics: the benchmark's own figures, then coverage and judge statuses."""
    metrics = bench.metrics(tasks, judged)
    metrics["coverage"], metrics["judge_status"] = coverage(bench, tasks, judged)
    for key in ("judge_format", "judge_parse"):  # the LLM judge's response_format mode and parse route, if recorded
        counts = field_counts(tasks, judged, key)
        if counts:
            metrics[key] = counts
    return metrics


def field_counts(tasks: list[Task], judged: dict, key: str) -> dict[str, int]:
    """How many of the selected tasks' judge rows have each value of `key` (rows without it are not counted)."""
    counts: dict[str, int] = {}
    for task in tasks:
        value = (judged.get(task.id) or {}).get(key)
        if value is not None:
            counts[str(value)] = counts.get(str(value), 0) + 1
    return dict(sorted(counts.items()))


def main(argv: list[str]) -> int:
    """score.py: read the judge rows, count them against the selected tasks, write score.json."""
    bench, args = cli.parser_for("score", "Compute one run's metrics.", _add_args, argv)
    judge_path = _judge_path(bench, args)
    _require(judge_path)
    gc.disable()  # a short-lived process building millions of objects: collection would only slow it
    fields = (*bench.score_fields, "judge_status", *cost.ACCOUNTING_FIELDS)
    judged = jsonl.latest_rows(judge_path, row_id, keep=lambda row: {k: row[k] for k in fields if k in row})
    tasks, selection = selected_tasks(bench, args, judge_path, judged)
    metrics = summarize(bench, tasks, judged)
    accounted = [judged]
    if isinstance(bench, ErrorAnalysis):
        analysis_path = paths.error_analysis_path(judge_path, bench.error_analysis_name)
        if analysis_path.exists():
            analyses = jsonl.latest_rows(analysis_path, row_id)
            metrics[bench.error_analysis_name] = bench.error_analysis_metrics(tasks, judged, analyses)
            accounted.append(analyses)
    metrics["cost"] = _cost({t.id for t in tasks}, accounted, cost.load_prices(args.prices))
    metrics["selection"] = selection
    metrics["judge_file"] = str(judge_path)
    if judge_path.name == "judge.jsonl":  # second opinions beside it: how far the judges agree
        second = agreement.for_run(bench, judge_path)
        if second is not None:
            metrics["agreement"] = second
    output = args.output or judge_path.with_name(
        "score.json" if judge_path.name == "judge.jsonl" else f"{judge_path.stem}_score.json"
    )
    # per-item values for aggregate's item-level error bars (compact: it may hold a million items);
    # written first, so that a score.json is never older than the items beside it
    jsonl.atomic_write(
        paths.items_path(output), items.dumps(bench.name, bench.item_cluster, bench.item_columns(tasks, judged))
    )
    jsonl.atomic_write(output, orjson.dumps(metrics, option=orjson.OPT_INDENT_2) + b"\n")
    print(bench.format_metrics(metrics))
    print("Calls, tokens, latency and cost:\n" + cost.format_summary(metrics["cost"]))
    if "agreement" in metrics:
        print(agreement.format_report(metrics["agreement"]))
    print(f"score: wrote {output}", file=sys.stderr)
    return _exit_code(metrics["coverage"])


def _require(judge_path: Path) -> None:
    """Stop with a clear line when there is no judge file, saying which stage to run."""
    if not judge_path.exists():
        answered = judge_path.with_name("infer.jsonl").exists()
        needed = "run judge first" if answered else "no answers either: run infer, then judge"
        raise BadInput(f"no such judge file ({needed})", judge_path)


def _cost(selected: set, accounted: list[dict], prices: cost.Prices) -> dict:
    """Calls, tokens, latency and cost of the selected tasks' rows (judge rows, analysis rows)."""
    ledger = cost.Ledger()
    for rows in accounted:
        for task_id, row in rows.items():
            if task_id in selected:
                for call in cost.api_calls(row):
                    ledger.add(*call)
    return ledger.summary(prices)


def _exit_code(covered: Coverage) -> int:
    """0 when every selected task has a final grade; else 3, saying what to rerun."""
    if covered["missing"]:
        print(
            f"score: {covered['missing']} selected tasks have no judge row yet (counted as 0); rerun infer/judge",
            file=sys.stderr,
        )
    if covered["to_rejudge"]:
        print(
            f"score: {covered['to_rejudge']} judge rows are provisional zeros (judge API failed); rerun judge",
            file=sys.stderr,
        )
    return EXIT_INCOMPLETE if covered["missing"] or covered["to_rejudge"] else EXIT_OK
