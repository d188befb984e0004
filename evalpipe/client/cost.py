"""Tokens, latency and cost per stage, from the rows; list prices per million tokens from a table the user can
replace. docs/results.md says how cached and reasoning tokens are priced."""

import math
import os
import re
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..errors import BadInput
from ..store.rows import ApiCall

_SNAPSHOT = re.compile(r"(.+?)(?:-\d{4}-\d{2}-\d{2}|-\d{4}|-latest|@[\w.-]+)$")
DEFAULT_PRICES = Path(__file__).resolve().parent / "prices.json"
TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens")


@dataclass
class Prices:
    models: dict[str, dict]
    as_of: str = "?"
    status: str = ""
    source: str = ""
    batch_discount: float = 1.0

    def price_for(self, model: str | None) -> dict | None:
        """The exact model, else a dated snapshot of a listed one (`gpt-4o-mini-2024-07-18` → `gpt-4o-mini`), never
        another extension (`o3-pro`, `o3-mini`: other models, other prices)."""
        if not model:
            return None
        name = model.rsplit("/", 1)[-1]  # "openai/gpt-4o" → "gpt-4o"
        if name in self.models:
            return self.models[name]
        snapshot = _SNAPSHOT.match(name)
        return self.models.get(snapshot.group(1)) if snapshot else None

    def cost(self, model: str | None, usage: dict) -> float | None:
        price = self.price_for(model)
        if price is None:
            return None
        cached = usage.get("cached_tokens", 0)
        uncached = usage.get("prompt_tokens", 0) - cached
        return (
            uncached * price["input"]
            + cached * price.get("cached_input", price["input"])
            + usage.get("completion_tokens", 0) * price["output"]
        ) / 1e6


def load_prices(path: Path | None = None) -> Prices:
    """--prices FILE, else $EVALPIPE_PRICES, else the bundled dated table."""
    path = Path(path or os.environ.get("EVALPIPE_PRICES") or DEFAULT_PRICES)
    try:
        table = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise BadInput(f"cannot read the price table: {exc.strerror}", path) from None
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"the price table is not valid JSON ({exc})", path) from None
    models = table.get("models") if isinstance(table, dict) else None
    if not isinstance(models, dict):
        raise BadInput("the price table needs a 'models' object: {name: {input, output[, cached_input]}}", path)
    for name, price in models.items():
        if not isinstance(price, dict):
            raise BadInput(f"model {name!r}: give {{input, output[, cached_input]}} in USD per million tokens", path)
        for key in ("input", "output", "cached_input"):
            if key in price or key != "cached_input":
                _check_amount(price.get(key), f"model {name!r}: {key}", "USD per million tokens, 0 or more", path)
    discount = table.get("batch_discount", 1.0)
    _check_amount(discount, "batch_discount", "the share of the price a batch call costs, from 0 to 1", path, most=1)
    return Prices(models, str(table.get("as_of", "?")), str(table.get("status", "")), str(path), float(discount))


def _check_amount(value, name: str, wanted: str, path: Path, most=math.inf) -> None:
    """A price table's number: finite and not negative (a negative price would make a spending cap unreachable)."""
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= most:
        shown = "missing" if value is None else f"{value!r}"[:40]
        raise BadInput(f"{name} is {shown}: give a number, {wanted}", path)


def percentiles(values: Sequence[float], points=(50, 90, 99)) -> dict[str, float]:
    """Nearest-rank percentiles (each one an observed value)."""
    if not values:
        return {}
    ordered = sorted(values)
    return {**{f"p{p}": ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] for p in points}, "max": ordered[-1]}


@dataclass
class _StageTally:
    calls: int = 0
    latencies: array = field(default_factory=lambda: array("d"))  # a million calls: 8 MB, not a list of floats
    usages: dict = field(default_factory=dict)  # (model, via batch) -> the calls' token counts, summed as added
    batch_calls: int = 0
    invalid_usage: int = 0  # calls whose usage numbers are not token counts: left out of tokens and cost


MAX_TOKEN_COUNT = 10**12  # more tokens than any call has: a count above it is a server's bug, not a count


def _counts_valid(usage: dict, calls: int) -> bool:
    """Whether `calls` calls' usage holds whole counts, 0 to MAX_TOKEN_COUNT a call (older rows may hold anything)."""
    if "invalid" in usage:
        return False
    limit = MAX_TOKEN_COUNT * max(1, calls)
    for key in TOKEN_KEYS:
        value = usage.get(key)
        if value is not None and not (type(value) is int and 0 <= value <= limit):
            return False
    return True


@dataclass
class Ledger:
    """Calls, tokens and latencies per stage (infer, judge, error_analysis) of one run."""

    stages: defaultdict[str, _StageTally] = field(default_factory=lambda: defaultdict(_StageTally))

    def add(self, stage: str, model: str | None, usage: dict | None, latency_s: float | None, calls=1, batch=False):
        # called once per call of a run (millions): kept to plain dict operations
        tally = self.stages[stage]
        tally.calls += calls
        if batch:
            tally.batch_calls += calls
        if usage and not _counts_valid(usage, calls):
            tally.invalid_usage += calls
        elif usage:
            sums = tally.usages.get((model, batch)) or tally.usages.setdefault(
                (model, batch), dict.fromkeys(TOKEN_KEYS, 0)
            )
            for key in TOKEN_KEYS:
                value = usage.get(key)
                if value:
                    sums[key] += value
        if latency_s is not None:
            tally.latencies.append(latency_s)

    def summary(self, prices: Prices) -> dict:
        out: dict = {"prices": {"file": prices.source, "as_of": prices.as_of, "status": prices.status}, "stages": {}}
        total, unpriced = 0.0, set()
        for stage, tally in self.stages.items():
            cost = reasoning = 0.0
            tokens: dict[str, int] = {}
            for (model, batch), counts in tally.usages.items():
                add_counts(tokens, counts)
                c, price = prices.cost(model, counts), prices.price_for(model)
                if c is None or price is None:
                    unpriced.add(str(model))
                else:
                    discount = prices.batch_discount if batch else 1.0
                    cost += c * discount
                    # reasoning tokens are among the completion tokens, billed as output
                    reasoning += counts.get("reasoning_tokens", 0) * price["output"] / 1e6 * discount
            tokens = {k: v for k, v in tokens.items() if v or k in ("prompt_tokens", "completion_tokens")}
            priced = not any(prices.price_for(m) is None for m, _ in tally.usages)
            out["stages"][stage] = {
                "calls": tally.calls,
                "batch_calls": tally.batch_calls,
                "tokens": tokens,
                "latency_s": {k: round(v, 3) for k, v in percentiles(tally.latencies).items()},
                "models": sorted({str(m) for m, _ in tally.usages}),
                "cost_usd": round(cost, 6) if priced else None,
                **({"reasoning_cost_usd": round(reasoning, 6)} if priced and tokens.get("reasoning_tokens") else {}),
                **({"invalid_usage_calls": tally.invalid_usage} if tally.invalid_usage else {}),
            }
            total += cost
        out["cost_usd"] = None if unpriced else round(total, 6)
        out["unpriced_models"] = sorted(unpriced)
        return out


def format_summary(summary: dict) -> str:
    lines, invalid = [], []
    for stage, s in summary["stages"].items():
        t, lat = s["tokens"], s["latency_s"]
        cost = "no price" if s["cost_usd"] is None else f"${s['cost_usd']:.4f}"
        timing = f"latency p50 {lat['p50']:.2f}s p90 {lat['p90']:.2f}s p99 {lat['p99']:.2f}s" if lat else "latency n/a"
        via = f" ({s['batch_calls']:,} by batch)" if s.get("batch_calls") else ""
        cached = f" ({t['cached_tokens']:,} cached)" if t.get("cached_tokens") else ""
        lines.append(
            f"  {stage:15} {s['calls']:7d} calls{via}  prompt {t.get('prompt_tokens', 0):>10,}{cached}  completion "
            f"{t.get('completion_tokens', 0):>9,}  reasoning {t.get('reasoning_tokens', 0):>8,}  {timing}  {cost}"
        )
        if s.get("invalid_usage_calls"):
            invalid.append(f"{stage} {s['invalid_usage_calls']:,} calls")
    if invalid:
        lines.append(
            "  warning: usage numbers that are not token counts (fractions, negatives, over 10^12) left out of tokens "
            "and cost: " + ", ".join(invalid)
        )
    if summary["unpriced_models"]:
        lines.append(f"  no price for {', '.join(summary['unpriced_models'])} (add them to a --prices file)")
    prices = summary["prices"]
    lines.append(f"  prices: {prices['file']} (as of {prices['as_of']}; review before relying on them)")
    return "\n".join(lines)


def add_counts(total: dict, counts: dict | None) -> dict:
    for key, value in (counts or {}).items():
        total[key] = total.get(key, 0) + value
    return total


def api_calls(row: dict) -> list[ApiCall]:
    """Every API call recorded in a judge row (its answer's calls too) or an error-analysis row."""
    get = row.get  # called once per row of a run (millions): plain lookups, a list, no generator
    out = []
    calls, batch = get("calls"), bool(get("batch"))
    if isinstance(calls, dict):  # several calls per task, each recorded on its own
        for call in calls.values():
            out.append(ApiCall("infer", get("model"), call.get("usage"), call.get("latency_s"), 1, batch))
    elif "usage" in row or "latency_s" in row:
        out.append(ApiCall("infer", get("model"), get("usage"), get("latency_s"), 1, batch))
    if "judge_usage" in row or "judge_latency_s" in row:
        attempts, batched = get("judge_attempts", 1), bool(get("judge_batch"))
        out.append(ApiCall("judge", get("judge_model"), get("judge_usage"), get("judge_latency_s"), attempts, batched))
    if "analysis_model" in row:
        usage, latency_s = get("analysis_usage"), get("analysis_latency_s")
        attempts, batched = get("analysis_attempts", 1), bool(get("analysis_batch"))
        out.append(ApiCall("error_analysis", get("analysis_model"), usage, latency_s, attempts, batched))
    return out
