"""Capitals: a country's capital among four cities, graded by the letter chosen (no judge model).

The worked example of docs/adding-a-benchmark.md, shown there whole. It is not in the registry:
tests/test_guide_example.py adds it there, as the guide's step 3 does, and runs it through the stages.
"""

from pathlib import Path

from ..store.paths import PROJECT
from .base import Benchmark, Task, one_call
from .grading import MULTIPLE_CHOICE, choice_letter, exact_match, multiple_choice, read_multiple_choice


class Capitals(Benchmark):
    name = "capitals"
    default_data = PROJECT / "data" / "capitals" / "sample.jsonl"

    def load(self, path: Path) -> list[Task]:
        return read_multiple_choice(path)

    async def solve(self, task: Task, model, steps=None) -> dict:
        prompt = multiple_choice(task.row["question"], task.row["choices"])
        return await one_call(task, model, prompt, target=task.row["answer"])

    async def grade(self, row: dict, judge) -> dict:
        return exact_match(row, choice_letter(self.graded_text(row)))

    def prompts(self) -> dict[str, list[str]]:
        return {"infer": [MULTIPLE_CHOICE]}
