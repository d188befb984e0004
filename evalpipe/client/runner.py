"""The bounded-concurrency loop every API-calling stage runs on its pending tasks, the event loop the one writer,
with a clean stop on SIGINT/SIGTERM, a refusing endpoint or an unwritable output (docs/operations.md)."""

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, CallFailed, EndpointRefused, OutputUnwritable
from ..store import jsonl
from .limiter import AdaptiveLimit
from .llm import ChatClient, Endpoint
from .scheduler import GroupOf, PrefixSchedule
from .spending import SpendingCap, SpendingCapReached


@dataclass(frozen=True)
class Settings:
    """How a stage's calls go: its flags, each field named as its flag, read once by engine.py and handed down."""

    workers: int = 8  # calls in flight at most
    grace: float = 10.0  # seconds the calls in flight may take after a stop
    log_every: float = 30.0  # seconds between progress lines
    progress: str = "auto"
    batch_max_requests: int = 50_000  # OpenAI Batch API limits per input file
    batch_max_bytes: int = 200 * 1024 * 1024
    batch_wait: float = 0.0  # seconds --backend batch keeps polling
    batch_poll: float = 30.0


@dataclass
class Tasks:
    """The pending tasks, counted when made and read again lazily each time: a stage holds ids, never the tasks."""

    count: int
    read: Callable[[], Iterator]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator:
        return self.read()


@dataclass
class RunSummary:
    pending: int
    written: int = 0
    failed: int = 0
    skipped: int = 0
    interrupted: bool = False
    refused: EndpointRefused | SpendingCapReached | None = None  # why no new call was started
    unwritable: OutputUnwritable | None = None  # the first write that failed for want of space or permission
    rescued: int = 0  # finished rows the output could not take, kept in the rescue file
    lost: int = 0  # finished rows neither the output nor the rescue file could take
    elapsed_s: float = 0.0
    first_errors: list[str] = field(default_factory=list)


def say(text: str) -> None:
    """A line for the user on stderr, flushed at once (cron logs)."""
    print(text, file=sys.stderr, flush=True)


def failures_path(output: Path) -> Path:
    return output.with_name(output.name + ".failed.jsonl")


class _Sink:
    """Where a run's results go: rows to the output (else to the rescue file, for the next run), failures to the
    side file, counts to a tqdm bar on a terminal or a line every `log_every` (cron logs)."""

    def __init__(self, output: Path, summary: RunSummary, stop: asyncio.Event, label: str, settings: Settings):
        self.output, self.summary, self.stop, self.label, self.settings = output, summary, stop, label, settings
        self._out = jsonl.Appender(output)
        self._failures: jsonl.Appender | None = None
        self._rescue: jsonl.Appender | None = None
        self.started = self.shown = time.monotonic()
        bar = settings.progress == "bar" or (settings.progress == "auto" and sys.stderr.isatty())
        self.bar = tqdm(total=summary.pending, desc=label, unit="task", file=sys.stderr) if bar else None

    def write(self, row: dict | None) -> None:
        """A finished task's row; None: nothing to write for it now (e.g. not in an imported batch)."""
        if row is None:
            self.summary.skipped += 1
        else:
            try:
                self._out.append(row)
                self.summary.written += 1
            except OutputUnwritable as exc:
                self.stop_writing(exc)
                try:
                    if self._rescue is None:
                        self._rescue = jsonl.open_rescue(self.output)
                    self._rescue.append(row)
                    self.summary.rescued += 1
                except (OutputUnwritable, OSError):
                    self.summary.lost += 1
        self._progress()

    def failed(self, task, error: str) -> None:
        self.summary.failed += 1
        if len(self.summary.first_errors) < 3:
            self.summary.first_errors.append(f"{task.id}: {error}")
        try:
            if self._failures is None:
                self._failures = jsonl.Appender(failures_path(self.output))
            self._failures.append(
                {"idx": task.id, "stage": self.label, "error": error, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            )
        except OutputUnwritable as exc:
            self.stop_writing(exc)  # the task stays pending all the same: the next run retries it
        self._progress(failed=True)

    def _progress(self, failed: bool = False) -> None:
        summary = self.summary
        if self.bar is not None:
            self.bar.update(1)
            if failed:
                self.bar.set_postfix(failed=summary.failed)
            return
        now = time.monotonic()
        if now - self.shown < self.settings.log_every:
            return
        self.shown = now
        done = summary.written + summary.rescued + summary.lost + summary.failed + summary.skipped
        rate = done / (now - self.started) if now > self.started else 0.0
        say(f"{self.label}: {done}/{summary.pending} finished, {summary.failed} failed, {rate:.2f} tasks/s")

    def stop_writing(self, exc: OutputUnwritable) -> None:
        """As on SIGINT: no new calls; the calls in flight get the grace period."""
        if self.summary.unwritable is None:
            self.summary.unwritable = exc
            say(
                f"{self.label}: cannot write {exc.path} ({exc.error.strerror}): no new calls; "
                f"waiting up to {self.settings.grace:g}s for calls in flight"
            )
        self.stop.set()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self._rescue is not None:
            with contextlib.suppress(OutputUnwritable, OSError):  # the rows are in the file; only their fsync failed
                self._rescue.close()
        if self._failures is not None:
            self._failures.close()
        self._out.close()


async def _worker(next_task, work, client: ChatClient | None, sink: _Sink) -> None:
    while (task := await next_task()) is not None:
        try:
            row = await work(task, client)
        except CallFailed as exc:
            sink.failed(task, str(exc))
        except (EndpointRefused, SpendingCapReached) as exc:
            sink.summary.refused = sink.summary.refused or exc
            sink.stop.set()
            return
        except OutputUnwritable as exc:  # a side file of the work, such as the step cache
            sink.stop_writing(exc)
            return
        else:
            sink.write(row)
        if sink.stop.is_set():
            return


async def _until_done_or_stopped(all_done: asyncio.Future, sink: _Sink) -> None:
    """Wait for the workers; on a stop, the calls in flight get the grace period (none after a second signal)."""
    stop, label, grace_s = sink.stop, sink.label, sink.settings.grace

    def on_signal(signame: str) -> None:
        if stop.is_set():
            all_done.cancel()
            return
        sink.summary.interrupted = True
        say(f"{label}: {signame} received: no new calls; waiting up to {grace_s:g}s for calls in flight")
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([all_done, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        await asyncio.wait([all_done], timeout=grace_s)  # at once when the workers are done
        all_done.cancel()  # calls still in flight after the grace period are abandoned
        with contextlib.suppress(asyncio.CancelledError):
            await all_done
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run(
    tasks: Tasks,
    work: Callable[[Any, ChatClient | None], Awaitable[dict | None]],
    output: Path,
    settings: Settings,
    label: str,
    endpoint: Endpoint | None = None,
    group_of: GroupOf | None = None,
    cap: SpendingCap | None = None,
) -> RunSummary:
    """`work(task, client)` for every task (by `group_of`'s PrefixSchedule, else in order), the client calling
    `endpoint` if any; OutputUnwritable, once the calls in flight finished, if a file could not be written."""
    total, workers = len(tasks), settings.workers
    summary = RunSummary(pending=total)
    jsonl.repair_tail(failures_path(output))  # a side file torn by a kill, even if nothing fails now
    if total == 0:
        return summary
    queue = iter(tasks)
    stop = asyncio.Event()
    schedule = None if group_of is None else PrefixSchedule(queue, group_of, stop, lookahead=max(4096, 4 * workers))

    async def next_task():
        return next(queue, None) if schedule is None else await schedule.next()

    watched = schedule.watching(work) if schedule is not None else work
    sink = _Sink(output, summary, stop, label, settings)
    client = None
    try:
        client = ChatClient(endpoint, AdaptiveLimit(workers), cap) if endpoint is not None else None
        running = [
            asyncio.create_task(_worker(next_task, watched, client, sink)) for _ in range(max(1, min(workers, total)))
        ]
        await _until_done_or_stopped(asyncio.gather(*running), sink)
    finally:
        sink.close()
        if client is not None:
            await client.aclose()
    summary.elapsed_s = time.monotonic() - sink.started
    if summary.unwritable is not None:
        _print_counts(label, summary)
        path, notes = jsonl.rescue_path(output), []
        if summary.rescued:
            notes.append(f"{summary.rescued} finished answers were kept in {path}; the next run adds them first")
        if summary.lost:
            notes.append(f"{summary.lost} finished answers were lost ({path} could not be written either)")
        summary.unwritable.note = "; ".join(notes)
        raise summary.unwritable
    return summary


def _print_counts(stage: str, summary: RunSummary) -> None:
    rate = summary.written / summary.elapsed_s if summary.elapsed_s > 0 else 0.0
    unwritten = summary.rescued + summary.lost
    say(
        f"{stage}: wrote {summary.written} rows, "
        + (f"{unwritten} finished but not written, " if unwritten else "")
        + f"{summary.failed} failed, "
        + (f"{summary.skipped} not in the batch files, " if summary.skipped else "")
        + f"{summary.pending - summary.written - unwritten - summary.failed - summary.skipped} not attempted, "
        f"{summary.elapsed_s:.1f}s ({rate:.2f} tasks/s)"
    )


def finish(stage: str, summary: RunSummary, output: Path) -> int:
    """Print what a run did and return its exit code (raise EndpointRefused if refused)."""
    _print_counts(stage, summary)
    for line in summary.first_errors:
        say(f"{stage}: failed: {line}")
    if summary.failed:
        say(f"{stage}: failures are listed in {failures_path(output)}; rerun to retry them")
    if summary.refused is not None:
        if isinstance(summary.refused, SpendingCapReached):
            say(f"{stage}: {summary.refused}")
            return summary.refused.exit_code
        raise summary.refused
    if summary.interrupted:
        say(f"{stage}: interrupted; rerun the same command to continue")
        return EXIT_INTERRUPTED
    return EXIT_INCOMPLETE if summary.written < summary.pending else EXIT_OK
