"""score: one run's metrics from its judge rows, with coverage against the selected tasks."""

import argparse
import gc
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
from ..store.rows import THINKING_TRUNCATED, Coverage
from . import agreement
from .graded import input_path
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


def selection(bench: Benchmark, args, judge_path: Path) -> tuple[Path | None, int | None, str]:
    """The dataset and prefix the run was selected from (None: unknown) and how to describe them. A dataset that is
    not the one infer read (its sha256 in infer's manifest) is refused: its gold answers would grade the rows."""
    data, max_samples = args.data, args.max_samples
    found = manifest.find_run(judge_path.with_name("infer.jsonl"))
    if found is not None:
        record_path, recorded = found
        if data is None:
            dataset = recorded.get("dataset")
            if not isinstance(dataset, str) or not dataset:
                raise BadInput("names no dataset (not infer's manifest?): pass the dataset with --data", record_path)
            if not os.path.exists(dataset):
                raise BadInput(f"the dataset recorded by infer is gone: {dataset} (pass --data)", record_path)
            data = Path(dataset)
            if max_samples is None:
                max_samples = recorded.get("max_samples")
        expected = recorded.get("dataset_sha256")  # none recorded: nothing to check
        if isinstance(expected, str) and expected and (actual := manifest.sha256_file(data)) != expected:
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
    if data is None:
        print(
            "score: warning: no dataset known (no --data, no infer manifest): coverage is counted "
            "against the judged rows only, so missing tasks cannot be seen",
            file=sys.stderr,
        )
        return None, None, "judged rows only"
    jsonl.require_regular_file(data)  # a pipe or a device would block or never end
    return data, max_samples, f"{data}" + (f" (first {max_samples})" if max_samples is not None else "")


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
    # each distinct judge row and how many tasks have it (`read_judged` shares a dict between rows alike)
    objects = {id(row): row for row in selected.values()}
    counted = [(objects[key], count) for key, count in Counter(map(id, selected.values())).items()]
    coverage: Coverage = {
        "expected": len(ids),
        "graded": len(ids) - len(missing),
        "missing": len(missing),
        "missing_ids": missing[:20],
        "extra_rows_ignored": len(judged) - len(ids) + len(missing),
        "to_rejudge": sum(count for row, count in counted if stand_in(row)),
    }
    truncated = sum(count for row, count in counted if row.get("status") == THINKING_TRUNCATED)
    if truncated:
        coverage["thinking_truncated"] = truncated
    metrics["coverage"], metrics["judge_status"] = coverage, _field_counts(counted, "judge_status", "ok")
    for key in ("judge_format", "judge_parse"):  # the LLM judge's response_format mode and parse route, if recorded
        if counts := _field_counts(counted, key):
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


def _field_counts(counted: list[tuple[dict, int]], key: str, default: str | None = None) -> dict[str, int]:
    """How many of the counted judge rows have each value of `key` (`default` when absent; None: not counted)."""
    counts: Counter = Counter()
    for row, count in counted:
        value = row.get(key, default)
        if value is not None:
            counts[str(value)] += count
    return dict(sorted(counts.items()))


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("score", "Compute one run's metrics.", _add_args, argv)
    paths.check_judge_label(args.judge_label)
    judge_path = input_path(bench, args, paths.judge_file_name(args.judge_label))
    parts = shards.parts(judge_path)  # the judge file as the files that hold it: its own, then its shards'
    infer_path = judge_path.with_name("infer.jsonl")
    if not parts:
        needed = "run judge first" if shards.exists(infer_path) else "no answers either: run infer, then judge"
        raise BadInput(f"no such judge file ({needed})", judge_path)
    gc.disable()  # a short-lived process building millions of objects: collection would only slow it
    fields = (*bench.score_fields, "judge_status", "status", *SERVED.values())
    data, max_samples, described = selection(bench, args, judge_path)
    judged, ledger, read = read_judged(parts, fields)
    tasks: Iterable[Task]
    if data is None:  # the judge rows stand in for the dataset
        tasks = [Task(key, row, 0) for key, row in jsonl.latest_rows(judge_path, row_id).items()]
    else:
        tasks = _Selected(bench, data, max_samples)
    output = args.output or judge_path.with_name(
        "score.json" if judge_path.name == "judge.jsonl" else f"{judge_path.stem}_score.json"
    )
    # per-item values: the figures of score.json and aggregate's item-level error bars (items.json) come from them
    columns = bench.item_columns(tasks, judged)
    metrics = summarize(bench, tasks, judged, columns)
    if read > metrics["coverage"]["graded"]:  # rows of other tasks, or several of a task (judged again)
        # only the calls of the rows kept are the run's
        ledger = _add_calls(cost.Ledger(), jsonl.latest_rows(judge_path, row_id, keep=cost.api_calls), tasks)
    n = shards.count(judge_path) or shards.count(infer_path)
    if n is not None:  # a run cut into shards: which have tasks without a final judge row, which wrote no file
        short = (
            shard_key(bench, task.id, task.row) for task in tasks if task.id not in judged or stand_in(judged[task.id])
        )
        metrics["coverage"]["shards"] = {
            "count": n,
            "unfinished": sorted({shards.index(key, n) for key in short}),
            "without_file": {"infer": shards.missing(infer_path, n), "judge": shards.missing(judge_path, n)},
        }
    if isinstance(bench, ErrorAnalysis):
        analysis_path = paths.error_analysis_path(judge_path, bench.error_analysis_name)
        if shards.exists(analysis_path):
            analyses = jsonl.latest_rows(analysis_path, row_id)
            metrics[bench.error_analysis_name] = bench.error_analysis_metrics(tasks, judged, analyses)
            _add_calls(ledger, {key: cost.api_calls(row) for key, row in analyses.items()}, tasks)
    metrics["cost"] = ledger.summary(cost.load_prices(args.prices))
    metrics["selection"] = described
    metrics["judge_file"] = str(judge_path)
    # second opinions beside judge.jsonl: how far the judges agree
    if judge_path.name == "judge.jsonl" and (second := agreement.for_run(bench, judge_path)):
        metrics["agreement"] = second
    # items.json before score.json, so that a score.json is never older than its items
    jsonl.atomic_write(paths.items_path(output), items.encoded(bench.name, bench.prefix_group, columns))
    del columns
    jsonl.write_json(output, metrics)
    print(bench.format_metrics(metrics))
    print("Calls, tokens, latency and cost:\n" + cost.format_summary(metrics["cost"]))
    if "agreement" in metrics:
        print(agreement_text(metrics["agreement"]))
    print(f"score: wrote {output}", file=sys.stderr)
    return _exit_code(metrics["coverage"], judge_path)


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


def _add_calls(ledger: cost.Ledger, calls: Mapping, tasks: Iterable[Task]) -> cost.Ledger:
    """`ledger` with the selected tasks' API calls of `calls` (`cost.api_calls` by id)."""
    selected = {task.id for task in tasks}
    for key, found in calls.items():  # in file order, as the summary lists stages in the order first met
        if key in selected:
            for call in found:
                ledger.add(*call)
    return ledger


def _listed(numbers: list[int], shown: int = 20) -> str:
    """The first `shown` numbers, comma-separated, and how many in all when there are more (score.json has all)."""
    more = f", … ({len(numbers):,} in all)" if len(numbers) > shown else ""
    return ", ".join(map(str, numbers[:shown])) + more


def _exit_code(covered: Coverage, judge_path: Path) -> int:
    """0 when every selected task has a final grade; else 3, saying what to rerun. Last, when answers ran out of
    tokens while thinking: raise infer's --max-tokens, and to what."""
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
    truncated = covered.get("thinking_truncated")
    if truncated:
        params = (manifest.read_run(judge_path.with_name("infer.jsonl")) or {}).get("params") or {}
        tokens = next(
            (params[k] for k in ("max_tokens", "max_completion_tokens") if isinstance(params.get(k), int)), None
        )
        print(
            f"score: {truncated} of {covered['graded']} graded answers ran out of tokens while thinking (no final "
            f"answer, scored 0): {budget_advice(tokens)} at infer, in a new run (--run N or --label)",
            file=sys.stderr,
        )
    return EXIT_INCOMPLETE if covered["missing"] or covered["to_rejudge"] else EXIT_OK
