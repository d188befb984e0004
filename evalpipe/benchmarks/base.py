"""What every benchmark answers: which tasks, how one is solved, how it is graded, which metrics."""

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TYPE_CHECKING

from ..checkpoint import StepCache
from ..errors import ContextTooLong

if TYPE_CHECKING:  # the openai SDK is imported only by stages that call an API
    from ..llm import ChatClient

VALID_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(slots=True)
class Task:
    id: str
    row: dict  # the dataset row as read
    line: int  # where it was read, for error messages


async def answer_into(out: dict, model: "ChatClient", messages: list[dict]) -> dict:
    """Fill an inference row from one chat call: the answer, or a final context-length failure."""
    try:
        done = await model.complete(messages)
    except ContextTooLong as exc:
        out.update(status="context_length", error=str(exc))
        return out
    out["model_output"] = done.text
    out.update(status="ok", finish_reason=done.finish_reason, usage=done.usage, latency_s=done.latency_s)
    return out


def row_id(row: dict) -> Any:
    """The task id of a stage row: `idx`, or upstream's fallback `metadata.task_id`."""
    if "idx" in row:
        return row["idx"]
    meta = row.get("metadata")
    return meta.get("task_id") if isinstance(meta, dict) else None


class Benchmark:
    name: str = ""
    default_data: Path | None = None
    judge_uses_llm: bool = False
    aggregate_note: str = ""  # printed under the aggregate table: how to read the figures
    flag_note: str = ""  # printed under the aggregate table when flagged() marked a model: what the † means
    score_fields: tuple[str, ...] = ()  # what metrics() and is_provisional() read of a judge row
    has_provisional: bool = False  # whether is_provisional() can ever be true
    error_analysis_name: str | None = None  # set when failed solutions can be classified (judge.py --error-analysis)

    def add_infer_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Benchmark-specific infer flags."""

    def add_judge_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Benchmark-specific judge flags."""

    def configure(self, args: argparse.Namespace) -> None:
        """Take the parsed flags (called once before load/solve/grade)."""
        self.args = args

    def load(self, path: Path) -> list[Task]:
        raise NotImplementedError

    def select(self, tasks: list[Task], max_samples: int | None) -> list[Task]:
        """`--max-samples N`: a prefix of the dataset's rows (as upstream)."""
        return tasks if max_samples is None else tasks[:max_samples]

    async def solve(self, task: Task, model: "ChatClient", steps: StepCache) -> dict:
        """Make the inference row for one task (raises llm.CallFailed to leave it pending).

        A task that needs several calls keeps each finished one in `steps`, so a rerun pays
        only for the calls that did not finish.
        """
        raise NotImplementedError

    def is_judged(self, row: dict) -> bool:
        """Whether judge.py, with its current flags, leaves this judge row as it is."""
        return not self.is_provisional(row)

    def is_provisional(self, row: dict) -> bool:
        """Whether a judge row is a stand-in (e.g. the judge API failed) that judge.py redoes by itself."""
        return False

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        """Make the judge row for one inference row."""
        raise NotImplementedError

    def metrics(self, tasks: list[Task], judged: dict[Any, dict]) -> dict:
        """One run's metrics from the selected tasks and their judge rows (last row per id)."""
        raise NotImplementedError

    def headline(self, metrics: dict) -> dict[str, float | None]:
        """The figures aggregate reports as mean ± std across runs, in display order (0..1)."""
        raise NotImplementedError

    def format_metrics(self, metrics: dict) -> str:
        """A human-readable table of one run's metrics."""
        raise NotImplementedError

    def flagged(self, runs: list[dict]) -> bool:
        """Whether aggregate marks a model's headline figure with a † (flag_note says why), from its runs' metrics."""
        return False

    # ---- optional: error types of failed solutions (benchmarks with an error_analysis_name)

    def needs_error_analysis(self, judge_row: dict) -> bool:
        """Whether a judge row is a failed solution to classify."""
        raise NotImplementedError

    def is_analyzed(self, row: dict) -> bool:
        """Whether judge.py --error-analysis, with its current flags, leaves this analysis row as it is."""
        raise NotImplementedError

    async def analyze_error(self, judge_row: dict, judge: "ChatClient") -> dict:
        """Make the error-analysis row for one failed solution."""
        raise NotImplementedError

    def error_analysis_metrics(self, tasks: list[Task], judged: dict[Any, dict], analyses: dict[Any, dict]) -> dict:
        raise NotImplementedError

    def error_analysis_prompts(self) -> list[str]:
        return []

    def extra_tables(self, metrics: dict) -> dict[str, dict[str, float | None]]:
        """Further figures aggregate reports as tables of their own, by title (e.g. CL-bench error types)."""
        return {}

    def infer_prompts(self) -> list[str]:
        """The prompt templates infer fills in beyond the dataset's own text (for the run's fingerprint)."""
        return []

    def judge_prompts(self) -> list[str]:
        """The prompt templates the judge fills in (for the judge's fingerprint)."""
        return []

    def api_calls(self, row: dict):
        """(stage, model, usage, latency_s, calls, via_batch) for every API call recorded in a judge row
        (or an error-analysis row)."""
        get = row.get  # called once per row of a run (millions): plain lookups, a list, no generator
        out = []
        calls, batch = get("calls"), bool(get("batch"))
        if isinstance(calls, dict):  # several calls per task, each recorded on its own
            for call in calls.values():
                out.append(("infer", get("model"), call.get("usage"), call.get("latency_s"), 1, batch))
        elif "usage" in row or "latency_s" in row:
            out.append(("infer", get("model"), get("usage"), get("latency_s"), 1, batch))
        if "judge_usage" in row or "judge_latency_s" in row:
            out.append(("judge", get("judge_model"), get("judge_usage"), get("judge_latency_s"), get("judge_attempts", 1),
                        bool(get("judge_batch"))))
        if "analysis_model" in row:
            out.append(("error_analysis", get("analysis_model"), get("analysis_usage"), get("analysis_latency_s"),
                        get("analysis_attempts", 1), bool(get("analysis_batch"))))
        return out


# What score reads of every judge row for tokens, latency and cost (besides a benchmark's score_fields).
ACCOUNTING_FIELDS = ("model", "usage", "latency_s", "calls", "batch", "judge_model", "judge_usage", "judge_latency_s",
                     "judge_attempts", "judge_batch")
