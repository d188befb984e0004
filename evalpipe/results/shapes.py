"""How the viewer shows one benchmark (`benchmarks.VIEWS`): its samples' facets and details, and its figures."""

from collections.abc import Sequence
from typing import Any

import orjson

from ..store import rows
from .items import ItemFigure


def row_id(row: dict) -> str:
    """A row's task id as text (ids that are not text, as their JSON)."""
    found = rows.row_id(row)
    return found if isinstance(found, str) else orjson.dumps(found).decode()


def meta_of(row: dict) -> dict:
    meta = row.get("metadata")
    return meta if isinstance(meta, dict) else {}


def as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


class Shape:
    """How one benchmark's samples are faceted and shown (the generic shape; benchmarks refine it)."""

    kind = "generic"
    facets = ("Category", "Sub-category")
    categories: tuple[str, ...] = (
        "context_category",
        "category",
    )  # the metadata keys of the first facet, the first present

    def __init__(self, figures: Sequence[ItemFigure] = ()):
        self.figures = figures  # the benchmark's declared figures (Benchmark.figures)

    def facet_values(self, row: dict) -> tuple[str, str, str]:
        """(first facet, second facet, group): the group ties samples that belong together."""
        meta = meta_of(row)
        first = next((meta[key] for key in self.categories if key in meta), "")
        return as_text(first), as_text(meta.get("sub_category", "")), ""

    def detail(self, row: dict, sample: dict) -> None:
        """Add benchmark-specific fields to a sample's detail."""

    def preview(self, row: dict, output: str) -> str:
        """The text shown beside the sample in the list."""
        return output


class CLBenchShape(Shape):
    kind = "clbench"
    categories = ("context_category",)


class CoinFlipShape(Shape):
    kind = "coin_flip"
    facets = ("Gold", "Prediction")

    def __init__(self, figures: Sequence[ItemFigure], template: str):
        """`template`: the zero-shot prompt, `{question}` where the question goes (a few-shot prompt's last one)."""
        super().__init__(figures)
        self.before, self.after = template.split("{question}")

    def facet_values(self, row):
        judged = "judge_status" in row
        prediction = row.get("prediction")
        shown = as_text(prediction) if prediction is not None else ("unparsed" if judged else "")
        return as_text(row.get("target", "")), shown, ""

    def detail(self, row, sample):
        prompt = next((m.get("content") for m in row.get("messages") or [] if isinstance(m, dict)), None)
        if isinstance(prompt, str):
            start = prompt.rfind(self.before)
            end = prompt.find(self.after, start + len(self.before)) if start >= 0 else -1
            if start >= 0 and end >= 0:
                sample["question"] = prompt[start + len(self.before) : end]


class ErrorRecoveryShape(Shape):
    kind = "error_recovery"
    facets = ("Task", "Variation")

    def facet_values(self, row):
        meta = meta_of(row)
        problem = row_id(row).rsplit(":", 1)[0]
        return as_text(meta.get("task", "")), as_text(meta.get("variation", "")), problem

    def preview(self, row, output):
        answer = row.get("answer")
        return f"→ {as_text(answer)} (target {as_text(row.get('target'))})" if answer is not None else output

    def detail(self, row, sample):
        messages = [m for m in row.get("messages") or [] if isinstance(m, dict)]
        meta = meta_of(row)
        question = next((m.get("content") for m in messages if m.get("role") == "user"), None)
        if isinstance(question, str):
            sample["question"] = question
        if meta.get("variation") in ("CR", "IR") and len(messages) > 2 and isinstance(messages[2].get("content"), str):
            given = messages[2]["content"]
            output = row.get("model_output")
            if isinstance(output, str) and output and given.endswith("\n\n" + output):  # --chat-compat merge
                given = given[: -len(output) - 2]
            sample["given"] = given
            if meta.get("variation") == "IR":
                lines = given.split("\n")
                m = meta.get("mistake_index")
                cut = m if isinstance(m, int) and 0 <= m < len(lines) else len(lines) - 1
                sample["mistake_at"] = len("\n".join(lines[:cut])) + (1 if cut else 0)
