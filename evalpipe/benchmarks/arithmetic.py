"""Arithmetic: two-number sums, differences and products, graded by exact match (no judge model); not a published
benchmark, a smoke test of an endpoint and of the contract tests (docs/benchmarks.md#arithmetic)."""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store.paths import PROJECT
from .base import Benchmark, Task, flag, one_call
from .grading import exact_match, read_tasks

if TYPE_CHECKING:  # the openai SDK is imported only by stages that call an API
    from ..client.llm import ChatClient

PROMPT = "Compute the answer. Reply with the number only.\n\n{question}"


@dataclass(frozen=True)
class ArithmeticOptions:
    last_number: bool = flag(False, "grade the last number in the reply instead of the whole reply", stage="judge")


class Arithmetic(Benchmark):
    name = "arithmetic"
    default_data = PROJECT / "data" / "arithmetic" / "sample.jsonl"
    Options = ArithmeticOptions
    options: ArithmeticOptions

    def load(self, path: Path) -> list[Task]:
        return read_tasks(path, id=str, question=str, answer=str)

    def prompts(self) -> dict[str, list[str]]:
        return {"infer": [PROMPT]}

    async def solve(self, task: Task, model: "ChatClient", steps=None) -> dict:
        return await one_call(task, model, PROMPT.format(question=task.row["question"]), task.row["answer"])

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        reply = self.graded_text(row).strip()
        if self.options.last_number:
            numbers = re.findall(r"-?\d+", reply)
            reply = numbers[-1] if numbers else ""
        return exact_match(row, reply, unread="empty_output")

    def details(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> dict:
        return {"solved": sum(row["score"] for row in judged.values())}  # the selected tasks' rows
