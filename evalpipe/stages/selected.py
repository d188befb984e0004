"""The tasks a run selects from its dataset, as infer and score read them."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..benchmarks import Benchmark, Task
from ..benchmarks.base import group_of, select
from ..store.shards import Shard


@dataclass
class SelectedTasks:
    """The tasks `select` keeps of the dataset (of a shard: those it takes), in dataset order, read again at each
    iteration rather than held: a benchmark whose `load` reads its file lazily costs no memory per task."""

    bench: Benchmark
    data: Path
    max_samples: int | None
    shard: Shard | None = None

    def __iter__(self) -> Iterator[Task]:
        tasks = iter(select(self.bench, self.bench.load(self.data), self.max_samples))
        if self.shard is None:
            return tasks
        takes, bench = self.shard.takes, self.bench
        return (task for task in tasks if takes(shard_key(bench, task.id, task.row)))


def shard_key(bench: Benchmark, task_id: Any, row: dict) -> object:
    """What decides a task's shard (shards.py): its prefix group, so that a group stays in one shard and its
    prefix is computed once, else its id. `row` may be the task's dataset, inference or judge row."""
    group = group_of(bench, row)
    return task_id if group is None else group
