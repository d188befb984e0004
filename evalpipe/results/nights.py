"""The watch's nights (docs/watch.md): each complete night's verdict and the history page made from the verdicts.
Reads files and the figures the caller hands it, never a benchmark."""

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from ..errors import EXIT_CHANGED, EXIT_OK, BadInput
from ..store import jsonl, manifest, paths
from . import items, plots, stats, tables
from .items import ItemFigure
from .shapes import row_id
from .tables import signed
from .viewer.collect import passed

VERDICT = "watch.json"  # a complete night's verdict, in its run folder
DATASET = "dataset.json"  # what the night was given to read, written by the watch when the night starts
HISTORY = "history"  # history.{md,csv,json,png} beside the nights
FORMAT = 1
DEFAULT_ALPHA = 0.01
FLIPS_SHOWN = 10  # flipped task ids named in a change report

# what else may change between two nights; those that flag the night (exit 8) and those only reported
FLAGGING = ("served model", "judge model", "judge's served model", "dataset")
SERVED_NAMES = ("served model", "served fingerprint", "judge's served model", "judge's fingerprint")
REPORTED = ("served fingerprint", "judge's fingerprint", "endpoint", "model settings", "judge settings", "price table")


def run_number(night: str) -> int:
    return int(night.replace("-", ""))


class Night:
    """A complete night's files, read once: items, facts, each task's pass (1) or fail (0) as the viewer counts."""

    def __init__(self, folder: Path):
        path = paths.items_path(folder / "score.json")
        if not path.exists():
            raise BadInput("no items.json: run score again", path)
        cluster, columns = items.read(path)
        self.folder, self.items = folder, items.ModelItems([columns], cluster)
        self.facts = facts(folder)
        self.passes: dict[str, int] = jsonl.latest_rows(folder / "judge.jsonl", row_id, passed)


def _headline(figures: Sequence[ItemFigure]) -> ItemFigure:
    """The figure a verdict rests on: the first of the headline table (the leaderboard sorts by it)."""
    return next(f for f in figures if not f.table and f.by is None)


def read_json(path: Path) -> dict:
    """A JSON object the watch wrote ({} when absent)."""
    if not path.exists():
        return {}
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON ({exc})", path) from None
    return data if isinstance(data, dict) else {}


def facts(folder: Path) -> dict:
    """What made a night's rows: served models, judge, dataset, settings (the manifests' fingerprints), price table."""
    score = read_json(folder / "score.json")
    served = score.get("served") or {}
    infer = manifest.read_run(folder / "infer.jsonl") or {}
    judge = manifest.read_run(folder / "judge.jsonl") or {}
    model_settings = dict(infer.get("fingerprint") or {})
    dataset = {"sha256": model_settings.pop("dataset_sha256", infer.get("dataset_sha256"))}
    dataset |= {k: v for k, v in read_json(folder / DATASET).items() if k in ("source", "source_sha256", "revision")}
    if infer.get("dataset_source"):
        dataset["revision"] = infer["dataset_source"]
    prices = (score.get("cost") or {}).get("prices") or {}
    price_file = Path(prices["file"]) if prices.get("file") else None
    return {
        "served model": served.get("model") or {},
        "served fingerprint": served.get("model_fingerprint") or {},
        "judge model": (judge.get("fingerprint") or {}).get("judge_model") or judge.get("judge_model"),
        "judge's served model": served.get("judge") or {},
        "judge's fingerprint": served.get("judge_fingerprint") or {},
        "dataset": dataset,
        "endpoint": infer.get("endpoint"),
        "model settings": model_settings,
        "judge settings": {k: v for k, v in (judge.get("fingerprint") or {}).items() if k != "judge_model"},
        "price table": {
            "as_of": prices.get("as_of"),
            "sha256": manifest.sha256_file(price_file) if price_file and price_file.exists() else None,
        },
        "cost_usd": (score.get("cost") or {}).get("cost_usd"),
    }


def _shown(value: Any) -> str:
    """A fact as one short line of plain text (names from an endpoint cannot add lines to a report)."""
    if isinstance(value, dict) and value and all(isinstance(n, int) for n in value.values()):
        text = ", ".join(f"{name} ({n})" for name, n in value.items())  # served names with their row counts
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in value.items() if v is not None) or "-"
    else:
        text = "-" if value in (None, "") else str(value)
    return re.sub(r"\s+", " ", "".join(c if c.isprintable() else " " for c in text))[:300]


def changes(before: dict, after: dict) -> list[dict]:
    """What differs between two nights' facts: served names as sets, settings key by key, the dataset where known."""
    out = []
    for what in (*FLAGGING, *REPORTED):
        old, new = before.get(what), after.get(what)
        if what in ("model settings", "judge settings"):
            detail = [_shown(d) for d in manifest.differences(old or {}, new or {})]
            if detail:
                out.append({"what": what, "before": None, "after": None, "detail": detail, "flags": False})
            continue
        if what in SERVED_NAMES:
            differ = set(old or {}) != set(new or {})
        elif what == "dataset":
            old, new = old or {}, new or {}
            differ = any(old[k] != new[k] for k in set(old) & set(new))
        else:
            differ = old != new
        if differ:
            out.append({"what": what, "before": _shown(old), "after": _shown(new), "flags": what in FLAGGING})
    return out


def _moved(result: dict, alpha: float) -> bool:
    """Beyond noise: p below alpha, or every paired difference the same and not zero (no spread to test)."""
    if result.get("p_value") is not None:
        return result["p_value"] < alpha
    return result.get("se") == 0 and abs(result.get("diff") or 0.0) > 1e-12


def compare(figures: Sequence[ItemFigure], before: Night, after: Night, alpha: float) -> dict:
    """Tonight (`after`) against an earlier night, paired task by task: headline, biggest moves, flips, changes."""
    tonight, earlier = after.items, before.items
    head = _headline(figures)
    result = items.compare(tonight, earlier, head, head.name, None)
    headline = None if result is None else {"figure": head.name, **result}
    moves = []
    for figure in figures:
        for name, _ in tonight.subsets(figure):
            if figure is head:
                continue
            other = items.compare(tonight, earlier, figure, name, None)
            if other is not None:
                kept = {k: other[k] for k in ("diff", "ci95", "p_value", "n_items")}
                moves.append({"figure": name, "table": figure.table, **kept, "beyond_noise": _moved(other, alpha)})
    moves.sort(key=lambda m: -abs(m["diff"]))
    old, new = before.passes, after.passes
    paired = [task for task in new if task in old]
    to_fail = [task for task in paired if old[task] == 1 and new[task] == 0]
    to_pass = [task for task in paired if old[task] == 0 and new[task] == 1]
    found = changes(before.facts, after.facts)
    flagged = [c["what"] for c in found if c["flags"]]
    if headline is not None and _moved(headline, alpha):
        flagged.insert(0, "headline")
    run = f"{int(paths.RUN_DIR.match(before.folder.name).group(1)):08d}"  # type: ignore[union-attr]
    return {
        "night": f"{run[:4]}-{run[4:6]}-{run[6:]}",
        "headline": headline,
        "moves": moves[:5],  # the biggest moves of the other figures
        "flips": {
            "paired": len(paired),
            "to_fail": len(to_fail),
            "to_pass": len(to_pass),
            "first_to_fail": to_fail[:FLIPS_SHOWN],
            "first_to_pass": to_pass[:FLIPS_SHOWN],
        },
        "changes": found,
        "flagged": flagged,
    }


def _interval(ci: Sequence[float] | None, diff: bool = False) -> str:
    if not ci:
        return "[-]"
    shown = signed if diff else tables.pct
    return f"[{shown(ci[0])}, {shown(ci[1])}]"


def _p_text(p: float | None) -> str:
    return "p -" if p is None else f"p {p:.2g}"


def summary_line(verdict: dict) -> str:
    head = verdict["headline"]
    where = f"watch: {verdict['benchmark']} {verdict['model']} {verdict['night']}"
    if verdict["exit_code"]:
        what = "CHANGED (" + ", ".join(verdict["flagged"]) + ")"
    elif verdict["previous"] is None:
        what = "first night, nothing to compare with yet"
    else:
        what = "no change"
    parts = [f"{head['figure']} {tables.pct(head['mean'])} {_interval(head['ci95'])}"]
    for c in filter(None, (verdict["previous"], verdict["baseline"])):
        h, flips = c["headline"], c["flips"]
        if h is None:
            parts.append(f"vs {c['night']}: no tasks in common")
            continue
        parts.append(
            f"vs {c['night']} {signed(h['diff'])} {_interval(h['ci95'], diff=True)} ({_p_text(h['p_value'])}, "
            f"{h['n_items']} tasks, {flips['to_fail'] + flips['to_pass']} flipped)"
        )
    if verdict["facts"].get("served model"):
        parts.append(f"served {_shown(verdict['facts']['served model'])}")
    also = [c["what"] for c in (verdict["previous"] or {}).get("changes", []) if not c["flags"]]
    if also:
        parts.append("also changed: " + ", ".join(also))
    return f"{where}: {what}. " + "; ".join(parts)


def report(verdict: dict, link: str | None) -> str:
    """The short report of a changed night (cron mails it)."""
    lines = [summary_line(verdict), ""]
    alpha = verdict["alpha"]
    for label, c in (("previous night", verdict["previous"]), ("baseline", verdict["baseline"])):
        if c is None:
            continue
        h = c["headline"]
        lines.append(f"Against the {label}, {c['night']}:")
        if h is not None:
            moved = _moved(h, alpha)
            verdict_word = f"{'beyond' if moved else 'within'} noise at two-sided alpha {alpha:g}"
            if not moved and h["p_value"] is None:
                verdict_word = "every paired task scored alike: nothing to test"
            lines.append(
                f"  {h['figure']}: {signed(h['diff'])} points {_interval(h['ci95'], diff=True)}, "
                f"{_p_text(h['p_value'])} ({verdict_word}), paired on {h['n_items']} tasks"
                + (f" in {h['n_clusters']} clusters" if h.get("n_clusters") else "")
                + (f", {h['n_left_out']} left out" if h.get("n_left_out") else "")
            )
        else:
            lines.append("  no tasks in common: the headline cannot be compared")
        for change in c["changes"]:
            # only a change since the previous night flags: the baseline's is the same change, flagged once
            mark = " (flags the night)" if change["flags"] and c is verdict["previous"] else ""
            if change.get("detail"):
                lines.append(f"  {change['what']} changed{mark}: " + "; ".join(change["detail"]))
            else:
                lines.append(f"  {change['what']}{mark}: {change['before']} -> {change['after']}")
        if c["moves"]:
            lines.append("  biggest moves of the other figures:")
            for m in c["moves"]:
                shown = f"{signed(m['diff'])} {_interval(m['ci95'], diff=True)} {_p_text(m['p_value'])}"
                lines.append(f"    {m['figure']}: {shown}" + (" *" if m["beyond_noise"] else ""))
        flips = c["flips"]
        lines.append(
            f"  flipped: {flips['to_fail'] + flips['to_pass']} of {flips['paired']} tasks "
            f"({flips['to_fail']} pass -> fail, {flips['to_pass']} fail -> pass)"
        )
        for key, words in (("first_to_fail", "pass -> fail"), ("first_to_pass", "fail -> pass")):
            if flips[key]:
                lines.append(f"    {words}: " + ", ".join(map(_shown, flips[key])))
    if any(m["beyond_noise"] for c in (verdict["previous"], verdict["baseline"]) if c for m in c["moves"]):
        lines.append(f"(* beyond noise at alpha {alpha:g}, each figure on its own: only the headline decides)")
    if link:
        lines.append(f"Compare the two nights: {link}")
    lines.append(f"History: {verdict['history']}")
    return "\n".join(lines) + "\n"


def noise(history: list[dict], alpha: float) -> dict | None:
    """The flip rate between consecutive quiet nights (all pairs when none is quiet) and the pass rate's MDE at
    two-sided `alpha`: a paired difference of 0/1 scores has variance flip rate / tasks."""
    pairs = [v["previous"] for v in history if v.get("previous")]
    quiet = [c for c in pairs if not c["flagged"]] or pairs
    flipped = sum(c["flips"]["to_fail"] + c["flips"]["to_pass"] for c in quiet)
    paired = sum(c["flips"]["paired"] for c in quiet)
    if not paired:
        return None
    rate = flipped / paired
    tasks = paired / len(quiet)
    return {
        "night_pairs": len(quiet),
        "flipped": flipped,
        "paired": paired,
        "flip_rate": rate,
        "tasks_per_night": round(tasks),
        "alpha": alpha,
        "power": stats.MDE_POWER,
        "mde": stats.minimum_detectable(math.sqrt(rate / tasks), level=1 - alpha),
    }


def _row(v: dict) -> dict:
    prev = v.get("previous") or {}
    h = prev.get("headline") or {}
    flips = prev.get("flips") or {}
    return {
        "night": v["night"],
        "figure": v["headline"]["figure"],
        "value": v["headline"]["mean"],
        "ci95": v["headline"]["ci95"],
        "tasks": v["headline"]["n_items"],
        "vs_night": prev.get("night"),
        "diff": h.get("diff"),
        "diff_ci95": h.get("ci95"),
        "p_value": h.get("p_value"),
        "flipped": (flips.get("to_fail", 0) + flips.get("to_pass", 0)) if flips else None,
        "served_model": _shown(v["facts"].get("served model")),
        "judge_served": _shown(v["facts"].get("judge's served model")),
        "cost_usd": v["facts"].get("cost_usd"),
        "flag": ", ".join(v["flagged"]),
        "exit_code": v["exit_code"],
    }


def write_history(model_dir: Path, title: str, plot: bool = False) -> list[Path]:
    """history.{json,csv,md} from the verdicts (history.png with `plot`: make report's; a night never waits for it)."""
    done = [f / VERDICT for f in model_dir.glob("run-*") if paths.RUN_DIR.match(f.name) and (f / VERDICT).exists()]
    found = sorted(map(read_json, done), key=lambda v: v.get("night", ""))
    if not found:
        return []
    alpha = found[-1].get("alpha", DEFAULT_ALPHA)
    rows = [_row(v) for v in found]
    power = noise(found, alpha)
    json_file, csv_file, png, md = (model_dir / f"{HISTORY}.{ext}" for ext in ("json", "csv", "png", "md"))
    body = {"format": FORMAT, "title": title, "noise": power, "nights": rows}
    jsonl.write_json(json_file, body)
    # each interval as two cells: ci95 as ci_low, ci_high
    headers = [h for k in rows[0] for h in ([f"{k[:-2]}_low", f"{k[:-2]}_high"] if k.endswith("ci95") else [k])]
    cells = [[c for k, v in r.items() for c in ((v or [None, None]) if k.endswith("ci95") else [v])] for r in rows]
    jsonl.atomic_write(csv_file, tables.csv_text(headers, cells).encode())
    if plot:
        _plot(png, title, rows)
    plotted = png.exists()  # drawn now, or the last one drawn until make report draws it again
    jsonl.atomic_write(md, _markdown(title, rows, power, plotted).encode())
    return [json_file, csv_file, *([png] if plotted else []), md]


def _markdown(title: str, rows: list[dict], power: dict | None, plotted: bool) -> str:
    lines = [f"## Watch: {tables.md_escape(title)}", ""]
    if power is not None:
        lines.append(
            f"Run-to-run noise, measured: {power['flipped']} of {power['paired']} paired tasks flipped between "
            f"{power['night_pairs']} pairs of consecutive nights (flip rate {100 * power['flip_rate']:.1f}%). With "
            f"{power['tasks_per_night']} tasks a night, the smallest change in the pass rate a night detects at "
            f"{100 * power['power']:.0f}% power (two-sided alpha {power['alpha']:g}) is {100 * power['mde']:.1f} points"
            + (" (no task flipped: any change is beyond noise)." if not power["flipped"] else ".")
        )
    else:
        lines.append("Run-to-run noise: not measured yet (it needs two complete nights).")
    lines.append("")
    table = []
    for r in reversed(rows):
        value = f"{tables.pct(r['value'])} {_interval(r['ci95'])}"
        change = "-" if r["diff"] is None else f"{signed(r['diff'])} {_interval(r['diff_ci95'], diff=True)}"
        p = "-" if r["p_value"] is None else f"{r['p_value']:.2g}"
        flipped = "-" if r["flipped"] is None else str(r["flipped"])
        table.append([r["night"], value, change, p, flipped, r["served_model"], r["judge_served"], r["flag"] or "-"])
    headers = ["Night", f"{rows[-1]['figure']} [95% CI]", "Change vs night before [95% CI]", "p", "Flipped"]
    lines.append(tables.markdown_table([*headers, "Served model", "Judge served", "Flag"], table))
    if plotted:
        lines.append(f"![{tables.md_escape(title)}]({HISTORY}.png)\n")
    lines.append(f"Also: [CSV]({HISTORY}.csv) · [JSON]({HISTORY}.json)\n")
    return "\n".join(lines)


def _plot(path: Path, title: str, rows: list[dict]) -> None:
    plt = plots._pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rows) + 3), 3.6))
    xs = list(range(len(rows)))
    values = [100 * (r["value"] or 0.0) for r in rows]
    low = [max(0.0, v - 100 * r["ci95"][0]) if r["ci95"] else 0.0 for v, r in zip(values, rows)]
    high = [max(0.0, 100 * r["ci95"][1] - v) if r["ci95"] else 0.0 for v, r in zip(values, rows)]
    ax.errorbar(xs, values, yerr=[low, high], fmt="o-", capsize=3, color="#1f77b4")
    flagged = [i for i, r in enumerate(rows) if r["exit_code"]]
    if flagged:
        ax.scatter(flagged, [values[i] for i in flagged], s=120, facecolors="none", edgecolors="#d62728", zorder=3)
    step = max(1, len(rows) // 12)
    ax.set_xticks(xs[::step], [r["night"] for r in rows][::step], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{rows[-1]['figure']} (%), 95% CI")
    ax.set_title(f"{title} (red ring: flagged night)", fontsize=9)
    fig.tight_layout()
    plots.save(plt, fig, path, dpi=110)


def history_sections(results: list[tuple[Path, list[str]]], outputs_dir: Path) -> list[str]:
    """report.md's sections for the watched models' history pages, each made again with its plot (make report)."""
    out = []
    for root, present in results:
        for bench in present:
            for page in sorted((root / bench).glob(f"*/{HISTORY}.md")):
                link = page.parent.relative_to(outputs_dir).as_posix()
                write_history(page.parent, f"{bench} / {page.parent.name}", plot=True)
                text = re.sub(r"^## ", "### ", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
                text = text.replace(f"]({HISTORY}.", f"]({link}/{HISTORY}.")
                out.append(f"## Watch history: {link}\n\n{text}")
    return out


def verdict(
    figures: Sequence[ItemFigure], folder: Path, previous: Path | None, baseline: Path | None, alpha: float, about: dict
) -> dict:
    """A night's verdict: exit 8 when the headline moved beyond noise or a flagging fact changed since last night."""
    tonight = Night(folder)
    before = compare(figures, Night(previous), tonight, alpha) if previous is not None else None
    pinned = compare(figures, Night(baseline), tonight, alpha) if baseline and baseline != previous else None
    flagged = list(before["flagged"]) if before else []
    if pinned is not None and pinned["headline"] is not None and _moved(pinned["headline"], alpha):
        flagged.append("headline vs baseline")
    head = _headline(figures)  # with its interval over tasks (clustered where the benchmark clusters)
    found = items.estimate(tonight.items, head, None, None)
    ci = items.display_interval(found)
    kept = {k: found[k] for k in ("mean", "se")}
    headline = {"figure": head.name, **kept, "ci95": list(ci) if ci else None, "n_items": found["n_items"]}
    return {
        "format": FORMAT,
        **about,
        "alpha": alpha,
        "headline": headline,
        "facts": tonight.facts,
        "previous": before,
        "baseline": pinned,
        "flagged": flagged,
        "exit_code": EXIT_CHANGED if flagged else EXIT_OK,
    }
