"""Statistics across runs: mean, standard deviation (sample or population), standard error."""

import math
from typing import Sequence


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def std(values: Sequence[float], kind: str = "sample") -> float:
    """Sample std divides by n − 1 (0.0 for a single run); population std divides by n."""
    n = len(values)
    if n == 0:
        raise ValueError("std of no values")
    ddof = 1 if kind == "sample" else 0
    if n - ddof <= 0:
        return 0.0
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - ddof))


def stderr(values: Sequence[float]) -> float:
    """Standard error of the mean, from the sample std."""
    return std(values, "sample") / math.sqrt(len(values))


def binomial_stderr(rate: float, n: int) -> float:
    """Standard error of a rate measured over n independent items: sqrt(p(1 − p)/n)."""
    return math.sqrt(rate * (1 - rate) / n) if n else 0.0


def add_counts(total: dict, counts: dict | None) -> dict:
    """Add token counts (or any counts) into a running total, key by key."""
    for key, value in (counts or {}).items():
        total[key] = total.get(key, 0) + value
    return total


def pct(rate: float | None, digits: int = 1) -> str:
    return "-" if rate is None else f"{100 * rate:.{digits}f}"
