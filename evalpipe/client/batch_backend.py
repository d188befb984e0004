"""--backend batch: the pending calls through OpenAI's Batch API, each invocation a step of `<output>.batch.json`:
import what finished, submit what is missing, exit 75 while a batch still runs (docs/batch.md)."""

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from ..errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_WAITING,
    BadInput,
    EndpointRefused,
    EndpointUnreachable,
    sigterm_as_interrupt,
)
from ..store import jsonl
from ..store.checkpoint import StepCache
from . import batch, runner
from .llm import connect_failure, describe

MAX_SUBMISSIONS = 3  # a request that failed this many batches is left to the user (side file)


def state_path(output: Path) -> Path:
    return output.with_name(output.name + ".batch.json")


def files_dir(output: Path) -> Path:
    return output.with_name(output.name + ".batches")


class State:
    def __init__(self, output: Path):
        self.path = state_path(output)
        self.batches: list[dict] = []
        self.submissions: dict[str, int] = {}  # custom_id -> batches it was sent in
        if self.path.exists():
            try:
                body = orjson.loads(self.path.read_bytes())
                self.batches, self.submissions = body["batches"], body.get("submissions", {})
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise BadInput(
                    f"unreadable batch state ({exc}); it lists batches you may have paid for: "
                    "repair it rather than deleting it",
                    self.path,
                ) from None

    def save(self) -> None:
        body = {"batches": self.batches, "submissions": self.submissions}
        jsonl.write_json(self.path, body)

    def open_batches(self) -> list[dict]:
        """Batches submitted for this output and not yet imported (none without a state file)."""
        return [b for b in self.batches if not b.get("imported")]


def refuse_other_engines(output: Path, in_batches: list[dict]) -> None:
    """Open Batch API batches hold calls already paid for: no engine but the Batch API's may run them again."""
    if in_batches:
        ids = ", ".join(b.get("id", "(being created)") for b in in_batches)
        raise BadInput(
            f"{len(in_batches)} Batch API batches for {output} are still open ({ids}; see {state_path(output)}): "
            "continue with --backend batch, or cancel them and delete that file to run otherwise"
        )


def advance(job: batch.Job, pending_now: Callable[[], runner.Tasks]) -> int:
    """One or more steps (see the module docstring); returns the stage's exit code."""
    import openai

    sigterm_as_interrupt()  # a stop between steps is a clean stop: the state is saved after each one
    endpoint, label = job.endpoint, job.label
    client = openai.OpenAI(**endpoint.sdk_options(), timeout=endpoint.timeout, max_retries=max(2, endpoint.max_retries))
    state = State(job.output)
    deadline, wait = time.monotonic() + job.settings.batch_wait, job.settings.batch_poll
    changed = True  # the first pass, and every pass after a batch finished: pending tasks may differ
    passes = 0
    try:
        while True:
            passes += 1
            changed |= _collect(job, pending_now, client, state)
            if changed:
                batch.import_files(job, pending_now(), [])
                _submit(job, client, state, pending_now())
                changed = False
            running = state.open_batches()
            if not running or time.monotonic() + wait > deadline:
                break
            time.sleep(wait)
            wait = min(wait * 2, 300.0)
    except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
        raise EndpointRefused(f"the Batch API refused us: {describe(exc)}") from None
    except (openai.APIConnectionError, openai.APIStatusError) as exc:
        if passes == 1 and connect_failure(exc):
            raise EndpointUnreachable(
                f"cannot reach the Batch API at {endpoint.host}: {connect_failure(exc)}; "
                f"is {endpoint.base_url_source} right? (the batch state is saved)"
            ) from None
        status = getattr(exc, "status_code", None)
        if status is not None and status < 500 and status not in (408, 409, 429):
            raise BadInput(f"the Batch API rejected a request: {describe(exc)}") from None
        runner.say(f"{label}: the Batch API did not answer ({describe(exc)}); the state is saved, run again later")
        return EXIT_INCOMPLETE
    if running:
        counts = ", ".join(f"{b['id']} {b.get('status', '?')} ({b['requests']} requests)" for b in running)
        runner.say(f"{label}: submitted, waiting: {counts}; run the same command again to continue")
        return EXIT_WAITING
    if left := pending_now():
        runner.say(
            f"{label}: {len(left)} tasks still without a row: their requests failed in {MAX_SUBMISSIONS} batches "
            f"(see {job.output.name}.failed.jsonl)"
        )
        return EXIT_INCOMPLETE
    return EXIT_OK


def _collect(job: batch.Job, pending_now: Callable[[], runner.Tasks], client, state: State) -> bool:
    """Retrieve open batches; download and import finished ones. True if one finished."""
    finished = False
    for entry in state.open_batches():
        if "id" not in entry and not _adopt(client, entry):
            state.batches.remove(entry)  # uploaded, but no batch was ever created: nothing to wait for
            state.save()
            finished = True  # its requests are free to be submitted again
            continue
        info = client.batches.retrieve(entry["id"])
        entry.update(
            status=info.status, request_counts=info.request_counts.model_dump() if info.request_counts else None
        )
        state.save()
        if info.status not in ("completed", "expired", "cancelled", "failed"):
            continue
        if info.status == "failed":
            entry.update(imported=True, errors=info.errors.model_dump() if info.errors else None)
            state.save()
            errors = (info.errors.data if info.errors else None) or []
            reasons = "; ".join(f"{e.code}: {e.message}" for e in errors) or "no reason given"
            raise BadInput(f"batch {entry['id']} failed validation ({reasons}); fix the cause and run again")
        downloaded = []
        for kind, file_id in (("output", info.output_file_id), ("errors", info.error_file_id)):
            if file_id:
                target = files_dir(job.output) / f"{entry['id']}.{kind}.jsonl"
                if not target.exists():
                    jsonl.atomic_write(target, client.files.content(file_id).read())
                downloaded.append(target)
        entry["files"] = [str(p) for p in downloaded]
        if downloaded:
            summary = batch.import_files(job, pending_now(), downloaded)
            if summary.interrupted or summary.refused:
                state.save()  # not marked imported: the next run imports this batch again, paying nothing
                raise KeyboardInterrupt
            runner.say(
                f"{job.label}: batch {entry['id']} {info.status}: imported {summary.written} rows, "
                f"{summary.failed} failed"
            )
            steps = StepCache.path_for(job.output)
            if steps.exists():  # imported steps reach the disk before the batch counts as imported
                with open(steps, "rb") as f:
                    os.fsync(f.fileno())
        entry["imported"] = True
        state.save()
        finished = True
    return finished


def _adopt(client, entry: dict) -> bool:
    """A crash between upload and saving the batch id: find the batch made from that upload, if any."""
    for info in client.batches.list(limit=100):
        if info.input_file_id == entry["input_file_id"]:
            entry["id"] = info.id
            return True
    return False


def _submit(job: batch.Job, client, state: State, pending: runner.Tasks) -> None:
    in_flight = {line["custom_id"] for entry in state.open_batches() for _, line in jsonl.iter_rows(entry["input"])}
    lines = [
        line
        for line in batch.request_lines(job, pending)
        if line["custom_id"] not in in_flight and state.submissions.get(line["custom_id"], 0) < MAX_SUBMISSIONS
    ]
    if not lines:
        return
    name = f"input-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}.jsonl"
    paths = batch.write_request_files(lines, files_dir(job.output) / name, job.settings)
    for path in paths:
        ids = [line["custom_id"] for _, line in jsonl.iter_rows(path)]
        uploaded = client.files.create(file=(path.name, path.read_bytes()), purpose="batch")
        entry = {
            "input": str(path),
            "input_file_id": uploaded.id,
            "requests": len(ids),
            "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        state.batches.append(entry)
        state.submissions.update((cid, state.submissions.get(cid, 0) + 1) for cid in ids)
        state.save()  # before create: a crash now is found again by its upload, never submitted twice
        try:
            # no SDK retries: a retried create whose first response was lost would make a second batch
            created = client.with_options(max_retries=0).batches.create(
                input_file_id=uploaded.id,
                endpoint=batch.URL,
                completion_window="24h",
                metadata={"evalpipe_output": str(job.output)[-500:]},
            )
        except Exception:
            if not _adopt(client, entry):
                raise  # the entry stays without an id: the next run looks for its batch again, or drops it
            created = client.batches.retrieve(entry["id"])
        entry.update(id=created.id, status=created.status)
        state.save()
        runner.say(f"{job.label}: submitted batch {created.id} with {entry['requests']} requests")
