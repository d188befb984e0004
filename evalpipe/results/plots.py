"""PNG bar charts of the leaderboard (models × figures); matplotlib is optional (requirements-report.txt)."""

import io
import re
import textwrap
from pathlib import Path

from ..store import jsonl
from .items import display_interval

MISSING = "matplotlib is not installed; `make report` installs it (requirements-report.txt)"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _bar(figure: dict | None, std_key: str) -> tuple[float, float, float, bool]:
    """(height, error below, error above, from items) in percent: the 95% item interval, else ± std over runs."""
    if not figure:
        return 0.0, 0.0, 0.0, False
    items = figure.get("items") or {}
    if items.get("mean") is not None:
        mean = items["mean"]
        low, high = display_interval(items) or (mean, mean)
        return 100 * mean, 100 * max(0.0, mean - low), 100 * max(0.0, high - mean), True
    if figure.get("mean") is None:
        return 0.0, 0.0, 0.0, False
    return 100 * figure["mean"], 100 * figure[std_key], 100 * figure[std_key], False


def bar_chart(path: Path, title: str, models: list[dict], figures_of, std_key: str) -> Path:
    plt = _pyplot()
    names = list(dict.fromkeys(n for m in models for n in figures_of(m)))
    width = 0.8 / max(1, len(models))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) * max(1, len(models)) ** 0.5 + 2), 4.5), dpi=110)
    kinds = set()
    for i, m in enumerate(models):
        figures = figures_of(m)
        xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(names))]
        bars = [_bar(figures.get(n), std_key) for n in names]
        kinds |= {from_items for *_, from_items in bars}
        errors = [[b[1] for b in bars], [b[2] for b in bars]]
        ax.bar(xs, [b[0] for b in bars], width, yerr=errors, capsize=3, label=f"{m['model']} ({len(m['runs'])} runs)")
    ax.set_xticks(range(len(names)))
    wrapped = [textwrap.fill(" ".join(n.split()), 16, break_long_words=False, break_on_hyphens=False) for n in names]
    ax.set_xticklabels(wrapped, fontsize=8)
    label = {
        frozenset({True}): "percent; error bars: 95% interval over tasks",
        frozenset({False}): "percent; error bars: ± std over runs",
    }.get(frozenset(kinds), "percent; error bars: 95% interval over tasks (± std over runs where no items)")
    ax.set_ylabel(label, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return save(plt, fig, path)


def save(plt, fig, path: Path, **options) -> Path:
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None}, **options)
    plt.close(fig)
    jsonl.atomic_write(path, png.getvalue())
    return path


def write_all(bench, models: list[dict], out_dir: Path, std_kind: str) -> list[Path] | None:
    """The headline chart and one per extra table; None when matplotlib is missing."""
    if _pyplot() is None:
        return None
    std_key = f"std_{std_kind}"
    written = [bar_chart(out_dir / "aggregate.png", bench.name, models, lambda m: m["figures"], std_key)]
    for title in dict.fromkeys(t for m in models for t in m["extra_tables"]):
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        path, name = out_dir / f"aggregate-{slug}.png", f"{bench.name}: {title}"
        written.append(bar_chart(path, name, models, lambda m, t=title: m["extra_tables"].get(t, {}), std_key))
    return written
