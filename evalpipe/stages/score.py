"""score: one run's metrics from its judge rows, with coverage against the selected tasks."""

import argparse
import gc
import itertools
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from .. import cli
from ..benchmarks import Benchmark, Task, row_id
from ..benchmarks.base import ErrorAnalysis, stand_in
from ..client import cost
from ..client.thinking import budget_advice
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput
from ..results import figures, items
from ..results.agreement import format_report as agreement_text
from ..results.items import ItemColumns
from ..store import jsonl, manifest, paths, shards
from ..store.rows import THINKING_TRUNCATED, Coverage, ShardCoverage
from . import agreement
from .selected import SelectedTasks, shard_key


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
    parser.add_argument(
        "--max-samples", type=cli.whole_number, help="the prefix size used by infer (default: as recorded)"
    )
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


def selection(bench: Benchmark, args, judge_path: Path) -> tuple[Path | None, int | None, str]:
    """The dataset and prefix the run was selected from (None: unknown) and how to describe them. A dataset that is
    not the one infer read (its sha256 in infer's manifest) is refused: its gold answers would grade the rows."""
    data, max_samples = args.data, args.max_samples
    found = manifest.find_run(judge_path.with_name("infer.jsonl"))
    if found is not None:
        record_path, recorded = found
        if data is None:
            data = _recorded_dataset(record_path, recorded)
            if max_samples is None:
                max_samples = recorded.get("max_samples")
        _refuse_other_dataset(data, record_path, recorded)
    if data is None:
        print(
            "score: warning: no dataset known (no --data, no infer manifest): coverage is counted "
            "against the judged rows only, so missing tasks cannot be seen",
            file=sys.stderr,
        )
        return None, None, "judged rows only"
    jsonl.require_regular_file(data)  # a pipe or a device would block or never end
    return data, max_samples, f"{data}" + (f" (first {max_samples})" if max_samples is not None else "")


def _recorded_dataset(record_path: Path, recorded: dict) -> Path:
    """The dataset infer's manifest names (BadInput when it names none, or the file is gone)."""
    dataset = recorded.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise BadInput("names no dataset (not infer's manifest?): pass the dataset with --data", record_path)
    if not os.path.exists(dataset):
        raise BadInput(f"the dataset recorded by infer is gone: {dataset} (pass --data)", record_path)
    return Path(dataset)


def _refuse_other_dataset(data: Path, record_path: Path, recorded: dict) -> None:
    """BadInput naming `data` when its sha256 is not the one infer recorded (no record: nothing to check)."""
    expected = recorded.get("dataset_sha256")
    if not isinstance(expected, str) or not expected:
        return
    actual = manifest.sha256_file(data)
    if actual == expected:
        return
    read = recorded.get("dataset")
    hashes = f"sha256 {actual[:12]}…, where {record_path} records {expected[:12]}…"
    if isinstance(read, str) and Path(read) != data.resolve():
        what = f"not the dataset infer read ({read}; {hashes}): score with that one"
    else:
        what = (
            f"changed since infer read it ({hashes}): its tasks and gold answers are no longer those the run "
            "answered; put back the file infer read"
        )
    raise BadInput(f"{what}, or run infer and judge again on this one into a new run (--run N)", data)


def _coverage(
    bench: Benchmark, ids: list, missing: list, judged: Mapping, counted: list[tuple[dict, int]]
) -> tuple[Coverage, dict]:
    """How much of the selected tasks (`ids`) the judge rows cover, and the judge statuses among their rows."""
    statuses: Counter = Counter()
    to_rejudge = truncated = 0
    for row, count in counted:
        statuses[row.get("judge_status", "ok")] += count
        to_rejudge += stand_in(row) * count
        truncated += (row.get("status") == THINKING_TRUNCATED) * count
    covered: Coverage = {
        "expected": len(ids),
        "graded": len(ids) - len(missing),
        "missing": len(missing),
        "missing_ids": missing[:20],
        "extra_rows_ignored": len(judged) - len(ids) + len(missing),
        "to_rejudge": to_rejudge,
    }
    if truncated:
        covered["thinking_truncated"] = truncated
    return covered, dict(sorted(statuses.items()))


def _counted(selected: dict) -> list[tuple[dict, int]]:
    """Each distinct judge row and how many tasks have it (`read_judged` shares a dict between rows alike)."""
    objects = {id(row): row for row in selected.values()}
    return [(objects[key], count) for key, count in Counter(map(id, selected.values())).items()]


def summarize(bench: Benchmark, tasks: Iterable[Task], judged: Mapping, columns: ItemColumns | None = None) -> dict:
    """One run's metrics: the benchmark's details and figures (from the item `columns`), coverage, judge statuses."""
    if columns is None:
        columns = bench.item_columns(tasks, judged)
    ids = tasks.ids if isinstance(tasks, _Selected) and tasks.ids is not None else [task.id for task in tasks]
    selected, missing = {}, []
    for key in ids:
        row = judged.get(key)
        if row is None:
            missing.append(key)
        else:
            selected[key] = row
    details = bench.details(tasks, selected)
    metrics = figures.write(bench.figures, columns, {"benchmark": bench.name, **details})
    counted = _counted(selected)
    metrics["coverage"], metrics["judge_status"] = _coverage(bench, ids, missing, judged, counted)
    for key in ("judge_format", "judge_parse"):  # the LLM judge's response_format mode and parse route, if recorded
        counts = _field_counts(counted, key)
        if counts:
            metrics[key] = counts
    served = {name: _field_counts(counted, key) for name, key in SERVED.items()}
    if any(served.values()):
        metrics["served"] = {name: counts for name, counts in served.items() if counts}
    return metrics


# score.json's `served`: which models the endpoints said answered and judged the rows (a name re-pointed to another
# snapshot shows as two), from the rows' keys
SERVED = {
    "model": "response_model",
    "model_fingerprint": "system_fingerprint",
    "judge": "judge_response_model",
    "judge_fingerprint": "judge_system_fingerprint",
    "reasoning_effort": "reasoning_effort_applied",
}


def _field_counts(counted: list[tuple], key: str) -> dict[str, int]:
    """How many of the `_counted` judge rows have each value of `key`."""
    counts: dict[str, int] = {}
    for row, count in counted:
        value = row.get(key)
        if value is not None:
            counts[str(value)] = counts.get(str(value), 0) + count
    return dict(sorted(counts.items()))


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("score", "Compute one run's metrics.", _add_args, argv)
    judge_path = _judge_path(bench, args)
    parts = shards.parts(judge_path)  # the judge file as the files that hold it: its own, then its shards'
    if not parts:
        answered = shards.exists(judge_path.with_name("infer.jsonl"))
        needed = "run judge first" if answered else "no answers either: run infer, then judge"
        raise BadInput(f"no such judge file ({needed})", judge_path)
    gc.disable()  # a short-lived process building millions of objects: collection would only slow it
    fields = (*bench.score_fields, "judge_status", "status", *SERVED.values())
    data, max_samples, described = selection(bench, args, judge_path)
    judged, ledger, read = read_judged(parts, fields)
    tasks: Iterable[Task]
    if data is None:  # the judge rows stand in for the dataset
        latest = {row_id(row): row for part in parts for _, row in jsonl.iter_rows(part, torn_tail_ok=True)}
        tasks = [Task(key, row, 0) for key, row in latest.items()]
    else:
        tasks = _Selected(bench, data, max_samples)
    output = args.output or judge_path.with_name(
        "score.json" if judge_path.name == "judge.jsonl" else f"{judge_path.stem}_score.json"
    )
    # per-item values: the figures of score.json and aggregate's item-level error bars (items.json) come from them
    columns = bench.item_columns(tasks, judged)
    metrics = summarize(bench, tasks, judged, columns)
    if read > metrics["coverage"]["graded"]:  # rows of other tasks, or several of a task (judged again)
        ledger = _recounted(parts, {task.id for task in tasks})  # only the calls of the rows kept are the run's
    cut = shard_coverage(bench, tasks, judged, judge_path)
    if cut is not None:
        metrics["coverage"]["shards"] = cut
    if isinstance(bench, ErrorAnalysis):
        analysis_path = paths.error_analysis_path(judge_path, bench.error_analysis_name)
        if shards.exists(analysis_path):
            analyses = jsonl.latest_rows(analysis_path, row_id)
            metrics[bench.error_analysis_name] = bench.error_analysis_metrics(tasks, judged, analyses)
            selected = {task.id for task in tasks}
            for task_id, row in analyses.items():
                if task_id in selected:
                    for call in cost.api_calls(row):
                        ledger.add(*call)
    metrics["cost"] = ledger.summary(cost.load_prices(args.prices))
    metrics["selection"] = described
    metrics["judge_file"] = str(judge_path)
    if judge_path.name == "judge.jsonl":  # second opinions beside it: how far the judges agree
        second = agreement.for_run(bench, judge_path)
        if second is not None:
            metrics["agreement"] = second
    # items.json before score.json, so that a score.json is never older than its items
    jsonl.atomic_write(paths.items_path(output), items.encoded(bench.name, bench.prefix_group, columns))
    del columns
    jsonl.atomic_write(output, orjson.dumps(metrics, option=orjson.OPT_INDENT_2) + b"\n")
    print(bench.format_metrics(metrics))
    print("Calls, tokens, latency and cost:\n" + cost.format_summary(metrics["cost"]))
    if "agreement" in metrics:
        print(agreement_text(metrics["agreement"]))
    print(f"score: wrote {output}", file=sys.stderr)
    code = _exit_code(metrics["coverage"])
    _say_thinking_truncated(metrics["coverage"], judge_path)
    return code


@dataclass
class _Selected(SelectedTasks):
    """The selected tasks, read again at each iteration, and the ids of the last whole reading: coverage takes
    those of the item columns' reading rather than read the dataset once more."""

    ids: list | None = field(default=None, init=False)

    def __iter__(self) -> Iterator[Task]:
        ids = []
        for task in super().__iter__():
            ids.append(task.id)
            yield task
        self.ids = ids


def read_judged(parts: list[Path], fields: tuple[str, ...]) -> tuple[dict, cost.Ledger, int]:
    """The judge file's last row per id on `fields`, the calls of all its rows, and how many rows it has. Rows of
    the same values share one dict (told apart by their JSON: 1, 1.0 and true are equal keys)."""
    latest: dict = {}
    shared: dict[bytes, dict] = {}
    ledger = cost.Ledger()
    read = 0
    for part in parts:
        for _, rows in jsonl.iter_row_chunks(part, torn_tail_ok=True):
            read += len(rows)
            for row in rows:
                kept = {key: row[key] for key in fields if key in row}
                latest[row_id(row)] = shared.setdefault(orjson.dumps(kept), kept)
                for call in cost.api_calls(row):
                    ledger.add(*call)
    return latest, ledger, read


def _recounted(parts: list[Path], selected: set) -> cost.Ledger:
    """The calls of each selected task's last judge row only."""
    calls = {}
    for part in parts:
        for _, row in jsonl.iter_rows(part, torn_tail_ok=True):
            key = row_id(row)
            if key in selected:
                calls[key] = cost.api_calls(row)
    ledger = cost.Ledger()
    for call in itertools.chain.from_iterable(calls.values()):
        ledger.add(*call)
    return ledger


def shard_coverage(bench: Benchmark, tasks: Iterable[Task], judged: Mapping, judge_path: Path) -> ShardCoverage | None:
    """Of a run cut into shards: which have tasks without a final judge row, which wrote no file (None: not cut)."""
    infer_path = judge_path.with_name("infer.jsonl")
    n = shards.count(judge_path) or shards.count(infer_path)
    if n is None:
        return None
    short = (
        shard_key(bench, task.id, task.row) for task in tasks if task.id not in judged or stand_in(judged[task.id])
    )
    return {
        "count": n,
        "unfinished": sorted({shards.index(key, n) for key in short}),
        "without_file": {"infer": shards.missing(infer_path, n), "judge": shards.missing(judge_path, n)},
    }


def _say_thinking_truncated(covered: Coverage, judge_path: Path) -> None:
    """The last line when answers ran out of tokens while thinking: raise infer's --max-tokens, and to what."""
    truncated = covered.get("thinking_truncated")
    if not truncated:
        return
    params = (manifest.read_run(judge_path.with_name("infer.jsonl")) or {}).get("params") or {}
    budget = next((params[k] for k in ("max_tokens", "max_completion_tokens") if isinstance(params.get(k), int)), None)
    print(
        f"score: {truncated} of {covered['graded']} graded answers ran out of tokens while thinking (no final answer, "
        f"scored 0): {budget_advice(budget)} at infer, in a new run (--run N or --label)",
        file=sys.stderr,
    )


def _listed(numbers: list[int], shown: int = 20) -> str:
    """The first `shown` numbers, comma-separated, and how many in all when there are more (score.json has all)."""
    more = f", … ({len(numbers):,} in all)" if len(numbers) > shown else ""
    return ", ".join(map(str, numbers[:shown])) + more


def _exit_code(covered: Coverage) -> int:
    """0 when every selected task has a final grade; else 3, saying what to rerun."""
    cut = covered.get("shards")
    if cut is not None and cut["unfinished"]:
        without = cut["without_file"]
        print(
            f"score: shard(s) {_listed(cut['unfinished'])} of {cut['count']} are missing or unfinished "
            f"(shards without a file: infer [{_listed(without['infer'])}], judge [{_listed(without['judge'])}]); "
            f"rerun them (--shard K/{cut['count']})",
            file=sys.stderr,
        )
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
