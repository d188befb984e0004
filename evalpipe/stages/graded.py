"""What judge and error analysis share: a stage that writes a row per input row (pending until the output's
latest row for its id is done), graded by a model or a rule; the engine (engine.py) runs the job."""

import gc
import itertools
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from .. import cli
from ..benchmarks import Benchmark, Task, row_id
from ..benchmarks.base import stand_in
from ..client.llm import Endpoint
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput
from ..store import jsonl, manifest, paths, shards
from . import engine
from .selected import shard_key

# Model names upstream routes to AWS Bedrock; we speak only the OpenAI-compatible protocol.
_BEDROCK_PREFIXES = ("anthropic.", "amazon.", "meta.", "mistral.", "cohere.")
# Judge flags that change which rows are (re)judged, not what a judge row says.
_NOT_IN_FINGERPRINT = (
    "model",
    "aws_region",
    "judge_prompt",
    "parse_attempts",
    "rejudge_parse_errors",
    "rejudge_truncated",
    "judge_max_tokens",  # a budget: raised to judge truncated rows again, it does not change the others
    "parse",
    "error_analysis",
    "judge_label",  # names the output file only
)


def input_path(bench: Benchmark, args, first_file: str) -> Path:
    """--input, else `first_file` in the run's folder of --model (BadInput without either)."""
    if args.input is not None:
        return args.input
    if not args.model:
        raise BadInput("give --input, or --model (and --run) to use the default output layout")
    return paths.run_dir(args.outputs_dir, bench.name, args.model, args.run, args.label) / first_file


def shard_filter(
    bench: Benchmark, shard: shards.Shard | None, keep: Callable[[dict], bool] | None = None
) -> Callable[[dict], bool] | None:
    """`keep`, and of those the rows of the shard's tasks (None: every row)."""
    if shard is None:
        return keep

    def kept(row: dict) -> bool:
        return (keep is None or keep(row)) and shard.takes(shard_key(bench, row_id(row), row))

    return kept


class InputRows:
    """A stage's input file (over its parts: shards.py) as its latest row per id that `keep` accepts, in the
    order the ids first occur: counted in one pass, then read again lazily for the pending ones. Holds the
    latest row of an id that has several rows (rare), never the rows; its ids only while it counts them."""

    def __init__(self, path: Path, keep: Callable[[dict], bool] | None = None):
        self.path, self.keep = path, keep
        ids: set = set()
        self.repeated: dict = {}  # id → its latest row, for ids with several rows
        self.left_out: set = set()  # ids whose latest row `keep` does not accept
        for _, row in jsonl.run_rows(path):
            key = row_id(row)
            if key in ids:
                self.repeated[key] = row
            else:
                ids.add(key)
                if keep is not None and not keep(row):
                    self.left_out.add(key)
        self.count = len(ids)
        del ids
        if keep is not None:
            for key, row in self.repeated.items():
                if keep(row):
                    self.left_out.discard(key)
                else:
                    self.left_out.add(key)
        gc.freeze()  # what is read lives to the end: keep the collector from rescanning it

    def __len__(self) -> int:  # the ids the stage covers
        return self.count - len(self.left_out)

    def pending(self, done: set) -> engine.Pending:
        if self.keep is not None:  # counted as they are given: rows added meanwhile are judged by `keep` too
            return engine.Pending(sum(1 for _ in self._tasks(done)), lambda: self._tasks(done))
        repeated, left_out = self.repeated, self.left_out
        once = (key for key in jsonl.iter_ids(self.path, row_id) if key not in repeated)
        count = sum(1 for key in itertools.chain(once, repeated) if key not in done and key not in left_out)
        return engine.Pending(count, lambda: self._tasks(done))

    def _tasks(self, done: set) -> Iterator[Task]:
        # `keep` again: rows added since the count (another shard's answers, written meanwhile) are not given
        repeated, left_out, keep, given = self.repeated, self.left_out, self.keep, set()
        for _, row in jsonl.run_rows(self.path):
            key = row_id(row)
            if key in repeated:
                if key in given:
                    continue
                given.add(key)
                row = repeated[key]
            if key not in done and key not in left_out and (keep is None or keep(row)):
                yield Task(id=key, row=row, line=0)


def _done_ids(output: Path, is_done: Callable[[dict], bool], cut: bool, elsewhere: set) -> "_Done":
    """The ids whose latest row in the output, over its parts, `is_done`. A run that is not cut leaves a row to
    redo in a shard file to its shard (a row it wrote in the whole file would not count: shards.py); those ids
    are done for it, and put in `elsewhere`."""
    done = _Done()
    whole = shards.whole(output)
    for part in shards.parts(output):
        others = not cut and part != whole
        for _, row in jsonl.iter_rows(part, torn_tail_ok=True):
            done.any_rows = True
            key, finished = row_id(row), is_done(row)
            if finished or others:
                done.add(key)
            else:
                done.discard(key)
            if others and not finished:
                elsewhere.add(key)
            else:
                elsewhere.discard(key)
    return done


class _Done(set):
    """Ids of rows that are done; true when the output has rows at all (done or not: paid for either way)."""

    any_rows = False

    def __bool__(self) -> bool:
        return self.any_rows


def run(
    bench: Benchmark,
    args,
    in_path: Path,
    output: Path,
    *,
    label: str,
    stage: str,
    prompts: list[str],
    is_done: Callable[[dict], bool],
    work: Callable[..., Awaitable[dict]],
    by_model: bool = True,
    keep: Callable[[dict], bool] | None = None,
) -> int:
    """Run a stage that writes a row per input row `keep` accepts (of --shard's tasks): pending until the output's
    latest row for its id `is_done`; `work(row, client)` makes it, by the judge model when `by_model`."""
    model = args.judge_model
    if by_model and "." in model and (":" in model or model.startswith(_BEDROCK_PREFIXES)):
        raise BadInput(
            f"{model!r} looks like an AWS Bedrock model; this pipeline speaks the OpenAI-compatible "
            "protocol only: put the judge behind an OpenAI-compatible gateway and pass --base-url"
        )
    shard = shards.chosen(args.shard, args.shards)
    rows = InputRows(in_path, keep=shard_filter(bench, shard, keep))
    # the judge's endpoint: flags, then JUDGE_* variables, then OPENAI_* ones
    endpoint = cli.endpoint_from_args(args, model, env_prefix="JUDGE") if by_model else None
    fingerprint = _fingerprint(bench, args, endpoint, prompts, stage)
    if shard is not None:
        output = shard.path(output)
    # an LLM judge's judge_format.Formats (what it learns of response_format), seeded from earlier runs
    formats = getattr(bench, "judge_formats", None) if endpoint is not None else None
    if formats is not None:
        formats.seed(manifest.learned(output, "judge_format"))
    stand_ins = _StandIns(label, work, formats)

    def written() -> _Done:
        stand_ins.elsewhere.clear()
        return _done_ids(output, is_done, shard is not None, stand_ins.elsewhere)

    def announce(pending: engine.Pending) -> None:
        cut = f" · shard {shard}" if shard is not None else ""
        print(
            f"{label}: {bench.name}{cut} · {len(rows)} rows to cover, {len(rows) - len(pending)} already done, "
            f"{len(pending)} to do → {output}",
            file=sys.stderr,
        )

    job = engine.Job(
        label=label,
        output=output,
        endpoint=endpoint,
        fingerprint=fingerprint,
        manifest={
            "stage": stage,
            "benchmark": bench.name,
            "input": str(in_path.resolve()),
            "judge_model": args.judge_model if endpoint else None,
            "endpoint": endpoint.host if endpoint else None,
            "params": {**endpoint.params, **endpoint.extra_body} if endpoint else {},
            "fingerprint": fingerprint,
        },
        total=("rows", len(rows)),
        written=written,
        pending_given=rows.pending,
        announce=announce,
        rows=stand_ins,
        first_call_only=True,
        rows_pending=True,
    )
    return engine.run(job, args)


def _fingerprint(bench: Benchmark, args, endpoint: Endpoint | None, prompts: list[str], stage: str) -> dict:
    """What makes the rows what they are: the prompts and the flags that shape a judge request; for a rule, the
    benchmark's own options of the stage (e.g. CoinFlip's --parse). Never in infer's: answers stay as they are."""
    if endpoint is None:
        own = [f.name for f in fields(bench.Options) if f.metadata.get("stage") == stage]
        return {"grader": "rule", **{name: getattr(bench.options, name) for name in own}}
    inputs = {"prompt_sha256": manifest.sha256_texts(prompts), "request_extra_body": endpoint.extra_body}
    return manifest.fingerprint(args, inputs, _NOT_IN_FINGERPRINT)


class _StandIns:
    """The rows a run writes as stand-ins (the judge API failed): the next run does them again."""

    def __init__(self, label: str, work: Callable[..., Awaitable[dict]], formats):
        self.label, self.work, self.formats = label, work, formats
        self.ids: set = set()  # of this run (every earlier one was pending again)
        self.elsewhere: set = set()  # rows to redo that an uncut run leaves to their shards (_done_ids)

    @contextmanager
    def session(self, paying: bool):
        async def grade(task: Task, client) -> dict:
            row = await self.work(task.row, client)
            if paying and stand_in(row):
                self.ids.add(task.id)
            return row

        yield grade

    def counts(self, summary) -> dict:
        learned = {} if self.formats is None else {"learned": {"judge_format": self.formats.state()}}
        return {"retry_later": len(self.ids), **learned}

    def settle(self, code: int) -> int:
        if self.ids:
            print(
                f"{self.label}: {len(self.ids)} rows will be done again on the next run (judge API failed)",
                file=sys.stderr,
            )
        if self.elsewhere:
            print(
                f"{self.label}: {len(self.elsewhere)} rows to do again are in shard files: rerun their shards "
                "(--shard K/N) to do them",
                file=sys.stderr,
            )
        if code == EXIT_OK and (self.ids or self.elsewhere):
            return EXIT_INCOMPLETE
        return code
