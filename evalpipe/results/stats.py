"""Statistics over runs and over items, after E. Miller, "Adding Error Bars to Evals" (arXiv 2411.00640); each
formula and where it comes from: docs/statistics.md."""

import math
import operator
from collections import defaultdict
from collections.abc import Hashable, Sequence
from functools import lru_cache
from statistics import NormalDist
from statistics import fmean as mean  # math.fsum(values) / len(values)

MDE_POWER = 0.80  # the power the minimum detectable difference is stated at (two-sided α = 1 − level)
z_quantile = NormalDist().inv_cdf


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
    return std(values, "sample") / math.sqrt(len(values))


def binomial_stderr(rate: float, n: int) -> float:
    return math.sqrt(rate * (1 - rate) / n) if n else 0.0


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return result


_LARGE_DF = 100_000  # beyond this, t is the normal plus its first two Cornish–Fisher terms (error < 1e-12)


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t: the regularised incomplete beta function I_x(df/2, 1/2) at x = df/(df + t²)."""
    if df >= _LARGE_DF:
        return math.erfc(abs(t) / math.sqrt(2))
    a, b, x = df / 2, 0.5, df / (df + t * t)
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t (p > 0.5), found by bisection on its distribution function."""
    if not 0.5 < p < 1:
        raise ValueError("t_quantile takes 0.5 < p < 1")
    if df < 1:
        raise ValueError("t needs at least one degree of freedom")
    z = z_quantile(p)
    if df >= _LARGE_DF:
        return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    tail = 2 * (1 - p)
    low, high = z, z
    while t_two_sided_p(high, df) > tail:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if t_two_sided_p(middle, df) > tail:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * high:
            break
    return (low + high) / 2


def ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """mean ± t(n − 1) · s/√n over runs: variation on a fixed task set, not how the tasks were drawn; not clipped."""
    if len(values) < 2:
        return None
    m, half = mean(values), t_quantile(0.975, len(values) - 1) * stderr(values)
    return m - half, m + half


def wilson(successes: float, trials: float, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson's score interval for a proportion (successes may be fractional: item means summed)."""
    if trials <= 0:
        return None
    z = z_quantile(0.5 + level / 2)
    p, z2 = successes / trials, z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= trials else min(1.0, centre + half)
    return low, high


class RatioEstimate:
    """R = Σa / Σb over items (b None: a plain mean) with its influence values ψ_i and their standard errors;
    `clusters` groups items that are not independent, `weights` counts the identical items a position stands for."""

    def __init__(
        self, a: Sequence[float], b: Sequence[float] | None, clusters: Sequence[Hashable] | None, weights: Sequence[int]
    ):
        self.clusters = clusters
        self.weights = w = weights
        self.n = n = sum(w)
        total_b = float(n) if b is None else math.fsum(map(operator.mul, w, b))
        self.value: float | None = None
        self.psi: list[float] = []
        if n == 0 or total_b == 0:
            return
        self.value = value = math.fsum(map(operator.mul, w, a)) / total_b
        mean_b = total_b / n
        self.psi = [x - value for x in a] if b is None else [(x - value * y) / mean_b for x, y in zip(a, b)]

    def se_naive(self) -> float | None:
        """sqrt(Σψ² / (n − 1) / n): Miller's eq. 1 on the influence values; None below 2 items."""
        n = self.n
        if self.value is None or n < 2:
            return None
        return _exact_zero(math.sqrt(math.fsum(w * p * p for w, p in zip(self.weights, self.psi)) / (n - 1) / n))

    def se_df(self) -> tuple[float | None, int | None, int]:
        """The standard error, the clusters and the degrees of freedom; with clusters, CR1 (CR0 times
        sqrt(C / (C − 1))) over the cluster sums of ψ, None below 2 clusters."""
        if self.clusters is None:
            return self.se_naive(), None, self.n - 1
        if self.value is None:
            return None, 0, -1
        sums: defaultdict[Hashable, float] = defaultdict(float)
        for key, w, p in zip(self.clusters, self.weights, self.psi):
            sums[key] += w * p
        c = len(sums)
        if c < 2:
            return None, c, c - 1
        cr0 = math.sqrt(math.fsum(s * s for s in sums.values())) / self.n
        return _exact_zero(cr0 * math.sqrt(c / (c - 1))), c, c - 1


def _exact_zero(se: float) -> float:
    """0.0 for a standard error that is only rounding noise (every item scored alike)."""
    return 0.0 if se < 1e-12 else se


def correlation(x: Sequence[float], y: Sequence[float], w: Sequence[int]) -> float | None:
    """Pearson's correlation (each pair counted `w` times); None when either side has no spread."""
    n = sum(w)
    if n < 2:
        return None
    mx, my = math.fsum(map(operator.mul, w, x)) / n, math.fsum(map(operator.mul, w, y)) / n
    sxy = math.fsum(c * (a - mx) * (b - my) for c, a, b in zip(w, x, y))
    sxx = math.fsum(c * (a - mx) ** 2 for c, a in zip(w, x))
    syy = math.fsum(c * (b - my) ** 2 for c, b in zip(w, y))
    return sxy / math.sqrt(sxx * syy) if sxx > 1e-24 and syy > 1e-24 else None


def minimum_detectable(se_difference: float, level: float = 0.95, power: float = MDE_POWER) -> float:
    """The smallest true difference a two-sided test at `level` finds with `power` (Miller eq. 10)."""
    return (z_quantile(0.5 + level / 2) + z_quantile(power)) * se_difference


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q quantile, interpolated linearly between order statistics."""
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
