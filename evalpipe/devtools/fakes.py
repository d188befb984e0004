"""Each benchmark's fakes, by name, for the loopback test server, chaos runs, `make bench` and the contract tests:
dataset rows for any number of tasks, and what a well-formed reply to one of its requests looks like. A benchmark
not named here gets its bundled rows repeated and free text."""

import json
import re
from collections.abc import Callable

from ..benchmarks import Benchmark
from ..benchmarks.clbench import ERROR_TYPES, JUDGE_KEYS
from ..benchmarks.error_recovery import FINAL_ANSWER_PROMPT, VARIATIONS
from ..store import jsonl


def _copy_ids(rows: list[dict]) -> list[dict]:
    return [{**row, "id": f"copy-{i:04d}"} for i, row in enumerate(rows)]


def _copy_task_ids(rows: list[dict]) -> list[dict]:
    return [{**row, "metadata": {**row.get("metadata", {}), "task_id": f"copy-{i:04d}"}} for i, row in enumerate(rows)]


# each copy of a row a new task, where a task's id is the row's own (else it comes from the position)
RENAMED: dict[str, Callable[[list[dict]], list[dict]]] = {"arithmetic": _copy_ids, "clbench": _copy_task_ids}
TASKS_PER_ROW = {"error_recovery": len(VARIATIONS)}


def sample_rows(bench: Benchmark, tasks: int) -> list[dict]:
    """Dataset rows for about `tasks` tasks with distinct ids, made from the benchmark's `default_data`."""
    assert bench.default_data is not None, f"{bench.name} has no default_data to make rows from"
    rows = [row for _, row in jsonl.iter_rows(bench.default_data)]
    n = max(1, tasks // TASKS_PER_ROW.get(bench.name, 1))
    return RENAMED.get(bench.name, list)((rows * (n // len(rows) + 1))[:n])


def _clbench_reply(prompt: str, seed: int) -> str:
    """A verdict for our judge prompt (score from the seed), error types for the analysis prompt."""
    if "Response to grade:" in prompt and "Rubrics:" in prompt:
        listed = prompt.split("Rubrics:", 1)[1].split("Response to grade:", 1)[0]
        n, score = len(re.findall(r"^\d+\. ", listed, re.M)), seed % 2
        statuses = ["yes" if score else "no"] * n
        return json.dumps({JUDGE_KEYS[0]: f"r{seed}", JUDGE_KEYS[1]: statuses, JUDGE_KEYS[2]: score})
    if '"Error Types"' in prompt:
        return json.dumps({"Error Types": [ERROR_TYPES[seed % len(ERROR_TYPES)]], "Reason": f"r{seed}"})
    return f"answer {seed}"


REPLIES: dict[str, Callable[[str, int], str]] = {
    "arithmetic": lambda prompt, seed: str(seed % 200 - 100),
    "clbench": _clbench_reply,
    "coin_flip": lambda prompt, seed: f"Tracking the coin.\nANSWER: {'YES' if seed % 3 else 'NO'}",
    "error_recovery": lambda prompt, seed: str(seed % 7 - 3) if FINAL_ANSWER_PROMPT in prompt else f"answer {seed}",
}


def example_reply(bench: Benchmark, prompt: str, seed: int) -> str:
    """A well-formed reply to one of the benchmark's own requests (`prompt` is its last message), varied by `seed`
    (every one must grade `ok`)."""
    reply = REPLIES.get(bench.name)
    return f"answer {seed}" if reply is None else reply(prompt, seed)
