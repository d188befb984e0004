"""Batch engines: pending calls out as OpenAI batch request files, batch output files back in (docs/batch.md).
Both run the benchmark's own code against a stand-in client, so request lines and rows are exactly an online
run's; a custom_id covers the request body's sha256, so an answer only ever lands on the request it answers."""

import asyncio
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .. import redact
from ..errors import BadInput, CallFailed, ContextTooLong
from ..store import jsonl
from . import runner
from .llm import Completion, Endpoint, completion_from, context_length_error

URL = "/v1/chat/completions"


def custom_id(task_id, body: dict) -> str:
    digest = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    return f"{task_id}~{digest}"


class _Unanswered(Exception):
    """A call the stand-in client does not answer: with its request line when exporting, bare when importing."""


def request_lines(job: "Job", pending: runner.Tasks) -> list[dict]:
    """The next call of every pending task that needs one (tasks done without a call need none)."""
    lines = []

    async def capture() -> None:
        for task in pending:
            try:
                await job.work(task, BatchClient(job.endpoint, task.id))
            except _Unanswered as call:
                lines.append(call.args[0])

    asyncio.run(capture())
    return lines


def write_request_files(lines: list[dict], path: Path, settings: runner.Settings) -> list[Path]:
    """Write `lines` to `path`, or to `<stem>-001<suffix>`, `-002`, ... when they exceed a file's limits."""
    max_requests, max_bytes = settings.batch_max_requests, settings.batch_max_bytes
    parts: list[list[bytes]] = [[]]
    size = 0
    for line in lines:
        data = orjson.dumps(line) + b"\n"
        if len(data) > max_bytes:
            raise BadInput(
                f"request {line['custom_id']} alone is {len(data):,} bytes, over the {max_bytes:,}-byte file limit"
            )
        if parts[-1] and (len(parts[-1]) >= max_requests or size + len(data) > max_bytes):
            parts.append([])
            size = 0
        parts[-1].append(data)
        size += len(data)
    numbered = [path.with_name(f"{path.stem}-{i:03d}{path.suffix}") for i in range(1, len(parts) + 1)]
    targets = [path] if len(parts) == 1 else numbered
    for target, part in zip(targets, parts):
        jsonl.atomic_write(target, b"".join(part))
    return targets


@dataclass(frozen=True)
class Job:
    """What the batch engines (export, import, the Batch API's) are given of a stage's job."""

    label: str  # "infer", "judge", "error analysis"
    work: Callable[[Any, Any], Awaitable[dict | None]]  # work(task, client) on a task, known here by its `.id`
    endpoint: Endpoint
    output: Path
    settings: runner.Settings
    current: Callable[[], dict] | None = None  # the output's latest rows, when a pending task can have one


def export(job: Job, pending: runner.Tasks, path: Path) -> int:
    lines = request_lines(job, pending)
    if not lines:
        runner.say(f"{job.label}: no pending task needs a call; nothing exported")
        return 0
    files = write_request_files(lines, path, job.settings)
    runner.say(
        f"{job.label}: exported {len(lines)} requests to {', '.join(map(str, files))}; "
        f"{len(pending) - len(lines)} pending tasks need no call now (import writes them)"
    )
    return 0


def _ok(row: dict | None) -> bool:
    response = (row or {}).get("response")
    return isinstance(response, dict) and response.get("status_code") == 200


class BatchClient:
    """llm.ChatClient's stand-in, sending nothing: a call becomes a request line or, given `results`, is answered."""

    batched = True  # one call per task: a batch cannot answer a second attempt

    def __init__(self, endpoint: Endpoint, task_id, results: dict[str, dict] | None = None):
        self.endpoint, self.task_id, self.results = endpoint, task_id, results

    async def complete(self, messages: list[dict], fields: dict | None = None, final=None) -> Completion:
        body = self.endpoint.request_body(messages, fields)
        if self.results is None:
            raise _Unanswered({"custom_id": custom_id(self.task_id, body), "method": "POST", "url": URL, "body": body})
        row = self.results.get(custom_id(self.task_id, body))
        if row is None:
            raise _Unanswered()  # not in the imported files
        response = row.get("response") or {}
        if _ok(row):
            from openai.types.chat import ChatCompletion

            try:
                reply = ChatCompletion.model_validate(response.get("body"))
            except ValueError as exc:
                raise CallFailed(f"batch output line for {row['custom_id']} is not a chat completion ({exc})") from None
            if not reply.choices:
                raise CallFailed(f"batch output line for {row['custom_id']} has no choices")
            return completion_from(reply, None, 1, self.endpoint.thinking)
        status, reply_body, reasons = response.get("status_code"), response.get("body"), []
        # OpenAI's {"error": {code, message}} in the body or beside it, or vLLM's plain strings
        for value in (reply_body.get("error") if isinstance(reply_body, dict) else reply_body, row.get("error")):
            if isinstance(value, dict):
                reasons.append(f"{value.get('code') or ''} {value.get('message') or ''}".strip())
            elif value:
                reasons.append(str(value))
        text = redact.redact(" · ".join(r for r in reasons if r) or "no error message")
        if context_length_error(status, text):
            raise ContextTooLong(f"HTTP {status}: {text}"[:500])
        raise CallFailed(f"batch: {'HTTP ' + str(status) if status else 'not run'}: {text}"[:500])


# The key that marks a row's call as served by a batch engine (priced with the table's batch_discount).
BATCH_FLAG = {"infer": "batch", "judge": "judge_batch", "error analysis": "analysis_batch"}


def import_files(job: Job, pending: runner.Tasks, paths: list[Path]) -> runner.RunSummary:
    """Write the rows the batch results complete, exactly as an online run would."""
    redact.register(job.endpoint.api_key)
    results: dict[str, dict] = {}  # custom_id → its line, from output and error files in any order
    for path in paths:
        if not Path(path).exists():
            raise BadInput("no such batch file", path)
        for line_no, row in jsonl.iter_rows(path):
            cid = row.get("custom_id")
            if not isinstance(cid, str) or ("response" not in row and "error" not in row):
                raise BadInput(
                    "not a batch output or error line (needs custom_id and response or error)", path, line_no
                )
            if not _ok(results.get(cid)) or _ok(row):  # an answer is never replaced by an error line
                results[cid] = row
    side = runner.failures_path(job.output)
    side_rows = jsonl.iter_rows(side, torn_tail_ok=True) if side.exists() else []
    recorded = {(r.get("idx"), r.get("error")) for _, r in side_rows}
    latest = job.current() if job.current is not None else None

    async def replay(task, _client) -> dict | None:
        try:
            row = await job.work(task, BatchClient(job.endpoint, task.id, results))
            if row is not None:
                row[BATCH_FLAG[job.label]] = True
            if latest is not None and row == latest.get(task.id):
                return None  # the same row from the same batch line is there already
            return row
        except _Unanswered:
            return None
        except CallFailed as exc:
            if (task.id, str(exc)) in recorded:
                return None  # this failure is in the side file already: importing again changes nothing
            raise

    if paths:
        runner.say(f"{job.label}: importing {len(results)} batch results for {len(pending)} pending tasks")
    return asyncio.run(runner.run(pending, replay, job.output, dataclasses.replace(job.settings, workers=1), job.label))
