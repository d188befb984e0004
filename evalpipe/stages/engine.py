"""The one sequence every API-calling stage runs (infer, judge, error analysis): docs/design.md#the-engine."""

import asyncio
import functools
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..benchmarks import Task, row_id
from ..client import batch, batch_backend, cost, dryrun, runner, spending
from ..client.llm import TOKEN_FIELDS, Endpoint
from ..errors import EXIT_OK, BadInput
from ..store import jsonl, lock, manifest
from ..store.checkpoint import StepCache

# work(task, client) -> its row (None: nothing to write now); the client: an llm.ChatClient, a stand-in, or None
Work = Callable[[Task, Any], Awaitable[dict | None]]


Pending = runner.Tasks


class Rows(Protocol):
    """How a stage makes its rows, and what it counts and says of those a run made."""

    # the work on one task; `paying`: a paid run's (it records what must be kept), else --dry-run's or export's
    def session(self, paying: bool) -> AbstractContextManager[Work]: ...
    def counts(self, summary: runner.RunSummary) -> dict: ...  # what the manifest adds of a run
    def settle(self, code: int) -> int: ...  # the last word on an online or import run's exit code


@dataclass
class Job:
    """What one API-calling stage asks of the engine."""

    label: str  # in messages, batch files and the failures side file: "infer", "judge", "error analysis"
    output: Path
    endpoint: Endpoint | None  # None: the stage makes no API calls (a rule judge)
    fingerprint: dict | None  # what makes the rows what they are; None: nothing to keep apart
    manifest: dict  # what the manifest records of this invocation
    total: tuple[str, int]  # what the pending tasks are counted out of, e.g. ("selected", 100)
    written: Callable[[], set]  # the done ids in the output; true when it holds any row (all paid for)
    pending_given: Callable[[set], Pending]  # the tasks still to do, given `written()`
    announce: Callable[[Pending], None]  # print what this invocation will do, given the pending tasks
    rows: Rows
    first_call_only: bool = False  # --dry-run counts one call per task (a judge asks again only to parse)
    rows_pending: bool = False  # a pending task can have a row (a judge's stand-in): batch import compares
    prefix_group: Callable[[Task], str | None] | None = None  # online: a task's group (scheduler.py); None: in order

    def pending(self) -> Pending:
        return self.pending_given(self.written())


def run(job: Job, args) -> int:
    """Run the job's pending tasks through the engine the flags choose; return the exit code."""
    if args.dry_run:  # reads only: no folder, lock file or manifest
        pending = job.pending()
        job.announce(pending)
        prices = cost.load_prices(args.prices)
        with job.rows.session(False) as work:
            dryrun.estimate(
                job.label, pending, work, job.endpoint, args.max_tokens, prices, job.first_call_only, args.max_cost
            )
        return EXIT_OK
    settings = runner.Settings(**{name: getattr(args, name) for name in runner.Settings.__dataclass_fields__})
    given = {"--export-batch": args.export_batch, "--backend batch": args.backend == "batch"}
    batch_flag = next((flag for flag, on in {**given, "--import-batch": args.import_batch}.items() if on), None)
    if batch_flag and job.endpoint is None:
        raise BadInput(f"{job.label} makes no API calls for this benchmark: run it without {batch_flag}")
    cap = None
    if job.endpoint is not None and args.max_cost is not None:  # a rule judge spends nothing
        if batch_flag:
            raise BadInput("--max-cost caps online calls; for a batch, --dry-run shows its estimate first")
        cap = spending.cap_for(args.max_cost, args.prices, job.endpoint.model, args.spending_ledger)
    with lock.exclusive(job.output):
        # the field each endpoint took --max-tokens in (a rule judge reads no manifest before its announce line)
        token_fields = manifest.learned(job.output, "token_field") if job.endpoint is not None else {}
        if job.endpoint is not None and token_fields.get(job.endpoint.learned_key) in TOKEN_FIELDS:
            job.endpoint.use_token_field(token_fields[job.endpoint.learned_key])
        written = job.written()
        in_batches = batch_backend.State(job.output).open_batches()
        # paid-for work made under another configuration is not added to, open Batch API batches not bypassed: a
        # rule's rows cost nothing (`is_judged` decides); a step cache with steps in it (infer's chains) is paid for
        steps = StepCache.path_for(job.output)
        paid_for = job.endpoint is not None and (written or in_batches or (steps.exists() and steps.stat().st_size > 0))
        if job.fingerprint is not None and paid_for and not args.allow_config_change:
            manifest.refuse_if_changed(job.output, job.fingerprint)
        if args.backend != "batch":
            batch_backend.refuse_other_engines(job.output, in_batches)
        pending = job.pending_given(written)
        job.announce(pending)
        if args.export_batch:
            assert job.endpoint is not None  # refused above
            with job.rows.session(False) as work:
                calls = batch.Job(job.label, work, job.endpoint, job.output, settings)
                return batch.export(calls, pending, args.export_batch)
        record = manifest.Record(job.output, job.manifest)
        name, total = job.total  # the manifest's counts before the run
        counts = {name: total, "done_before": total - len(pending), "pending": len(pending)}
        if not pending and not in_batches:
            record.finish(**counts, written=0, failed=0)
            return job.rows.settle(EXIT_OK)
        current = functools.partial(jsonl.latest_rows, job.output, row_id) if job.rows_pending else None
        with job.rows.session(True) as work:
            if batch_flag:
                assert job.endpoint is not None  # refused above
                calls = batch.Job(job.label, work, job.endpoint, job.output, settings, current)
            if args.backend == "batch":  # a step of the Batch API state file (or more, with --batch-wait)
                code = batch_backend.advance(calls, job.pending)
                record.finish(**counts, backend="batch", exit_code=code, still_pending=len(job.pending()))
                return code
            if args.import_batch:  # the rows the batch files complete
                summary = batch.import_files(calls, pending, args.import_batch)
            else:
                online = runner.run(pending, work, job.output, settings, job.label, job.endpoint, job.prefix_group, cap)
                summary = asyncio.run(online)
        extra = job.rows.counts(summary)
        learned = extra.pop("learned", {})
        if job.endpoint is not None and job.endpoint.token_field is not None:  # not the flag's, or learned before
            field, key = job.endpoint.token_field, job.endpoint.learned_key
            if field != args.max_tokens_param or key in token_fields:
                learned["token_field"] = {**token_fields, key: field}
        extra |= {"learned": learned} if learned else {}
        record.finish(**counts, written=summary.written, failed=summary.failed, **extra)
    return job.rows.settle(runner.finish(job.label, summary, job.output))
