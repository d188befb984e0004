"""How far judges agree, from their final rows keyed by task id: Cohen's κ and the 2×2 table overall, per category
and per rubric item, each side's response_format modes; files of one judge model: flip rate and Fleiss' κ."""

from collections import Counter
from collections.abc import Iterable
from typing import Any

NOTE = (
    "Judge agreement: the first judge file against each other one, on the tasks both graded finally "
    "(provisional rows left out). Raw agreement is the share of tasks given the same 0/1 score; Cohen's κ "
    "corrects it for the agreement expected by chance from the two pass rates (1: perfect, 0: chance, "
    "undefined when both judges give every task the same score). Flip rate and Fleiss' κ: files of one "
    "judge model, on the tasks all of them graded."
)

Rows = dict[Any, dict]


def fleiss_kappa(ratings: list[list[int]]) -> float | None:
    """Fleiss' κ of 0/1 ratings, one list per item with the same number (≥ 2) of raters each."""
    if not ratings or len(ratings[0]) < 2:
        return None
    m, n = len(ratings[0]), len(ratings)
    ones = [sum(item) for item in ratings]
    p_bar = sum((k1 * k1 + (m - k1) * (m - k1) - m) / (m * (m - 1)) for k1 in ones) / n
    p1 = sum(ones) / (n * m)
    pe = p1 * p1 + (1 - p1) * (1 - p1)
    return None if pe >= 1 else (p_bar - pe) / (1 - pe)


def _table_figures(pairs: Iterable[tuple[int, int]]) -> dict:
    """The 2×2 table of (first judge / second) scores, raw agreement po, pass rates, Cohen's κ: (po − pe) / (1 − pe)."""
    table = {"1/1": 0, "1/0": 0, "0/1": 0, "0/0": 0} | Counter(f"{a}/{b}" for a, b in pairs)
    n = sum(table.values())
    if n == 0:
        return {"n": 0, **dict.fromkeys(("raw_agreement", "cohen_kappa", "pass_rate_a", "pass_rate_b")), "table": table}
    po = (table["1/1"] + table["0/0"]) / n
    a1, b1 = (table["1/1"] + table["1/0"]) / n, (table["1/1"] + table["0/1"]) / n
    pe = a1 * b1 + (1 - a1) * (1 - b1)
    kappa = None if pe >= 1 else (po - pe) / (1 - pe)  # undefined when both judges give every task one score
    return {"n": n, "raw_agreement": po, "cohen_kappa": kappa, "pass_rate_a": a1, "pass_rate_b": b1, "table": table}


def _counts(values: Iterable[Any]) -> dict[str, int]:
    return dict(sorted(Counter("(not recorded)" if v is None else str(v) for v in values).items()))


def compare(a: Rows, b: Rows) -> dict:
    """Two judges on the tasks both graded finally: overall, per category, per rubric item, and formats."""
    common = [k for k in a if k in b]
    overall = _table_figures((a[k]["score"], b[k]["score"]) for k in common)
    categories: dict[str, list] = {}
    for k in common:
        categories.setdefault(a[k]["category"], []).append((a[k]["score"], b[k]["score"]))
    statuses = [(a[k]["statuses"], b[k]["statuses"]) for k in common]
    rubric_rows = [(sa, sb) for sa, sb in statuses if sa is not None and sb is not None and len(sa) == len(sb)]
    rubric_pairs = [pair for sa, sb in rubric_rows for pair in zip(sa, sb)]
    rubric = _table_figures(rubric_pairs) | {"tasks": len(rubric_rows)} if rubric_pairs else None
    formats = {side: _counts(rows[k]["format"] for k in common) for side, rows in (("a", a), ("b", b))}
    return {
        "overall": overall,
        "by_category": {c: _table_figures(p) for c, p in sorted(categories.items())},
        "rubric_items": rubric,
        "only_a": len(a) - len(common),
        "only_b": len(b) - len(common),
        "formats": formats,
        "format_ab": set(formats["a"]) != set(formats["b"]),
    }


def repeated(files: list[Rows]) -> dict:
    """Repeated judgments by one judge: on the tasks every file graded finally, the flip rate and Fleiss' κ."""
    common = [k for k in files[0] if all(k in f for f in files[1:])]
    ratings = [[f[k]["score"] for f in files] for k in common]
    flips = sum(1 for r in ratings if len(set(r)) > 1)
    return {
        "n": len(common),
        "flip_rate": flips / len(common) if common else None,
        "fleiss_kappa": fleiss_kappa(ratings),
        "pass_rate": sum(map(sum, ratings)) / (len(common) * len(files)) if common else None,
    }


def report(files: dict[str, tuple[Rows, int, str | None]]) -> dict:
    """Every file (name → final rows, provisional rows, judge model) against the first; repeats of one judge model."""
    first, *others = files
    pairs = [
        {"a": first, "b": name, "judge_model_a": files[first][2], "judge_model_b": files[name][2]}
        | compare(files[first][0], files[name][0])
        for name in others
    ]
    by_model: dict[str, list[str]] = {}
    for name, (_, _, model) in files.items():
        if model is not None:
            by_model.setdefault(model, []).append(name)
    repeats = [
        {"judge_model": model, "files": group} | repeated([files[n][0] for n in group])
        for model, group in sorted(by_model.items())
        if len(group) >= 2
    ]
    return {
        "files": {
            n: {"judge_model": m, "final_rows": len(rows), "provisional_left_out": p}
            for n, (rows, p, m) in files.items()
        },
        "pairs": pairs,
        "repeated": repeats,
        "note": NOTE,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _kappa(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def _line(f: dict) -> str:
    t = f["table"]
    return (
        f"{f['n']} tasks, raw {_pct(f['raw_agreement'])}, Cohen's κ {_kappa(f['cohen_kappa'])}, "
        f"pass rates {_pct(f['pass_rate_a'])} / {_pct(f['pass_rate_b'])}, "
        f"table (a/b) 1/1 {t['1/1']} · 1/0 {t['1/0']} · 0/1 {t['0/1']} · 0/0 {t['0/0']}"
    )


def format_report(section: dict) -> str:
    pooled = f" (pooled over {', '.join(section['pooled_over_runs'])})" if "pooled_over_runs" in section else ""
    lines = [f"Judge agreement{pooled}:"]
    for pair in section["pairs"]:
        lines.append(f"  {pair['a']} ({pair['judge_model_a'] or '?'}) vs {pair['b']} ({pair['judge_model_b'] or '?'}):")
        lines.append(f"    overall: {_line(pair['overall'])}")
        for cat, f in pair["by_category"].items():
            lines.append(f"    {cat}: {_line(f)}")
        rubric = pair["rubric_items"]
        if rubric is not None:
            counted = _line(rubric).replace(" tasks,", " items,", 1)
            lines.append(f"    rubric items ({rubric['tasks']} tasks): {counted}")
        fa, fb = (", ".join(f"{k} {v}" for k, v in pair["formats"][s].items()) or "-" for s in ("a", "b"))
        lines.append(f"    judge_format: {fa} | {fb}" + ("  (format A/B)" if pair["format_ab"] else ""))
        if pair["only_a"] or pair["only_b"]:
            lines.append(f"    not compared: {pair['only_a']} tasks final in a only, {pair['only_b']} in b only")
    for r in section["repeated"]:
        lines.append(
            f"  repeated ({r['judge_model']}: {', '.join(r['files'])}): {r['n']} tasks, "
            f"flip rate {_pct(r['flip_rate'])}, Fleiss' κ {_kappa(r['fleiss_kappa'])}"
        )
    return "\n".join(lines)
