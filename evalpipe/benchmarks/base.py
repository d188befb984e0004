"""What every benchmark answers: which tasks, how one is solved, how it is graded, which figures.

A benchmark is a `Benchmark` subclass that implements the answers — `load`, `solve`, `grade` —
declares its `figures` (with the `item_columns` they are made of), and sets `name` and
`default_data`. Everything else has a default. Its own
flags are the fields of an `Options` dataclass (declared with `flag`); the stages turn them into
command-line flags and hand the parsed values over once, as `self.options`. Coverage (expected,
graded, missing), call accounting and cost are the framework's: a benchmark never counts them.
docs/adding-a-benchmark.md walks through adding one.
"""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
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
    """A benchmark option: a field of its `Options` dataclass that the `stage` ("infer" or "judge")
    offers as `--field-name` (a bool is an on/off switch; other types convert from the text)."""
    return field(default=default, metadata={"help": help, "stage": stage, "choices": choices})


@dataclass(frozen=True)
class NoOptions:
    """A benchmark without flags of its own."""


async def one_call(
    task: "Task", model: "ChatClient", prompt: str, target: Any = None, metadata: dict | None = None
) -> dict:
    """The inference row of a task solved by one chat call with one user message (`prompt`): upstream's keys
    first (`idx`, `messages`, `model_output`), then `target` (what grade compares with), `metadata` and `model`,
    then the answer (answer_into). The `solve` of most rule-graded benchmarks is this one line."""
    messages = [{"role": "user", "content": prompt}]
    out = {"idx": task.id, "messages": messages, "model_output": "", "target": target}
    out.update(metadata=metadata or {}, model=model.endpoint.model)
    return await answer_into(out, model, messages)


async def answer_into(out: dict, model: "ChatClient", messages: list[dict], fields: dict | None = None) -> dict:
    """Fill an inference row from one chat call: the final answer (its thinking last, in `thinking`), or a final
    context-length failure. `fields`: body fields of this call (ChatClient.complete)."""
    try:
        done = await model.complete(messages, fields)
    except ContextTooLong as exc:
        out.update(status="context_length", error=str(exc))
        return out
    out["model_output"] = done.text
    status = THINKING_TRUNCATED if done.thinking_truncated else "ok"
    out.update(status=status, finish_reason=done.finish_reason, usage=done.usage, latency_s=done.latency_s)
    if done.served is not None:
        out.update(done.served.fields())
    out["thinking"] = done.thinking
    return out


class Benchmark:
    """The three answers are required (`load`, `solve`, `grade`); the rest, `figures` too, are defaults."""

    name: ClassVar[str] = ""  # the --bench value and the outputs/<name>/ folder
    default_data: ClassVar[Path | None] = None  # the bundled dataset infer reads without --input
    Options: ClassVar[type] = NoOptions  # a frozen dataclass of `flag` fields
    score_fields: ClassVar[tuple[str, ...]] = ("score",)  # the judge row keys details() and item_columns() read
    # the key of a task's `metadata` (copied into its rows) naming the tasks that share their leading messages
    # (e.g. one long context): infer sends a group's first task alone and the rest once it is answered, so that a
    # prefix-caching server computes the prefix once; a group stays in one shard; and its tasks, not independent,
    # are one cluster in aggregate's error bars (items.json's `cluster`). None: no groups
    prefix_group: ClassVar[str | None] = None
    aggregate_note: ClassVar[str] = ""  # printed under the aggregate table: how to read the figures
    # infer's defaults for generation flags, where the reference sends its own (e.g. temperature 0)
    generation_defaults: ClassVar[dict[str, Any]] = {}
    # each figure of a run, declared once: its value in score.json (at `key`), its item-level error bars in
    # aggregate, and its place on the leaderboard, all as ratios of sums of item_columns() (results/figures.py)
    figures: ClassVar[tuple[ItemFigure, ...]] = (ItemFigure("Score", "score", key="score"),)
    thinking: str = "separate"  # --thinking (thinking.MODES), set by the stage: what of a row's text is graded

    def __init__(self, options: Any = None):
        self.options = self.Options() if options is None else options

    # ---- the answers (the fourth, which figures a run has, is `figures` above)

    def load(self, path: Path) -> Iterable[Task]:
        """Which tasks: read a dataset file into tasks, in file order (a list, or a generator that reads the
        file as it goes: infer and score then read it again rather than hold a million tasks).

        Called by infer and score (and tools) before anything else; never calls an API. Raises
        errors.BadInput(message, path, line) for a row it cannot use. A task's id must be stable
        under --max-samples (a prefix keeps its ids) and must not match old rows when the file is
        a different one (derive it from the row's own id, or from its position and content).
        """
        raise NotImplementedError

    async def solve(self, task: Task, model: "ChatClient", steps: StepCache) -> dict:
        """How a task is solved: make its inference row (docs/outputs.md#rows), calling `model`.

        Called by infer once per pending task, concurrently with others. Raises llm.CallFailed
        (from `model`) to leave the task pending; a context-length failure is final and becomes a
        row (see `answer_into`). A task that needs several calls keeps each finished one in
        `steps`, so a rerun pays only for the calls that did not finish.
        """
        raise NotImplementedError

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        """How a solution is graded: make the judge row (docs/outputs.md#rows) for one inference row.

        Called by judge once per inference row not yet judged. `judge` is the judge model when `prompts()`
        has judge templates, else None (a rule). The row keeps the inference keys and adds `score` (0/1)
        and `judge_status` ("ok", or why the score is a conservative 0; `api_error`: a stand-in, see
        `stand_in`).
        """
        raise NotImplementedError

    def graded_text(self, row: dict, key: str = "model_output") -> str:
        """The text of `row[key]` a grade reads: the final answer, never thinking written inline (thinking.py)."""
        return thinking.text_to_grade(row, key, self.thinking)

    # ---- optional, with defaults

    def is_judged(self, row: dict) -> bool:
        """Whether judge, with its current options, leaves this judge row as it is (else grades again)."""
        return not stand_in(row)

    def details(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> dict:
        """What a run's score.json holds besides its figures (e.g. a confusion matrix), from the selected tasks
        (iterate them once: a large dataset is read again) and their judge rows by id (last row per id, only the
        `score_fields` keys; a task without a row counts as wrong). Called by score; no API. Coverage, judge
        statuses and cost are score's: leave them out. Default: nothing."""
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
        """Why aggregate marks a model's headline figure with † (the note printed under the table), from its runs'
        metrics; "": no mark."""
        return ""

    def prompts(self) -> dict[str, list[str]]:
        """The prompt templates a stage fills in beyond the dataset's own text, by stage ("infer", "judge"): part of
        that stage's fingerprint. Judge templates make it an LLM-graded benchmark: grade gets the judge model."""
        return {}

    def item_columns(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> ItemColumns:
        """One run's values per item (items.json), that the `figures` are sums of, from the selected tasks (iterate
        them once) and the judge rows by id. Called by score; no API. A value is None where the item was not graded
        in this run (aggregate averages each item over the runs that graded it); `--max-samples` counts the keys
        (`select`). Default: each task is an item, its column `score` the judge row's 0/1 score."""
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
    """Whether a judge or analysis row stands in for a grade because the judge API failed after its retries: the
    next run redoes it, and score counts its task as not graded."""
    return row.get("judge_status") == API_ERROR or row.get("analysis_status") == API_ERROR


def select(bench: Benchmark, tasks: Iterable[Task], max_samples: int | None) -> Iterable[Task]:
    """`--max-samples N` (infer and score): the tasks of the first N items (`item_columns`' keys, an item's tasks
    consecutive: one task, or Error Recovery's problem with its three variations), as upstream. Every row is still
    read, so that a bad row past them is an error as with `load`."""
    return tasks if max_samples is None else _first_items(bench, tasks, max_samples)


def _first_items(bench: Benchmark, tasks: Iterable[Task], max_samples: int) -> Iterator[Task]:
    tasks, items = iter(tasks), set[Any]()
    for task in tasks:
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
    """Optional capability: classify why failed solutions failed (`judge.py --error-analysis`).

    A benchmark offers it by also deriving from this class (CL-bench does); the stages test
    `isinstance(bench, ErrorAnalysis)`. The analysis reads the judge rows and writes
    `<error_analysis_name>.jsonl` beside them; score adds its metrics under that name.
    """

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
