"""Structured output for LLM judges: which `response_format` an endpoint takes, learned once per run (a Ladder per
endpoint and model, most to least constrained: MODES); docs/usage.md ("How --judge-format auto learns") has the
policy. Also reads a judge's JSON reply within bounds."""

import asyncio
import decimal
import functools
import json
import math
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import EndpointRefused

if TYPE_CHECKING:  # the openai SDK is loaded only by stages that call an API (score reads rows only)
    from .llm import ChatClient, Completion

MODES = ("json_schema", "json_object_schema", "json_object", "none")  # what judge rows record as `judge_format`
CHOICES = ("auto", "json_schema", "json_object", "none")
STRUCTURED = ("json_schema", "json_object_schema")  # modes that carry the schema: their replies must keep it
_LADDERS = {
    "auto": MODES,
    "json_schema": ("json_schema",),
    "json_object": ("json_object_schema", "json_object"),
    "none": ("none",),
}
# A 500 counts only when its text names the format (llama-cpp-python, 2024 llama-server).
_FORMAT_NAMES = ("response_format", "json_schema", "json_object", "input should be 'text'")
# Texts of "this format is not supported" answers (../shared/research/judge.md §2, §6.2), lower case.
_UNSUPPORTED_HINTS = (
    *_FORMAT_NAMES,
    "input should be",
    "must be one of",
    "not supported",
    "unavailable",
    "unknown name",
    "unrecognized request argument",
    "no endpoints found that can handle",
)
_REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")
_AT_MOST = re.compile(r"at most (\d+) completion tokens", re.I)  # how a model says its own cap


def unsupported(status: int | None, text: str) -> bool:
    """Whether an error says the requested response_format is not supported (research note §6.2)."""
    from .llm import context_length_error, token_field_refused

    if status is None or context_length_error(status, text) or token_field_refused(status, text, "max_tokens"):
        return False
    text = text.lower()
    if status in (400, 404, 415, 422):
        return any(hint in text for hint in _UNSUPPORTED_HINTS)
    return status == 500 and any(hint in text for hint in _FORMAT_NAMES)


def budget_too_large(status: int | None, text: str) -> bool:
    """Our token budget is more than the model allows (`max_tokens is too large`: OpenAI, vLLM)."""
    text = text.lower()
    return status in (400, 422) and "too large" in text and ("max_tokens" in text or "max_completion_tokens" in text)


def default_token_field(base_url: str, model: str) -> str:
    """max_completion_tokens for OpenAI's reasoning models (they reject max_tokens), else max_tokens."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    reasoning = host.endswith("openai.com") and model.lower().startswith(_REASONING_PREFIXES)
    return "max_completion_tokens" if reasoning else "max_tokens"


@dataclass
class Ladder:
    """What one endpoint and model take, learned during the run."""

    modes: tuple[str, ...]
    budget: int | None = None  # the token budget a judge call sends unless the user gave --max-tokens
    index: int = 0
    settled: bool = False  # a request in the current mode was answered
    token_field: str | None = None  # learned: the body field that carries the token budget
    budget_cap: int | None = None  # learned: the most our default budget may be here (0: send none)
    rejected: dict[str, str] = field(default_factory=dict)  # mode → the rejection's text
    not_enforced: set[str] = field(default_factory=set)  # structured modes whose replies broke the schema
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def mode(self) -> str:
        return self.modes[self.index]

    def state(self) -> dict:
        return {
            "choice": next(c for c, modes in _LADDERS.items() if modes == self.modes),
            "mode": self.mode,
            "settled": self.settled,
            "rejected": dict(self.rejected),
            "not_enforced": sorted(self.not_enforced),
            "token_field": self.token_field,
            "budget_cap": self.budget_cap,
        }

    def seed(self, saved: dict) -> None:
        """Start from an earlier run's decisions (its manifest), where they fit this run's ladder."""
        mode = saved.get("mode")
        if saved.get("settled") and mode in self.modes:
            self.index = self.modes.index(mode)
            self.rejected.update({k: str(v) for k, v in (saved.get("rejected") or {}).items() if k in self.modes})
        self.not_enforced.update(m for m in saved.get("not_enforced") or () if m in STRUCTURED)
        if saved.get("token_field") in ("max_tokens", "max_completion_tokens"):
            self.token_field = saved["token_field"]
        if isinstance(saved.get("budget_cap"), int) and saved["budget_cap"] >= 0:
            self.budget_cap = saved["budget_cap"]

    def mark(self, mode: str, enforced: bool) -> None:
        if not enforced and mode in STRUCTURED:
            self.not_enforced.add(mode)


@dataclass
class Formats:
    """The ladders of one run (per endpoint and model) for a `--judge-format` choice (CHOICES) and a token budget."""

    choice: str = "auto"
    budget: int | None = None
    ladders: dict[str, Ladder] = field(default_factory=dict)
    saved: dict[str, dict] = field(default_factory=dict)

    def ladder(self, client: "ChatClient") -> Ladder:
        key = client.endpoint.learned_key
        if key not in self.ladders:
            ladder = self.ladders[key] = Ladder(_LADDERS[self.choice], None if self.choice == "none" else self.budget)
            saved = self.saved.get(key, {})
            if saved.get("choice", "auto") == self.choice:  # a forced choice teaches auto nothing
                ladder.seed(saved)
        return self.ladders[key]

    def seed(self, learned: dict) -> None:
        """The `judge_format` an earlier run's manifest learned, by endpoint and model."""
        if isinstance(learned, dict):
            self.saved = {k: v for k, v in learned.items() if isinstance(v, dict)}

    def state(self) -> dict:
        return {**self.saved, **{k: ladder.state() for k, ladder in self.ladders.items()}}


class Answer(NamedTuple):
    completion: "Completion"
    mode: str


async def ask(formats: Formats, client: "ChatClient", messages: list[dict], *, name: str, schema: dict) -> Answer:
    """One reply to `messages` in the best mode the endpoint takes."""
    ladder = formats.ladder(client)
    if client.batched:  # a batch cannot be probed: the mode an earlier run learned, else the ladder's first
        return Answer(await client.complete(messages, _fields(ladder, client, name, schema)[0]), ladder.mode)
    if not ladder.settled:
        async with ladder._lock:
            if not ladder.settled:
                return await _send(ladder, client, messages, name, schema)
    return await _send(ladder, client, messages, name, schema)


async def _send(ladder: Ladder, client: "ChatClient", messages: list[dict], name: str, schema: dict) -> Answer:
    from .llm import Rejected, error_text, status_of, token_field_refused

    def final(own_budget: bool, exc: BaseException) -> bool:  # the ladder handles it (a budget error if ours): no retry
        status, text = status_of(exc), error_text(exc)
        too_large = own_budget and budget_too_large(status, text)
        return too_large or unsupported(status, text) or token_field_refused(status, text, "max_tokens")

    while True:
        mode = ladder.mode
        fields, own_budget = _fields(ladder, client, name, schema)
        try:
            reply = await client.complete(messages, fields, final=functools.partial(final, own_budget))
        except Rejected as exc:
            status, text = exc.status, exc.text
            if token_field_refused(status, text, "max_tokens") and ladder.token_field != "max_completion_tokens":
                ladder.token_field = "max_completion_tokens"
                continue
            if own_budget and budget_too_large(status, text):
                at_most = _AT_MOST.search(text)
                sent = fields.get("max_tokens") or fields.get("max_completion_tokens") or 0
                # the model's own cap when it says it, else send none and let the server use what is left
                ladder.budget_cap = int(at_most.group(1)) if at_most and int(at_most.group(1)) < sent else 0
                continue
            if not unsupported(status, text) or mode == "none":
                raise
            if ladder.mode == mode:  # not stepped down meanwhile by another request
                ladder.rejected[mode] = str(exc)[:300]
                if ladder.index + 1 >= len(ladder.modes):
                    raise EndpointRefused(
                        f"{client.endpoint.host} rejects response_format {mode} for model "
                        f"{client.endpoint.model!r} ({str(exc)[:200]}); use --judge-format auto"
                    ) from None
                ladder.index += 1
                ladder.settled = False
            continue
        ladder.settled = True
        return Answer(reply, mode)


def _fields(ladder: Ladder, client: "ChatClient", name: str, schema: dict) -> tuple[dict, bool]:
    """A judge call's body fields in the ladder's mode, the budget in the endpoint's field; and whether it is ours."""
    response_formats = {
        "json_schema": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        "json_object_schema": {"type": "json_object", "schema": schema},  # llama.cpp makes a grammar of the schema
        "json_object": {"type": "json_object"},
    }
    fields: dict[str, Any] = {"response_format": response_formats[ladder.mode]} if ladder.mode != "none" else {}
    endpoint = client.endpoint
    given = None if endpoint.token_field is None else endpoint.params[endpoint.token_field]  # the user's --max-tokens
    budget = given if given is not None else ladder.budget
    if given is None and budget and ladder.budget_cap is not None:
        budget = min(budget, ladder.budget_cap)
    if budget:
        wanted = ladder.token_field or endpoint.token_field or default_token_field(endpoint.url, endpoint.model)
        other = "max_tokens" if wanted == "max_completion_tokens" else "max_completion_tokens"
        fields[wanted] = budget
        if other in endpoint.params:
            fields[other] = None
    return fields, given is None and bool(budget)


# ---- reading a judge's JSON reply
MAX_DEPTH = 32  # nesting a judge's JSON may have (a verdict has 2); deeper is no verdict, and no row could hold it


class TooDeep(json.JSONDecodeError):
    """JSON nested deeper than MAX_DEPTH."""


def _exact_float(text: str) -> float:
    """A JSON float; NaN for one that rounds to 0 or 1 without being it (`1e-400`): never read as a verdict."""
    value = float(text)
    return value if value not in (0.0, 1.0) or decimal.Decimal(text) == value else math.nan


# strict=False: control characters allowed in strings (llama-cpp-python's grammar emits them)
_DECODER = json.JSONDecoder(strict=False, parse_float=_exact_float)


def loads(text: str) -> Any:
    """The reply as JSON; json.JSONDecodeError for text that is not, or is nested deeper than MAX_DEPTH."""
    return decode(text, 0, whole=True)[0]


def decode(text: str, pos: int, whole: bool = False) -> tuple[Any, int]:
    """The JSON value at `pos` and its end (whole: filling the text); TooDeep past MAX_DEPTH, never a RecursionError."""
    if whole:
        pos = len(text) - len(text.lstrip(" \t\n\r"))
    try:
        obj, end = _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise TooDeep(f"nested deeper than {MAX_DEPTH}", text, pos) from None
    if whole and text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end)
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise TooDeep(f"nested deeper than {MAX_DEPTH}", text, pos)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return obj, end


def check(text: str, validate: Callable[[Any], list[str]]) -> list[str]:
    """What keeps the reply from matching the schema exactly (empty: it matches)."""
    try:
        obj = loads(text.strip())
    except ValueError as exc:
        return [f"not JSON ({exc})"]
    return validate(obj)
