"""What every benchmark answers: which tasks, how one is solved, how it is graded, which figures. A benchmark
subclasses `Benchmark`, implements `load`, `solve` and `grade`, and overrides defaults only where it must
(docs/adding-a-benchmark.md). Coverage, call accounting and cost are the stages', never its own."""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..client import thinking
from ..errors import ContextTooLong
from ..results import tables
from ..results.figures import headline
from ..results.items import ItemColumns, ItemFigure
from ..store.checkpoint import StepCache
from ..store.rows import THINKING_TRUNCATED

if TYPE_CHECKING:  # the openai SDK is imported only by stages that call an API
    from ..client.llm import ChatClient

VALID_ROLES = {"system", "developer", "user", "assistant", "tool"}
API_ERROR = "api_error"  # a judge_status: the judge API failed after its retries (`stand_in`)


@dataclass(slots=True)
class Task:
    """One task of a dataset, as `load` read it."""

    id: str | int  # unique in the dataset; rows carry it as `idx`
    row: dict  # the dataset row as read
    line: int  # where it was read, for error messages


def flag(default: Any, help: str, *, stage: str = "infer", choices: tuple[str, ...] | None = None) -> Any:
    """A field of a benchmark's `Options` dataclass: `--field-name` on `stage` (a bool is an on/off switch)."""
    return field(default=default, metadata={"help": help, "stage": stage, "choices": choices})


async def one_call(
    task: "Task", model: "ChatClient", prompt: str, target: Any = None, metadata: dict | None = None
) -> dict:
    """The inference row of a task asked in one user message: upstream's keys, `target`, `metadata`, the answer."""
    return await chat_row(task, model, [{"role": "user", "content": prompt}], target=target, metadata=metadata or {})


async def chat_row(task: Task, model: "ChatClient", messages: list[dict], fields: dict | None = None, **keys) -> dict:
    """One chat call's inference row: upstream's keys, then `keys`, then the answer (or a final context-length row)."""
    out = {"idx": task.id, "messages": messages, "model_output": "", **keys, "model": model.endpoint.model}
    try:
        done = await model.complete(messages, fields)
    except ContextTooLong as exc:
        out.update(status="context_length", error=str(exc))
        return out
    out["model_output"] = done.text
    status = THINKING_TRUNCATED if done.thinking_truncated else "ok"
    out.update(status=status, finish_reason=done.finish_reason, usage=done.usage, latency_s=done.latency_s)
    out.update(done.served)
    out["thinking"] = done.thinking
    return out


class Benchmark:
    """The three answers are required (`load`, `solve`, `grade`); the rest, `figures` too, are defaults."""

    name: ClassVar[str] = ""  # the --bench value and the outputs/<name>/ folder
    default_data: ClassVar[Path | None] = None  # the bundled dataset infer reads without --input
    Options: ClassVar[type] = make_dataclass("NoOptions", [], frozen=True)  # a frozen dataclass of `flag` fields
    score_fields: ClassVar[tuple[str, ...]] = ("score",)  # the judge row keys details() and item_columns() read
    # the `metadata` key naming tasks that share their leading messages: infer sends a group's first task alone (for
    # prefix caching), a group stays in one shard and is one cluster in the error bars. None: no groups
    prefix_group: ClassVar[str | None] = None
    aggregate_note: ClassVar[str] = ""  # printed under the aggregate table: how to read the figures
    # infer's defaults for generation flags, where the reference sends its own (e.g. temperature 0)
    generation_defaults: ClassVar[dict[str, Any]] = {}
    # each figure of a run, declared once, as a ratio of sums of item_columns() (results/figures.py)
    figures: ClassVar[tuple[ItemFigure, ...]] = (ItemFigure("Score", "score", key="score"),)
    thinking: str = "separate"  # --thinking (thinking.MODES), set by the stage: what of a row's text is graded

    def __init__(self, options: Any = None):
        self.options = self.Options() if options is None else options

    # ---- the answers (the fourth, which figures a run has, is `figures` above)
    def load(self, path: Path) -> Iterable[Task]:
        """Which tasks: read a dataset file into tasks, in file order (a list, or a generator).

        Called by infer and score; no API. Raises errors.BadInput(message, path, line) for a row it cannot
        use. A task's id is stable under --max-samples and matches no old row of a different file.
        """
        raise NotImplementedError

    async def solve(self, task: Task, model: "ChatClient", steps: StepCache) -> dict:
        """How a task is solved: make its inference row (docs/outputs.md#rows), calling `model`.

        Called by infer, concurrently. llm.CallFailed leaves the task pending; a context-length failure is a
        final row (`chat_row`). A task of several calls keeps each finished one in `steps`.
        """
        raise NotImplementedError

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        """How a solution is graded: make the judge row (docs/outputs.md#rows) for one inference row.

        Called by judge. `judge` is the judge model if `prompts()` has judge templates, else None. The row adds
        `score` (0/1) and `judge_status` ("ok", or why the score is a conservative 0; `api_error`: `stand_in`).
        """
        raise NotImplementedError

    def graded_text(self, row: dict, key: str = "model_output") -> str:
        """The text of `row[key]` a grade reads: the final answer, without inline thinking (thinking.py)."""
        return thinking.text_to_grade(row, key, self.thinking)

    # ---- optional, with defaults
    def is_judged(self, row: dict) -> bool:
        """Whether judge, with its current options, leaves this judge row as it is (else grades again)."""
        return not stand_in(row)

    def details(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> dict:
        """What score.json holds besides the figures, from the selected tasks (iterate once) and their judge rows
        by id (the `score_fields` keys; no row: wrong). Called by score; no API. Default: nothing."""
        return {}

    def format_metrics(self, metrics: dict) -> str:
        """The table score prints for one run (`metrics` includes score's `coverage`). Default: the headline."""
        cov = metrics["coverage"]
        lines = [
            f"{self.name}: {cov['graded']}/{cov['expected']} tasks graded, {cov['missing']} missing (counted as wrong)"
        ]
        lines += [f"  {name:20} {tables.pct(value):>6}" for name, value in headline(self.figures, metrics).items()]
        return "\n".join(lines)

    def flagged(self, runs: list[dict]) -> str:
        """Why aggregate marks a model's headline with † (the note under the table), from its runs; "": no mark."""
        return ""

    def prompts(self) -> dict[str, list[str]]:
        """The templates each stage fills in, by stage (its fingerprint); judge templates make it LLM-graded."""
        return {}

    def item_columns(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> ItemColumns:
        """One run's values per item (items.json; None: not graded in this run) that the `figures` sum, read as
        `details` reads. Called by score; no API. Default: each task an item, its 0/1 `score`."""
        keys, scores = [], []
        for task in tasks:
            row = judged.get(task.id)
            keys.append(task.id)
            scores.append(None if row is None or stand_in(row) else int(row.get("score") == 1))
        return {"keys": keys, "clusters": None, "groups": {}, "columns": {"score": scores}}


def uses_judge_model(bench: Benchmark) -> bool:
    """Whether `bench` is graded by the judge model (it has judge prompt templates), else by a rule."""
    return bool(bench.prompts().get("judge"))


def stand_in(row: dict) -> bool:
    """Whether a judge or analysis row stands in for a grade the judge API failed to give (redone, not graded)."""
    return row.get("judge_status") == API_ERROR or row.get("analysis_status") == API_ERROR


def select(bench: Benchmark, tasks: Iterable[Task], max_samples: int | None) -> Iterator[Task]:
    """`--max-samples N`: the tasks of the first N items (`item_columns`' keys); the rest is still read, to check."""
    tasks, items = iter(tasks), set[Any]()
    for task in tasks:
        if max_samples is not None:
            [item] = bench.item_columns([task], {})["keys"]
            if item not in items and len(items) == max_samples:
                break
            items.add(item)
        yield task
    for _ in tasks:
        pass


def group_of(bench: Benchmark, row: dict) -> str | None:
    """The prefix group of a task, from its dataset row or its inference or judge row (`Benchmark.prefix_group`)."""
    meta = row.get("metadata")
    group = meta.get(bench.prefix_group) if bench.prefix_group and isinstance(meta, dict) else None
    return None if group is None else str(group)


class ErrorAnalysis:
    """Optional, by also deriving from it: why failed solutions failed, in `<error_analysis_name>.jsonl`."""

    error_analysis_name: ClassVar[str] = "error_analysis"

    def needs_error_analysis(self, judge_row: dict) -> bool:
        """Whether a judge row is a failed solution to classify. Called by the analysis stage and score; no API."""
        raise NotImplementedError

    def is_analyzed(self, row: dict) -> bool:
        """Whether the analysis stage, with its current options, leaves this analysis row as it is."""
        raise NotImplementedError

    async def analyze_error(self, judge_row: dict, judge: "ChatClient") -> dict:
        """Make the analysis row (docs/outputs.md#rows) for one failed solution, calling `judge`."""
        raise NotImplementedError

    def error_analysis_metrics(
        self, tasks: Iterable[Task], judged: Mapping[Any, dict], analyses: dict[Any, dict]
    ) -> dict:
        """The analysis figures of one run (score.json's `<error_analysis_name>`). Called by score; no API."""
        raise NotImplementedError

    def error_analysis_prompts(self) -> list[str]:
        """The prompt templates of the analysis (part of its fingerprint)."""
        return []

    def error_analysis_tables(self, metrics: dict) -> dict[str, dict[str, float | None]]:
        """The analysis figures aggregate reports as tables of their own, by title, from a run's score.json."""
        return {}
