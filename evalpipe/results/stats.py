"""Statistics across runs: mean, standard deviation (sample or population), standard error."""

import math
from collections.abc import Sequence


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


# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t (beyond 30 degrees of freedom, 1.96 + 2.37/df, within 0.001)."""
    if df < 1:
        raise ValueError("t needs at least one degree of freedom")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.37 / df


def ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """95% interval for the mean over runs: mean ± t(n − 1) · s/√n; None for a single run.

    It measures run-to-run variation (sampling), not how the tasks were drawn, and is not clipped
    to [0, 1]: with 3 runs t is 4.30, so the interval is wide unless the runs agree."""
    if len(values) < 2:
        return None
    m, half = mean(values), t975(len(values) - 1) * stderr(values)
    return m - half, m + half
