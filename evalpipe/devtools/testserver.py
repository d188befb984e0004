"""A scriptable OpenAI-compatible server on loopback, for tests and benchmarks.

It speaks enough HTTP/1.1 (keep-alive, Content-Length or chunked bodies) for the `openai` SDK and
answers POST /v1/chat/completions with whatever its handler returns for each request: an answer, a
delay, an HTTP error with headers (Retry-After), a hang, a connection reset, a malformed or
trickled body, or any bytes at all as the response (an invalid chunked body, say). Run it
in-process (FakeOpenAI, in a background thread) or as `python -m evalpipe.devtools.testserver`
(deterministic answers).

`with_server_kind(kind, handler)` puts a handler behind the `response_format` behaviour of a real
server kind (SERVER_KINDS: enforcing, llama-cpp-python's 500, 2024 llama-server's 500, DeepSeek's
422, rejecting every format with a 400, silently ignoring, an OpenAI reasoning model refusing
`max_tokens`, an older server refusing `max_completion_tokens`); `--server-kind` does the same for the command
line.

`RateLimit(handler, rpm=..., tpm=...)` puts a handler behind OpenAI-style requests- and
tokens-per-minute limits: 429 (with or without Retry-After) when over, x-ratelimit-* headers on
every reply when asked.

It also serves the Files and Batches APIs (/v1/files, /v1/batches) well enough for the SDK's
`client.files` and `client.batches`. Each line of a batch is answered by the same `handler` as an
online call (the Request carries the line's `custom_id`; delay, hang, reset and trickle are
ignored): a 200 reply becomes a line of the output file, any other status a line of the error file
with that status_code and the reply's error body. Output and error file ids stay null when the file
would be empty, and request_counts.completed/failed always equal the lines in those two files.

A batch moves only when it is retrieved (GET /v1/batches/{id}), so tests need no sleeps. With
P = batch_polls_to_finish and n requests, retrieve number k does:

    k = 1        validating -> in_progress, the first n // 2 requests answered
                 (or -> failed with `errors`, when validation fails)
    1 < k < P-1  in_progress, nothing new
    k = P-1 > 1  all requests answered -> finalizing
    k >= P       all requests answered -> completed, output/error files written

(P = 1 goes straight to completed on the first retrieve.) With batch_expire_after = N, only the
first N requests are ever answered and the batch ends `expired` instead, with N lines across the
two files and the rest absent. POST /v1/batches/{id}/cancel turns validating, in_progress or
finalizing into `cancelling`; the next retrieve ends it `cancelled`, with files holding whatever had
been answered (none before the first retrieve, n // 2 after it). The settings are read when a
batch is created.
"""

import argparse
import asyncio
import copy
import dataclasses
import hashlib
import itertools
import json
import math
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from ..benchmarks import Benchmark


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: dict | None
    number: int  # 1-based arrival order
    raw: bytes = field(default=b"", repr=False)  # the body as received
    custom_id: str | None = None  # set when the request is a line of a batch

    @property
    def messages(self) -> list[dict]:
        return (self.body or {}).get("messages", [])

    @property
    def last_content(self) -> str:
        msgs = self.messages
        return str(msgs[-1].get("content", "")) if msgs else ""


@dataclass
class Reply:
    content: str = "ok"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering
    body: bytes | None = None  # raw body instead of a chat completion
    content_type: str = "application/json"
    hang: bool = False  # accept the request and never answer
    reset: bool = False  # drop the connection without answering
    trickle: float = 0.0  # seconds between body chunks of `trickle_bytes`
    trickle_bytes: int = 16
    finish_reason: str = "stop"
    usage: dict | None = None
    reasoning: str | None = None  # sent as message.<reasoning_field> (vLLM, llama.cpp, DeepSeek, routers)
    reasoning_field: str = "reasoning_content"  # or "reasoning" (vLLM's newer name, OpenRouter)
    reasoning_tokens: int | None = None  # sent as usage.completion_tokens_details.reasoning_tokens (also counted
    # in completion_tokens, as OpenAI counts them): hidden reasoning
    cached_tokens: int | None = None  # sent as usage.prompt_tokens_details.cached_tokens (PrefixCache sets it)
    served_model: str | None = None  # the reply's `model` (default: the request's, as most servers echo it)
    system_fingerprint: str | None = None  # sent when set, as OpenAI does
    effort_applied: str | None = None  # sent as the reply's reasoning_effort: the effort a router says it applied
    raw: bytes | None = (
        None  # a whole HTTP response sent as it is (status line, headers, body), then the connection closed
    )

    @classmethod
    def error(cls, status: int, message: str, code: str | None = None, **kw) -> "Reply":
        err = {"message": message, "type": "error", "code": code}
        return cls(status=status, body=json.dumps({"error": err}).encode(), **kw)


def deterministic(request: Request) -> Reply:
    """The default handler: an answer derived from the prompt, the same every time."""
    return Reply(content=f"answer-{digest(request):012x}")


def digest(request: Request) -> int:
    """A number derived from the request's messages, the same every time they are the same."""
    return int(hashlib.sha256(json.dumps(request.messages, sort_keys=True).encode()).hexdigest()[:12], 16)


def example_replies(bench: "Benchmark", delay: float = 0.0) -> Callable[[Request], Reply]:
    """A handler that answers each request as `fakes.example_reply` says a well-formed reply to the benchmark looks
    (an ANSWER line, a judge's JSON), varied by the request and the same for the same request."""
    from .fakes import example_reply  # the benchmarks' modules, only for a server that answers as one

    def answer(request: Request) -> Reply:
        return Reply(content=example_reply(bench, request.last_content, digest(request)), delay=delay)

    return answer


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def completion_body(request: Request, reply: Reply) -> bytes:
    prompt_chars = sum(len(str(m.get("content", ""))) for m in request.messages)
    completion = max(1, len(reply.content) // 4) + (reply.reasoning_tokens or 0)
    usage = reply.usage or {
        "prompt_tokens": max(1, prompt_chars // 4),
        "completion_tokens": completion,
        "total_tokens": max(1, prompt_chars // 4) + completion,
    }
    if reply.reasoning_tokens is not None:
        usage = {**usage, "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens}}
    if reply.cached_tokens is not None:
        usage = {**usage, "prompt_tokens_details": {"cached_tokens": reply.cached_tokens}}
    return json.dumps(
        {
            "id": f"chatcmpl-{request.number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.served_model or (request.body or {}).get("model", "test"),
            **({"system_fingerprint": reply.system_fingerprint} if reply.system_fingerprint else {}),
            **({"reasoning_effort": reply.effort_applied} if reply.effort_applied else {}),
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": reply.content,
                        **({reply.reasoning_field: reply.reasoning} if reply.reasoning is not None else {}),
                    },
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": usage,
        }
    ).encode()


# ---- How servers answer a response_format they do not support (../shared/research/judge.md §2)

# kind → what it does with each response_format type; texts as those servers send them
SERVER_KINDS = {
    "enforcing": "accepts json_schema, json_object and json_object with a schema (OpenAI, vLLM, llama-server)",
    "llama_cpp_python": "json_schema → HTTP 500 with the pydantic text; json_object (+schema) accepted",
    "llama_server_2024": "json_schema → HTTP 500 `response_format type must be one of ...`; json_object accepted",
    "deepseek": "json_schema → HTTP 422 `json_schema is unavailable now`; json_object accepted",
    "rejecting": "every response_format → HTTP 400 `Unrecognized request argument supplied: response_format`",
    "ignoring": "accepts every response_format and ignores it (HTTP 200, nothing enforced)",
    "reasoning": "like enforcing, and max_tokens → HTTP 400 asking for max_completion_tokens (OpenAI o-series)",
    "legacy": "like enforcing, and max_completion_tokens → HTTP 400 `Unrecognized request argument` (older servers)",
}
_LLAMA_CPP_PYTHON_500 = (
    "1 validation error for CreateChatCompletionRequest\nresponse_format.type\n  Input should be 'text' or "
    "'json_object' [type=literal_error, input_value='json_schema', input_type=str]"
)


def format_gate(kind: str, request: Request) -> Reply | None:
    """The rejection a server of `kind` (SERVER_KINDS) answers to this request, or None when it answers normally."""
    if kind not in SERVER_KINDS:
        raise ValueError(f"unknown server kind {kind!r}; one of {sorted(SERVER_KINDS)}")
    body = request.body or {}
    fmt = body.get("response_format")
    kind_of = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "reasoning" and "max_tokens" in body:
        return Reply.error(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "unsupported_parameter",
        )
    if kind == "legacy" and "max_completion_tokens" in body:
        return Reply.error(400, "Unrecognized request argument supplied: max_completion_tokens")
    if kind_of is None or kind in ("enforcing", "ignoring", "reasoning", "legacy"):
        return None
    if kind == "rejecting":
        return Reply.error(400, "Unrecognized request argument supplied: response_format")
    if kind_of != "json_schema":
        return None
    if kind == "llama_cpp_python":
        return Reply(
            status=500,
            body=json.dumps({"error": {"message": _LLAMA_CPP_PYTHON_500, "type": "internal_server_error"}}).encode(),
        )
    if kind == "llama_server_2024":
        text = 'response_format type must be one of "text" or "json_object", but got: json_schema'
        return Reply(
            status=500, body=json.dumps({"error": {"code": 500, "message": text, "type": "server_error"}}).encode()
        )
    return Reply.error(
        422,
        "Failed to deserialize the JSON body into the target type: response_format: "
        "response_format.type `json_schema` is unavailable now",
    )


def with_server_kind(kind: str, handler: Callable[[Request], Reply]) -> Callable[[Request], Reply]:
    """`handler` behind a server of `kind`: its rejections first, else the handler's answer."""

    def gated(request: Request) -> Reply:
        return format_gate(kind, request) or handler(request)

    return gated


def go_duration(seconds: float) -> str:
    """A duration as Go prints one, as OpenAI's reset headers are: 20ms, 1s, 6m0s, 1m30.5s."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def request_tokens(request: Request) -> int:
    """What a request counts against a tokens-per-minute limit: its prompt tokens as completion_body
    estimates them, plus the completion tokens it reserves (max_tokens or max_completion_tokens)."""
    body = request.body or {}
    prompt_chars = sum(len(str(m.get("content", ""))) for m in request.messages)
    reserved = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return max(1, prompt_chars // 4) + (reserved if isinstance(reserved, int) else 0)


class RateLimit:
    """`handler` behind OpenAI-style rate limits: `rpm` requests and `tpm` tokens (request_tokens) a minute.

    Each limit is a bucket that refills continuously (rpm/60 a second) up to `burst_s` seconds of
    its rate, one minute's allowance by default as OpenAI describes its limits. A request is admitted
    when both buckets hold its cost, else answered 429 (with Retry-After and retry-after-ms saying
    when it would be admitted, if `retry_after`). With `headers`, every reply carries OpenAI's
    x-ratelimit-{limit,remaining,reset}-{requests,tokens}: the bucket's size, what is left after this
    request, and a Go duration until full again; with `per_minute_limit`, limit-* says the per-minute
    limit instead of the bucket's size (a token bucket smaller than a minute's allowance, as some
    providers and proxies announce it). The most it can admit in t seconds is burst + rate * t (`allowed`).
    """

    def __init__(
        self,
        handler: Callable[[Request], Reply],
        rpm: float | None = None,
        tpm: float | None = None,
        *,
        burst_s: float = 60.0,
        headers: bool = True,
        retry_after: bool = True,
        per_minute_limit: bool = False,
    ):
        self.handler, self.headers, self.retry_after = handler, headers, retry_after
        self.per_minute_limit = per_minute_limit
        self.burst_s = burst_s
        self.limits = {kind: per_minute / 60 for kind, per_minute in (("requests", rpm), ("tokens", tpm)) if per_minute}
        self.levels = {kind: rate * burst_s for kind, rate in self.limits.items()}
        self.at = time.monotonic()
        self.admitted = self.rejected = self.admitted_tokens = 0
        self._lock = threading.Lock()

    def allowed(self, kind: str, seconds: float) -> float:
        """The most requests or tokens (`kind`) its limit admits in `seconds` from a full bucket (inf: no limit)."""
        rate = self.limits.get(kind)
        return rate * (self.burst_s + seconds) if rate else float("inf")

    def __call__(self, request: Request) -> Reply:
        costs = {"requests": 1, "tokens": request_tokens(request)}
        with self._lock:
            now = time.monotonic()
            for kind, rate in self.limits.items():
                self.levels[kind] = min(rate * self.burst_s, self.levels[kind] + rate * (now - self.at))
            self.at = now
            short = {
                kind: min(costs[kind], rate * self.burst_s) - self.levels[kind]
                for kind, rate in self.limits.items()
                if self.levels[kind] < min(costs[kind], rate * self.burst_s)
            }
            if not short:
                for kind in self.limits:
                    self.levels[kind] -= costs[kind]
                self.admitted += 1
                self.admitted_tokens += costs["tokens"]
            else:
                self.rejected += 1
            announced = self._announced() if self.headers else {}
        if not short:
            reply = self.handler(request)
            return dataclasses.replace(reply, headers={**announced, **reply.headers})
        kind = "requests" if "requests" in short else "tokens"
        wait = max(missing / self.limits[name] for name, missing in short.items())
        if self.retry_after:
            announced.update({"retry-after-ms": str(int(wait * 1000) + 1), "Retry-After": str(max(1, round(wait)))})
        return Reply.error(
            429,
            f"Rate limit reached for {kind} per min. Please try again in {go_duration(wait)}.",
            "rate_limit_exceeded",
            headers=announced,
        )

    def _announced(self) -> dict[str, str]:
        headers = {}
        for kind, rate in self.limits.items():
            size, level = rate * self.burst_s, max(0.0, self.levels[kind])
            headers[f"x-ratelimit-limit-{kind}"] = str(round(rate * 60 if self.per_minute_limit else size))
            headers[f"x-ratelimit-remaining-{kind}"] = str(int(level))
            headers[f"x-ratelimit-reset-{kind}"] = go_duration((size - level) / rate)
        return headers


class FixedWindow:
    """`handler` behind a fixed-window limit: `per_window` requests in each `window_s` window (counted from the
    first request), 429 with Retry-After when over; every reply says x-ratelimit-{limit,remaining,reset}-requests:
    the window's allowance, what is left of it, and a Go duration until the next window."""

    def __init__(self, handler: Callable[[Request], Reply], per_window: int, window_s: float):
        self.handler, self.per_window, self.window_s = handler, per_window, window_s
        self.started: float | None = None
        self.window = -1
        self.used = self.admitted = self.rejected = 0
        self._lock = threading.Lock()

    def allowed(self, seconds: float) -> float:
        """The most requests it admits in `seconds` from the first."""
        return self.per_window * (math.floor(seconds / self.window_s) + 1)

    def __call__(self, request: Request) -> Reply:
        with self._lock:
            now = time.monotonic()
            self.started = now if self.started is None else self.started
            window = int((now - self.started) // self.window_s)
            if window != self.window:
                self.window, self.used = window, 0
            admitted = self.used < self.per_window
            self.used += admitted
            self.admitted += admitted
            self.rejected += not admitted
            reset = self.started + (window + 1) * self.window_s - now
            headers = {
                "x-ratelimit-limit-requests": str(self.per_window),
                "x-ratelimit-remaining-requests": str(self.per_window - self.used),
                "x-ratelimit-reset-requests": go_duration(reset),
            }
        if admitted:
            reply = self.handler(request)
            return dataclasses.replace(reply, headers={**headers, **reply.headers})
        headers.update({"retry-after-ms": str(int(reset * 1000) + 1), "Retry-After": str(max(1, math.ceil(reset)))})
        return Reply.error(429, "Rate limit reached for requests", "rate_limit_exceeded", headers=headers)


class Faults:
    """`handler` behind an overloaded provider: of the chat replies, a share `overloaded` answered 429 with
    Retry-After (an `overloaded_error`, no x-ratelimit-* headers), `errors` HTTP 500 and `resets` a dropped
    connection, drawn from a seeded random generator."""

    def __init__(
        self,
        handler: Callable[[Request], Reply],
        overloaded: float = 0.0,
        errors: float = 0.0,
        resets: float = 0.0,
        retry_after: float = 1.0,
        seed: int = 0,
    ):
        self.handler = handler
        self.overloaded, self.errors, self.resets, self.retry_after = overloaded, errors, resets, retry_after
        self.random = random.Random(seed)
        self.faults = 0
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        with self._lock:
            draw = self.random.random()
        if draw < self.overloaded:
            kind = Reply(
                status=429,
                headers={"Retry-After": f"{self.retry_after:g}"},
                body=json.dumps(
                    {"error": {"message": "The server is overloaded, try again later.", "type": "overloaded_error"}}
                ).encode(),
            )
        elif draw < self.overloaded + self.errors:
            kind = Reply.error(500, "internal server error", "server_error")
        elif draw < self.overloaded + self.errors + self.resets:
            kind = Reply(reset=True)
        else:
            return self.handler(request)
        with self._lock:
            self.faults += 1
        return kind


# ---- Files and Batches: formats and bookkeeping

FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
BATCH_ENDPOINTS = ("/v1/chat/completions",)  # the only endpoint this server answers
FINISHED = ("completed", "failed", "expired", "cancelled")
DAY = 24 * 3600


class ApiError(Exception):
    """An OpenAI-style error answer: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def payload(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return json.dumps(self.payload()).encode()


def parse_multipart(raw: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a multipart/form-data body: name -> (filename, or None for a plain field; value)."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.lower().startswith("multipart/form-data") or not boundary:
        raise ApiError(400, "Expected a multipart/form-data body.")
    fields = {}
    for part in raw.split(b"--" + boundary.group(1).encode())[1:]:
        if part.startswith(b"--"):  # the closing delimiter
            break
        head, _, value = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        disposition = next(
            (
                line
                for line in head.decode("utf-8", "replace").split("\r\n")
                if line.lower().startswith("content-disposition:")
            ),
            "",
        )
        params = dict(re.findall(r'(\w+)="([^"]*)"', disposition))
        if "name" in params:
            fields[params["name"]] = (params.get("filename"), value.removesuffix(b"\r\n"))
    return fields


def parse_batch_input(content: bytes) -> list[dict]:
    """The request lines of a batch input file, or ApiError(400) naming the first bad line."""
    lines, seen = [], set()
    # lines end at "\n" only, as JSONL's do: str.splitlines would also cut at U+2028, which JSON strings may hold
    for number, text in enumerate(content.decode("utf-8", "replace").split("\n"), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError:
            line = None
        if not isinstance(line, dict):
            raise ApiError(400, f"Line {number} of the batch input is not a JSON object.", "invalid_json_line", "file")
        for key, kind in (("custom_id", str), ("method", str), ("url", str), ("body", dict)):
            if not isinstance(line.get(key), kind) or not line[key]:
                raise ApiError(
                    400,
                    f"Line {number} of the batch input needs '{key}' ({kind.__name__}).",
                    "missing_required_parameter",
                    "file",
                )
        if line["method"] != "POST":
            raise ApiError(400, f"Line {number} of the batch input: method must be POST.", "invalid_value", "file")
        if line["custom_id"] in seen:
            raise ApiError(
                400,
                f"Line {number} of the batch input repeats custom_id {line['custom_id']!r}; "
                "custom_id must be unique within a batch.",
                "duplicate_custom_id",
                "file",
            )
        seen.add(line["custom_id"])
        lines.append(line)
    if not lines:
        raise ApiError(400, "The batch input file is empty.", "empty_file", "file")
    return lines


def batch_validation_errors(lines: list[dict], endpoint: str) -> list[dict]:
    """What makes a batch `failed` at validation: a line for another endpoint, or a second model."""
    errors = []
    models = {line["body"].get("model") for line in lines}
    for number, line in enumerate(lines, 1):
        if line["url"] != endpoint:
            errors.append(
                {
                    "code": "invalid_url",
                    "line": number,
                    "param": "url",
                    "message": f"The URL {line['url']!r} does not match the batch endpoint {endpoint!r}.",
                }
            )
    if len(models) > 1:
        errors.append(
            {
                "code": "mismatched_model",
                "line": None,
                "param": "body.model",
                "message": "All requests in a batch must use the same model.",
            }
        )
    return errors


def cursor_page(items: list[dict], query: dict[str, str], default_limit: int) -> dict:
    """One page of a list answer (items already in list order), honouring `limit` and `after`."""
    try:
        limit = int(query.get("limit", default_limit))
    except ValueError:
        limit = 0
    if not 1 <= limit <= max(100, default_limit):
        raise ApiError(400, f"Invalid limit {query.get('limit')!r}.", "invalid_value", "limit")
    if "after" in query:
        ids = [item["id"] for item in items]
        items = items[ids.index(query["after"]) + 1 :] if query["after"] in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def batch_usage(output: list[dict]) -> dict:
    """A batch's `usage`: the token counts of its successful responses, summed."""
    usages = [
        line["response"]["body"].get("usage") or {} for line in output if isinstance(line["response"]["body"], dict)
    ]

    def total(key: str, detail: str | None = None) -> int:
        values = [(u.get(key) or {}).get(detail) if detail else u.get(key) for u in usages]
        return sum(v for v in values if isinstance(v, int))

    input_tokens, output_tokens = total("prompt_tokens"), total("completion_tokens")
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": total("prompt_tokens_details", "cached_tokens")},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": total("completion_tokens_details", "reasoning_tokens")},
        "total_tokens": input_tokens + output_tokens,
    }


@dataclass
class StoredFile:
    info: dict  # the FileObject the API returns
    content: bytes


@dataclass
class BatchJob:
    info: dict  # the Batch object the API returns
    lines: list[dict]
    # settings, as they were when the batch was created
    polls_to_finish: int
    expire_after: int | None
    fail_validation: bool
    report_unexecuted: bool
    polls: int = 0
    answered: int = 0  # lines[:answered] have a line in `output` or `errors`
    output: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)


class PrefixCache:
    """`handler` behind a server's prefix cache (vLLM, SGLang, OpenAI's prompt caching).

    A request reads from the cache the longest run of leading messages (all but its last message)
    that an earlier request sent and that is computed by now: the earlier request was answered
    (arrived, then waited out its delay) with a 200, as a server keeps a prefix only once it has
    computed it; requests sent together all miss. The hit's characters / 4 (tokens as
    completion_body counts them) go out as usage.prompt_tokens_details.cached_tokens, on every 200
    reply (0 on a miss). With `prefill_s_per_token`, a 200 reply also waits that long per uncached
    prompt token on top of the handler's delay, so hits are faster, as on a real server.
    """

    def __init__(self, handler: Callable[[Request], Reply], prefill_s_per_token: float = 0.0):
        self.handler = handler
        self.prefill_s_per_token = prefill_s_per_token
        self.prompt_tokens = self.cached_tokens = 0  # over the 200 replies so far
        self._ready: dict[bytes, float] = {}  # a prefix's digest -> when it is computed (time.monotonic)
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        reply = self.handler(request)
        if reply.status != 200 or reply.body is not None or reply.hang or reply.reset:
            return reply
        messages = request.messages
        sizes = [len(str(m.get("content", ""))) for m in messages]
        digest, prefixes = hashlib.sha256(), []
        for message in messages[:-1]:
            digest.update(json.dumps(message, sort_keys=True).encode())
            prefixes.append(digest.digest())
        prompt = max(1, sum(sizes) // 4)
        now = time.monotonic()
        with self._lock:
            hit = next((k for k in range(len(prefixes), 0, -1) if self._ready.get(prefixes[k - 1], now + 1) <= now), 0)
            cached = min(prompt, sum(sizes[:hit]) // 4)
            delay = reply.delay + (prompt - cached) * self.prefill_s_per_token
            for key in prefixes:
                self._ready[key] = min(self._ready.get(key, now + delay), now + delay)
            self.prompt_tokens += prompt
            self.cached_tokens += cached
        return dataclasses.replace(reply, delay=delay, cached_tokens=cached)


class FakeOpenAI:
    """An OpenAI-compatible server in a background thread; `handler` may be swapped any time."""

    def __init__(
        self,
        handler: Callable[[Request], Reply] = deterministic,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        batch_polls_to_finish: int = 2,
        batch_expire_after: int | None = None,
        batch_fail_validation: bool = False,
        batch_report_unexecuted: bool = False,
        silent: bool = False,
    ):
        self.handler = handler
        self.silent = silent  # accept connections and requests, answer none, not even GET /v1/models
        self.host, self.port = host, port
        # How batches behave (see the module docstring); read when a batch is created.
        self.batch_polls_to_finish = batch_polls_to_finish  # retrieves until a batch is finished
        self.batch_expire_after = batch_expire_after  # answer only this many requests, then `expired`
        self.batch_fail_validation = batch_fail_validation  # every batch ends `failed` at validation
        # Give the requests an expired or cancelled batch never ran an error-file line (response null,
        # error.code batch_expired / batch_cancelled), as OpenAI's API reference describes such lines.
        self.batch_report_unexecuted = batch_report_unexecuted
        self.requests: list[Request] = []
        self._files: dict[str, StoredFile] = {}
        self._batches: dict[str, BatchJob] = {}
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def chat_requests(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def files(self) -> list[dict]:
        """Copies of the stored FileObjects (uploads and batch output/error files), oldest first."""
        with self._lock:
            return [copy.deepcopy(f.info) for f in self._files.values()]

    def file_content(self, file_id: str) -> bytes:
        with self._lock:
            return self._files[file_id].content

    def batches(self) -> list[dict]:
        """Copies of the Batch objects as a retrieve would return them (without advancing), oldest first."""
        with self._lock:
            return [copy.deepcopy(job.info) for job in self._batches.values()]

    # ---- lifecycle

    def start(self) -> "FakeOpenAI":
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._on_connection, self.host, self.port, backlog=2048)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fake-openai", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            assert self._server is not None  # set by serve() before the loop runs
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None  # started by start(), which is what set _loop
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- HTTP

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio.start_server runs each connection's callback in a task
        self._conns.add(task)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    break
                keep_open = await self._respond(request, writer)
                if not keep_open:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | None:
        head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
        if not head:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            raw = await self._read_chunked(reader)
        else:
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = Request(method, path, headers, body, next(self._counter), raw=raw)
        with self._lock:
            self.requests.append(request)
        return request

    async def _respond(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        if self.silent:
            await asyncio.sleep(3600)
            return False
        if not request.path.startswith("/v1/"):  # the API lives under /v1, as on OpenAI and vLLM
            await self._send(writer, 404, {}, b'{"detail": "Not Found"}', "application/json", 0.0)
            return True
        if request.method == "GET" and request.path.rstrip("/").endswith("/models"):
            body = json.dumps({"object": "list", "data": [{"id": "test", "object": "model"}]}).encode()
            await self._send(writer, 200, {}, body, "application/json", 0.0)
            return True
        answer = self._files_and_batches(request)
        if answer is not None:
            status, body, content_type = answer
            await self._send(writer, status, {}, body, content_type, 0.0)
            return True
        if not request.path.endswith("/chat/completions"):
            await self._send(writer, 404, {}, b'{"error": {"message": "not found"}}', "application/json", 0.0)
            return True
        reply = self.handler(request)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.hang:
            await asyncio.sleep(3600)
            return False
        if reply.reset:
            writer.transport.abort()
            return False
        if reply.raw is not None:
            writer.write(reply.raw)
            await writer.drain()
            return False
        body = reply.body if reply.body is not None else completion_body(request, reply)
        await self._send(
            writer, reply.status, reply.headers, body, reply.content_type, reply.trickle, reply.trickle_bytes
        )
        return True

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        chunks: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                return b"".join(chunks)
            chunks.append((await reader.readexactly(size + 2))[:-2])

    async def _send(
        self, writer, status: int, headers: dict, body: bytes, content_type: str, trickle: float, chunk: int = 16
    ) -> None:
        head = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        head += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if trickle:
            for i in range(0, len(body), chunk):
                writer.write(body[i : i + chunk])
                await writer.drain()
                await asyncio.sleep(trickle)
        else:
            writer.write(body)
        await writer.drain()

    # ---- Files and Batches
    # Everything here runs on the server's event loop, the only writer of _files and _batches; the
    # lock guards writes against readers on other threads and is never held while `handler` runs.

    def _files_and_batches(self, request: Request) -> tuple[int, bytes, str] | None:
        """The answer (status, body, content type) to a Files or Batches call; None for other paths."""
        url = urlsplit(request.path)
        parts = url.path.strip("/").split("/")
        if parts[:1] == ["v1"]:
            parts = parts[1:]
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            match [request.method, *parts]:
                case ["POST", "files"]:
                    answer = self._upload(request)
                case ["GET", "files"]:
                    answer = self._list_files(query)
                case ["GET", "files", file_id]:
                    answer = self._stored_file(file_id).info
                case ["GET", "files", file_id, "content"]:
                    return 200, self._stored_file(file_id).content, "application/octet-stream"
                case ["DELETE", "files", file_id]:
                    self._stored_file(file_id)
                    with self._lock:
                        del self._files[file_id]
                    answer = {"id": file_id, "object": "file", "deleted": True}
                case ["POST", "batches"]:
                    answer = self._create_batch(request.body)
                case ["GET", "batches"]:
                    with self._lock:
                        newest_first = [job.info for job in reversed(self._batches.values())]
                    answer = cursor_page(newest_first, query, default_limit=20)
                case ["GET", "batches", batch_id]:
                    job = self._batch_job(batch_id)
                    self._advance(job)
                    answer = job.info
                case ["POST", "batches", batch_id, "cancel"]:
                    answer = self._cancel(self._batch_job(batch_id))
                case _:
                    return None
            body = json.dumps(answer).encode()
        except ApiError as error:
            return error.status, error.body(), "application/json"
        except Exception as exc:  # a bug here, or in a test's handler: answer rather than drop the connection
            return 500, ApiError(500, f"FakeOpenAI failed: {exc!r}").body(), "application/json"
        return 200, body, "application/json"

    def _stored_file(self, file_id: str) -> StoredFile:
        if file_id not in self._files:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return self._files[file_id]

    def _batch_job(self, batch_id: str) -> BatchJob:
        if batch_id not in self._batches:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param="id")
        return self._batches[batch_id]

    def _store_file(self, filename: str, purpose: str, content: bytes) -> dict:
        now = int(time.time())
        file_id = new_id("file-")
        info = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": now,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": now + 30 * DAY if purpose.startswith("batch") else None,
        }
        with self._lock:
            self._files[file_id] = StoredFile(info, content)
        return info

    def _upload(self, request: Request) -> dict:
        fields = parse_multipart(request.raw, request.headers.get("content-type", ""))
        purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace")
        filename, content = fields.get("file", (None, b""))
        if filename is None:
            raise ApiError(400, "Missing required parameter: 'file'.", "missing_required_parameter", "file")
        if purpose not in FILE_PURPOSES:
            raise ApiError(
                400,
                f"Invalid purpose {purpose!r}; expected one of {', '.join(FILE_PURPOSES)}.",
                "invalid_value",
                "purpose",
            )
        if purpose == "batch":
            if not filename.endswith(".jsonl"):
                raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", "invalid_file_format", "file")
            parse_batch_input(content)
        return self._store_file(filename, purpose, content)

    def _list_files(self, query: dict[str, str]) -> dict:
        with self._lock:
            items = [f.info for f in self._files.values() if query.get("purpose") in (None, f.info["purpose"])]
        if query.get("order", "desc") == "desc":
            items.reverse()
        return cursor_page(items, query, default_limit=10000)

    def _create_batch(self, body: dict | None) -> dict:
        body = body if isinstance(body, dict) else {}
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        metadata = body.get("metadata")
        if not isinstance(file_id, str) or not file_id:
            raise ApiError(
                400, "Missing required parameter: 'input_file_id'.", "missing_required_parameter", "input_file_id"
            )
        if endpoint not in BATCH_ENDPOINTS:
            raise ApiError(
                400,
                f"Unsupported endpoint {endpoint!r}; this server batches only {', '.join(BATCH_ENDPOINTS)}.",
                "invalid_value",
                "endpoint",
            )
        if body.get("completion_window") != "24h":
            raise ApiError(
                400,
                f"Invalid completion_window {body.get('completion_window')!r}; only '24h' is supported.",
                "invalid_value",
                "completion_window",
            )
        if metadata is not None and not isinstance(metadata, dict):
            raise ApiError(400, "metadata must be an object.", "invalid_type", "metadata")
        stored = self._files.get(file_id)
        if stored is None:
            raise ApiError(400, f"Input file {file_id!r} not found.", "invalid_value", "input_file_id")
        if stored.info["purpose"] != "batch":
            raise ApiError(
                400, f"Input file {file_id!r} was not uploaded with purpose 'batch'.", "invalid_value", "input_file_id"
            )
        lines = parse_batch_input(stored.content)
        now = int(time.time())
        info = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": endpoint,
            "model": lines[0]["body"].get("model"),
            "errors": None,
            "input_file_id": file_id,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + DAY,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},  # counted once validated
            "metadata": metadata,
            "usage": batch_usage([]),
        }
        job = BatchJob(
            info,
            lines,
            max(1, self.batch_polls_to_finish),
            self.batch_expire_after,
            self.batch_fail_validation,
            self.batch_report_unexecuted,
        )
        with self._lock:
            self._batches[info["id"]] = job
        return info

    def _cancel(self, job: BatchJob) -> dict:
        status = job.info["status"]
        if status in FINISHED:
            raise ApiError(409, f"Cannot cancel a batch with status '{status}'.")
        if status != "cancelling":
            with self._lock:
                job.info.update(status="cancelling", cancelling_at=int(time.time()))
        return job.info

    def _advance(self, job: BatchJob) -> None:
        """One retrieve's worth of progress, as scheduled in the module docstring."""
        status, total = job.info["status"], len(job.lines)
        if status in FINISHED:
            return
        job.polls += 1
        now = int(time.time())
        if status == "cancelling":
            self._finish(job, now)
            return
        if status == "validating":
            problems = batch_validation_errors(job.lines, job.info["endpoint"])
            if job.fail_validation:
                problems.append(
                    {
                        "code": "invalid_request",
                        "line": None,
                        "param": None,
                        "message": "Validation failed (FakeOpenAI batch_fail_validation is set).",
                    }
                )
            with self._lock:
                if problems:
                    job.info.update(status="failed", failed_at=now, errors={"object": "list", "data": problems})
                    return
                job.info.update(
                    status="in_progress",
                    in_progress_at=now,
                    request_counts={"total": total, "completed": 0, "failed": 0},
                )
            if job.polls < job.polls_to_finish:
                self._answer_lines(job, total // 2)
                return
        if job.polls >= job.polls_to_finish:
            self._answer_lines(job, total)
            self._finish(job, now)
        elif job.polls == job.polls_to_finish - 1:
            self._answer_lines(job, total)
            if job.answered == total:
                with self._lock:
                    job.info.update(status="finalizing", finalizing_at=now)

    def _answer_lines(self, job: BatchJob, upto: int) -> None:
        """Answers lines[answered:upto] (never past batch_expire_after) with the handler."""
        if job.expire_after is not None:
            upto = min(upto, job.expire_after)
        answers = [self._answer_line(line) for line in job.lines[job.answered : upto]]
        with self._lock:
            for succeeded, answer in answers:
                (job.output if succeeded else job.errors).append(answer)
            job.answered = max(job.answered, upto)
            self._count(job)

    def _answer_line(self, line: dict) -> tuple[bool, dict]:
        """(succeeded, output line) for one request line, in OpenAI's batch output format."""
        request = Request(
            "POST",
            line["url"],
            {},
            line["body"],
            next(self._counter),
            raw=json.dumps(line["body"]).encode(),
            custom_id=line["custom_id"],
        )
        reply = self.handler(request)
        if reply.body is not None:
            try:
                body = json.loads(reply.body)
            except ValueError:
                body = reply.body.decode("utf-8", "replace")
        elif reply.status == 200:
            body = json.loads(completion_body(request, reply))
        else:
            body = ApiError(reply.status, _REASONS.get(reply.status, "Error")).payload()
        response = {"status_code": reply.status, "request_id": new_id("req_"), "body": body}
        return reply.status == 200, {
            "id": new_id("batch_req_"),
            "custom_id": line["custom_id"],
            "response": response,
            "error": None,
        }

    def _count(self, job: BatchJob) -> None:
        job.info["request_counts"] = {
            "total": job.info["request_counts"]["total"],
            "completed": len(job.output),
            "failed": len(job.errors),
        }
        job.info["usage"] = batch_usage(job.output)

    def _finish(self, job: BatchJob, now: int) -> None:
        """Ends a batch completed, expired or cancelled, writing its output and error files."""
        if job.info["status"] == "cancelling":
            status, unexecuted_code = "cancelled", "batch_cancelled"
        elif job.answered < len(job.lines):
            status, unexecuted_code = "expired", "batch_expired"
        else:
            status, unexecuted_code = "completed", None
        unexecuted = []
        if unexecuted_code and job.report_unexecuted and job.info["in_progress_at"] is not None:
            message = (
                "This request could not be executed before the completion window expired."
                if status == "expired"
                else "The batch was cancelled before this request was executed."
            )
            unexecuted = [
                {
                    "id": new_id("batch_req_"),
                    "custom_id": line["custom_id"],
                    "response": None,
                    "error": {"code": unexecuted_code, "message": message},
                }
                for line in job.lines[job.answered :]
            ]
        with self._lock:
            job.errors.extend(unexecuted)
            self._count(job)
        files = {}
        for kind, lines in (("output", job.output), ("error", job.errors)):
            if lines:
                content = "".join(json.dumps(line) + "\n" for line in lines).encode()
                files[kind] = self._store_file(f"{job.info['id']}_{kind}.jsonl", "batch_output", content)["id"]
        with self._lock:
            job.info.update(status=status, output_file_id=files.get("output"), error_file_id=files.get("error"))
            job.info[f"{status}_at"] = now
            if status == "completed" and job.info["finalizing_at"] is None:
                job.info["finalizing_at"] = now


def main() -> None:
    parser = argparse.ArgumentParser(description="A deterministic OpenAI-compatible test server on loopback.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument(
        "--bench",
        help="answer as a well-formed reply to this benchmark looks (devtools/fakes.py; default: free text, which "
        "a rule-graded benchmark reads as unparsed)",
    )
    parser.add_argument(
        "--server-kind",
        choices=sorted(SERVER_KINDS),
        default="enforcing",
        help="how it answers a response_format: " + "; ".join(f"{k}: {v}" for k, v in SERVER_KINDS.items()),
    )
    args = parser.parse_args()

    def delayed(request: Request) -> Reply:
        reply = deterministic(request)
        reply.delay = args.delay
        return reply

    handler: Callable[[Request], Reply] = delayed
    if args.bench is not None:
        from .. import benchmarks

        if args.bench not in benchmarks.REGISTRY:
            parser.error(f"--bench {args.bench}: one of {', '.join(benchmarks.REGISTRY)}")
        handler = example_replies(benchmarks.get(args.bench), args.delay)
    server = FakeOpenAI(with_server_kind(args.server_kind, handler), port=args.port).start()
    print(f"OPENAI_BASE_URL={server.base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
