"""Paid-for intermediate results of tasks that need several calls, kept beside the output.

A task such as an error-recovery variation makes a reasoning call and then an extraction call.
Each finished call is appended to `<output>.steps.jsonl` at once, so a rerun after a crash or a
failed second call repeats only the calls that never finished.
"""

from pathlib import Path

from . import jsonl


class StepCache:
    @staticmethod
    def path_for(output: Path) -> Path:
        return output.with_name(output.name + ".steps.jsonl")

    def __init__(self, output: Path, record: bool = True):
        """record=False: read what is there, keep new steps in memory only (for --dry-run)."""
        self.path = self.path_for(output)
        self.record = record
        if record:
            jsonl.repair_tail(self.path)
        self._done: dict[tuple, dict] = {}
        if self.path.exists():
            for _, row in jsonl.iter_rows(self.path, torn_tail_ok=True):
                self._done[(row.get("idx"), row.get("step"))] = row
        self._out: jsonl.Appender | None = None

    def get(self, task_id, step: str) -> dict | None:
        return self._done.get((task_id, step))

    def put(self, task_id, step: str, value: dict) -> dict:
        row = {"idx": task_id, "step": step, **value}
        if not self.record:
            self._done[(task_id, step)] = row
            return row
        if self._out is None:
            self._out = jsonl.Appender(self.path)
        self._out.append(row)
        self._done[(task_id, step)] = row
        return row

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
