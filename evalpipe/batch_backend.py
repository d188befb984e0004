"""--backend batch: run the pending calls through OpenAI's Batch API, one step per invocation.

Each invocation (from cron, or by hand) advances a state file beside the output,
`<output>.batch.json`:
  1. every batch not yet imported is retrieved; a finished one (completed, expired, cancelled,
     failed) has its output and error files downloaded next to the state file and imported;
  2. the calls still missing (including the next call of chained tasks, and whatever an expired
     or cancelled batch left undone) are uploaded as new batches — the state file records each
     upload before the batch is created and each batch id right after, so a crash at any point
     never submits the same calls twice;
  3. the stage exits EXIT_WAITING (75) while any batch is still running, else as an online run.
With --batch-wait S it keeps polling (with backoff from --batch-poll) for up to S seconds.
"""

import sys
import time
from pathlib import Path
from typing import Callable

import orjson

from . import batch, jsonl, redact
from .errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_WAITING, BadInput, EndpointRefused
from .llm import Endpoint

FINISHED = {"completed", "expired", "cancelled", "failed"}


def state_path(output: Path) -> Path:
    return output.with_name(output.name + ".batch.json")


def files_dir(output: Path) -> Path:
    return output.with_name(output.name + ".batches")


class State:
    def __init__(self, output: Path):
        self.path = state_path(output)
        self.batches: list[dict] = []
        if self.path.exists():
            try:
                self.batches = orjson.loads(self.path.read_bytes())["batches"]
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise BadInput(f"unreadable batch state ({exc}); it lists batches you may have paid for: "
                               "repair it rather than deleting it", self.path) from None

    def save(self) -> None:
        jsonl.atomic_write(self.path, orjson.dumps({"batches": self.batches}, option=orjson.OPT_INDENT_2) + b"\n")

    def open_batches(self) -> list[dict]:
        return [b for b in self.batches if not b.get("imported")]


def _client(endpoint: Endpoint, args):
    import openai

    key = endpoint.api_key
    if not key:
        if endpoint.base_url is None:
            raise BadInput("no API key: set OPENAI_API_KEY or pass --api-key")
        key = "no-key"
    redact.register(key)
    return openai.OpenAI(api_key=key, base_url=endpoint.base_url, timeout=endpoint.timeout, max_retries=max(2, args.max_retries))


def _refused(exc) -> EndpointRefused:
    return EndpointRefused(redact.redact(f"the Batch API refused us: {type(exc).__name__}: {exc}")[:500])


def advance(
    label: str,
    pending_now: Callable[[], list],
    work: batch.Work,
    endpoint: Endpoint | None,
    output: Path,
    args,
) -> int:
    """One or more steps (see the module docstring); returns the stage's exit code."""
    if endpoint is None:
        raise BadInput(f"{label} makes no API calls for this benchmark: run it without --backend batch")
    import openai

    client = _client(endpoint, args)
    state = State(output)
    deadline = time.monotonic() + args.batch_wait
    wait = args.batch_poll
    incomplete = False
    try:
        while True:
            incomplete |= _collect(label, client, state, pending_now, work, endpoint, output, args)
            _submit(label, client, state, pending_now(), work, endpoint, output, args)
            running = state.open_batches()
            if not running or time.monotonic() + wait > deadline:
                break
            time.sleep(wait)
            wait = min(wait * 2, 300.0)
    except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
        raise _refused(exc) from None
    if running:
        counts = ", ".join(f"{b['id']} {b.get('status', '?')} ({b['requests']} requests)" for b in running)
        print(f"{label}: submitted, waiting: {counts}; run the same command again to continue", file=sys.stderr)
        return EXIT_WAITING
    left = pending_now()
    if left:
        print(f"{label}: {len(left)} tasks still without a row (see {output.name}.failed.jsonl)", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def _collect(label, client, state: State, pending_now, work, endpoint, output, args) -> bool:
    """Retrieve open batches; download and import finished ones. True if an import left failures."""
    incomplete = False
    for entry in state.open_batches():
        if "id" not in entry and not _adopt(client, entry):
            state.batches.remove(entry)  # uploaded, but no batch was ever created: nothing to wait for
            state.save()
            continue
        info = client.batches.retrieve(entry["id"])
        entry["status"] = info.status
        entry["request_counts"] = info.request_counts.model_dump() if info.request_counts else None
        state.save()
        if info.status not in FINISHED:
            continue
        downloaded = []
        for kind, file_id in (("output", info.output_file_id), ("errors", info.error_file_id)):
            if file_id:
                target = files_dir(output) / f"{entry['id']}.{kind}.jsonl"
                if not target.exists():
                    jsonl.atomic_write(target, client.files.content(file_id).read())
                downloaded.append(target)
        entry["files"] = [str(p) for p in downloaded]
        if info.status == "failed":
            errors = info.errors.model_dump() if info.errors else {}
            entry["errors"] = errors
            print(f"{label}: batch {entry['id']} failed: {errors}", file=sys.stderr)
        if downloaded:
            summary = batch.import_files(label, pending_now(), work, endpoint, downloaded, output, args)
            incomplete |= summary.failed > 0
            print(f"{label}: batch {entry['id']} {info.status}: imported {summary.written} rows, "
                  f"{summary.failed} failed", file=sys.stderr)
        entry["imported"] = True
        state.save()
    return incomplete


def _adopt(client, entry: dict) -> bool:
    """A crash between upload and saving the batch id: find the batch made from that upload, if any."""
    for info in client.batches.list(limit=100):
        if info.input_file_id == entry["input_file_id"]:
            entry["id"] = info.id
            return True
    return False


def _submit(label, client, state: State, pending: list, work, endpoint, output, args) -> None:
    in_flight = set()
    for entry in state.open_batches():
        for _, line in jsonl.iter_rows(entry["input"]):
            in_flight.add(line["custom_id"])
    lines = [line for line in batch.request_lines(pending, work, endpoint) if line["custom_id"] not in in_flight]
    if not lines:
        return
    folder = files_dir(output)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    paths = batch.write_request_files(lines, folder / f"input-{stamp}.jsonl", args.batch_max_requests, args.batch_max_bytes)
    for path in paths:
        uploaded = client.files.create(file=(path.name, path.read_bytes()), purpose="batch")
        entry = {"input": str(path), "input_file_id": uploaded.id, "requests": sum(1 for _ in jsonl.iter_rows(path)),
                 "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        state.batches.append(entry)
        state.save()  # before create: a crash now is found again by its upload, never submitted twice
        created = client.batches.create(
            input_file_id=uploaded.id, endpoint=batch.URL, completion_window="24h",
            metadata={"evalpipe_output": str(output)[-500:]},
        )
        entry.update(id=created.id, status=created.status)
        state.save()
        print(f"{label}: submitted batch {created.id} with {entry['requests']} requests", file=sys.stderr)
