"""What the stages pass along beside the rows themselves (docs/outputs.md#rows): a row's task id, the status of
an answer that ran out of tokens while thinking, score's coverage and the API calls a row records."""

from typing import Any, NamedTuple, NotRequired, TypedDict

# An inference row's `status` when a call ran out of its token budget while thinking: no final answer (scored 0,
# as an empty answer), counted apart by score and aggregate.
THINKING_TRUNCATED = "thinking_truncated"


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
    usage: dict | None  # prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens
    latency_s: float | None
    calls: int  # attempts it took
    via_batch: bool


def row_id(row: dict) -> Any:
    """The task id of a stage row: `idx`, or upstream's fallback `metadata.task_id`."""
    if "idx" in row:
        return row["idx"]
    meta = row.get("metadata")
    return meta.get("task_id") if isinstance(meta, dict) else None
