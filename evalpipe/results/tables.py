"""Markdown, CSV and LaTeX tables. Cells may hold a dataset's or a model's text: Markdown cells are HTML-escaped,
CSV cells a spreadsheet would read as a formula get a leading '."""

import csv
import html
import io
from collections.abc import Sequence

_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def md_escape(text: object) -> str:
    return html.escape(str(text), quote=False).replace("|", "\\|")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(map(md_escape, values)) + " |" for values in [headers, *rows]]
    lines.insert(1, "|" + "|".join("---" for _ in headers) + "|")
    return "\n".join(lines) + "\n"


def csv_cell(value: object) -> object:
    """A CSV cell a spreadsheet will not run: text starting as a formula gets a leading ' (numbers stay numbers)."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        try:
            float(value)
        except ValueError:
            return "'" + value
    return value


def csv_text(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(map(csv_cell, row) for row in [headers, *rows])
    return buf.getvalue()


_LATEX_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "−": "$-$",
    "±": r"$\pm$",
    "§": r"\S{}",
    "–": "--",  # so that plain pdflatex takes the figure names too
}


def latex_escape(text: object) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in str(text))


def latex_table(headers: Sequence[str], rows: Sequence[Sequence[object]], caption: str) -> str:
    """A booktabs table. Headers and each row's first cell are escaped; the other cells are LaTeX already."""
    spec = "l" + "r" * (len(headers) - 1)
    lines = ["\\begin{table}[ht]", "\\centering", f"\\begin{{tabular}}{{{spec}}}", "\\toprule"]
    lines += [" & ".join(latex_escape(h) for h in headers) + " \\\\", "\\midrule"]
    lines += [" & ".join([latex_escape(row[0]), *map(str, row[1:])]) + " \\\\" for row in rows]
    lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{caption}}}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def pct(rate: float | None) -> str:
    """A rate in 0..1 as a percentage, or "-" when unknown."""
    return "-" if rate is None else f"{100 * rate:.1f}"


def signed(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"
