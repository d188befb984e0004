"""OpenAI-compatible chat calls: what is retried (the SDK's own retries are off), what fails a call and what stops
the run, each attempt bounded in time and each reply in size, and usage accounting. docs/operations.md holds the
policy ("Errors and retries"), the bounds on a reply and when an endpoint counts as unreachable or hung (exit 69)."""

import asyncio
import contextlib
import email.utils
import functools
import importlib.util
import re
import socket
import ssl
import sys
import time
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from .. import redact
from ..errors import BadInput, CallFailed, ContextTooLong, EndpointRefused, EndpointUnreachable, RetryLater
from . import spending, thinking
from .cost import MAX_TOKEN_COUNT
from .limiter import AdaptiveLimit, Attempt, PacedPastLimit, wall_clock


def _on_first_use(name: str) -> ModuleType:
    """The module `name`, imported when an attribute is first read (importlib's LazyLoader): the SDK and its transports
    take most of a second to import, which a stage that makes no call (a rule judge, --help, nothing to do) skips."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    import aiohttp
    import httpx2
    import openai
else:
    aiohttp, httpx2, openai = map(_on_first_use, ("aiohttp", "httpx2", "openai"))

_CONTEXT_LENGTH = re.compile(  # how an error says the prompt does not fit the model's context, lower case
    "context_length_exceeded|context length|context window|maximum context|context size|too many tokens"
    "|prompt is too long|input is too long"
)
MAX_RETRY_AFTER = 300.0  # the longest one wait a server's Retry-After gets (then the call tries again)
LONG_WAIT_S = 10.0  # a wait the server asks for (Retry-After, a rate limit's pacing) this long or longer is printed
MAX_REPLY_BYTES = 32 * 2**20  # the largest reply body read, on the wire and decompressed: larger is malformed
MAX_FIELD_CHARS = 256  # the reply's model, system_fingerprint and finish_reason are cut to this many characters
CONNECT_TIMEOUT = 10.0  # seconds to open a connection: longer means nothing answers there
UNREACHABLE_TRIES = 3  # connection attempts before an endpoint that never answered counts as unreachable
DEADLINE_MARGIN_S = 0.5  # past --timeout, so that the SDK's own connect and read timeouts say what timed out first
MODELS_PROBE_S = 10.0  # after a first call waited its whole --timeout unanswered, GET /models gets this long (at most)
STILL_WAITING_S = 30.0  # a first reply this late is said to be awaited (a line on stderr, once)
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")  # the body fields a token budget goes in
# how a 400 says a body field is not taken (OpenAI, Azure, pydantic-based servers), lower case
_FIELD_REFUSED_HINTS = ("unsupported", "not supported", "unrecognized", "not permitted", "unknown")
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone UTF-16 surrogate (valid_text)
_usage_warned = False  # usage_dict warns once a run


class Rejected(CallFailed):
    """A request the caller's `final` test marked as rejected for good (no retry): status and text kept."""

    def __init__(self, message: str, status: int | None, text: str):
        super().__init__(message)
        self.status, self.text = status, text


class MalformedReply(Exception):
    """The server answered 2xx with something that is not a chat completion."""


class CallTimedOut(Exception):
    """An attempt that had no complete reply (headers and body) within the endpoint's timeout."""


async def _bound_body(response: "httpx2.Response") -> None:
    encodings = [name.strip().lower() for name in response.headers.get_list("content-encoding", split_commas=True)]
    encodings = [name for name in encodings if name != "identity"]
    unknown = [name for name in encodings if name not in ("gzip", "x-gzip", "deflate")]
    if unknown:
        raise MalformedReply(f"a body in Content-Encoding {', '.join(unknown)}, which was not asked for")
    response.stream = _bounded_stream_type()(response.stream, encodings)
    response.headers.pop("content-encoding", None)  # undone by the stream: httpx must not decode it again


async def _bounded(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    size = 0
    async for piece in pieces:
        size += len(piece)
        if size > MAX_REPLY_BYTES:
            raise MalformedReply(f"a reply body over {MAX_REPLY_BYTES // 2**20} MiB, the most read")
        yield piece


async def _inflated(pieces: AsyncIterator[bytes], encoding: str) -> AsyncIterator[bytes]:
    """`pieces` with one gzip or deflate layer undone, a MiB at a time: a bomb is never inflated whole."""
    inflate = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding != "deflate" else zlib.MAX_WBITS)
    first = True
    async for data in pieces:
        try:
            piece = inflate.decompress(data, 2**20)
        except zlib.error:
            if not (first and encoding == "deflate"):
                raise MalformedReply(f"a {encoding} body that does not decompress") from None
            inflate = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as some servers send it
            piece = inflate.decompress(data, 2**20)
        first = False
        while piece:
            yield piece
            piece = inflate.decompress(inflate.unconsumed_tail, 2**20)


@functools.cache
def _bounded_stream_type() -> type:
    """A reply body of at most MAX_REPLY_BYTES, on the wire and decoded (made on first use: httpx2 loads lazily)."""

    class _BoundedStream(httpx2.AsyncByteStream):
        def __init__(self, stream: "httpx2.AsyncByteStream", encodings: list[str]):
            self.stream, self.encodings = stream, encodings

        async def __aiter__(self):
            body = _bounded(aiter(self.stream))
            for encoding in reversed(self.encodings):
                body = _inflated(body, encoding)
            async for piece in _bounded(body):
                yield piece

        async def aclose(self) -> None:
            await self.stream.aclose()

    return _BoundedStream


@dataclass
class Endpoint:
    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 600.0
    max_retries: int = 6
    max_retry_seconds: float = 900.0
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    params: dict[str, Any] = field(default_factory=dict)  # request body fields
    extra_body: dict[str, Any] = field(default_factory=dict)  # provider-specific fields
    base_url_source: str = "--base-url"  # where base_url came from (a flag or an environment variable), for messages
    # HTTP headers by name, None: never sent (the SDK would otherwise add OPENAI_ORG_ID etc. by itself)
    headers: dict[str, str | None] = field(default_factory=dict, repr=False)
    http_client: str = "aiohttp"  # or "httpx": how requests travel, never what they are (not fingerprinted)
    thinking: str = "separate"  # thinking.MODES: how a reply's thinking is told from its final answer

    OPENAI_URL = "https://api.openai.com/v1"  # not a field: where calls go without a base URL

    @property
    def url(self) -> str:
        """The URL calls go to, always given to the SDK (left None, it would read OPENAI_BASE_URL itself)."""
        return self.base_url or self.OPENAI_URL

    def sdk_options(self) -> dict[str, Any]:
        """openai.(Async)OpenAI's keyword arguments, nothing left to take from the environment; the key is redacted."""
        if not self.api_key and self.base_url is None:
            raise BadInput("no API key: set OPENAI_API_KEY or pass --api-key")
        key = self.api_key or "no-key"  # local servers (vLLM, llama.cpp) take any key
        redact.register(key)
        headers = {name: openai.Omit() if value is None else value for name, value in self.headers.items()}
        return {"api_key": key, "base_url": self.url, "default_headers": {**headers, "Authorization": f"Bearer {key}"}}

    def request_body(self, messages: list[dict], fields: dict | None = None) -> dict:
        params, extra = self.call_fields(fields)
        return {"model": self.model, "messages": messages, **params, **extra}

    def call_fields(self, fields: dict | None) -> tuple[dict, dict]:
        """(params, extra_body) of one call: the endpoint's, with `fields` put into extra_body (None: not sent)."""
        fields = fields or {}
        params = {name: value for name, value in self.params.items() if name not in fields}
        extra = {name: value for name, value in self.extra_body.items() if name not in fields}
        return params, extra | {name: value for name, value in fields.items() if value is not None}

    @property
    def host(self) -> str:
        """The endpoint URL without user:password@ or ?query (which can carry credentials)."""
        return redact.url(self.url)

    @property
    def learned_key(self) -> str:
        """How a manifest's `learned` names this endpoint and model."""
        return f"{self.host} {self.model}"

    @property
    def token_field(self) -> str | None:
        """The body field that carries --max-tokens (TOKEN_FIELDS), None when no budget is sent."""
        return next((name for name in TOKEN_FIELDS if name in self.params), None)

    def use_token_field(self, name: str) -> None:
        current = self.token_field
        if current is not None and current != name:
            self.params = {k: v for k, v in self.params.items() if k != current} | {name: self.params[current]}


@dataclass
class Completion:
    text: str  # the final answer (thinking.separate): content without inline thinking, unless --thinking as-is
    finish_reason: str | None
    usage: dict[str, int]
    latency_s: float | None  # None: not measured (a batch reply)
    attempts: int
    reasoning: str = ""  # message.reasoning_content (or .reasoning), which some servers fill instead of content
    served: dict[str, str] = field(default_factory=dict)  # which model the endpoint says answered (llm.served)
    thinking: str = ""  # the reasoning field and any thinking written inline in content
    thinking_truncated: bool = False  # no final answer: the token limit was reached while thinking


def served(response: Any) -> dict[str, str]:
    """A row's fields for what a reply says answered (a provider may re-point a name: a changed snapshot shows), each
    only when given, cut to MAX_FIELD_CHARS (a server may send megabytes), our key taken out."""
    out = {}
    for name, key in (("response_model", "model"), ("system_fingerprint", "system_fingerprint")):
        value = getattr(response, key, None)
        if isinstance(value, str) and value:
            out[name] = short_field(redact.secrets(value))
    extra = getattr(response, "model_extra", None) or {}
    effort, reasoning = extra.get("reasoning_effort"), extra.get("reasoning")
    if effort is None and isinstance(reasoning, dict):  # as the Responses API and some routers echo it
        effort = reasoning.get("effort")
    if isinstance(effort, str) and effort:
        out["reasoning_effort_applied"] = redact.secrets(valid_text(effort[:40]))
    return out


def status_of(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def _error_code(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    err = body.get("error", body) if isinstance(body, dict) else None
    return str(err.get("code") or err.get("type") or "") if isinstance(err, dict) else ""


def error_text(exc: BaseException) -> str:
    return f"{_error_code(exc)} {exc}"


def context_length_error(status: int | None, text: str) -> bool:
    return status in (400, 413, 422) and _CONTEXT_LENGTH.search(text.lower()) is not None


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, (openai.APIConnectionError, MalformedReply, CallTimedOut, ValueError)):
        return True  # includes timeouts; ValueError: a body that is not JSON
    status = status_of(exc)
    if status == 429:
        return _error_code(exc) != "insufficient_quota"
    return status is not None and (status in (408, 409, 425) or status >= 500)


def retry_after_seconds(exc: BaseException) -> float | None:
    """The wait retry-after-ms or Retry-After asks for; None (back off): none readable, 0, negative or a date past."""
    headers = getattr(getattr(exc, "response", None), "headers", {})
    try:
        if "retry-after-ms" in headers:
            seconds = float(headers["retry-after-ms"]) / 1000
        elif "retry-after" in headers:
            try:
                seconds = float(headers["retry-after"])
            except ValueError:
                seconds = email.utils.parsedate_to_datetime(headers["retry-after"]).timestamp() - time.time()
        else:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if 0 < seconds < float("inf") else None


def _retry_after_said(exc: BaseException) -> str:
    headers = getattr(getattr(exc, "response", None), "headers", {})
    name = "retry-after-ms" if "retry-after-ms" in headers else "Retry-After"
    return f"HTTP {status_of(exc)}, {name}: {redact.printable(str(headers.get(name)))[:60]}"


def connect_failure(exc: BaseException) -> str | None:
    """Why a call never reached a server (refused, unknown host, TLS, connect timeout); None: something answered."""
    reason = None
    seen: BaseException | None = exc
    while seen is not None:
        # The SDK's httpx errors by name, whatever its module is called; over aiohttp they are a coarse mapping (any
        # aiohttp connection error is a ConnectTimeout): then the aiohttp error below decides. aiohttp's errors before
        # the ssl.SSLError they also are: their cause says more.
        httpx_name = "" if isinstance(seen.__cause__, aiohttp.ClientError) else type(seen).__name__
        if isinstance(seen, aiohttp.ConnectionTimeoutError) or httpx_name == "ConnectTimeout":
            return f"no connection within {CONNECT_TIMEOUT:g}s"
        if isinstance(seen, aiohttp.ClientConnectorError) or httpx_name == "ConnectError":
            reason = reason or " ".join(str(seen).split()) or "connection failed"
        elif isinstance(seen, aiohttp.ClientError):
            return reason  # a connection that broke after it was made (a reset, a read timeout)
        elif isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        elif isinstance(seen, socket.gaierror):
            return "unknown host"
        elif isinstance(seen, ssl.SSLError):
            return f"TLS failed ({seen.reason or seen})"
        seen = seen.__cause__ or seen.__context__
    return reason


def _mapped_as_timeout(exc: BaseException) -> bool:
    """A broken connection (a reset) that the SDK's aiohttp transport, mapping every aiohttp error, calls a timeout."""
    if not isinstance(exc, openai.APITimeoutError):
        return False
    cause = exc.__cause__.__cause__ if exc.__cause__ is not None else None
    return isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, aiohttp.ServerTimeoutError)


def _bare_404(exc: BaseException) -> bool:
    """A 404 whose error names no model: no API at that path, or a proxy that lost its way once."""
    return status_of(exc) == 404 and "model" not in error_text(exc).lower()


def describe(exc: BaseException) -> str:
    """A one-line, key-free description of a failed call, its control characters escaped (redact.printable)."""
    status = status_of(exc)
    said = f"HTTP {status}: {exc}" if status else f"{type(exc).__name__}: {exc}"
    if _mapped_as_timeout(exc):
        said = "APIConnectionError: Connection error."  # what the httpx transport says
    return redact.printable(redact.redact(said))[:500]


class ChatClient:
    """Calls one model on one endpoint with the retry policy above."""

    batched = False  # the batch stand-ins (batch.py) answer one call per task; this client any number
    token_field_switched = False  # set on the client once the endpoint refused the --max-tokens field in this run

    def __init__(self, endpoint: Endpoint, limit: AdaptiveLimit | None = None, cap: spending.SpendingCap | None = None):
        self.endpoint, self.limit, self.cap = endpoint, limit, cap
        connections = max(1000, limit.ceiling if limit else 0)  # the SDK's cap, or the ceiling: past 100, calls queue
        transport = openai.DefaultAioHttpClient if endpoint.http_client == "aiohttp" else openai.DefaultAsyncHttpxClient
        self._client = openai.AsyncOpenAI(
            **endpoint.sdk_options(),
            timeout=openai.Timeout(endpoint.timeout, connect=min(endpoint.timeout, CONNECT_TIMEOUT)),
            max_retries=0,
            http_client=transport(
                limits=httpx2.Limits(max_connections=connections, max_keepalive_connections=connections),
                # _heard_from first: it hears of every reply, even one whose body _bound_body refuses
                event_hooks={"response": [self._heard_from, _bound_body]},
                headers={"Accept-Encoding": "gzip, deflate"},
            ),
        )
        self._fallback_wait = wait_exponential_jitter(
            multiplier=endpoint.backoff_initial, max=endpoint.backoff_max, jitter=endpoint.backoff_initial
        )
        self.answered = False  # whether the endpoint has answered a call in this run (an API is there)
        self.heard = False  # whether it has sent the status line and headers of any reply in this run
        self._probe: asyncio.Task[bool] | None = None  # GET /models, asked once when a first call timed out
        self._still_waiting: asyncio.TimerHandle | None = None
        self._announced_until = float("-inf")  # the end of the last long wait said (monotonic)

    def _announce_wait(self, seconds: float, why: str) -> None:
        """Says a wait of LONG_WAIT_S or more on stderr, unless the last one said is still on (many calls wait)."""
        now = time.monotonic()
        if seconds >= LONG_WAIT_S and now >= self._announced_until:
            self._announced_until = now + seconds
            print(f"waiting {seconds:.0f}s, until {wall_clock(seconds)}: {why}", file=sys.stderr, flush=True)

    def _before_sleep(self, state) -> None:
        exc = state.outcome.exception()
        if retry_after_seconds(exc) is not None:
            self._announce_wait(state.upcoming_sleep, f"the endpoint asks so ({_retry_after_said(exc)})")

    def _retry_later(self, wait: str, seconds: float) -> RetryLater:
        return RetryLater(
            f"{self.endpoint.host}{wait}, until {wall_clock(seconds)}: past --max-retry-seconds "
            f"{self.endpoint.max_retry_seconds:g}; run again after then (the rows written are kept)"
        )

    def _unreachable_so_far(self, exc: BaseException) -> bool:
        return not self.answered and connect_failure(exc) is not None

    def _wait(self, state) -> float:
        exc = state.outcome.exception()
        if self._unreachable_so_far(exc):
            return 0.5 * state.attempt_number  # a server still starting gets a moment, a dead one costs seconds
        hinted = retry_after_seconds(exc)
        if hinted is not None:
            return min(hinted, MAX_RETRY_AFTER)
        if isinstance(exc, openai.RateLimitError) and self.limit is not None and self.limit.pacing:
            return 0.0  # the retry waits its turn in the pacing with every other attempt, not a backoff besides
        return self._fallback_wait(state)

    async def _call_once(self, messages: list[dict], fields: dict | None) -> Any:
        if self.cap is None:
            return await self._attempt(messages, fields)
        params, extra = self.endpoint.call_fields(fields)
        body = {**params, **extra}
        reservation = await self.cap.reserve(spending.request_bytes(messages, body), max_tokens_of(body))
        try:
            response = await self._attempt(messages, fields)
        except BaseException:
            self.cap.release(reservation)
            raise
        self.cap.settle(reservation, usage_dict(getattr(response, "usage", None)))
        return response

    async def _attempt(self, messages: list[dict], fields: dict | None) -> Any:
        if self.limit is None:
            return (await self._request(messages, fields))[0]
        max_wait_s = self.endpoint.max_retry_seconds
        tokens = max_tokens_of(self.endpoint.request_body(messages, fields))
        try:
            async with Attempt(self.limit, prompt_chars(messages), tokens, max_wait_s, self._announce_wait) as attempt:
                try:
                    response, headers = await self._request(messages, fields)
                except openai.RateLimitError as exc:
                    # the other calls pause as the server asks, never longer than one wait; not at all when the
                    # run stops for it (a wait past --max-retry-seconds)
                    hinted = retry_after_seconds(exc)
                    if hinted is not None:
                        hinted = None if hinted > max_wait_s else min(hinted, MAX_RETRY_AFTER)
                    attempt.rate_limited(exc.response.headers, hinted)
                    raise
                prompt_tokens = getattr(getattr(response, "usage", None), "prompt_tokens", None)
                attempt.succeeded(headers, prompt_tokens if valid_count(prompt_tokens) else None)
                return response
        except PacedPastLimit as exc:
            raise self._retry_later(f"'s {exc.said} holds the next call {exc.wait_s:.0f}s", exc.wait_s) from None

    async def _request(self, messages: list[dict], fields: dict | None = None) -> tuple[Any, Mapping[str, str]]:
        """The parsed chat completion and the reply's headers, within the deadline for the whole call."""
        if not self.heard and self._still_waiting is None:
            self._still_waiting = asyncio.get_running_loop().call_later(STILL_WAITING_S, self._say_still_waiting)
        params, extra = self.endpoint.call_fields(fields)
        timed_out: Exception
        try:
            async with asyncio.timeout(self.endpoint.timeout + DEADLINE_MARGIN_S) as deadline:
                raw = await self._client.chat.completions.with_raw_response.create(
                    model=self.endpoint.model,
                    # The benchmarks build plain dicts, which the SDK's typed transform of `messages` would only
                    # copy, walking every message and part (a third of a call's CPU at CL-bench sizes): they go
                    # in extra_body, which replaces the body's empty `messages` as it is.
                    messages=[],
                    extra_body={"messages": messages, **extra},
                    **params,
                )
            self.answered = True
            try:
                response = raw.parse()
            except RecursionError:
                raise MalformedReply("a JSON body nested too deep to read") from None
            if isinstance(response, str) or not getattr(response, "choices", None):
                raise MalformedReply(f"not a chat completion: {str(response)[:200]!r}")
            return response, raw.headers
        except openai.APIStatusError as exc:
            self.answered = self.answered or not _bare_404(exc)
            raise
        except aiohttp.ClientResponseError as exc:  # the aiohttp transport passes these on as they are
            raise MalformedReply(f"an invalid HTTP reply: {exc.message}") from None
        except TimeoutError:
            if not deadline.expired():
                raise
            timed_out = CallTimedOut(
                f"no complete reply within {self.endpoint.timeout:g}s (--timeout bounds the whole call)"
            )
        except openai.APITimeoutError as exc:  # the SDK's read timeout: nothing came for --timeout
            if self.answered or _mapped_as_timeout(exc) or connect_failure(exc) is not None:
                raise
            timed_out = exc
        if not self.heard and not await self._answers_models():
            timeout, source = self.endpoint.timeout, self.endpoint.base_url_source
            raise EndpointUnreachable(
                f"{self.endpoint.host} accepted connections but never answered: no reply to a chat call within "
                f"--timeout {timeout:g}s, nor to GET /models within {min(timeout, MODELS_PROBE_S):g}s after it; "
                f"is the server stuck, or is {source} pointing at something that is not an HTTP API? (A server "
                "that is alive but slower than that: raise --timeout.)"
            )
        raise timed_out

    async def _heard_from(self, response: Any) -> None:
        """The HTTP client's response hook: a reply's headers have come (its body may still be on the way)."""
        self.heard = True

    def _say_still_waiting(self) -> None:
        if not self.heard:
            print(
                f"waiting for the first reply from {self.endpoint.host}: none after {STILL_WAITING_S:g}s; a call "
                f"may take up to --timeout {self.endpoint.timeout:g}s (a model served on a CPU can take minutes)",
                file=sys.stderr,
                flush=True,
            )

    async def _answers_models(self) -> bool:
        """Whether the endpoint answers GET /models (headers are enough), asked once for all first calls."""
        if self._probe is None:
            self._probe = asyncio.ensure_future(self._ask_models())
        return await asyncio.shield(self._probe)

    async def _ask_models(self) -> bool:
        bound = min(self.endpoint.timeout, MODELS_PROBE_S)
        with contextlib.suppress(Exception):  # an HTTP error, a timeout, no connection: the headers tell
            async with asyncio.timeout(bound + DEADLINE_MARGIN_S):
                await self._client.models.with_raw_response.list(timeout=bound)
        return self.heard

    async def complete(
        self, messages: list[dict], fields: dict | None = None, final: Callable[[BaseException], bool] | None = None
    ) -> Completion:
        """One chat completion, `fields` overriding the endpoint's (call_fields); Rejected at once if `final(error)`."""
        started = time.monotonic()
        attempts = failures = 0
        sent_field = self.endpoint.token_field

        def give_up(state) -> bool:
            # A 429 is the server asking us to wait, not a failure: only the time cap ends those.
            nonlocal failures
            exc = state.outcome.exception()
            if not isinstance(exc, openai.RateLimitError):
                failures += 1
            spent = time.monotonic() - started
            if self._unreachable_so_far(exc) and (attempts >= UNREACHABLE_TRIES or spent >= CONNECT_TIMEOUT):
                return True
            # a wait the server asks for that would end past the time this call may spend retrying: fail now (past
            # --max-retry-seconds as a whole, the run stops: _failure)
            spent += retry_after_seconds(exc) or 0.0
            return failures > self.endpoint.max_retries or spent >= self.endpoint.max_retry_seconds

        def retryable(exc: BaseException) -> bool:
            stray_404 = self.answered and _bare_404(exc)  # once the endpoint has answered: retried as a 5xx
            return (is_retryable(exc) or stray_404) and not (final is not None and final(exc))

        retrying = AsyncRetrying(
            retry=retry_if_exception(retryable),
            wait=self._wait,
            stop=give_up,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    response = await self._call_once(messages, fields)
        except EndpointRefused:
            raise
        except Exception as exc:
            if final is not None and final(exc):  # the caller's test first: it may take a budget error itself
                raise Rejected(describe(exc), status_of(exc), error_text(exc)) from None
            if self._other_token_field(exc, sent_field, fields):
                return await self.complete(messages, fields, final)
            failure = self._failure(exc, attempts)
            if failure is None:
                raise
            raise failure from None
        return completion_from(response, round(time.monotonic() - started, 3), attempts, self.endpoint.thinking)

    def _other_token_field(self, exc: BaseException, sent: str | None, fields: dict | None) -> bool:
        """Whether a call goes again with --max-tokens in the other field than the refused `sent` (once a run)."""
        if sent is None or any(name in (fields or {}) for name in TOKEN_FIELDS):
            return False
        if not token_field_refused(status_of(exc), error_text(exc), sent):
            return False
        if self.endpoint.token_field != sent:  # another call switched it meanwhile
            return True
        if self.token_field_switched:
            return False  # both fields refused: the error stands
        self.token_field_switched = True
        self.endpoint.use_token_field(next(name for name in TOKEN_FIELDS if name != sent))
        return True

    def _failure(self, exc: BaseException, attempts: int) -> Exception | None:
        """What a call that failed for good raises (docs/operations.md, "Errors and retries"); None: exc as it is."""
        status, url, source = status_of(exc), self.endpoint.host, self.endpoint.base_url_source
        if context_length_error(status, error_text(exc)):
            return ContextTooLong(describe(exc))
        seconds = retry_after_seconds(exc) if is_retryable(exc) else None
        if seconds is not None and seconds > self.endpoint.max_retry_seconds:
            return self._retry_later(f" asks us to wait {seconds:.0f}s ({_retry_after_said(exc)})", seconds)
        if self._unreachable_so_far(exc):
            return EndpointUnreachable(
                f"cannot reach {url}: {connect_failure(exc)}; is the server running, and is {source} right?"
            )
        if _bare_404(exc) and not self.answered:
            path = urllib.parse.urlsplit(url).path.rstrip("/")
            hint = f"check the path in {source}"
            if not path.endswith("/v1"):
                hint = f"the URL may be missing /v1: try {url.rstrip('/')}/v1"
            return EndpointUnreachable(
                f"no OpenAI-compatible API at {url} (HTTP 404 for {path}/chat/completions); {hint}"
            )
        if (
            status in (401, 403)
            or (status == 404 and not (self.answered and _bare_404(exc)))
            or (status == 429 and _error_code(exc) == "insufficient_quota")
        ):
            return EndpointRefused(f"{url} refused model {self.endpoint.model!r}: {describe(exc)}")
        if isinstance(exc, (openai.OpenAIError, MalformedReply, CallTimedOut, ValueError)):
            return CallFailed(f"{describe(exc)} (after {attempts} attempt{'s' if attempts != 1 else ''})")
        return None

    async def aclose(self) -> None:
        if self._still_waiting is not None:
            self._still_waiting.cancel()
        if self._probe is not None:
            self._probe.cancel()
        await self._client.close()


def prompt_chars(messages: list[dict]) -> int:
    """Characters of a request's message contents: with the learned characters per token, its prompt tokens."""
    return sum(len(str(message.get("content") or "")) for message in messages)


def token_field_refused(status: int | None, text: str, sent: str) -> bool:
    """Whether an error says the endpoint does not take the token field `sent` (not that the budget is too large)."""
    lowered = text.lower()
    other = next(name for name in TOKEN_FIELDS if name != sent)
    if status not in (400, 422) or sent not in lowered or "too large" in lowered or context_length_error(status, text):
        return False
    if "response_format" in lowered and other not in lowered:
        return False  # a refused response_format, the request's max_tokens echoed beside it
    return other in lowered or any(hint in lowered for hint in _FIELD_REFUSED_HINTS)


def max_tokens_of(body: dict) -> int:
    """The completion tokens a request reserves (OpenAI counts them against its tokens-per-minute limit)."""
    values = (body.get(name) for name in ("max_completion_tokens", "max_tokens"))
    return next((value for value in values if isinstance(value, int) and value > 0), 0)


def valid_text(text: str) -> str:
    """`text` with any lone UTF-16 surrogate (a JSON \\ud800 escape gives one) replaced by U+FFFD: valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def short_field(text: str) -> str:
    """A reply's short field (model, finish_reason...) as a row keeps it: valid, cut to MAX_FIELD_CHARS with "…"."""
    text = valid_text(text)
    return text if len(text) <= MAX_FIELD_CHARS else text[: MAX_FIELD_CHARS - 1] + "…"


def completion_from(response: Any, latency_s: float | None, attempts: int, mode: str = "separate") -> Completion:
    """Our Completion from the SDK's ChatCompletion (online or batch), our key taken out of every text (echoed)."""
    message, finish_reason = response.choices[0].message, response.choices[0].finish_reason
    content = message.content if message is not None and isinstance(message.content, str) else ""
    extra = getattr(message, "model_extra", None) or {}
    # the field some servers send beside content (vLLM, llama.cpp, DeepSeek; not OpenAI's API)
    said = (extra.get(name, getattr(message, name, None)) for name in ("reasoning_content", "reasoning"))
    reasoning = next((redact.secrets(valid_text(v)) for v in said if isinstance(v, str) and v.strip()), "")
    answer, thought, truncated = thinking.separate(redact.secrets(valid_text(content)), reasoning, finish_reason, mode)
    return Completion(
        text=answer,
        finish_reason=None if finish_reason is None else short_field(redact.secrets(str(finish_reason))),
        usage=usage_dict(response.usage),
        latency_s=latency_s,
        attempts=attempts,
        reasoning=reasoning,
        served=served(response),
        thinking=thought,
        thinking_truncated=truncated,
    )


def valid_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_TOKEN_COUNT


def usage_dict(usage: Any) -> dict[str, Any]:
    """A reply's token counts; numbers that are not counts give {"invalid": {...}} (left out of cost), warned once."""
    global _usage_warned
    if usage is None:
        return {}
    found = {
        "prompt_tokens": getattr(usage, "prompt_tokens", None) or 0,
        "completion_tokens": getattr(usage, "completion_tokens", None) or 0,
        "reasoning_tokens": getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None),
        "cached_tokens": getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None),
    }
    invalid = {name: str(value)[:40] for name, value in found.items() if value is not None and not valid_count(value)}
    if invalid:
        if not _usage_warned:
            _usage_warned = True
            shown = ", ".join(f"{name}={value}" for name, value in invalid.items())
            print(
                f"warning: the endpoint sent usage numbers that are not token counts ({shown}): such calls are "
                "left out of tokens and cost (their rows say usage.invalid)",
                file=sys.stderr,
            )
        return {"invalid": invalid}
    return {name: value for name, value in found.items() if value or name in ("prompt_tokens", "completion_tokens")}
