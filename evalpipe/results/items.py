"""Item-level uncertainty and paired model comparisons (docs/statistics.md). Items are counted, not listed: identical
items (cluster, group labels, every run's value of every column) are one weighted entry."""

import math
import random
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, TypedDict, cast

import orjson

from ..errors import BadInput
from . import stats

FORMAT = 1  # items.json's layout version
LEVEL = 0.95
SMALL_ITEMS = 100  # fewer items than this get a Wilson interval (where the figure is a proportion)
MDE_RUNS = (1, 3, 5, 10)  # runs per item the minimum detectable difference is projected for


@dataclass(frozen=True)
class ItemFigure:
    """One figure a benchmark reports: Σnum / Σden over items (den None: over all items; 0/0 is 0.0); with `by`,
    one figure per value of that group column, named `name.format(value)`."""

    name: str
    num: str
    den: str | None = None
    by: str | None = None
    table: str = ""  # "" for the headline table, else the title of an extra table
    proportion: bool = True  # per run, num ∈ {0, 1} and num ≤ den ∈ {0, 1}: Wilson applies
    bounds: tuple[float | None, float | None] = (0.0, 1.0)  # the values it can take (None: unbounded)
    # where score.json keeps the run's value: keys joined by "/", "{}" the group value ("{-}": "_" written "-")
    key: str | None = None
    # the run's value from score.json's other figures where the reference computes it so (F1 from precision, recall)
    run: Callable[[dict], float | None] | None = None


def display_interval(items: dict) -> tuple[float, float] | None:
    """An estimate's 95% interval clipped to its figure's bounds (estimates without `bounds`: rates to [0, 1])."""
    ci = items.get("ci95")
    if not ci:
        return None
    lowest, highest = items.get("bounds") or ([0.0, 1.0] if items.get("proportion") else [None, None])
    return ci[0] if lowest is None else max(lowest, ci[0]), ci[1] if highest is None else min(highest, ci[1])


class ItemColumns(TypedDict):
    """One run's values per item, as score writes them (None: the item was not graded in that run)."""

    keys: list  # the item of each position (a task id, or what several tasks share)
    clusters: list | None  # the cluster of each item, or None when items are independent
    groups: dict[str, list]  # group columns the `by` figures split on
    columns: dict[str, list]  # value columns the figures read


def encoded(benchmark: str, cluster: str | None, columns: ItemColumns) -> Iterator[bytes]:
    """items.json's bytes (compact JSON), a column at a time: a million items are never one buffer."""
    head = orjson.dumps({"format": FORMAT, "benchmark": benchmark, "cluster": cluster})
    yield head[:-1]  # the object stays open for the rest
    for name, value in columns.items():
        yield b"," + orjson.dumps(name) + b":"
        if name != "columns":
            yield orjson.dumps(value)
            continue
        yield b"{"
        for i, (column, values) in enumerate(cast(dict, value).items()):
            yield (b"," if i else b"") + orjson.dumps(column) + b":" + orjson.dumps(values)
        yield b"}"
    yield b"}"


def read(path: Path) -> tuple[str | None, ItemColumns]:
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON ({exc}); run score again", path) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInput(f"not an items file of format {FORMAT}; run score again", path)
    try:
        columns = cast(ItemColumns, {key: data[key] for key in ("keys", "clusters", "groups", "columns")})
    except KeyError as exc:
        raise BadInput(f"no {exc} in the items file; run score again", path) from None
    return data.get("cluster"), columns


Entry = tuple[Hashable, float, float, int, int]  # (cluster, a, b, runs that graded it, how many such items)


class ModelItems:
    """A model's runs aligned by item key, each item coded by its profile (every run's value of every column)."""

    def __init__(self, runs: Sequence[ItemColumns], cluster: str | None):
        if not runs:
            raise ValueError("no runs")
        self.cluster = cluster
        first = runs[0]
        if all(r["keys"] == first["keys"] for r in runs[1:]):
            self.keys = first["keys"]
            aligned = list(runs)
        else:  # runs over different task sets: every item of any run, in first-seen order
            self.keys = list(dict.fromkeys(key for r in runs for key in r["keys"]))
            position = {key: i for i, key in enumerate(self.keys)}
            aligned = [_realigned(r, position) for r in runs]
        n = len(self.keys)
        self.n_runs = len(aligned)
        self.column_names = sorted({name for r in aligned for name in r["columns"]})
        columns = [r["columns"].get(name) or [None] * n for r in aligned for name in self.column_names]
        index: dict[tuple, int] = {}
        self.codes = [index.setdefault(p, len(index)) for p in zip(*columns)] if columns else [0] * n
        self.profiles = list(index) or [()]
        self.clusters = next((r["clusters"] for r in aligned if r["clusters"] is not None), None)
        self.groups = first["groups"]
        if len(aligned) > 1:  # each item's labels from the first run that has the item
            names = dict.fromkeys(name for r in aligned for name in r["groups"])
            by = {name: [r["groups"][name] for r in aligned if name in r["groups"]] for name in names}
            self.groups = {n: [next((x for x in xs if x is not None), None) for xs in zip(*c)] for n, c in by.items()}
        self._values: dict[tuple[str, str | None], list[tuple[float, float, int]]] = {}
        self._counts: dict[str | None, Counter] = {}

    def values(self, num: str, den: str | None) -> list[tuple[float, float, int]]:
        """Per profile code: the means (a, b) of num and den over the k runs that graded both, and k."""
        cached = self._values.get((num, den))
        if cached is not None:
            return cached
        for column in filter(None, (num, den)):
            if column not in self.column_names:
                raise BadInput(f"the items files have no column {column!r}; run score again")
        width = len(self.column_names)  # a profile holds each run's columns in turn
        nums = [j * width + self.column_names.index(num) for j in range(self.n_runs)]
        dens = [j * width + self.column_names.index(den) for j in range(self.n_runs)] if den else [None] * self.n_runs
        out = []
        for profile in self.profiles:
            pairs = [(profile[i], 1 if j is None else profile[j]) for i, j in zip(nums, dens)] if profile else []
            graded = [xy for xy in pairs if None not in xy]
            k = len(graded)
            sa, sb = sum(x for x, _ in graded), sum(y for _, y in graded)
            out.append((sa / k, sb / k if den else 1.0, k) if k else (0.0, 0.0 if den else 1.0, 0))
        self._values[(num, den)] = out
        return out

    def entries(self, figure: ItemFigure, label: Hashable) -> list[Entry]:
        """The figure's items (of the group value `label` for a `by` figure), counted by (cluster, label, profile)."""
        values, by = self.values(figure.num, figure.den), figure.by
        if by not in self._counts:
            labels = self.groups.get(by) if by else None
            self._counts[by] = Counter(zip(self.clusters or repeat(None), labels or repeat(None), self.codes))
        return [(c, *values[code], n) for (c, item, code), n in self._counts[by].items() if by is None or item == label]

    def subsets(self, figure: ItemFigure) -> Iterator[tuple[str, Hashable]]:
        """(figure name, group value) for a figure: one per value of its group, or (name, None)."""
        if figure.by is None:
            yield figure.name, None
            return
        for label in dict.fromkeys(self.groups.get(figure.by) or ()):
            yield figure.name.format(label), label


def _realigned(run: ItemColumns, position: dict[Hashable, int]) -> ItemColumns:
    n = len(position)
    where = [position[k] for k in run["keys"]]

    def spread(values: list | None) -> list | None:
        if values is None:
            return None
        out: list = [None] * n
        for i, v in zip(where, values):
            out[i] = v
        return out

    return {
        "keys": list(position),
        "clusters": spread(run["clusters"]),
        "groups": {g: spread(v) for g, v in run["groups"].items()},  # type: ignore[misc]
        "columns": {c: spread(v) for c, v in run["columns"].items()},  # type: ignore[misc]
    }


def _methods(figure: ItemFigure, cluster: str | None, df: int) -> tuple[str, float, str | None]:
    """The SE's method, and the 95% interval's quantile and method: a plain mean, or a clustered ratio, uses t(df), an
    unclustered ratio (the delta method) z; one cluster (tasks that share one context) leaves no degrees of freedom."""
    se_method = "delta" if figure.den else "naive"
    if cluster is not None:
        se_method = ("delta+" if figure.den else "") + f"cr1:{cluster}"
    if df < 1:
        return se_method, 0.0, None
    if figure.den is not None and cluster is None:
        return se_method, stats.z_quantile(0.5 + LEVEL / 2), "z"
    return se_method, stats.t_quantile(0.5 + LEVEL / 2, df), f"t(df={df})"


def _ratio(entries: list[Entry], figure: ItemFigure, clustered: bool) -> stats.RatioEstimate:
    clusters, a, b, _, weights = zip(*entries) if entries else ([], [], [], [], [])
    return stats.RatioEstimate(a, b if figure.den else None, clusters if clustered else None, weights)


def estimate(items: ModelItems, figure: ItemFigure, label: Hashable, bootstrap: "Bootstrap | None") -> dict:
    """The `items` object of one figure: mean, standard errors, 95% interval and how they were made."""
    entries = items.entries(figure, label)
    clustered = items.clusters is not None
    ratio = _ratio(entries, figure, clustered)
    se, n_clusters, df = ratio.se_df()
    se_method, q, ci_method = _methods(figure, items.cluster if clustered else None, df)
    graded = [e[3] for e in entries]
    n = ratio.n
    out: dict[str, Any] = {
        "mean": ratio.value,
        "se": None,
        "se_naive": ratio.se_naive(),
        "ci95": None,
        "n_items": n,
        "n_clusters": None,
        "runs_per_item": [min(graded), max(graded)] if graded else [0, 0],
        "n_ungraded": sum(e[4] for e in entries if e[3] == 0),
        "se_method": se_method,
        "ci_method": None,
        "ci_level": LEVEL,
        "proportion": figure.proportion,
        "bounds": list(figure.bounds),
    }
    if ratio.value is None:
        return out
    out["n_clusters"] = n_clusters
    if clustered and se is not None and out["se_naive"]:
        out["design_effect"] = (se / out["se_naive"]) ** 2
    out["se"] = se
    if se is not None:
        out["ci95"], out["ci_method"] = [ratio.value - q * se, ratio.value + q * se], ci_method
        if se > 0:  # no spread at all says nothing about the differences it could detect
            out["mde"] = stats.minimum_detectable(math.sqrt(2) * se, LEVEL)
    exact_bound = figure.proportion and ratio.value in (0.0, 1.0)
    out["small_sample"] = n < SMALL_ITEMS or exact_bound or se is None or se == 0
    if out["small_sample"] and figure.proportion:
        trials = math.fsum(e[4] * e[2] for e in entries) if figure.den else float(n)
        successes = math.fsum(e[4] * e[1] for e in entries)
        deff = max(1.0, out.get("design_effect") or 1.0)  # clustered: Kish's effective sample size
        interval = stats.wilson(successes / deff, trials / deff, LEVEL)
        if interval is not None:
            out["ci95_from_se"] = out["ci95"]
            out["ci95"], out["ci_method"] = list(interval), "wilson"
    if figure.proportion and figure.den is None and se and min(graded) >= 2:
        # from the spread within items: the run-to-run std it predicts, the MDE with other runs per item; the
        # within-item variance of 0/1 scores with mean x over k runs is k·x(1 − x)/(k − 1)
        within = math.fsum(w * k * x * (1 - x) / (k - 1) for _, x, _, k, w in entries)
        out["run_std_predicted"] = math.sqrt(within) / n
        if len(set(graded)) == 1:
            k = graded[0]
            noise = within / k / n / n  # the part of se² that more runs per item shrink
            between = max(0.0, se * se - noise)
            out["mde_runs"] = {
                str(r): stats.minimum_detectable(math.sqrt(2 * (between + noise * k / r)), LEVEL) for r in MDE_RUNS
            }
    if bootstrap is not None:
        out["bootstrap"] = bootstrap.interval([_units(entries, figure, clustered)], figure.name, clustered)
    return out


Units = tuple[list[float], list[float]]  # per resampling unit: the sum of numerators and of denominators


def _units(entries: list[Entry], figure: ItemFigure, clustered: bool) -> Units:
    if not clustered:  # an item once for each identical item it stands for
        nums = [a for _, a, _, _, w in entries for _ in range(w)]
        return nums, [b if figure.den else 1.0 for _, _, b, _, w in entries for _ in range(w)]
    sums: dict[Hashable, list[float]] = {}
    for cluster, a, b, _, w in entries:
        cell = sums.setdefault(cluster, [0.0, 0.0])
        cell[0] += w * a
        cell[1] += w * (b if figure.den else 1.0)
    return [s[0] for s in sums.values()], [s[1] for s in sums.values()]


@dataclass(frozen=True)
class Bootstrap:
    """Percentile intervals from resampling whole clusters (or items), each with all its runs."""

    replicates: int
    seed: int

    def interval(self, sides: list[Units], label: str, clustered: bool) -> dict:
        count = len(sides[0][0])
        rng = random.Random(f"{self.seed}:{label}")
        draws: list[float] = []
        picks = range(count)
        for _ in range(self.replicates if count else 0):
            chosen = rng.choices(picks, k=count)
            values = []
            for nums, dens in sides:
                total = sum(map(dens.__getitem__, chosen))
                values.append(sum(map(nums.__getitem__, chosen)) / total if total else math.nan)
            draws.append(values[0] if len(values) == 1 else values[0] - values[1])
        finite = sorted(d for d in draws if not math.isnan(d))
        return {
            "method": "percentile",
            "resampled": "clusters" if clustered else "items",
            "replicates": self.replicates,
            "seed": self.seed,
            "ci95": [stats.percentile(finite, q) for q in ((1 - LEVEL) / 2, (1 + LEVEL) / 2)] if finite else None,
            "se": stats.std(finite) if len(finite) > 1 else None,
            "undefined_replicates": len(draws) - len(finite),
        }


def compare(
    model: ModelItems, baseline: ModelItems, figure: ItemFigure, name: str, bootstrap: "Bootstrap | None"
) -> dict | None:
    """model − baseline on the items both graded (of the figure's group value), paired item by item."""
    label = None
    if figure.by is not None:
        label = next((x for _, x in model.subsets(figure) if figure.name.format(x) == name), None)
        if label is None:
            return None
    mine, theirs = model.values(figure.num, figure.den), baseline.values(figure.num, figure.den)
    codes: Sequence[int | None] = baseline.codes  # the baseline's profile code of each of the model's items
    dropped = 0  # items graded by one of the two models only
    if model.keys != baseline.keys:
        position = {key: j for j, key in enumerate(baseline.keys)}
        codes = [baseline.codes[position[key]] if key in position else None for key in model.keys]
        known, their_labels = set(model.keys), baseline.groups.get(figure.by) if figure.by else None
        for j, (key, code) in enumerate(zip(baseline.keys, baseline.codes)):
            item_label = their_labels[j] if their_labels else None
            if key not in known and (figure.by is None or item_label == label) and theirs[code][2]:
                dropped += 1
    labels = model.groups.get(figure.by) if figure.by else None
    joint = Counter(zip(model.clusters or repeat(None), labels or repeat(None), model.codes, codes))
    sides: tuple[list[Entry], list[Entry]] = ([], [])  # the items both graded, as each model graded them
    for (cluster, item_label, code1, code2), count in joint.items():
        if figure.by is not None and item_label != label:
            continue
        one, other = mine[code1], theirs[code2] if code2 is not None else (0.0, 0.0, 0)
        if one[2] and other[2]:  # graded by both
            sides[0].append((cluster, *one, count))
            sides[1].append((cluster, *other, count))
        elif one[2] or other[2]:
            dropped += count
    clustered = model.clusters is not None
    side1, side2 = (_ratio(side, figure, clustered) for side in sides)
    if side1.n < 2 or side1.value is None or side2.value is None:
        return None
    diff = stats.RatioEstimate([p - q for p, q in zip(side1.psi, side2.psi)], None, side1.clusters, side1.weights)
    se, n_clusters, df = diff.se_df()
    se_method, q, ci_method = _methods(figure, model.cluster if clustered else None, df)
    out: dict[str, Any] = {
        "diff": side1.value - side2.value,
        "se": se,
        "ci95": None,
        "p_value": None,
        "correlation": stats.correlation(side1.psi, side2.psi, side1.weights),
        "n_items": side1.n,
        "n_clusters": n_clusters,
        "n_left_out": dropped,
        "mde": stats.minimum_detectable(se, LEVEL) if se else None,
        "se_method": se_method,
        "ci_method": ci_method,
    }
    # se == 0: every paired difference is the same, so there is no spread to test against (no interval, no p)
    if se:
        out["ci95"] = [out["diff"] - q * se, out["diff"] + q * se]
        t = out["diff"] / se
        out["p_value"] = math.erfc(abs(t) / math.sqrt(2)) if ci_method == "z" else stats.t_two_sided_p(t, df)
    if bootstrap is not None:
        units = [_units(side, figure, clustered) for side in sides]
        out["bootstrap"] = bootstrap.interval(units, f"{name}:diff", clustered)
    return out
