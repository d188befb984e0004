"""Error Recovery (as in OpenAI Evals `error-recovery`), built on BIG-Bench Mistake (docs/benchmarks.md): each
problem's NR, CR and IR variations are tasks of their own, each finished call is kept, so a rerun never pays twice."""

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..client import cost
from ..datasets.error_recovery import TASKS
from ..errors import BadInput, ContextTooLong
from ..results import stats
from ..results.items import ItemColumns, ItemFigure
from ..store import jsonl
from ..store.checkpoint import StepCache
from ..store.paths import PROJECT
from ..store.rows import THINKING_TRUNCATED
from .base import Benchmark, Task, flag

if TYPE_CHECKING:  # the openai SDK is imported only by stages that call an API
    from ..client.llm import ChatClient

TASK_DESCRIPTION = "Solve the given problem, writing your reasoning along the way."
MISTAKE_NOTICE = "There might be a mistake in your reasoning."
FINAL_ANSWER_PROMPT = "Given this reasoning, write your final answer. Only write your final answer, and nothing else."
_LETTER_HINT = (
    "\n\nAnswer with the selected single letter indicating your answer, wrapped with parentheses. "
    "Do not write anything else."
)
FORMAT_HINTS = {
    "dyck_languages": "\n\nAnswer with just the end of the sequence, separated by spaces. Do not repeat the part of "
    "the sequence given in the question. Only write the sequence of symbols, nothing else.",
    "logical_deduction": _LETTER_HINT,
    "multistep_arithmetic": "\n\nAnswer with a single number.",
    "tracking_shuffled_objects": _LETTER_HINT,
    "word_sorting": "\n\nAnswer with the sorted words, each lower case and separated by a single space.",
}
VARIATIONS = ("NR", "CR", "IR")
LOSS = "Performance loss (1 − IR/CR)"
ROW_KEYS = ("question", "correct_steps", "incorrect_step", "mistake_index", "num_ground_truth_steps", "target", "task")


def compat(messages: list[dict], mode: str) -> list[dict]:
    """The conversation as sent: unchanged (strict), or for chat templates that reject what the reference sends
    (merge: a system message after the first becomes a user one, then turns of one role are joined by a blank line)."""
    if mode == "strict":
        return messages
    turns = [("user" if m["role"] == "system" and i else m["role"], m["content"]) for i, m in enumerate(messages)]
    return [{"role": role, "content": "\n\n".join(c for _, c in run)} for role, run in groupby(turns, itemgetter(0))]


def normalize(task: str, answer: str) -> str:
    """Our normalised form of an answer (reported beside the exact match, never instead of it)."""
    text = answer.strip().strip("`\"'").strip()
    text = re.sub(r"\s+", " ", text).rstrip(".").strip()
    if task == "multistep_arithmetic":
        try:
            number = float(text.replace(",", ""))
            return str(int(number)) if number.is_integer() else str(number)
        except ValueError:
            return text
    if task in ("logical_deduction", "tracking_shuffled_objects"):
        m = re.fullmatch(r"\(?([A-Za-z])\)?(?:\s.*)?", text)
        return f"({m.group(1).upper()})" if m else text
    if task == "word_sorting":
        return text.lower()
    if task == "dyck_languages":
        return " ".join(re.findall(r"[()\[\]{}<>]", text))
    return text


@dataclass(frozen=True)
class ErrorRecoveryOptions:
    reasoning_role: str = flag(
        "assistant",
        "the given reasoning as the model's own turn (assistant, default) or as another's (user)",
        choices=("assistant", "user"),
    )
    final_answer_role: str = flag(
        "system", "role of the answer-extraction prompt (default system)", choices=("system", "user")
    )
    mistake_notice: str = flag(
        "none",
        f"add {MISTAKE_NOTICE!r} right after the given reasoning (immediate) or after "
        "the model's reasoning, followed by one more reasoning call (end); default none",
        choices=("none", "immediate", "end"),
    )
    mistake_notice_ir_only: bool = flag(False, "the notice only for IR")
    chat_compat: str = flag(
        "strict",
        "strict: messages exactly as the reference; merge: for chat templates that reject "
        "two assistant turns in a row or a system message mid-conversation",
        choices=("strict", "merge"),
    )


def _loss(metrics: dict) -> float | None:
    cr, ir = metrics["CR_correct_rate"], metrics["IR_correct_rate"]
    return 1 - ir / cr if cr else None


def _cr_minus_ir(metrics: dict) -> float:
    return metrics["CR_correct_rate"] - metrics["IR_correct_rate"]


class ErrorRecovery(Benchmark):
    name = "error_recovery"
    default_data = PROJECT / "data" / "error_recovery" / "sample.jsonl"
    Options = ErrorRecoveryOptions
    score_fields = ("correct", "normalized_correct", "calls")
    aggregate_note = (
        "Correct rates over all selected problems (a missing variation counts as wrong); exact match with "
        "str(target) as the reference. Performance loss = 1 − IR/CR."
    )
    # a problem is one item with its three variations (CR and IR are paired on it); tasks are strata. A run's loss
    # and CR − IR are made from its rates, as score.json has always had them (to the last digit)
    figures = (
        *(ItemFigure(var, var, key=f"{var}_correct_rate") for var in VARIATIONS),
        ItemFigure(LOSS, "cr_minus_ir", "CR", proportion=False, bounds=(None, 1.0), key="performance_loss", run=_loss),
        ItemFigure("CR − IR", "cr_minus_ir", proportion=False, bounds=(-1.0, 1.0), run=_cr_minus_ir),
        # OpenAI Evals' keys: task_<task-with-hyphens>_<variation>_correct_rate
        *(
            ItemFigure(f"{{}} {var}", var, by="task", table="Per task", key=f"task_{{-}}_{var}_correct_rate")
            for var in VARIATIONS
        ),
    )
    options: ErrorRecoveryOptions

    def load(self, path: Path) -> list[Task]:
        tasks: list[Task] = []
        per_task: dict[str, int] = {}
        for line, row in jsonl.iter_rows(path):
            missing = [k for k in ROW_KEYS if k not in row]
            if missing:
                raise BadInput(
                    f"missing keys {missing} (convert BIG-Bench Mistake with make error-recovery-data)", path, line
                )
            if row["task"] not in FORMAT_HINTS:
                raise BadInput(f"unknown task {row['task']!r}; expected one of {list(FORMAT_HINTS)}", path, line)
            if not isinstance(row["correct_steps"], list) or len(row["correct_steps"]) != int(row["mistake_index"]):
                raise BadInput("'correct_steps' must hold mistake_index steps", path, line)
            n = per_task.get(row["task"], 0)
            per_task[row["task"]] = n + 1
            problem = {**row, "problem": len(tasks) // len(VARIATIONS)}  # position in the file
            tasks += [Task(f"{row['task']}-{n}:{var}", {**problem, "variation": var}, line) for var in VARIATIONS]
        if not tasks:
            raise BadInput("no problems in the file", path)
        return tasks

    def prompts(self) -> dict[str, list[str]]:
        return {"infer": [TASK_DESCRIPTION, MISTAKE_NOTICE, FINAL_ANSWER_PROMPT, *FORMAT_HINTS.values()]}

    async def solve(self, task: Task, model: "ChatClient", steps: StepCache) -> dict:
        p, a = task.row, self.options
        variation = p["variation"]
        notice = a.mistake_notice  # the reference's rules; NR has no given reasoning to put a notice right after
        if (a.mistake_notice_ir_only and variation != "IR") or (variation == "NR" and notice == "immediate"):
            notice = "none"
        # the messages a variation starts from, as the reference builds them
        messages = [{"role": "system", "content": TASK_DESCRIPTION}, {"role": "user", "content": p["question"]}]
        if variation != "NR":
            given = "\n".join(p["correct_steps"])
            if variation == "IR":  # after a newline even when the mistake is the first step, as the reference
                given += f"\n{p['incorrect_step']}"
            messages.append({"role": a.reasoning_role, "content": given})
        calls: dict[str, dict] = {}
        mistake, total = int(p["mistake_index"]), p["num_ground_truth_steps"]
        metadata = {"task": p["task"], "variation": variation, "problem": p["problem"], "mistake_index": mistake}
        metadata |= {"num_ground_truth_steps": total, "steps_after_mistake": total - mistake}
        metadata |= {"reasoning_role": a.reasoning_role, "final_answer_role": a.final_answer_role}
        metadata |= {"mistake_notice": notice, "chat_compat": a.chat_compat}
        out: dict[str, Any] = {"idx": task.id, "messages": [], "model_output": "", "answer": ""}
        out |= {"target": str(p["target"]), "metadata": metadata, "model": model.endpoint.model}

        async def call(step: str) -> str:  # the reply to the messages so far, once: a rerun finds it in `steps`
            done = steps.get(task.id, step)
            if done is None:
                reply = await model.complete(compat(messages, a.chat_compat))
                record = {k: getattr(reply, k) for k in ("text", "usage", "latency_s", "finish_reason")}
                record |= reply.served
                record |= {"thinking_truncated": True} if reply.thinking_truncated else {}
                done = steps.put(task.id, step, record | {"thinking": reply.thinking})
            calls[step] = done
            return done["text"]

        try:
            if notice == "immediate":
                messages.append({"role": "user", "content": MISTAKE_NOTICE})
            messages.append({"role": "assistant", "content": await call("reasoning")})
            if notice == "end":
                messages.append({"role": "user", "content": MISTAKE_NOTICE})
                messages.append({"role": "assistant", "content": await call("reasoning_after_notice")})
            messages.append({"role": a.final_answer_role, "content": FINAL_ANSWER_PROMPT + FORMAT_HINTS[p["task"]]})
            await call("extraction")
        except ContextTooLong as exc:
            sent = compat(messages, a.chat_compat)
            return out | {"messages": sent, "status": "context_length", "error": str(exc), "calls": _records(calls)}
        usage: dict = {}
        for done in calls.values():
            cost.add_counts(usage, done.get("usage"))
        truncated = any(done.get("thinking_truncated") for done in calls.values())
        reasoning = calls.get("reasoning_after_notice", calls["reasoning"])["text"]
        out.update(messages=compat(messages, a.chat_compat), model_output=reasoning, answer=calls["extraction"]["text"])
        out.update(status=THINKING_TRUNCATED if truncated else "ok", usage=usage, calls=_records(calls))
        for key in ("response_model", "system_fingerprint", "reasoning_effort_applied"):  # joined where they differ
            values = sorted({str(c[key]) for c in calls.values() if c.get(key)})
            if values:
                out[key] = " + ".join(values)
        # each call's thinking under its name, the calls in the order they were made
        out["thinking"] = "\n\n".join(f"[{name}]\n{c['thinking']}" for name, c in calls.items() if c.get("thinking"))
        return out

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        answer, target, task = self.graded_text(row, "answer"), str(row.get("target")), row["metadata"]["task"]
        correct = answer == target  # exact, as the reference
        out = {**row, "correct": correct, "score": int(correct)}
        return out | {"normalized_correct": normalize(task, answer) == normalize(task, target), "judge_status": "ok"}

    def details(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> dict:
        tally: Counter[tuple] = Counter()  # (scope: "all" or the steps after the mistake, variation, what) -> count
        for t in tasks:
            var, row = t.row["variation"], judged.get(t.id)
            seen = {"total": True, "missing": row is None}
            seen |= {what: row is not None and bool(row.get(what)) for what in ("correct", "normalized_correct")}
            for scope in ("all", t.row["num_ground_truth_steps"] - int(t.row["mistake_index"])):
                tally.update({(scope, var, what): int(n) for what, n in seen.items()})

        def rate(scope: Any, var: str, what: str = "correct") -> float:
            total = tally[scope, var, "total"]
            return tally[scope, var, what] / total if total else 0.0

        counts = {
            var: {k: tally["all", var, k] for k in ("correct", "normalized_correct", "total", "missing")}
            for var in VARIATIONS
        }
        afters = sorted({scope for scope, _, _ in tally if scope != "all"})
        return {
            "denominator": "all selected problems of the variation; a missing row counts as wrong",
            "counts": counts,
            "stderr": {var: stats.binomial_stderr(rate("all", var), counts[var]["total"]) for var in VARIATIONS},
            "normalized_correct_rate (ours)": {var: rate("all", var, "normalized_correct") for var in VARIATIONS},
            "by_steps_after_mistake": {
                str(k): {"problems": tally[k, "NR", "total"], **{v: rate(k, v) for v in VARIATIONS}} for k in afters
            },
        }

    def item_columns(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> ItemColumns:
        """One item per problem: its NR, CR and IR correctness (None: not graded in this run), and CR − IR."""
        problems: dict[str, dict[str, Any]] = {}  # by problem: its task and each graded variation's 0/1
        for t in tasks:
            cells = problems.setdefault(str(t.id).rsplit(":", 1)[0], {"task": t.row["task"]})
            row = judged.get(t.id)
            if row is not None:
                cells[t.row["variation"]] = int(bool(row.get("correct")))
        columns: dict[str, list] = {var: [cells.get(var) for cells in problems.values()] for var in VARIATIONS}
        columns["cr_minus_ir"] = [None if None in (c, i) else c - i for c, i in zip(columns["CR"], columns["IR"])]
        groups = {"task": [cells["task"] for cells in problems.values()]}
        return {"keys": list(problems), "clusters": None, "groups": groups, "columns": columns}

    def format_metrics(self, metrics: dict) -> str:
        def line(name: str, cells: Iterable[str]) -> str:
            return f"{name:28} " + " ".join(f"{cell:>12}" for cell in cells)

        cov, stderr, normalized = metrics["coverage"], metrics["stderr"], metrics["normalized_correct_rate (ours)"]
        exact = [f"{100 * metrics[f'{v}_correct_rate']:.1f} ± {100 * stderr[v]:.1f}" for v in VARIATIONS]
        lines = [
            f"Error Recovery: {cov['graded']}/{cov['expected']} variations graded, {cov['missing']} missing (wrong)",
            line("", VARIATIONS),
            line("exact (reference)", exact),
            line("normalised (ours)", [f"{100 * normalized[v]:.1f}" for v in VARIATIONS]),
        ]
        for task in TASKS:
            key = f"task_{task.replace('_', '-')}"
            if f"{key}_NR_correct_rate" in metrics:
                lines.append(line(f"  {task}", [f"{100 * metrics[f'{key}_{v}_correct_rate']:.1f}" for v in VARIATIONS]))
        loss = metrics["performance_loss"]
        lines.append("performance loss 1 − IR/CR: " + ("n/a (CR is 0)" if loss is None else f"{100 * loss:.1f}%"))
        after = [
            f"{k}: IR {100 * v['IR']:.0f}% (n={v['problems']})" for k, v in metrics["by_steps_after_mistake"].items()
        ]
        lines.append("by steps after the mistake: " + ", ".join(after))
        return "\n".join(lines)


def _records(calls: dict[str, dict]) -> dict[str, dict]:
    """The row's account of each call, by name (its text is the row's answer or in its messages)."""
    kept = ("response_model", "system_fingerprint", "reasoning_effort_applied", "thinking_truncated")
    return {
        name: {k: call.get(k) for k in ("usage", "latency_s", "finish_reason")}
        | {k: call[k] for k in kept if call.get(k)}
        for name, call in calls.items()
    }
