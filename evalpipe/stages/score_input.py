"""What score reads, in one plain pass over each file: the selected tasks (their ids, and the fields the figures
read of their rows), then the judge rows (their ids, the fields the figures read, and the calls they record),
joined by id. Rows are parsed and looked at a block at a time; a million rows are held as their ids and a
handful of distinct dicts of those fields, never whole."""

from array import array
from collections.abc import Iterator
from functools import partial
from itertools import count, repeat
from operator import is_not, itemgetter
from pathlib import Path

from ..benchmarks import Benchmark, row_id
from ..benchmarks.base import TaskList
from ..client import cost
from ..store import jsonl


def judged_tasks(
    bench: Benchmark, data: Path, max_samples: int | None, judge_path: Path, fields: tuple[str, ...]
) -> tuple[TaskList, list, int, cost.Ledger]:
    """The selected tasks (each row held as the fields the figures read, `task_fields`); each one's last judge
    row on `fields` (None: no row), aligned with them; how many ids of the judge file are of no selected task;
    and the calls of the rows kept."""
    tasks = selected_tasks(bench, data, max_samples)
    judge_ids, judge_rows, ledger = _judge_rows(judge_path, fields)
    read = len(judge_ids)
    # joined once both files are read: the table of a million ids is made and read at once, while in the cache
    latest = dict(zip(judge_ids, judge_rows))
    del judge_rows
    rows = list(map(latest.pop, tasks.ids, repeat(None)))  # an id that repeats in the dataset: its first task's
    extra = len(latest)
    if read > len(rows) - rows.count(None):  # rows of other tasks, or several of a task (judged again)
        ledger = _recounted(judge_path, judge_ids, tasks.ids)  # only the calls of the rows kept are the run's
    return tasks, rows, extra, ledger


def selected_tasks(bench: Benchmark, data: Path, max_samples: int | None) -> TaskList:
    """The selected tasks, each row held as the fields the benchmark's figures read (`task_fields`)."""
    ids: list = []
    rows: list[dict] = []
    shared = Shared(bench.task_fields)
    for block_ids, block_rows in _selected_blocks(bench, data, max_samples):
        ids += block_ids
        rows += shared(block_rows)
    return TaskList(ids, rows)


def _selected_blocks(bench: Benchmark, data: Path, max_samples: int | None) -> Iterator[tuple[list, list[dict]]]:
    """`bench.selected` a block at a time, as `task_blocks` gives them (ids, rows on `task_fields`)."""
    if not bench.selects_prefix():
        tasks = list(bench.selected(data, max_samples))
        yield [task.id for task in tasks], [task.row for task in tasks]
        return
    left = max_samples
    for ids, rows in bench.task_blocks(data, bench.task_fields):  # read to the end, as `selected`
        if left is None:
            yield ids, rows
        elif left > 0:
            yield ids[:left], rows[:left]
            left -= len(ids)


_IDX = itemgetter("idx")


def _judge_rows(path: Path, fields: tuple[str, ...]) -> tuple[list, list, cost.Ledger]:
    """The ids of the judge file's rows, in order, the rows on `fields`, and the calls of them all."""
    ids: list = []
    rows: list = []
    shared, ledger = Shared(fields), cost.Ledger()
    for _, block_ids, block in _blocks(path):
        ids += block_ids
        rows += shared(block)
        add_calls(ledger, block)
    return ids, rows, ledger


def _blocks(path: Path) -> Iterator[tuple[int, list, list[dict]]]:
    """The judge rows a block at a time: which row of the file the first is (0, 1, ...), their ids, the rows."""
    ordinal = 0
    for _, block in jsonl.run_row_chunks(path):
        try:
            ids = list(map(_IDX, block))
        except KeyError:
            ids = list(map(row_id, block))
        yield ordinal, ids, block
        ordinal += len(block)


def _recounted(path: Path, judge_ids: list, selected: list) -> cost.Ledger:
    """The calls of each selected task's last row only (`judge_ids`: the file's ids in order): which row of the
    file that is, then those rows, read again."""
    last = dict.fromkeys(selected, -1)
    last.update((key, n) for n, key in enumerate(judge_ids) if key in last)
    ledger = cost.Ledger()
    for ordinal, ids, block in _blocks(path):
        add_calls(ledger, [row for n, key, row in zip(count(ordinal), ids, block) if last.get(key) == n])
    return ledger


def judged_rows_only(bench: Benchmark, path: Path, fields: tuple[str, ...]) -> tuple[TaskList, list, cost.Ledger]:
    """With no dataset known: the judge rows stand in for it (their last row per id, as tasks); those rows
    on `fields`, and the calls they record."""
    latest = jsonl.latest_rows(path, row_id)
    rows = list(latest.values())
    ledger = cost.Ledger()
    add_calls(ledger, rows)
    return TaskList(list(latest), Shared(bench.task_fields)(rows)), Shared(fields)(rows), ledger


class _Absent:
    """A field the row does not have (its projection leaves it out)."""


_ABSENT = _Absent()
# Values of these types equal only values of their own type: their projections need no type beside them.
_PLAIN = {str, type(None), _Absent}


class Shared:
    """Rows → their `fields` (those they have; None: the whole row), one dict per distinct projection. Values
    are told apart by type too (1, 1.0 and true are equal keys); a list or object among them makes a dict of
    the row's own."""

    def __init__(self, fields: tuple[str, ...] | None):
        self.fields = fields
        self._seen: dict = {}  # by the values of `fields` and their types, a row at a time
        self._by_fields: dict[tuple, _Projections] = {}  # by the fields a block's rows have, then their values

    def __call__(self, rows: list[dict]) -> list[dict]:
        if self.fields is None:
            return rows
        try:  # no value needs its type beside it: at once
            # keyed on the fields some row of the block has: most rows lack most of the served-model fields
            present = tuple(field for field in self.fields if any(map(dict.__contains__, rows, repeat(field))))
            columns = [map(dict.get, rows, repeat(field), repeat(_ABSENT)) for field in present]
            keys = zip(*columns) if columns else repeat((), len(rows))
            projections = self._by_fields.get(present)
            if projections is None:
                projections = self._by_fields[present] = _Projections(present)
            return list(map(projections.__getitem__, keys))
        except TypeError:  # a row that is no object, or a list or an object among the values
            return list(map(self._one, rows))

    def _one(self, row: dict) -> dict:
        values = tuple(row.get(field, _ABSENT) for field in self.fields or ())
        key = (values, tuple(map(type, values)))
        try:
            return self._seen.setdefault(key, _made(self.fields or (), values))
        except TypeError:  # a list or an object
            return _made(self.fields or (), values)


class _Projections(dict):
    """Values of `fields` (a tuple) → their projection, made when first met, of plain values only (else
    TypeError, as for a list among them)."""

    def __init__(self, fields: tuple[str, ...]):
        self.fields = fields

    def __missing__(self, values: tuple) -> dict:
        if not set(map(type, values)) <= _PLAIN:  # 1 and 1.0 would find each other's projection
            raise TypeError("a value that needs its type beside it")
        made = self[values] = _made(self.fields, values)
        return made


def _made(fields: tuple[str, ...], values: tuple) -> dict:
    return {field: value for field, value in zip(fields, values) if value is not _ABSENT}


def add_calls(ledger: cost.Ledger, rows: list[dict]) -> None:
    """Add the calls the rows record to the ledger, as `cost.api_calls` counts them: a block of rows of one call
    each (a usage and a latency), of one model and not by batch, at once (a run's rows, but for the judge's
    own calls); another block a row at a time."""
    try:
        models = set(map(_MODEL, rows))
        usages = list(filter(None, map(_USAGE, rows)))
        latencies = array("d", map(_LATENCY, rows))
    except (KeyError, TypeError):  # a row without them, or a latency of None
        models = set()
    sums = _usage_sums(usages) if len(models) == 1 else None
    if sums is None or any(any(map(dict.__contains__, rows, repeat(key))) for key in _MORE_CALLS):
        for row in rows:
            for call in cost.api_calls(row):
                ledger.add(*call)
        return
    ledger.add_many("infer", models.pop(), sums if usages else None, latencies, len(rows), False)


def _usage_sums(usages: list[dict]) -> dict | None:
    """The calls' token counts summed per key; None when one call's usage is not token counts (cost's rule,
    which the ledger applies call by call: such a block is added a row at a time)."""
    if any(map(dict.__contains__, usages, repeat("invalid"))):
        return None
    sums = {}
    for key in cost.TOKEN_KEYS:
        values: list = list(filter(_NOT_NONE, map(dict.get, usages, repeat(key))))
        if values and not _counts(values):
            return None
        sums[key] = sum(values)
    return sums


def _counts(values: list) -> bool:
    """Whether every value is a token count (cost._counts_valid: a whole number from 0 to MAX_TOKEN_COUNT)."""
    return set(map(type, values)) == {int} and 0 <= min(values) and max(values) <= cost.MAX_TOKEN_COUNT


# Keys of a row that records its calls otherwise.
_MORE_CALLS = ("calls", "batch", "judge_usage", "judge_latency_s", "analysis_model")
_MODEL, _USAGE, _LATENCY = itemgetter("model"), itemgetter("usage"), itemgetter("latency_s")
_NOT_NONE = partial(is_not, None)
