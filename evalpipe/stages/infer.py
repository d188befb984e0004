"""infer: ask the model for every selected task that has no row yet."""

import argparse
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import cli
from ..benchmarks import Benchmark, Task, row_id
from ..benchmarks.base import group_of
from ..client import cost
from ..client.runner import RunSummary
from ..client.thinking import budget_advice
from ..datasets import hub
from ..store import jsonl, manifest, paths, shards
from ..store.checkpoint import StepCache
from ..store.rows import THINKING_TRUNCATED
from . import engine
from .selected import SelectedTasks


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--model", required=True, help="model name sent to the endpoint")
    default = bench.default_data.relative_to(paths.PROJECT) if bench.default_data else None
    parser.add_argument(
        "--input",
        type=Path,
        help=f"dataset JSONL, or hf://<repo>[@<revision>]/<file or split> (default: the bundled sample, {default})",
    )
    parser.add_argument(
        "--output", type=Path, help="output JSONL (default outputs/<bench>/<model>/run-<K>/infer.jsonl)"
    )
    parser.add_argument(
        "--max-samples", type=cli.whole_number, help="only the first N tasks of the dataset (a prefix, as upstream)"
    )
    parser.add_argument(
        "--slim",
        action="store_true",
        help="leave the copied `messages` and a reasoning model's `thinking` (null) out of the rows (much smaller "
        "files; `python -m evalpipe.expand` joins the messages back from the dataset for upstream tools, not the "
        "thinking)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="add rows to an output made under another configuration (model, parameters, dataset, options); "
        "without it such a rerun is refused",
    )
    cli.add_endpoint_args(parser, "infer")
    # the reference's generation settings for this benchmark (e.g. coin_flip: temperature 0), unless given
    parser.set_defaults(**bench.generation_defaults)


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("infer", "Run the model on every pending task (resumable).", _add_args, argv)
    data = Path(args.input or bench.default_data)
    shard = shards.chosen(args.shard, args.shards)
    jsonl.require_regular_file(data)  # a pipe or a device would block or never end (every format is read to its end)
    tasks = Selected(bench, data, args.max_samples, shard)  # prefix first, then resume, as upstream
    data_sha = manifest.sha256_file(data)
    gc.freeze()  # what is loaded lives to the end: keep the collector from rescanning it
    run_dir = paths.run_dir(args.outputs_dir, bench.name, args.model, args.run, args.label)
    output = args.output or run_dir / "infer.jsonl"
    if shard is not None:
        output = shard.path(output)
    endpoint = cli.endpoint_from_args(args, args.model)
    fingerprint = manifest.fingerprint(
        args,
        {
            "dataset_sha256": data_sha,
            "prompt_sha256": manifest.sha256_texts(bench.prompts().get("infer", [])),
            "request_extra_body": endpoint.extra_body,
        },
        ignore=("prefix_schedule", "prompt_cache_key"),  # the order of the calls and a cache hint, not the answers
    )
    rows = _Rows(bench, args.slim, output, args.max_tokens)

    def announce(pending: engine.Pending) -> None:
        cut = f" · shard {tasks.shard}" if tasks.shard is not None else ""
        print(
            f"infer: {bench.name} · {args.model}{cut} · {len(tasks)} selected, "
            f"{len(tasks) - len(pending)} already done, {len(pending)} to run → {output}",
            file=sys.stderr,
        )

    job = engine.Job(
        label="infer",
        output=output,
        endpoint=endpoint,
        fingerprint=fingerprint,
        manifest={
            "stage": "infer",
            "benchmark": bench.name,
            "dataset": str(data.resolve()),
            "dataset_sha256": data_sha,
            "dataset_source": hub.source_of(data),  # hf://<repo>@<commit>/<file> for a file fetched from the Hub
            "max_samples": args.max_samples,
            "model": args.model,
            "endpoint": endpoint.host,
            "params": {**endpoint.params, **endpoint.extra_body},
            "slim": args.slim,
            "shard": None if tasks.shard is None else str(tasks.shard),
            "fingerprint": fingerprint,
        },
        total=("selected", len(tasks)),
        written=lambda: jsonl.ids_in(output, row_id),
        pending_given=tasks.pending,
        announce=announce,
        rows=rows,
        # without groups the tasks go in order, as they are read
        prefix_group=(lambda task: group_of(bench, task.row))
        if args.prefix_schedule == "on" and bench.prefix_group
        else None,
    )
    return engine.run(job, args)


@dataclass
class Selected(SelectedTasks):
    """The selected tasks: counted (and every row checked) once, then read again lazily for the pending ones, so
    that infer holds the done ids, never the tasks."""

    def __post_init__(self) -> None:
        self.count = sum(1 for _ in self)

    def __len__(self) -> int:
        return self.count

    def pending(self, done: set) -> engine.Pending:
        def tasks() -> Iterator[Task]:
            return (task for task in self if task.id not in done)

        return engine.Pending(sum(1 for _ in tasks()), tasks)


class _Rows:
    """The rows this run makes, and what it counts of them: prompt tokens (cached ones too), answers that ran out
    of tokens while thinking (and the completion tokens the others used)."""

    def __init__(self, bench: Benchmark, slim: bool, output: Path, budget: int | None) -> None:
        self.bench, self.slim, self.output = bench, slim, output
        self.budget = budget  # --max-tokens (None: the endpoint's own limit)
        self.prompt_tokens = self.cached = self.truncated = self.answered = 0
        self.stopped_at = self.finished_used = 0  # the most completion tokens of a call of each

    @contextmanager
    def session(self, paying: bool) -> Iterator[engine.Work]:
        steps = StepCache(self.output, record=paying)

        async def solve(task: Task, client) -> dict:
            row = await self.bench.solve(task, client, steps)
            self._add(row)
            if self.slim:
                row.pop("messages", None)
                if "thinking" in row:
                    row["thinking"] = None  # still there: model_output was separated from it (thinking.text_to_grade)
            return row

        try:
            yield solve
        finally:
            steps.close()

    def _add(self, row: dict) -> None:
        used = 0  # the most completion tokens of the row's calls
        for call in cost.api_calls(row):
            usage = call.usage or {}
            self.prompt_tokens += usage.get("prompt_tokens", 0)
            self.cached += usage.get("cached_tokens", 0)
            if type(usage.get("completion_tokens")) is int:
                used = max(used, usage["completion_tokens"])
        if row.get("status") == THINKING_TRUNCATED:
            self.truncated += 1
            self.stopped_at = max(self.stopped_at, used)
        elif row.get("status") == "ok":
            self.answered += 1
            self.finished_used = max(self.finished_used, used)

    def counts(self, summary: RunSummary) -> dict:
        return {
            "interrupted": summary.interrupted,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached,
        }

    def settle(self, code: int) -> int:
        if self.prompt_tokens:
            print(
                f"infer: {self.cached:,} of {self.prompt_tokens:,} prompt tokens cached "
                f"({self.cached / self.prompt_tokens:.1%})",
                file=sys.stderr,
            )
        if self.truncated:
            limit = f"--max-tokens {self.budget}" if self.budget else "the endpoint's own limit (no --max-tokens)"
            finished = f"; the answers that finished used up to {self.finished_used:,}" if self.answered else ""
            print(
                f"infer: {self.truncated:,} of {self.truncated + self.answered:,} answers ran out of tokens while "
                f"thinking under {limit} (no final answer, scored 0){finished}: "
                f"{budget_advice(self.budget or self.stopped_at)}, in a new run (--run N or --label)",
                file=sys.stderr,
            )
        return code
