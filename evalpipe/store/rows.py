"""The shapes of what the stages pass along: rows (plain dicts on disk) and what score reports.

These are type descriptions only: a `TypedDict` is a plain dict at run time, so rows are read
and written with orjson as before. `total=False` keys may be absent. Rows keep upstream
CL-bench's keys first (SPEC.md §1.2); each benchmark adds keys of its own after them.
"""

from typing import Any, NamedTuple, NotRequired, TypedDict

# An inference row's `status` when a call ran out of its token budget while thinking: no final answer (scored 0,
# as an empty answer), counted apart by score and aggregate.
THINKING_TRUNCATED = "thinking_truncated"


class Usage(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int


class InferRow(TypedDict, total=False):
    """One line of infer.jsonl: a task's answer, or why there is none."""

    idx: Any  # the task id
    messages: list[dict]  # the conversation sent (left out with --slim)
    model_output: str
    rubrics: list  # CL-bench
    metadata: dict
    model: str
    status: str  # "ok", "context_length" or THINKING_TRUNCATED
    error: str
    finish_reason: str | None
    usage: Usage | None
    latency_s: float | None
    calls: dict[str, dict]  # several calls per task (Error Recovery): each one's usage and latency
    batch: bool  # answered through a batch
    thinking: str  # a reasoning model's thinking, apart from model_output (the final answer); "" when none


class JudgeRow(InferRow, total=False):
    """One line of judge.jsonl: the inference row plus its grade."""

    score: int  # 0 or 1
    judge_status: str  # "ok", or why the score is a conservative 0 (each benchmark lists its own)
    grading_rationale: str  # CL-bench (upstream's judge keys)
    requirement_status: list
    judge_model: str
    judge_usage: Usage | None
    judge_latency_s: float | None
    judge_attempts: int
    judge_batch: bool


class AnalysisRow(TypedDict, total=False):
    """One line of error_analysis.jsonl (CL-bench): why a failed solution failed."""

    idx: Any
    error_types: list[str]
    error_reason: str
    analysis_status: str
    analysis_model: str
    analysis_usage: Usage | None
    analysis_latency_s: float | None
    analysis_attempts: int
    analysis_batch: bool


class Coverage(TypedDict):
    """score.json's `coverage`: how much of the selected tasks the run covers (the score stage counts it)."""

    expected: int  # selected tasks
    graded: int  # of them, with a judge row
    missing: int  # without one: they count as wrong
    missing_ids: list  # the first 20 of those
    extra_rows_ignored: int  # judge rows of tasks not selected
    to_rejudge: int  # provisional rows (the judge API failed) that the next judge run redoes
    thinking_truncated: NotRequired[int]  # graded rows whose answer ran out of tokens while thinking (scored 0)
    shards: NotRequired["ShardCoverage"]  # a run cut into shards: which are unfinished


class ShardCoverage(TypedDict):
    """score.json's `coverage.shards`, for a run cut into shards (shards.py)."""

    count: int  # N
    unfinished: list[int]  # shards with selected tasks that have no final judge row yet
    without_file: dict[str, list[int]]  # per stage file (infer, judge): the shards that wrote none


class ApiCall(NamedTuple):
    """One API call recorded in a row, as the cost ledger counts it."""

    stage: str  # "infer", "judge" or "error_analysis"
    model: str | None
    usage: dict | None  # a Usage
    latency_s: float | None
    calls: int  # attempts it took
    via_batch: bool


def row_id(row: dict) -> Any:
    """The task id of a stage row: `idx`, or upstream's fallback `metadata.task_id`."""
    if "idx" in row:
        return row["idx"]
    meta = row.get("metadata")
    return meta.get("task_id") if isinstance(meta, dict) else None
