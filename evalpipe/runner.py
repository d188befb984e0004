"""The bounded-concurrency loop every API-calling stage runs.

pending = selected − done is computed by the stage; this loop calls `work` on each pending
task with at most `workers` calls in flight, appends each finished row at once (one writer:
the event loop), records failures in a side file, shows progress, and stops cleanly on
SIGINT/SIGTERM or when the endpoint refuses us.
"""

import asyncio
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Iterable

from tqdm import tqdm

from . import jsonl
from .errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, CallFailed, EndpointRefused
from .limiter import AdaptiveLimit
from .llm import ChatClient, Endpoint


@dataclass
class RunSummary:
    pending: int
    written: int = 0
    failed: int = 0
    skipped: int = 0
    interrupted: bool = False
    refused: EndpointRefused | None = None
    elapsed_s: float = 0.0
    first_errors: list[str] = field(default_factory=list)


def failures_path(output: Path) -> Path:
    return output.with_name(output.name + ".failed.jsonl")


class _Progress:
    """A tqdm bar on a terminal; a plain line every `every` seconds otherwise (cron logs)."""

    def __init__(self, label: str, total: int, every: float, mode: str = "auto"):
        self.label, self.total, self.every = label, total, every
        self.done = self.failed = 0
        self.started = self.last = time.monotonic()
        bar = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.bar = tqdm(total=total, desc=label, unit="task", file=sys.stderr) if bar else None

    def update(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        if self.bar is not None:
            self.bar.update(1)
            if failed:
                self.bar.set_postfix(failed=self.failed)
            return
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.log()

    def log(self) -> None:
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        print(
            f"{self.label}: {self.done}/{self.total} finished, {self.failed} failed, {rate:.2f} tasks/s",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


async def run(
    tasks: Iterable,
    total: int,
    work: Callable[[object], Awaitable[dict]],
    output: Path,
    *,
    workers: int,
    label: str,
    grace_s: float = 10.0,
    log_every_s: float = 30.0,
    progress: str = "auto",
) -> RunSummary:
    """Run `work(task)` for every task; each task has `.id`. Returns what happened."""
    summary = RunSummary(pending=total)
    jsonl.repair_tail(failures_path(output))  # a side file torn by a kill, even if nothing fails now
    if total == 0:
        return summary
    queue = iter(tasks)
    stop = asyncio.Event()
    progress = _Progress(label, total, log_every_s, progress)
    failures = None
    started = time.monotonic()

    def record_failure(task, error: str) -> None:
        nonlocal failures
        if failures is None:
            failures = jsonl.Appender(failures_path(output))
        failures.append({"idx": task.id, "stage": label, "error": error, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        summary.failed += 1
        if len(summary.first_errors) < 3:
            summary.first_errors.append(f"{task.id}: {error}")

    with jsonl.Appender(output) as out:

        async def worker() -> None:
            for task in queue:
                try:
                    row = await work(task)
                except CallFailed as exc:
                    record_failure(task, str(exc))
                    progress.update(failed=True)
                except EndpointRefused as exc:
                    summary.refused = summary.refused or exc
                    stop.set()
                    return
                else:
                    if row is None:  # nothing to write for this task now (e.g. not in an imported batch)
                        summary.skipped += 1
                    else:
                        out.append(row)
                        summary.written += 1
                    progress.update()
                if stop.is_set():
                    return

        loop = asyncio.get_running_loop()
        running = [asyncio.create_task(worker()) for _ in range(max(1, min(workers, total)))]
        all_done = asyncio.gather(*running)

        def on_signal(signame: str) -> None:
            if stop.is_set():
                all_done.cancel()  # a second signal: abandon in-flight calls now
                return
            summary.interrupted = True
            print(
                f"{label}: {signame} received: no new calls; waiting up to {grace_s:g}s for calls in flight",
                file=sys.stderr,
                flush=True,
            )
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait([all_done, stopper], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not all_done.done():
                _, still_running = await asyncio.wait([all_done], timeout=grace_s)
                if still_running:
                    all_done.cancel()
            try:
                await all_done
            except asyncio.CancelledError:
                pass
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            progress.close()
            if failures is not None:
                failures.close()
    summary.elapsed_s = time.monotonic() - started
    return summary


async def run_with_client(
    label: str,
    endpoint: Endpoint | None,
    pending: list,
    output: Path,
    args,
    work: Callable[[object, ChatClient | None], Awaitable[dict]],
) -> RunSummary:
    """`run` with a client for `endpoint` (None: no API calls) that is closed afterwards.

    The client's requests in flight adapt to 429s below the --workers ceiling.
    """
    client = ChatClient(endpoint, AdaptiveLimit(args.workers)) if endpoint is not None else None
    try:
        return await run(
            pending,
            len(pending),
            lambda task: work(task, client),
            output,
            workers=args.workers,
            label=label,
            grace_s=args.grace,
            log_every_s=args.log_every,
            progress=args.progress,
        )
    finally:
        if client is not None:
            await client.aclose()


def finish(stage: str, summary: RunSummary, output: Path) -> int:
    """Print what a run did and return its exit code (raise EndpointRefused if refused)."""
    rate = summary.written / summary.elapsed_s if summary.elapsed_s > 0 else 0.0
    print(
        f"{stage}: wrote {summary.written} rows, {summary.failed} failed, "
        + (f"{summary.skipped} not in the batch files, " if summary.skipped else "")
        + f"{summary.pending - summary.written - summary.failed - summary.skipped} not attempted, "
        f"{summary.elapsed_s:.1f}s ({rate:.2f} tasks/s)",
        file=sys.stderr,
    )
    for line in summary.first_errors:
        print(f"{stage}: failed: {line}", file=sys.stderr)
    if summary.failed:
        print(f"{stage}: failures are listed in {failures_path(output)}; rerun to retry them", file=sys.stderr)
    if summary.refused is not None:
        raise summary.refused
    if summary.interrupted:
        print(f"{stage}: interrupted; rerun the same command to continue", file=sys.stderr)
        return EXIT_INTERRUPTED
    if summary.written < summary.pending:
        return EXIT_INCOMPLETE
    return EXIT_OK
