"""A run's figures (`Benchmark.figures`, each an items.ItemFigure): score writes their values into score.json at each
figure's `key`, from the item columns of items.json; the leaderboard, the viewer and score's table read them back."""

import itertools
from collections.abc import Sequence
from typing import Any

from .items import ItemColumns, ItemFigure

HEADLINE = ""  # the `table` of the headline figures


def write(figures: Sequence[ItemFigure], columns: ItemColumns, metrics: dict) -> dict:
    """Each figure's run value into `metrics` at its key (per group value for a `by` figure), then the `run` ones."""
    for figure in sorted(figures, key=lambda f: f.run is not None):
        if figure.key is None:
            continue
        if figure.run is not None:
            _put(metrics, figure.key, "", figure.run(metrics))
        elif figure.by is None:
            _put(metrics, figure.key, "", _ratio(figure, columns, range(len(columns["keys"]))))
        else:
            positions: dict[Any, list[int]] = {}
            for i, label in enumerate(columns["groups"][figure.by]):
                positions.setdefault(label, []).append(i)
            for label, where in positions.items():
                _put(metrics, figure.key, str(label), _ratio(figure, columns, where))
    return metrics


def tables(figures: Sequence[ItemFigure], metrics: dict) -> dict[str, dict[str, float | None]]:
    """A run's figures from its score.json, by table title (HEADLINE first) then name; `by` figures group by group."""
    out: dict[str, dict[str, float | None]] = {}
    for (table, by), block in itertools.groupby(figures, lambda f: (f.table, f.by)):
        shown = out.setdefault(table, {})
        if by is None:
            for figure in block:
                shown[figure.name] = _get(metrics, figure.key, "") if figure.key else figure.run and figure.run(metrics)
            continue
        block_figures = list(block)
        labels = dict.fromkeys(label for figure in block_figures for label in _labels(metrics, figure.key or ""))
        for label in labels:
            for figure in block_figures:
                value = _get(metrics, figure.key or "", label, missing=_MISSING)
                if value is not _MISSING:
                    shown[figure.name.format(label)] = value
    return {title: shown for title, shown in out.items() if shown or title == HEADLINE}


def headline(figures: Sequence[ItemFigure], metrics: dict) -> dict[str, float | None]:
    return tables(figures, metrics)[HEADLINE]


_MISSING = object()


def _ratio(figure: ItemFigure, columns: ItemColumns, where: Sequence[int]) -> float:
    def total(name: str) -> float:
        values = columns["columns"][name]
        return sum(filter(None, values if len(where) == len(values) else map(values.__getitem__, where)))

    den = total(figure.den) if figure.den else len(where)
    return total(figure.num) / den if den else 0.0


def _part(part: str, label: str) -> str:
    return part.replace("{-}", label.replace("_", "-")).replace("{}", label)


def _put(metrics: dict, key: str, label: str, value: float | None) -> None:
    *path, last = key.split("/")
    for part in path:
        metrics = metrics.setdefault(_part(part, label), {})
    metrics[_part(last, label)] = value


def _get(metrics: dict, key: str, label: str, missing: Any = None) -> Any:
    value: Any = metrics
    for part in key.split("/"):
        if not isinstance(value, dict) or _part(part, label) not in value:
            return missing
        value = value[_part(part, label)]
    return value


def _labels(metrics: dict, key: str) -> list[str]:
    """The group values a `by` figure has in score.json: the keys that fit its key's part with "{}" (or "{-}")."""
    level: Any = metrics
    for part in key.split("/"):
        if "{" in part:
            break
        level = level.get(part) if isinstance(level, dict) else None
    if not isinstance(level, dict):
        return []
    hyphens = "{-}" in part
    before, after = part.split("{-}" if hyphens else "{}")
    fits = [k for k in level if len(k) > len(before) + len(after) and k.startswith(before) and k.endswith(after)]
    labels = [k[len(before) : len(k) - len(after)] for k in fits]
    return [label.replace("-", "_") for label in labels] if hyphens else labels
