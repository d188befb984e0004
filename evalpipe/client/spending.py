"""--max-cost USD: a cap on what one run of a stage spends, that a cron job cannot pass. Each call's worst case is
reserved before it goes and replaced by its reply's cost (docs/results.md#a-spending-cap)."""

import asyncio
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..errors import EXIT_SPENDING_CAP, BadInput, StageError
from . import cost

DEFAULT_WORST_COMPLETION = 16_384  # completion tokens a call may answer when it sends no cap on them
PROMPT_OVERHEAD = 16  # tokens a request adds around its messages (a reply's primer)
FIRST_IN_FLIGHT = 2  # calls in flight until a reply has shown what the endpoint bills


class SpendingCapReached(StageError):
    """The next call could pass --max-cost: no new calls; rows kept; a rerun with a higher cap resumes."""

    exit_code = EXIT_SPENDING_CAP


def request_bytes(messages: list[dict], fields: dict) -> int:
    """The UTF-8 bytes of a request's messages and body fields as JSON: more than the prompt tokens it can bill."""
    try:
        return len(orjson.dumps(messages, default=str)) + len(orjson.dumps(fields, default=str))
    except TypeError:  # what orjson refuses (an integer past 64 bits, a lone surrogate): as escaped ASCII, longer
        return len(json.dumps([messages, fields], default=str))


@dataclass(frozen=True)
class Reservation:
    usd: float  # what is held for the call
    bound_usd: float  # its worst case before any raise (factor 1)


@dataclass
class SpendingCap:
    cap_usd: float
    prices: cost.Prices
    model: str
    ledger: Path | None = None  # --spending-ledger: each reply's cost is added to it (docs/results.md)
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    in_flight: int = 0
    billed: bool = False  # a reply has shown what the endpoint bills
    factor: float = 1.0  # raised by a reply that billed more than its reservation
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    async def reserve(self, request_size: int, max_tokens: int) -> Reservation:
        """Reserve a call's worst case, waiting while calls in flight may leave room; SpendingCapReached if none is."""
        usage = dict(
            prompt_tokens=request_size + PROMPT_OVERHEAD, completion_tokens=max_tokens or DEFAULT_WORST_COMPLETION
        )
        bound = self.prices.cost(self.model, usage) or 0.0
        while True:
            worst = bound * self.factor
            fits = self.spent_usd + self.reserved_usd + worst <= self.cap_usd
            if fits and (self.billed or self.in_flight < FIRST_IN_FLIGHT):
                break
            if not self.in_flight:
                raise SpendingCapReached(
                    f"spending cap reached: ${self.spent_usd:.4f} spent leaves less than the next call's worst "
                    f"case (${worst:.4f}) under --max-cost ${self.cap_usd:g}; rows so far are kept: raise the cap "
                    "or run again later"
                )
            await self._changed.wait()
        self.reserved_usd += worst
        self.in_flight += 1
        return Reservation(worst, bound)

    def release(self, reservation: Reservation) -> None:
        """A call done: its reservation gives way (a call that got no reply cost nothing)."""
        self.reserved_usd -= reservation.usd
        self.in_flight -= 1
        self._changed.set()  # wake the calls waiting for room; they check again
        self._changed = asyncio.Event()

    def settle(self, reservation: Reservation, usage: dict) -> None:
        """A reply: its cost replaces its reservation; without usage (or invalid usage) the reservation counts."""
        self.release(reservation)
        priced = self.prices.cost(self.model, usage) if usage and "invalid" not in usage else None
        spent = reservation.usd if priced is None else priced
        self.spent_usd += spent
        if spent > reservation.usd and reservation.bound_usd > 0:
            self.factor = max(self.factor, spent / reservation.bound_usd)
        self.billed = True
        if self.ledger is not None and spent:
            with open(self.ledger, "a") as f:
                f.write(f"{spent!r}\n")


def amount(text: str, zero_ok: bool = False) -> float:
    """An amount in USD as given (--max-cost, MAX_COST: above 0; a ledger line: 0 or more), else ValueError."""
    try:
        usd = float(text)
    except ValueError:
        usd = math.nan
    if not (math.isfinite(usd) and (usd > 0 or zero_ok and usd == 0)):
        raise ValueError(f"{text}: give a positive amount in USD")
    return usd


def prices_for(prices_path: Path | None, model: str | None) -> cost.Prices:
    """The price table, which must price `model`: BadInput (exit 2, before any call) otherwise."""
    prices = cost.load_prices(prices_path)
    if model is None or prices.price_for(model) is None:
        raise BadInput(
            f"--max-cost needs a price for {model!r}, and {prices.source} has none: add it to a --prices file "
            "(or set EVALPIPE_PRICES)"
        )
    return prices


def cap_for(max_cost: float, prices_path: Path | None, model: str, ledger: Path | None) -> SpendingCap:
    """The stage's cap, counting from what the runner's `ledger` says was spent (a line not an amount is refused)."""
    prices = prices_for(prices_path, model)
    spent = 0.0
    for number, line in enumerate(ledger.read_text().split("\n") if ledger and ledger.exists() else [], 1):
        try:
            spent += amount(line, zero_ok=True) if line.strip() else 0
        except ValueError:
            said = line.strip()[:40]
            raise BadInput(f"the spending ledger holds {said!r}, not an amount spent", ledger, number) from None
    return SpendingCap(max_cost, prices, model, ledger, spent_usd=spent)
