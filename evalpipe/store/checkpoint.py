"""Paid-for calls of tasks that need several (Error Recovery: reasoning, then extraction), appended to
`<output>.steps.jsonl` as each finishes, so that a rerun repeats only the calls that never finished."""

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
            jsonl.repair_tail(self.path)  # also refuses a link there before it is read
        rows = jsonl.iter_rows(self.path, torn_tail_ok=True) if self.path.exists() else ()
        self._done = {(row.get("idx"), row.get("step")): row for _, row in rows}
        self._out: jsonl.Appender | None = None

    def get(self, task_id, step: str) -> dict | None:
        return self._done.get((task_id, step))

    def put(self, task_id, step: str, value: dict) -> dict:
        row = {"idx": task_id, "step": step, **value}
        if self.record:
            if self._out is None:
                self._out = jsonl.Appender(self.path)
            self._out.append(row)
        self._done[(task_id, step)] = row
        return row

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
