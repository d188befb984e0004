"""The tasks a run selects from its dataset, as infer and score read them."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..benchmarks import Benchmark, Task
from ..benchmarks.base import shard_key
from ..store.shards import Shard


@dataclass
class SelectedTasks:
    """The tasks `select` keeps of the dataset (of a shard: those it takes), in dataset order, read again at each
    iteration rather than held: a benchmark whose `load` reads its file lazily costs no memory per task."""

    bench: Benchmark
    data: Path
    max_samples: int | None
    shard: Shard | None = None

    ids: list | None = field(default=None, init=False)  # of the last whole reading (score's coverage reads these)

    def __iter__(self) -> Iterator[Task]:
        tasks = self.bench.select(self.bench.load(self.data), self.max_samples)
        bench, shard, ids = self.bench, self.shard, []
        for task in tasks:
            if shard is None or shard.takes(shard_key(bench, task.id, task.row)):
                ids.append(task.id)
                yield task
        self.ids = ids
