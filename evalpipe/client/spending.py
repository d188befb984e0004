"""--max-cost USD: a cap on what one run of a stage spends, that a cron job cannot pass.

Before each call goes out, its worst case is reserved: its prompt tokens (from its characters, at the
fewest characters per token the replies have shown, and 2 until one has) at the input price, plus the
completion tokens it may answer (its token cap, else DEFAULT_WORST_COMPLETION) at the output price.
A call whose reservation would take what was spent plus what is reserved past the cap is not sent:
the stage stops starting calls, keeps every row it has, and exits 6. When a reply comes, its
reservation gives way to what its usage costs (cached prompt tokens at their price; a reply without
usage, or with numbers that are not token counts, costs its reservation); a failed attempt costs
nothing. So what a run spends passes the cap by at most what the calls in flight cost beyond their
worst case, which a reply within its token cap cannot.

Prices come from the table score uses (cost.load_prices: --prices, $EVALPIPE_PRICES, the bundled one).
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EXIT_SPENDING_CAP, BadInput, StageError
from . import cost

# The runner's ledger of one pipeline invocation: each reply's cost is appended, and a stage starts counting
# from what the stages before it spent, so that MAX_COST caps the whole invocation, not each stage.
LEDGER_ENV = "EVALPIPE_SPENDING_LEDGER"
DEFAULT_WORST_COMPLETION = 16_384  # completion tokens a call may answer when it sends no cap on them
FIRST_CHARS_PER_TOKEN = 2.0  # before any reply: fewer characters per token than any real tokenizer averages
PROMPT_OVERHEAD = 16  # tokens a request adds around its messages (roles, separators)


class SpendingCapReached(StageError):
    """The next call could pass --max-cost: no new calls; rows kept; a rerun with a higher cap resumes."""

    exit_code = EXIT_SPENDING_CAP


@dataclass
class SpendingCap:
    cap_usd: float
    prices: cost.Prices
    model: str
    ledger: str | None = None  # the runner's ledger (LEDGER_ENV) each reply's cost is appended to, if any
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    chars_per_token: float = field(default=FIRST_CHARS_PER_TOKEN)
    learned: bool = False

    def worst_case(self, prompt_chars: int, max_tokens: int) -> float:
        prompt = prompt_chars / self.chars_per_token + PROMPT_OVERHEAD
        usage = {"prompt_tokens": int(prompt) + 1, "completion_tokens": max_tokens or DEFAULT_WORST_COMPLETION}
        return self.prices.cost(self.model, usage) or 0.0

    def reserve(self, prompt_chars: int, max_tokens: int) -> float:
        """Reserve a call's worst case, or raise SpendingCapReached if it could pass the cap."""
        worst = self.worst_case(prompt_chars, max_tokens)
        if self.spent_usd + self.reserved_usd + worst > self.cap_usd:
            raise SpendingCapReached(
                f"spending cap reached: ${self.spent_usd:.4f} spent and ${self.reserved_usd:.4f} reserved by the "
                f"calls in flight leave less than the next call's worst case (${worst:.4f}) under --max-cost "
                f"${self.cap_usd:g}; rows so far are kept: raise the cap or run again later"
            )
        self.reserved_usd += worst
        return worst

    def release(self, reservation: float) -> None:
        """A call that got no reply: it cost nothing."""
        self.reserved_usd -= reservation

    def settle(self, reservation: float, usage: dict, prompt_chars: int) -> None:
        """A reply: its cost replaces its reservation. A reply whose usage says nothing, or nothing that is a token
        count (usage.invalid), counts its reservation, the worst case: an endpoint cannot spend past the cap unseen."""
        self.reserved_usd -= reservation
        priced = self.prices.cost(self.model, usage) if usage and "invalid" not in usage else None
        spent = reservation if priced is None else priced
        self.spent_usd += spent
        if self.ledger and spent:
            with open(self.ledger, "a") as f:
                f.write(f"{spent!r}\n")
        tokens = usage.get("prompt_tokens")
        if isinstance(tokens, int) and tokens > PROMPT_OVERHEAD and prompt_chars > 0:
            seen = prompt_chars / (tokens - PROMPT_OVERHEAD)
            self.chars_per_token = seen if not self.learned else min(self.chars_per_token, seen)
            self.learned = True


def cap_for(max_cost: float | None, prices_path, model: str | None) -> SpendingCap | None:
    """The stage's cap, or None without --max-cost; BadInput (exit 2, before any call) for a model with no price."""
    if max_cost is None:
        return None
    if max_cost <= 0:
        raise BadInput(f"--max-cost {max_cost:g}: give a positive amount in USD")
    prices = cost.load_prices(prices_path)
    if model is None or prices.price_for(model) is None:
        raise BadInput(
            f"--max-cost needs a price for {model!r}, and {prices.source} has none: add it to a --prices file "
            "(or set EVALPIPE_PRICES)"
        )
    ledger = os.environ.get(LEDGER_ENV)
    return SpendingCap(max_cost, prices, model, ledger, spent_usd=spent_before(ledger))


def spent_before(ledger: str | None) -> float:
    """What the earlier stages of this pipeline invocation spent (the runner's ledger; 0 without one)."""
    if not ledger or not Path(ledger).exists():
        return 0.0
    return sum(float(line) for line in Path(ledger).read_text().split() if line)
