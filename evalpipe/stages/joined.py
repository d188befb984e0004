"""score's reading: each selected task's latest judge row, projected on the fields the figures read, and the
calls the rows record; the judge file read by forked processes when it is large, the selected tasks from the
task cache or read at the same time by one more."""

import contextlib
from array import array
from collections.abc import Callable, Generator, Iterator
from functools import partial
from pathlib import Path

from .. import cost, jsonl, parallel, task_cache
from ..benchmarks import Benchmark, row_id
from ..benchmarks.base import TaskList
from ..errors import BadInput
from ..projections import Projections

# A file larger than this is read by forked processes while this one works (the dataset in one, the judge rows
# in JUDGE_PARTS parts): score then uses every core. Smaller files are read here, where forking costs more.
FORK_ABOVE_BYTES = 1 << 20
JUDGE_PARTS = 2


def selected_in_parallel(
    bench: Benchmark, data: Path, max_samples: int | None, data_sha256: Callable[[], str]
) -> Iterator[task_cache.Chunk]:
    """`selected_chunks`, from the task cache where it has them (`data_sha256` gives the dataset's hash, asked
    for only where the cache may), else read (by a forked process where the dataset is large) and kept there."""
    chunks: Callable[[], Iterator[task_cache.Chunk]] = partial(task_cache.selected_chunks, bench, data, max_samples)
    if task_cache.keeps(bench, data):
        entry = task_cache.Entry(bench, data, max_samples, data_sha256())
        cached = entry.read()
        if cached is not None:
            return cached
        chunks = partial(entry.recorded, chunks())
    return iter(parallel.in_child(chunks)) if data.stat().st_size > FORK_ABOVE_BYTES else chunks()


class Accounts:
    """Calls, tokens and latency of the rows counted, added a chunk of rows at a time (rows are not kept)."""

    def __init__(self):
        self.ledger = cost.Ledger()
        # most rows record one call: (model, via batch) → [calls, summed usage or None, latencies]
        self.single: dict[tuple, list] = {}

    def add_rows(self, rows: list[dict]) -> None:
        # a million rows: as cost.api_calls and Ledger.add count a row of one call, without a call per row
        group = tally = None
        for row in rows:
            if "calls" in row or "judge_usage" in row or "judge_latency_s" in row or "analysis_model" in row:
                for call in cost.api_calls(row):
                    self.ledger.add(*call)
                continue
            if "usage" not in row and "latency_s" not in row:
                continue
            get = row.get
            if tally is None or group != (get("model"), bool(get("batch"))):
                group = (get("model"), bool(get("batch")))
                tally = self.single.get(group)
                if tally is None:
                    tally = self.single[group] = [0, None, array("d")]
                    self.ledger.add("infer", group[0], None, None, 0, group[1])  # the stage, in the order they come
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


def judge_part(path: Path, start: int, stop: int | None, fields: tuple[str, ...]) -> Generator:
    """The judge rows between two offsets of the file, a chunk at a time: their ids, and the codes of their
    projections on `fields` with the projections first seen (see `Projections`); at the end, the ledger of their
    calls (latencies sorted: the parts' sorted runs are kept apart, not merged and sorted again)."""
    projections = Projections(fields)
    accounts = Accounts()
    ids: list = []
    codes, first_seen = array("I"), []
    for _, rows in jsonl.iter_row_chunks(path, torn_tail_ok=True, start=start, stop=stop):
        ids += [row["idx"] if "idx" in row else row_id(row) for row in rows]
        more_codes, more_first_seen = projections.codes(rows)
        codes += more_codes
        first_seen += more_first_seen
        accounts.add_rows(rows)
        if len(ids) >= task_cache.CHUNK:  # chunks as large as the tasks': each is looked up at once (`Join`)
            yield ids, codes, first_seen
            ids, codes, first_seen = [], array("I"), []
    if ids:
        yield ids, codes, first_seen
    ledger = accounts.finish()
    ledger.sort_latencies()
    yield ledger


def judge_parts(path: Path, fields: tuple[str, ...]) -> list[tuple[int, parallel.Items]]:
    """`judge_part`s that cover the file, each with its start: all forked at once and read ahead (what each
    sends is kept here until it is read, so that none waits); one part, read here, where the file is small."""
    if path.stat().st_size <= FORK_ABOVE_BYTES:
        return [(0, judge_part(path, 0, None, fields))]
    return [
        (start, parallel.in_child(partial(judge_part, path, start, stop, fields), read_ahead=True))
        for start, stop in jsonl.line_ranges(path, JUDGE_PARTS)
    ]


# How far before or after where it is expected a judge row may be and still be found without a table of every
# id: concurrent workers write rows a little out of dataset order.
_WINDOW = 1024


class Join:
    """The latest judge row of each selected task (only the fields asked for), read in one pass while
    the selected tasks arrive (in chunks, pulled as the rows need them).

    Rows come in about dataset order (workers finish a little out of it), so each chunk of rows is looked up
    among the tasks a little before and after where it is expected, then among the tasks passed over without
    a row: no table of a million ids. A row of another task, or one far from where it is expected, makes
    the table, once; a second row of a task (a rerun) means the calls of the rows are counted again in a
    second pass, from each task's last row only."""

    def __init__(self, tasks: Callable[[], Iterator[task_cache.Chunk]], task_fields: tuple[str, ...] | None):
        # chunks of the selected tasks (`selected_in_parallel`), pulled as the rows need them; made once the judge
        # file's readers are forked, so that they work while the dataset is hashed and its readers start
        self._tasks = tasks
        self._source: Iterator[task_cache.Chunk] = iter(())
        self._task_projections = Projections(task_fields)  # the tasks' projections, shared in this process
        self._task_table: list[dict] = []  # the source's codes → them
        self.ids: list = []
        self.task_rows: list[dict] = []
        self.rows: list = []
        self.extra: set = set()  # ids of rows that are not of a selected task
        self._position: dict | None = None
        self._last_row: dict[int, int] = {}  # task position → which row of the file (0, 1, ...) is its last
        self._cursor = 0  # the position after the last task found about where expected
        self._passed = 0  # tasks before this position are out of the window of lookups
        self._passed_over: dict = {}  # id → position of those of them still without a row

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
            ids, codes, first_seen = chunk
            self._task_table += self._task_projections.shared(first_seen)
            self.ids += ids
            self.task_rows += map(self._task_table.__getitem__, codes)
            self.rows += [None] * len(ids)
        return len(self.ids)

    def read(self, path: Path, fields: tuple[str, ...]) -> cost.Ledger:
        """Read the judge rows, keeping each selected task's last one projected on `fields`; the ledger of the
        calls of those rows."""
        ledger = cost.Ledger()
        projections = Projections(fields)  # the rows' projections, shared in this process
        parts = judge_parts(path, fields)
        try:
            self._source = self._tasks()
            ordinal = 0  # rows of the file before this chunk
            for start, part in parts:
                table: list[dict] = []  # the part's codes → the projections
                try:
                    for item in part:
                        if isinstance(item, cost.Ledger):
                            ledger.merge(item)
                        else:
                            keys, codes, first_seen = item
                            table += projections.shared(first_seen)
                            self._match(keys, list(map(table.__getitem__, codes)), ordinal)
                            ordinal += len(keys)
                except BadInput as exc:
                    if start == 0 or exc.path != path or exc.line is None:
                        raise
                    raise BadInput(exc.message, path, exc.line + _lines_before(path, start)) from None
        finally:
            for _, part in parts:
                part.close()  # a child not read to its end (an error) is stopped
        self._pull(None)
        if self._last_row:
            ledger = self._recount(path)
        self._position = None  # what only the reading needed
        return ledger

    def _match(self, keys: list, projected: list[dict], ordinal: int) -> None:
        """Set each selected task's row from a chunk of rows (the file's `ordinal`-th row onwards): looked up
        among the tasks about where the chunk was expected (or in the table, once made), the chunk at once
        where each row is the first of a task found there."""
        if self._position is None:
            low, high = max(self._cursor - _WINDOW, 0), self._cursor + len(keys) + _WINDOW
            self._pull(high)
            self._pass_over(low)
            where = dict(zip(self.ids[low:high], range(low, high)))
        else:
            where = self._position
        positions: list = list(map(where.get, keys))
        rows = self.rows
        if None not in positions and len(set(positions)) == len(keys):
            if list(map(rows.__getitem__, positions)).count(None) == len(keys):
                list(map(rows.__setitem__, positions, projected))
                self._cursor = max(self._cursor, max(positions, default=-1) + 1)
                return
        for key, row, position in zip(keys, projected, positions):
            if position is None:
                position = self._passed_over.pop(key, None)
                if position is None:
                    position = self._table().get(key)
                    if position is None:
                        self.extra.add(key)
                        ordinal += 1
                        continue
            elif where is not self._position:
                self._cursor = max(self._cursor, position + 1)
            if rows[position] is not None:  # a second row of the task: only the last one counts
                self._last_row[position] = ordinal
            rows[position] = row
            ordinal += 1

    def _pass_over(self, low: int) -> None:
        """Tasks before `low` still without a row leave the window of lookups: kept by id, to be found if their
        row comes later."""
        start = self._passed
        if low <= start:
            return
        waiting, index = self.rows[start:low], -1
        with contextlib.suppress(ValueError):  # no more of them
            while True:
                index = waiting.index(None, index + 1)
                self._passed_over[self.ids[start + index]] = start + index
        self._passed = low

    def _table(self) -> dict:
        if self._position is None:
            self._pull(None)
            self._position = dict(zip(self.ids, range(len(self.ids))))
        return self._position

    def _recount(self, path: Path) -> cost.Ledger:
        """The calls of each selected task's last row only (some tasks have several rows)."""
        accounts = Accounts()
        position_of, last_row = self._table().get, self._last_row
        for ordinal, (_, row) in enumerate(jsonl.iter_rows(path, torn_tail_ok=True)):
            position = position_of(row["idx"] if "idx" in row else row_id(row))
            if position is not None and last_row.get(position, ordinal) == ordinal:
                accounts.add_rows([row])
        return accounts.finish()


def _lines_before(path: Path, offset: int) -> int:
    """How many lines of the file start before `offset` (to name a line found by a part that starts there)."""
    lines = 0
    with open(path, "rb") as f:
        while offset > 0 and (block := f.read(min(offset, 1 << 20))):
            lines += block.count(b"\n")
            offset -= len(block)
    return lines


def judged_rows_only(bench: Benchmark, judge_path: Path, fields: tuple[str, ...]) -> tuple[TaskList, list, cost.Ledger]:
    """With no dataset known: the judge rows stand in for it (their latest row per id, as tasks); those rows
    projected on `fields`, and the ledger of their calls."""
    latest = jsonl.latest_rows(judge_path, row_id)
    rows = list(latest.values())
    tasks = TaskList(list(latest), Projections(bench.task_fields).shared(rows))
    accounts = Accounts()
    accounts.add_rows(rows)
    return tasks, Projections(fields).shared(rows), accounts.finish()
