"""--dry-run: count the calls a run would make and estimate their tokens and cost, sending nothing; the benchmark's
own code runs against a client that records each request (docs/results.md#dry-run)."""

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from . import cost
from .llm import Completion, Endpoint, prompt_chars
from .runner import Tasks

CHARS_PER_TOKEN = 4
DEFAULT_COMPLETION_TOKENS = 1000


class _FirstCallOnly(Exception):
    """Ends a task after its first request: a judge asks again only when a reply cannot be parsed."""


class RecordingClient:
    """Stands in for llm.ChatClient: records what would be sent and answers with filler."""

    batched = False

    def __init__(self, endpoint: Endpoint | None, completion_tokens: int, first_call_only: bool):
        self.endpoint, self.completion_tokens, self.first_call_only = endpoint, completion_tokens, first_call_only
        self.calls = self.prompt_chars = 0

    async def complete(self, messages: list[dict], fields: dict | None = None, final=None) -> Completion:
        self.calls += 1
        self.prompt_chars += prompt_chars(messages)
        if self.first_call_only:
            raise _FirstCallOnly("dry run")
        filler = "x" * (CHARS_PER_TOKEN * self.completion_tokens)  # fed into a chained call's prompt as a reply is
        return Completion(filler, finish_reason="stop", usage={}, latency_s=0.0, attempts=1)


def estimate(
    label: str,
    pending: Tasks,
    work: Callable[[Any, RecordingClient], Awaitable[object]],
    endpoint: Endpoint | None,
    max_tokens: int | None,
    prices: cost.Prices,
    first_call_only: bool,
    max_cost: float | None,
) -> None:
    """Run `work(task, client)` for every pending task against a recording client; print the totals."""
    completion_tokens = max_tokens or DEFAULT_COMPLETION_TOKENS
    client = RecordingClient(endpoint, completion_tokens, first_call_only)

    async def count() -> None:
        for task in pending:
            with contextlib.suppress(_FirstCallOnly):
                await work(task, client)

    if endpoint is not None:
        asyncio.run(count())
    calls = client.calls
    usage = {"prompt_tokens": client.prompt_chars // CHARS_PER_TOKEN, "completion_tokens": calls * completion_tokens}
    price = prices.cost(endpoint.model, usage) if endpoint is not None else 0.0
    assumed = f"--max-tokens {max_tokens}" if max_tokens else f"an assumed {completion_tokens:,} (set --max-tokens)"
    if endpoint is None:
        priced = "no API calls (a rule-based judge)"
    elif price is None:
        priced = f"no price for {endpoint.model!r} in {prices.source} (add it to a --prices file)"
        if max_cost is not None:
            priced += f"; --max-cost ${max_cost:g} cannot be kept without a price (the run would exit 2)"
    else:
        priced = f"≈ ${price:,.4f} at {prices.source} prices as of {prices.as_of} (review them)"
        if max_cost is not None:
            within = "within it" if price <= max_cost else "the run would stop at the cap, exit 6"
            priced += f"; --max-cost ${max_cost:g}: {within}"
    print(
        f"{label} --dry-run: {len(pending):,} tasks pending → {calls:,} calls\n"
        f"  prompt tokens     ≈ {usage['prompt_tokens']:,} (characters / {CHARS_PER_TOKEN})\n"
        f"  completion tokens ≈ {usage['completion_tokens']:,} ({completion_tokens:,} per call: {assumed})\n"
        f"  cost: {priced}\n  nothing was sent",
        file=sys.stderr,
    )
