"""score: one run's metrics from its judge rows, with coverage against the selected tasks."""

import argparse
import contextlib
import gc
import os
import pickle
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import orjson

from .. import cli, cost, jsonl, manifest, paths
from ..benchmarks import Benchmark, Task, row_id
from ..benchmarks.base import ErrorAnalysis, JudgedRows, TaskList, judge_rows, task_ids
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


def selection(bench: Benchmark, args, judge_path: Path) -> tuple[Path | None, int | None, str]:
    """The dataset and prefix the run was selected from (None: unknown), and how to describe them."""
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
        return None, None, "judged rows only"
    return data, max_samples, f"{data}" + (f" (first {max_samples})" if max_samples is not None else "")


_ABSENT = object()


def sharing(fields: tuple[str, ...]) -> Callable[[dict], dict]:
    """A row → its `fields` (those it has), as one dict per distinct projection: a million rows hold a
    handful of dicts, not a million. Values are told apart by type too (1, 1.0 and true are equal keys)."""
    seen: dict[Any, dict] = {}
    absent = (_ABSENT,) * len(fields)

    def project(row: dict) -> dict:
        values = tuple(map(row.get, fields, absent))
        key = (values, tuple(map(type, values)))
        try:
            shared = seen.get(key)
        except TypeError:  # an unhashable value (a list, a dict): this row keeps its own
            return {k: v for k, v in zip(fields, values) if v is not _ABSENT}
        if shared is None:
            shared = seen[key] = {k: v for k, v in zip(fields, values) if v is not _ABSENT}
        return shared

    if len(fields) != 1:
        return project
    (only,) = fields

    def project_one(row: dict) -> dict:
        value = row.get(only, _ABSENT)
        key = (value, type(value))
        try:
            shared = seen.get(key)
        except TypeError:
            return {only: value}
        if shared is None:
            shared = seen[key] = {} if value is _ABSENT else {only: value}
        return shared

    return project_one


_CHUNK = 4096  # tasks per chunk of selected tasks


def selected_chunks(bench: Benchmark, data: Path, max_samples: int | None) -> Iterator[tuple[list, list]]:
    """The selected tasks, a chunk of (ids, rows) at a time, each row holding only the fields the benchmark's
    figures read."""
    project = sharing(bench.task_fields) if bench.task_fields is not None else None
    ids: list = []
    rows: list[dict] = []
    for task in bench.selected(data, max_samples):
        ids.append(task.id)
        rows.append(task.row if project is None else project(task.row))
        if len(ids) == _CHUNK:
            yield ids, rows
            ids, rows = [], []
    if ids:
        yield ids, rows


# A dataset larger than this is read by a forked process while this one reads the judge rows (two cores).
_FORK_ABOVE_BYTES = 1 << 18


def selected_in_parallel(bench: Benchmark, data: Path, max_samples: int | None) -> Iterator[tuple[list, list]]:
    """`selected_chunks`, read by a child process (forked, where there is fork) and sent over a pipe, so that
    the dataset and the judge rows are parsed at once. The child's errors are raised here, as they would be."""
    if not hasattr(os, "fork") or data.stat().st_size <= _FORK_ABOVE_BYTES:
        yield from selected_chunks(bench, data, max_samples)
        return
    read_end, write_end = os.pipe()
    with contextlib.suppress(ImportError, AttributeError, OSError):  # a larger pipe: the child runs ahead (Linux)
        import fcntl

        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
    pid = os.fork()
    if pid == 0:  # the child: send the chunks, then an end or the error, and leave without cleanup
        os.close(read_end)
        code = 0
        try:
            with os.fdopen(write_end, "wb") as out:
                try:
                    for chunk in selected_chunks(bench, data, max_samples):
                        pickle.dump(chunk, out, pickle.HIGHEST_PROTOCOL)
                    pickle.dump(None, out)
                except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
                    pickle.dump(exc if isinstance(exc, BadInput) else RuntimeError(repr(exc)), out)
        except BaseException:  # noqa: BLE001 - the parent stopped reading
            code = 1
        os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as source:
            while True:
                try:
                    chunk = pickle.load(source)
                except EOFError:
                    raise RuntimeError(f"the process reading {data} stopped before its end") from None
                if chunk is None:
                    break
                if isinstance(chunk, Exception):
                    raise chunk
                yield chunk
    finally:
        os.waitpid(pid, 0)


class _Accounts:
    """Calls, tokens and latency of the rows counted, added a row at a time (rows are not kept)."""

    def __init__(self):
        self.ledger = cost.Ledger()
        # most rows record one call: (model, via batch) → [calls, summed usage or None, latencies]
        self.single: dict[tuple, list] = {}

    def add(self, row: dict) -> None:
        if "calls" in row or "judge_usage" in row or "judge_latency_s" in row or "analysis_model" in row:
            for call in cost.api_calls(row):
                self.ledger.add(*call)
            return
        if "usage" not in row and "latency_s" not in row:
            return
        get = row.get  # as cost.api_calls and Ledger.add count the one call, without a call per row
        group = (get("model"), bool(get("batch")))
        tally = self.single.get(group)
        if tally is None:
            tally = self.single[group] = [0, None, array("d")]
            self.ledger.add("infer", group[0], None, None, 0, group[1])  # the stage, in the order stages come
        tally[0] += 1
        usage = get("usage")
        if usage:
            sums = tally[1]
            if sums is None:
                sums = tally[1] = dict.fromkeys(cost.TOKEN_KEYS, 0)
            for key in cost.TOKEN_KEYS:
                value = usage.get(key)
                if value:
                    sums[key] += value
        latency = get("latency_s")
        if latency is not None:
            tally[2].append(latency)

    def finish(self) -> cost.Ledger:
        """The ledger of every row added."""
        for (model, batch), (calls, usage, latencies) in self.single.items():
            self.ledger.add_many("infer", model, usage, latencies, calls, batch)
        self.single = {}
        return self.ledger


# How far ahead of the next expected task a judge row may be and still be found without a table of every id:
# concurrent workers write rows a little out of dataset order.
_WINDOW = 1024


class _Join:
    """The latest judge row of each selected task (only the fields `project` keeps), read in one pass while
    the selected tasks arrive (in chunks, pulled as the rows need them).

    Rows come in about dataset order (workers finish a little out of it), so each is matched to the next
    task, or found a little ahead, or among the tasks passed over: no table of a million ids. A row of
    another task, or a second row of a task (a rerun), makes the table, once, and the calls of the
    rows are then counted again in a second pass, from each task's last row only."""

    def __init__(self, tasks: Iterator[tuple[list, list]], project: Callable[[dict], dict]):
        self._source = tasks  # chunks of (ids, rows) of the selected tasks, pulled as the rows need them
        self.ids: list = []
        self.task_rows: list[dict] = []
        self.rows: list = []
        self.project = project
        self.extra: set = set()  # ids of rows that are not of a selected task
        self._position: dict | None = None
        self._last_line: dict[int, int] = {}  # task position → line of its last row, for tasks with several

    def tasks(self) -> TaskList:
        """The selected tasks (every one: read after `read`)."""
        self._pull(None)
        return TaskList(self.ids, self.task_rows)

    def _pull(self, upto: int | None) -> int:
        """Read selected tasks until there are more than `upto` (None: all); return how many there are."""
        while upto is None or len(self.ids) <= upto:
            chunk = next(self._source, None)
            if chunk is None:
                break
            self.ids += chunk[0]
            self.task_rows += chunk[1]
            self.rows += [None] * len(chunk[0])
        return len(self.ids)

    def read(self, path: Path) -> cost.Ledger:
        ids, rows, project = self.ids, self.rows, self.project
        passed_over: dict = {}  # id → position of tasks skipped when a row came early
        accounts = _Accounts()
        account = accounts.add
        cursor = n = 0
        for line, row in jsonl.iter_rows(path, torn_tail_ok=True):
            key = row["idx"] if "idx" in row else row_id(row)
            if cursor >= n:
                n = self._pull(cursor)
            if cursor < n and ids[cursor] == key:
                position = cursor
                cursor += 1
            else:
                found = passed_over.pop(key, None)
                if found is None:
                    found = self._ahead(key, cursor)
                    if found is not None:
                        passed_over.update(zip(ids[cursor:found], range(cursor, found)))
                        cursor = found + 1
                    else:
                        found = self._table().get(key)
                        if found is None:
                            self.extra.add(key)
                            continue
                position = found
            if rows[position] is not None:  # a second row of the task: only the last one counts
                self._last_line[position] = line
            rows[position] = project(row)
            account(row)
        self._pull(None)
        ledger = accounts.finish() if not self._last_line else self._recount(path)
        self._position = None  # what only the reading needed
        return ledger

    def _ahead(self, key, cursor: int) -> int | None:
        """Where the task of `key` is a little ahead of `cursor`, while no table of ids is made."""
        if self._position is not None:
            return None
        self._pull(cursor + _WINDOW)
        try:
            return self.ids.index(key, cursor, cursor + _WINDOW)
        except ValueError:
            return None

    def _table(self) -> dict:
        if self._position is None:
            self._pull(None)
            self._position = dict(zip(self.ids, range(len(self.ids))))
        return self._position

    def _recount(self, path: Path) -> cost.Ledger:
        """The calls of each selected task's last row only (some tasks have several rows)."""
        accounts = _Accounts()
        position_of, last_line = self._table().get, self._last_line
        for line, row in jsonl.iter_rows(path, torn_tail_ok=True):
            position = position_of(row["idx"] if "idx" in row else row_id(row))
            if position is not None and last_line.get(position, line) == line:
                accounts.add(row)
        return accounts.finish()


def judged_rows_only(
    bench: Benchmark, judge_path: Path, project: Callable[[dict], dict]
) -> tuple[Sequence[Task], _Join, cost.Ledger]:
    """With no dataset known: the judge rows stand in for it (their latest row per id, as tasks)."""
    task_project = sharing(bench.task_fields) if bench.task_fields is not None else None
    latest = jsonl.latest_rows(judge_path, row_id)
    tasks = TaskList(list(latest), [row if task_project is None else task_project(row) for row in latest.values()])
    joined = _Join(iter([(tasks.ids, tasks.rows)]), project)
    joined.tasks()
    joined.rows = [project(row) for row in latest.values()]
    accounts = _Accounts()
    for row in latest.values():
        accounts.add(row)
    return tasks, joined, accounts.finish()


def coverage(
    bench: Benchmark, tasks: Sequence[Task], judged: Mapping, counted: list[tuple] | None = None
) -> tuple[Coverage, dict[str, int]]:
    """How much of the selected tasks the judge rows cover, and the judge statuses among them
    (`counted`: the rows' `_distinct`, if known)."""
    rows = judge_rows(tasks, judged)
    statuses: dict[str, int] = {}
    to_rejudge = 0
    for row, count in counted if counted is not None else _distinct(rows):
        if row is None:
            continue
        status = row.get("judge_status", "ok")
        statuses[status] = statuses.get(status, 0) + count
        to_rejudge += bench.is_provisional(row) * count
    missing = _missing_ids(tasks, rows)
    graded = len(tasks) - missing[0]
    extra = judged.extra_rows if isinstance(judged, _Judged) else len(judged) - graded
    covered: Coverage = {
        "expected": len(tasks),
        "graded": graded,
        "missing": missing[0],
        "missing_ids": missing[1],
        "extra_rows_ignored": extra,
        "to_rejudge": to_rejudge,
    }
    return covered, dict(sorted(statuses.items()))


def _distinct(rows: list) -> list[tuple]:
    """(row, how many times) for each distinct row object (projected rows are shared: a handful of them)."""
    objects = dict(zip(map(id, rows), rows))
    return [(objects[key], count) for key, count in Counter(map(id, rows)).items()]


def _missing_ids(tasks: Sequence[Task], rows: list) -> tuple[int, list]:
    """How many tasks have no judge row, and the first 20 of their ids."""
    count = rows.count(None)
    first: list = []
    position = -1
    while len(first) < min(count, 20):
        position = rows.index(None, position + 1)
        first.append(task_ids(tasks)[position])
    return count, first


class _Judged(JudgedRows):
    """The rows score aligned with the selected tasks, with how many rows of other tasks the file has."""

    def __init__(self, tasks: Sequence[Task], rows: list, extra_rows: int):
        super().__init__(tasks, rows)
        self.extra_rows = extra_rows


def summarize(bench: Benchmark, tasks: Sequence[Task], judged: Mapping) -> dict:
    """One run's metrics: the benchmark's own figures, then coverage and judge statuses."""
    # the benchmark reads the tasks (a TaskList) and rows as the sequence and mapping they are (base.py)
    metrics = bench.metrics(cast(list, tasks), cast(dict, judged))
    counted = _distinct(judge_rows(tasks, judged))
    metrics["coverage"], metrics["judge_status"] = coverage(bench, tasks, judged, counted)
    for key in ("judge_format", "judge_parse"):  # the LLM judge's response_format mode and parse route, if recorded
        counts = field_counts(counted, key)
        if counts:
            metrics[key] = counts
    return metrics


def field_counts(counted: list[tuple], key: str) -> dict[str, int]:
    """How many judge rows (`_distinct` rows and their counts) have each value of `key` (rows without it are not
    counted)."""
    counts: dict[str, int] = {}
    for row, count in counted:
        value = None if row is None else row.get(key)
        if value is not None:
            counts[str(value)] = counts.get(str(value), 0) + count
    return dict(sorted(counts.items()))


def main(argv: list[str]) -> int:
    """score.py: read the judge rows, count them against the selected tasks, write score.json."""
    bench, args = cli.parser_for("score", "Compute one run's metrics.", _add_args, argv)
    judge_path = _judge_path(bench, args)
    _require(judge_path)
    gc.disable()  # a short-lived process building millions of objects: collection would only slow it
    project = sharing((*bench.score_fields, "judge_status"))
    data, max_samples, described = selection(bench, args, judge_path)
    if data is None:
        tasks, joined, ledger = judged_rows_only(bench, judge_path, project)
    else:
        joined = _Join(selected_in_parallel(bench, data, max_samples), project)
        ledger = joined.read(judge_path)
        tasks = joined.tasks()
    judged = _Judged(tasks, joined.rows, len(joined.extra))
    metrics = summarize(bench, tasks, judged)
    if isinstance(bench, ErrorAnalysis):
        analysis_path = paths.error_analysis_path(judge_path, bench.error_analysis_name)
        if analysis_path.exists():
            analyses = jsonl.latest_rows(analysis_path, row_id)
            metrics[bench.error_analysis_name] = bench.error_analysis_metrics(
                cast(list, tasks), cast(dict, judged), analyses
            )
            selected = set(task_ids(tasks))
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
    output = args.output or judge_path.with_name(
        "score.json" if judge_path.name == "judge.jsonl" else f"{judge_path.stem}_score.json"
    )
    # per-item values for aggregate's item-level error bars (compact: it may hold a million items);
    # written first, so that a score.json is never older than the items beside it
    columns = bench.item_columns(cast(list, tasks), cast(dict, judged))
    del judged, joined, tasks  # what the items file does not need, before its bytes are made
    jsonl.atomic_write(paths.items_path(output), items.dumps(bench.name, bench.item_cluster, columns))
    del columns
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
