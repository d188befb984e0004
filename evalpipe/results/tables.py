"""Tables out of figures: Markdown and CSV text."""

import csv
import io
from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cells(values):
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    lines = [cells(headers), "|" + "|".join("---" for _ in headers) + "|"]
    lines += [cells(r) for r in rows]
    return "\n".join(lines) + "\n"


def csv_text(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows(rows)
    return buf.getvalue()


_LATEX_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "−": "$-$",
    "±": r"$\pm$",
    "–": "--",  # so that plain pdflatex takes the figure names too
}


def latex_escape(text: object) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in str(text))


def latex_table(headers: Sequence[str], rows: Sequence[Sequence[object]], caption: str = "") -> str:
    """A booktabs table. Headers and each row's first cell are escaped; the other cells are LaTeX already."""
    spec = "l" + "r" * (len(headers) - 1)
    lines = ["\\begin{table}[ht]", "\\centering", f"\\begin{{tabular}}{{{spec}}}", "\\toprule"]
    lines.append(" & ".join(latex_escape(h) for h in headers) + " \\\\")
    lines.append("\\midrule")
    for row in rows:
        lines.append(" & ".join([latex_escape(row[0]), *map(str, row[1:])]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    if caption:
        lines.append(f"\\caption{{{caption}}}")
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


def pct(rate: float | None, digits: int = 1) -> str:
    """A rate in 0..1 as a percentage with `digits` decimals, or "-" when unknown."""
    return "-" if rate is None else f"{100 * rate:.{digits}f}"
