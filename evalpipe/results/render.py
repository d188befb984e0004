"""aggregate's tables (leaderboard, item-level, run-to-run, power, comparisons, agreement) as Markdown, CSV, LaTeX."""

from collections.abc import Callable
from typing import NamedTuple

from . import tables
from .agreement import NOTE as AGREEMENT_NOTE
from .items import MDE_RUNS, display_interval
from .tables import pct, signed

MAIN = "main"  # the key of the headline table among a model's tables
FLAG, FLAG_TEX = "†", "\\textsuperscript{\\dag}"  # beside a headline figure the benchmark flags (Benchmark.flagged)
SMALL, SMALL_TEX = "‡", "\\textsuperscript{\\ddag}"  # beside an item-level figure from few items or a rate of 0 or 1
MIXED = "§"  # beside a model whose runs more than one served model answered or judged

ITEMS_NOTE = (
    "Items: each task's score averaged over the runs that graded it, then the mean over tasks, with its "
    "standard error (SE, in parentheses) and 95% interval [in brackets]; the intervals say how well the score is "
    "known given the tasks drawn. Methods per column in the last row: naive = SE over independent items; "
    "cr1:<key> = cluster-robust SE (CR1) over tasks sharing <key>; delta = the delta method for a ratio of item "
    "means; t(df) = Student's t with df = items − 1, or clusters − 1 when clustered; z = normal; wilson = "
    "Wilson's interval. Intervals are clipped for display to the values a figure can take (rates and F1: [0, 100]; "
    "aggregate.json has them raw)."
)
SMALL_NOTE = (
    f"{SMALL} Small sample (fewer than 100 items, or a rate of exactly 0 or 100, or no spread): the interval of a "
    "rate is Wilson's (for clustered items, on the effective sample size); other figures: cross-check with "
    "`--bootstrap`."
)
NO_ITEMS_NOTE = "Items: no items.json beside the runs' score.json (scored by an older version): run score again."
RUNS_NOTE = (
    "Runs: mean ± {std} over the runs: reproducibility of the score on this task set (sampling and judge noise), "
    "not an error bar for the model's skill."
)
RUNS_CI_NOTE = (
    "t-interval over runs: mean ± t(runs − 1) · s/√runs, conditional on the task set (it leaves out which tasks "
    "were drawn); not clipped."
)
POWER_NOTE = (
    "Minimum detectable difference (MDE): the smallest true gap, in points, that a two-sided test at α = 0.05 "
    "finds with 80% power against a model of the same variance when the two are not paired (a paired comparison, "
    "below, usually does better). Projected from the spread between each task's runs for other runs per task."
)
MIXED_NOTE = (
    f"{MIXED} Runs answered or judged by more than one served model (the rows' response_model, with "
    "counts): a name re-pointed to another snapshot mixes two models in one row. "
)
THINKING_NOTE = (
    "Thinking, over all runs (reasoning tokens are billed as output; the share is of the whole bill, judge "
    "included, or of the completion tokens without a price; an answer that ran out of tokens while thinking "
    "has no final answer and scores 0, as an empty answer): "
)
SETTINGS_NOTE = "Generation settings (from the manifests; a setting not listed was not sent): "
NOT_SENT = "none sent (the endpoint's defaults)"
COMPARE_NOTE = (
    "Paired comparisons: model − baseline on the tasks both graded, task by task (a task missing for either "
    "model is left out and counted), with the SE of the paired difference (clustered like the figure), its 95% "
    "interval, two-sided p-value, the correlation of the two models' task scores, and the MDE of this pair."
)


class Tables(NamedTuple):
    markdown: str
    csv: str
    latex: str
    comparisons_csv: str


def _figures_of(title: str) -> Callable[[dict], dict]:
    return lambda m: m["figures"] if title == MAIN else m["extra_tables"].get(title, {})


def _names(models: list[dict], figures_of: Callable[[dict], dict]) -> list[str]:
    return list(dict.fromkeys(n for m in models for n in figures_of(m)))


def _counted(found: dict) -> str:
    return ", ".join(f"{tables.md_escape(name)} ({n})" for name, n in found.items())


def provenance_notes(models: list[dict]) -> list[str]:
    """Under the leaderboard: mixed served models, thinking, and each row's settings (every name escaped)."""
    esc = tables.md_escape
    mixed, thought, settings_lines = [], [], []
    for m in models:
        model = esc(m["model"])
        if m.get("mixed_served_models"):
            served = m["served"]
            said = [f"{who} {_counted(served[who])}" for who in ("model", "judge") if len(served.get(who, {})) > 1]
            mixed.append(f"{model}: {'; '.join(said)}")
        t = m.get("thinking")
        if t:
            said = []
            if t["reasoning_tokens_per_task"] is not None:
                share = "" if t["reasoning_share"] is None else f", {pct(t['reasoning_share'])}% of the {t['share_of']}"
                said.append(f"{t['reasoning_tokens_per_task']:,.0f} reasoning tokens per task{share}")
            if t["thinking_truncated"]:
                said.append(f"{t['thinking_truncated']} answers ran out of tokens while thinking (scored 0)")
            if t["effort_applied"]:
                said.append(f"reasoning effort applied, as the endpoint said: {_counted(t['effort_applied'])}")
            thought.append(f"{model}: {'; '.join(said)}")
        settings = m.get("settings") or {}
        said = [
            f"{who}: " + (", ".join(f"{k} {esc(v)}" for k, v in values.items() if k != "model") or NOT_SENT)
            for who, values in settings.items()
        ]
        judge = (settings.get("judge") or {}).get("model")
        if said:
            settings_lines.append(model + (f" (judge {esc(judge)})" if judge else "") + ": " + "; ".join(said))
    intros = [(MIXED_NOTE, mixed), (THINKING_NOTE, thought), (SETTINGS_NOTE, settings_lines)]
    return [intro + ". ".join(parts) + "." for intro, parts in intros if parts]


def items_cell(items: dict | None, tex: bool = False) -> str:
    """`mean (SE) [low, high]` in percent, with the small-sample mark."""
    if not items or items.get("mean") is None:
        return "--" if tex else "-"
    text = pct(items["mean"]) + (f" ({pct(items['se'])})" if items.get("se") is not None else "")
    interval = display_interval(items)
    if interval:
        text += f" [{pct(interval[0])}, {pct(interval[1])}]"
    if tex:
        text = tables.latex_escape(text) + (SMALL_TEX if items.get("small_sample") else "")
    elif items.get("small_sample"):
        text += f" {SMALL}"
    return text


def runs_cell(figure: dict | None, std_key: str, with_ci: bool, tex: bool = False) -> str:
    if not figure or figure.get("mean") is None:
        return "--" if tex else "-"
    mean, std = 100 * figure["mean"], 100 * figure[std_key]
    text = f"${mean:.1f} \\pm {std:.1f}$" if tex else f"{mean:.1f} ± {std:.1f}"
    if with_ci:
        ci = figure.get("ci95")
        span = f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "[n/a: 1 run]"
        text += " " + (tables.latex_escape(span) if tex else span)
    return text


def _method(models: list[dict], figures_of: Callable[[dict], dict], name: str) -> str:
    """How a column's item-level figures were made, when all models agree (else "varies")."""
    found = [(figures_of(m).get(name) or {}).get("items") or {} for m in models]
    seen = {f"{i['se_method']}, {i['ci_method'] or 'no interval'}" for i in found if i.get("mean") is not None}
    return seen.pop() if len(seen) == 1 else ("varies (see JSON)" if seen else "-")


def _has_items(models: list[dict], figures_of: Callable[[dict], dict]) -> bool:
    return any((f or {}).get("items") for m in models for f in figures_of(m).values())


_STD_WORDS = {  # the std over runs shown, in Markdown and in LaTeX
    "sample": ("sample std (ddof 1)", "sample std ($n-1$)"),
    "population": ("population std (ddof 0)", "population std ($n$)"),
}


def render(bench, models: list[dict], comparisons: list[dict], std_kind: str, runs_ci: bool, flag_note: str) -> Tables:
    """Every table of a benchmark's aggregate, in Markdown, CSV (one row per model) and LaTeX."""
    flag_note = flag_note if any(m["flagged"] for m in models) else ""
    main_names = _names(models, _figures_of(MAIN))
    first = main_names[0] if main_names else None
    md: list[str] = []
    tex: list[str] = []
    if first is not None:
        _leaderboard(bench, models, first, std_kind, flag_note, md, tex)
    titles = [MAIN] + list(dict.fromkeys(t for m in models for t in m["extra_tables"] if t))
    for title in titles:
        _figure_tables(bench, models, title, std_kind, runs_ci, flag_note, md, tex)
    power = []
    for m in models:
        items = ((m["figures"].get(first) or {}).get("items") or {}) if first else {}
        if items.get("mde") is not None:
            projected = items.get("mde_runs") or {}
            mde = f"{pct(items['mde'])} ({items['runs_per_item'][1]} runs)"
            power.append([m["model"], mde, *(pct(projected.get(str(r))) for r in MDE_RUNS)])
    if power:
        headers = ["Model", "MDE now", *(f"{r} run{'s' if r > 1 else ''}/task" for r in MDE_RUNS)]
        table = tables.markdown_table(headers, power)
        md.append(f"## {bench.name}: power ({first}), in points\n\n{table}\n{POWER_NOTE}\n")
    rows = []  # the paired comparisons of the headline table's figures
    for c in [c for c in comparisons if c["table"] == "" and c["figure"] in main_names]:
        interval = f"[{signed(c['ci95'][0])}, {signed(c['ci95'][1])}]" if c["ci95"] else "-"
        p = "-" if c["p_value"] is None else f"{c['p_value']:.3g}"
        correlation = "-" if c["correlation"] is None else f"{c['correlation']:.2f}"
        cells = [f"{signed(c['diff'])} ({pct(c['se'])})", interval, p, correlation, str(c["n_items"])]
        counts = [_count(c["n_clusters"]), str(c["n_left_out"]), pct(c["mde"])]
        rows.append([c["model"], c["baseline"], c["figure"], *cells, *counts])
    if rows:
        table = tables.markdown_table(COMPARE_HEADERS, rows)
        md.append(f"## {bench.name}: paired comparisons, in points\n\n{table}\n{COMPARE_NOTE}\n")
        caption = tables.latex_escape(f"{bench.name}: paired comparisons (model − baseline), in points")
        tex_rows = [[row[0], *map(tables.latex_escape, row[1:])] for row in rows]
        tex.append(tables.latex_table(COMPARE_HEADERS, tex_rows, caption=caption))
    agreed = agreement_table(bench.name, models)
    if agreed:
        md.append(agreed)
    md.append(f"{bench.aggregate_note}\n")
    return Tables("\n".join(md), _csv(models, titles, std_kind), "\n".join(tex), _comparisons_csv(comparisons))


def _both(models: list[dict], row: Callable[[dict, bool], list]) -> tuple[list[list], list[list]]:
    return [row(m, False) for m in models], [row(m, True) for m in models]


def _leaderboard(bench, models: list[dict], first: str, std_kind: str, flag_note: str, md: list, tex: list) -> None:
    headers = ["Model", "Runs", "Items", "Clusters", f"{first}: items, mean (SE) [95% CI]"]
    headers += [f"{first}: runs, mean ± std", f"MDE ({first})", "Cost/run (USD)"]

    def row(m: dict, tex: bool) -> list:
        figure = m["figures"].get(first)
        items = (figure or {}).get("items") or {}
        name = m["model"] + (f" {MIXED}" if m.get("mixed_served_models", False) else "")
        counts = [len(m["runs"]), _count(items.get("n_items")), _count(items.get("n_clusters"))]
        cost = "-" if m["cost_usd_per_run"] is None else f"{m['cost_usd_per_run']:.4f}"
        shown = [items_cell(items, tex), runs_cell(figure, f"std_{std_kind}", False, tex)]
        if m["flagged"]:
            shown[0] += FLAG_TEX if tex else f" {FLAG}"
        return [name, *counts, *shown, pct(items.get("mde")), cost]

    rows, tex_rows = _both(models, row)
    notes = [ITEMS_NOTE if _has_items(models, _figures_of(MAIN)) else NO_ITEMS_NOTE]
    notes.append(RUNS_NOTE.format(std=_STD_WORDS[std_kind][0]))
    if flag_note:
        notes.append(flag_note)
    notes += provenance_notes(models)
    md.append(f"## {bench.name}: leaderboard, in percent\n\n" + tables.markdown_table(headers, rows))
    md.append("\n\n".join(notes) + "\n")
    caption = tables.latex_escape(f"{bench.name}: leaderboard, in percent")
    tex.append(tables.latex_table(headers, tex_rows, caption=caption))


def _figure_tables(
    bench, models: list[dict], title: str, std_kind: str, runs_ci: bool, flag_note: str, md: list, tex: list
) -> None:
    figures_of = _figures_of(title)
    names = _names(models, figures_of)
    if not names:
        return
    heading = bench.name if title == MAIN else f"{bench.name}: {title}"
    if _has_items(models, figures_of):
        rows, tex_rows = _both(
            models,
            lambda m, tex: [m["model"], *(items_cell((figures_of(m).get(n) or {}).get("items"), tex) for n in names)],
        )
        rows.append(["method", *(_method(models, figures_of, n) for n in names)])
        md.append(
            f"## {tables.md_escape(heading)}: item-level estimates, in percent\n\n"
            + tables.markdown_table(["Model", *names], rows)
        )
        if any(((figures_of(m).get(n) or {}).get("items") or {}).get("small_sample") for m in models for n in names):
            md.append(SMALL_NOTE + "\n")
        caption = f"{heading}: item-level mean (SE) [95% CI], in percent"
        tex.append(tables.latex_table(["Model", *names], tex_rows, caption=tables.latex_escape(caption)))
    if not any(f.get("mean") is not None for m in models for f in figures_of(m).values()):
        return

    def runs_row(m: dict, tex: bool) -> list:
        cells = [runs_cell(figures_of(m).get(n), f"std_{std_kind}", runs_ci, tex) for n in names]
        if title == MAIN and m["flagged"]:  # the benchmark's mark beside the headline figure
            cells[0] += FLAG_TEX if tex else f" {FLAG}"
        return [m["model"], len(m["runs"]), *cells]

    rows, tex_rows = _both(models, runs_row)
    words, tex_words = _STD_WORDS[std_kind]
    md.append(
        f"## {tables.md_escape(heading)}: run-to-run, mean ± {words} over runs, in percent\n\n"
        + tables.markdown_table(["Model", "Runs", *names], rows)
        + (f"\n{RUNS_CI_NOTE}\n" if runs_ci else "")
    )
    caption = f"{tables.latex_escape(heading)}: mean $\\pm$ {tex_words} over runs, in percent"
    if title == MAIN and flag_note:
        caption += ". " + tables.latex_escape(flag_note).replace(FLAG, FLAG_TEX)
    tex.append(tables.latex_table(["Model", "Runs", *names], tex_rows, caption=caption))


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


COMPARE_HEADERS = ["Model", "Baseline", "Figure", "Model − baseline (SE)", "95% CI", "p", "Correlation"]
COMPARE_HEADERS += ["Items", "Clusters", "Left out", "MDE"]


def _r(value: float | None, scale: float = 100) -> object:
    return "" if value is None else round(scale * value, 4)


def _blank(value: float | None) -> float | str:
    return "" if value is None else value


CSV_RUN_COLUMNS = ("mean %", "std % ({std})", "stderr %", "ci95 low %", "ci95 high %")
CSV_ITEM_COLUMNS = ("mean %", "se %", "ci95 low %", "ci95 high %", "n", "clusters", "se method", "ci method")


def _csv(models: list[dict], titles: list[str], std_kind: str) -> str:
    headers = ["model", "runs"]
    rows: list[list] = [[m["model"], len(m["runs"])] for m in models]
    for title in titles:
        figures_of = _figures_of(title)
        prefix = "" if title == MAIN else f"{title}: "
        for name in _names(models, figures_of):
            headers += [f"{prefix}{name} {part.format(std=std_kind)}" for part in CSV_RUN_COLUMNS]
            headers += [f"{prefix}{name} items {part}" for part in CSV_ITEM_COLUMNS]
            for row, m in zip(rows, models):
                f = figures_of(m).get(name) or {}
                if f.get("mean") is None:
                    row += [""] * 5
                else:
                    row += map(_r, [f["mean"], f[f"std_{std_kind}"], f["stderr"], *(f.get("ci95") or [None, None])])
                items = f.get("items") or {}
                ici = items.get("ci95") or [None, None]
                row += [_r(items.get("mean")), _r(items.get("se")), _r(ici[0]), _r(ici[1])]
                row += [items.get("n_items", ""), _blank(items.get("n_clusters"))]
                row += [items.get("se_method", ""), items.get("ci_method") or ""]
    headers.append("cost_usd_per_run")
    for row, m in zip(rows, models):
        row.append("" if m["cost_usd_per_run"] is None else round(m["cost_usd_per_run"], 6))
    return tables.csv_text(headers, rows)


def _comparisons_csv(comparisons: list[dict]) -> str:
    headers = ["model", "baseline", "table", "figure", "diff %", "se %", "ci95 low %", "ci95 high %", "p_value"]
    headers += ["correlation", "n_items", "n_clusters", "n_left_out", "mde %", "se method", "ci method"]
    rows = []
    for c in comparisons:
        ci = c["ci95"] or [None, None]
        rows.append(
            [c["model"], c["baseline"], c["table"], c["figure"], _r(c["diff"]), _r(c["se"]), _r(ci[0]), _r(ci[1])]
            + [_blank(c["p_value"]), _r(c["correlation"], 1), c["n_items"]]
            + [_blank(c["n_clusters"]), c["n_left_out"], _r(c["mde"]), c["se_method"], c["ci_method"]]
        )
    return tables.csv_text(headers, rows)


AGREEMENT_POOLED = "Pooled over the runs that have second opinions: each run's task is an item of its own."


def _k(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def agreement_table(bench_name: str, models: list[dict]) -> str:
    """The judge agreement of every model with second opinions (aggregate's `agreement`), or ""."""
    rows, repeats = [], []
    for m in models:
        section = m.get("agreement")
        if not section:
            continue
        for pair in section["pairs"]:
            f, rubric = pair["overall"], pair["rubric_items"] or {}
            formats = " | ".join(", ".join(pair["formats"][s]) or "-" for s in ("a", "b"))
            rows.append(
                [m["model"], f"{pair['a']} vs {pair['b']}", f["n"], pct(f["raw_agreement"]), _k(f["cohen_kappa"])]
                + [f"{pct(f['pass_rate_a'])} / {pct(f['pass_rate_b'])}", pct(rubric.get("raw_agreement"))]
                + [_k(rubric.get("cohen_kappa")), formats + (" (A/B)" if pair["format_ab"] else "")]
            )
        for r in section["repeated"]:
            cells = [r["judge_model"], ", ".join(r["files"]), r["n"], pct(r["flip_rate"]), _k(r["fleiss_kappa"])]
            repeats.append([m["model"], *cells])
    if not rows and not repeats:
        return ""
    headers = ["Model", "Judges (a vs b)", "Tasks", "Raw agreement", "Cohen's κ", "Pass rate a / b"]
    headers += ["Rubric items: agreement", "Rubric items: κ", "judge_format a | b"]
    out = f"## {bench_name}: judge agreement, in percent\n\n" + tables.markdown_table(headers, rows)
    if repeats:
        headers = ["Model", "Judge model", "Files", "Tasks", "Flip rate", "Fleiss' κ"]
        out += "\n" + tables.markdown_table(headers, repeats)
    return out + f"\n{AGREEMENT_NOTE} {AGREEMENT_POOLED}\n"
