"""OpenAI-compatible chat calls: one retry policy, error classes and usage accounting.

The SDK's own retries are turned off; this module decides what is retried:
  429            wait as the server's Retry-After says (else back off), retry
  5xx, 408, 409, timeouts, connection errors, malformed bodies
                 capped exponential backoff with jitter, retry
  400/413 context length exceeded
                 ContextTooLong: final, the task gets a row with an empty answer
  other 400/422  CallFailed at once (not retried in this run, retried next run)
  401/403/404, 429 insufficient_quota
                 EndpointRefused: the whole run stops
Retries are capped in count (max_retries; 429s do not count, the server asked us to wait) and
in total time (max_retry_seconds).
"""

import email.utils
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import openai
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from . import redact
from .errors import BadInput, CallFailed, ContextTooLong, EndpointRefused
from .limiter import AdaptiveLimit

_CONTEXT_LENGTH_HINTS = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "context size",
    "too many tokens",
    "prompt is too long",
    "input is too long",
)
_RETRYABLE_STATUS = {408, 409, 425, 429}
MAX_RETRY_AFTER = 300.0


class MalformedReply(Exception):
    """The server answered 2xx with something that is not a chat completion."""


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

    def key(self) -> str:
        """The API key to send (registered for redaction); local servers (vLLM, llama.cpp) take any key."""
        key = self.api_key
        if not key:
            if self.base_url is None:
                raise BadInput("no API key: set OPENAI_API_KEY or pass --api-key")
            key = "no-key"
        redact.register(key)
        return key

    def request_body(self, messages: list[dict]) -> dict:
        """The chat request body a call sends (ChatClient hands the same fields to the SDK): model,
        messages, generation parameters and provider-specific fields."""
        return {"model": self.model, "messages": messages, **self.params, **self.extra_body}

    @property
    def host(self) -> str:
        """The endpoint URL without user:password@ or ?query (which can carry credentials)."""
        parts = urllib.parse.urlsplit(self.base_url or "https://api.openai.com/v1")
        return urllib.parse.urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else "")
                                        if parts.hostname else parts.netloc, parts.path, "", ""))


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    usage: dict[str, int]
    latency_s: float | None  # None: not measured (a batch reply)
    attempts: int


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def _error_code(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("code") or err.get("type") or "")
    return ""


def is_context_length(exc: BaseException) -> bool:
    return context_length_error(_status(exc), f"{_error_code(exc)} {exc}")


def context_length_error(status: int | None, text: str) -> bool:
    """Whether an error (its HTTP status and code/message text) says the prompt is too long."""
    return status in (400, 413, 422) and any(hint in text.lower() for hint in _CONTEXT_LENGTH_HINTS)


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, (openai.APIConnectionError, MalformedReply, ValueError)):
        return True  # includes timeouts; ValueError: a body that is not JSON
    status = _status(exc)
    if status is None:
        return False
    if status == 429:
        return _error_code(exc) != "insufficient_quota"
    return status in _RETRYABLE_STATUS or status >= 500


def retry_after_seconds(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = response.headers
    try:
        if "retry-after-ms" in headers:
            return float(headers["retry-after-ms"]) / 1000
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def describe(exc: BaseException) -> str:
    """A one-line, key-free description of a failed call."""
    status = _status(exc)
    prefix = f"HTTP {status}: " if status else f"{type(exc).__name__}: "
    text = " ".join(str(exc).split())
    return redact.redact(prefix + text)[:500]


class ChatClient:
    """Calls one model on one endpoint with the retry policy above."""

    def __init__(self, endpoint: Endpoint, limit: AdaptiveLimit | None = None):
        self.endpoint = endpoint
        self.limit = limit
        self._client = openai.AsyncOpenAI(
            api_key=endpoint.key(),
            base_url=endpoint.base_url,
            timeout=endpoint.timeout,
            max_retries=0,
        )
        self._fallback_wait = wait_exponential_jitter(
            multiplier=endpoint.backoff_initial, max=endpoint.backoff_max, jitter=endpoint.backoff_initial
        )

    def _wait(self, state) -> float:
        exc = state.outcome.exception()
        hinted = retry_after_seconds(exc) if exc is not None else None
        if hinted is not None:
            return min(hinted, MAX_RETRY_AFTER)
        return self._fallback_wait(state)

    async def _call_once(self, messages: list[dict]) -> Any:
        if self.limit is None:
            return await self._request(messages)
        async with self.limit:
            sent = time.monotonic()
            try:
                response = await self._request(messages)
            except openai.RateLimitError as exc:
                self.limit.rate_limited(retry_after_seconds(exc))
                raise
            self.limit.succeeded(time.monotonic() - sent)
            return response

    async def _request(self, messages: list[dict]) -> Any:
        response = await self._client.chat.completions.create(
            model=self.endpoint.model,
            messages=messages,
            extra_body=self.endpoint.extra_body or None,
            **self.endpoint.params,
        )
        if isinstance(response, str) or not getattr(response, "choices", None):
            raise MalformedReply(f"not a chat completion: {str(response)[:200]!r}")
        return response

    async def complete(self, messages: list[dict]) -> Completion:
        """One chat completion. Raises ContextTooLong, CallFailed or EndpointRefused."""
        started = time.monotonic()
        attempts = failures = 0

        def give_up(state) -> bool:
            # A 429 is the server asking us to wait, not a failure: only the time cap ends those.
            nonlocal failures
            if not isinstance(state.outcome.exception(), openai.RateLimitError):
                failures += 1
            return failures > self.endpoint.max_retries or time.monotonic() - started >= self.endpoint.max_retry_seconds

        retrying = AsyncRetrying(retry=retry_if_exception(is_retryable), wait=self._wait, stop=give_up, reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    response = await self._call_once(messages)
        except Exception as exc:
            status = _status(exc)
            if is_context_length(exc):
                raise ContextTooLong(describe(exc)) from None
            if status in (401, 403, 404) or (status == 429 and _error_code(exc) == "insufficient_quota"):
                raise EndpointRefused(
                    f"{self.endpoint.host} refused model {self.endpoint.model!r}: {describe(exc)}"
                ) from None
            if isinstance(exc, (openai.OpenAIError, MalformedReply, ValueError)):
                tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
                raise CallFailed(f"{describe(exc)} ({tries})") from None
            raise
        return completion_from(response, round(time.monotonic() - started, 3), attempts)

    async def aclose(self) -> None:
        await self._client.close()


def completion_from(response: Any, latency_s: float | None, attempts: int) -> Completion:
    """Our Completion from the SDK's ChatCompletion (an online reply, or a batch output line's body)."""
    choice = response.choices[0]
    message = choice.message
    return Completion(
        text=(message.content if message is not None and message.content else ""),
        finish_reason=choice.finish_reason,
        usage=usage_dict(response.usage),
        latency_s=latency_s,
        attempts=attempts,
    )


def usage_dict(usage: Any) -> dict[str, int]:
    if usage is None:
        return {}
    out = {
        "prompt_tokens": usage.prompt_tokens or 0,
        "completion_tokens": usage.completion_tokens or 0,
    }
    details = getattr(usage, "completion_tokens_details", None)
    reasoning = getattr(details, "reasoning_tokens", None) if details else None
    if reasoning:
        out["reasoning_tokens"] = reasoning
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(prompt_details, "cached_tokens", None) if prompt_details else None
    if cached:
        out["cached_tokens"] = cached
    return out
