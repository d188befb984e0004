"""CL-bench: context learning, graded by an LLM judge against rubrics, all-or-nothing. Rows keep upstream's
(Tencent-Hunyuan/CL-bench) keys first, in its order, and ours after them (docs/upstream.md)."""

import json
import re
import urllib.parse
from collections import Counter, namedtuple
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..client import cost, judge_format
from ..errors import BadInput, CallFailed, ContextTooLong
from ..results import tables
from ..results.items import ItemColumns, ItemFigure
from ..store import jsonl
from ..store.paths import PROJECT
from ..store.rows import THINKING_TRUNCATED, row_id
from .base import API_ERROR, VALID_ROLES, Benchmark, ErrorAnalysis, Task, chat_row, flag, group_of, stand_in

if TYPE_CHECKING:  # the openai SDK is imported only by stages that call an API
    from ..client.llm import ChatClient

CATEGORIES = (
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
)
NO_RUBRICS = "No specific rubrics provided."

JUDGE_PROMPT = """\
You are grading one response against a list of rubrics. Be strict: grading is all-or-nothing.

Check every rubric on its own, as written, against the response only. A rubric is met ("yes")
only if the response fully satisfies it; if it is missing, partly met, malformed or
contradicted, it is not met ("no"). Do not reward effort, length or style the rubrics do not ask
for, and do not invent requirements they do not state.

The overall score is 1 if every rubric is met, and 0 if even one is not.

Rubrics:
{rubrics}

Response to grade:
<<<RESPONSE
{response}
RESPONSE>>>

Answer with one JSON object and nothing else, with exactly these keys:
{{"Grading Rationale": "<one short sentence per rubric>", "List of Requirement Satisfaction Status": ["yes" or "no", one per rubric, in order], "Overall Score": <0 or 1>}}
"""  # noqa: E501 (the prompt's one JSON line, verbatim)


# judge_status values; the first two are real grades, the rest are conservative zero scores
OK, SALVAGED = "ok", "salvaged"
EMPTY_OUTPUT, PARSE_ERROR = "empty_output", "parse_error"
JUDGE_CONTEXT_LENGTH, JUDGE_TRUNCATED = "judge_context_length", "judge_truncated"

# The contract's JSON shape, asked for through response_format (keys in the contract's order: the
# score comes last); OpenAI strict-mode subset, fixed for every row (the list length is checked here).
JUDGE_KEYS = ("Grading Rationale", "List of Requirement Satisfaction Status", "Overall Score")
JUDGE_SCHEMA = {
    "type": "object",
    "properties": {
        JUDGE_KEYS[0]: {"type": "string"},
        JUDGE_KEYS[1]: {"type": "array", "items": {"type": "string", "enum": ["yes", "no"]}},
        JUDGE_KEYS[2]: {"type": "integer", "enum": [0, 1]},
    },
    "required": list(JUDGE_KEYS),
    "additionalProperties": False,
}


def rubric_lines(rubrics: Any) -> list[str]:
    texts = (rubric.get("rubric_criteria", "") if isinstance(rubric, dict) else rubric for rubric in rubrics or [])
    return [line for line in (str(text or "").strip() for text in texts) if line]


def rubrics_text(rubrics: Any) -> str:
    return "\n".join(f"{i}. {text}" for i, text in enumerate(rubric_lines(rubrics), 1)) or NO_RUBRICS


# ---- judge reply parsing
Verdict = namedtuple("Verdict", "score rationale statuses how notes")  # how: the route the reply was read by
_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.DOTALL)
_SCORE = re.compile(r'"Overall Score"\s*:([^,}]*)')  # the stated value: up to where a JSON value ends
_RATIONALE = re.compile(r'"Grading Rationale"\s*:\s*"((?:[^"\\]|\\.)*)')
_STATUS_LIST = re.compile(r'"List of Requirement Satisfaction Status"\s*:\s*\[([^\]]*)')


def _json_objects(text: str):
    pos = text.find("{")
    while pos >= 0:
        try:
            obj, end = judge_format.decode(text, pos)
        except judge_format.TooDeep:
            raise  # no verdict nests that deep, and each `{` inside it would be tried as deep again
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(obj, dict):
            yield obj
        pos = text.find("{", end)


def _candidates(text: str) -> tuple[list[tuple[Any, str]], list[str]]:
    """What a reply states and how it was found, in reading order: the whole reply unfenced, as upstream ("json"); the
    objects in fenced blocks ("fenced_json"), then anywhere ("json_in_prose"), last stated first; and why not JSON."""
    whole = text.strip()
    whole = whole[7:] if whole.startswith("```json") else whole.removeprefix("```")
    try:
        found, failed = [(judge_format.loads(whole.removesuffix("```")), "json")], []
    except judge_format.TooDeep:
        raise
    except ValueError as exc:  # JSONDecodeError, or an integer past Python's digit limit
        found, failed = [], [f"not JSON ({getattr(exc, 'msg', exc)})"]
    fenced = [obj for block in _FENCE.findall(text) for obj in _json_objects(block)]
    found += [(obj, "fenced_json") for obj in fenced[::-1]]
    return found + [(obj, "json_in_prose") for obj in list(_json_objects(text))[::-1]], failed


def _normalize_score(value: Any) -> int | None:
    """0 or 1 if `value` is exactly that number, or a string of JSON that is (`"1"`, `"0.0"`); else None."""
    if isinstance(value, str):
        try:
            value = judge_format.loads(value)
        except ValueError:
            return None
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in (0, 1) else int(value)


def _verdict_from(obj: Any, how: str, n_rubrics: int) -> Verdict | str:
    if not isinstance(obj, dict):
        return f"JSON {type(obj).__name__}, not an object"
    if "Overall Score" not in obj:
        return "no 'Overall Score' key"
    score = _normalize_score(obj["Overall Score"])
    if score is None:
        return f"'Overall Score' must be 0 or 1, got {obj['Overall Score']!r}"
    notes = []
    rationale = obj.get("Grading Rationale", "")
    rationale = rationale if isinstance(rationale, str) else json.dumps(rationale, ensure_ascii=False)
    statuses = obj.get("List of Requirement Satisfaction Status", [])
    if not isinstance(statuses, list):
        notes.append(f"status list is a {type(statuses).__name__}, not a list")
        statuses = []
    statuses = [s.strip().lower() if isinstance(s, str) else s for s in statuses]
    if len(statuses) != n_rubrics:
        notes.append(f"{len(statuses)} statuses for {n_rubrics} rubrics")
    if any(s not in ("yes", "no") for s in statuses):
        notes.append("status values other than yes/no")
    if score == 1 and "no" in statuses:
        notes.append("score 1 although a rubric is marked no")
    return Verdict(score, rationale, statuses, how, notes)


def parse_judge_reply(text: str, n_rubrics: int) -> Verdict | str:
    """A Verdict, or the reason the reply could not be read: the first of `_candidates` that is one, else a
    clearly stated "Overall Score" in a reply cut short (how="score_only")."""
    if not text.strip():
        return "empty judge reply"
    try:
        candidates, reasons = _candidates(text)
    except judge_format.TooDeep as exc:
        return f"JSON in the reply {exc.msg}"  # no verdict nests that deep, whatever it states
    for obj, how in candidates:
        verdict = _verdict_from(obj, how, n_rubrics)
        if isinstance(verdict, Verdict):
            return verdict
        reasons.append(verdict)
    scores = _SCORE.findall(text)
    if not scores:
        return "; ".join(dict.fromkeys(reasons)) or "no verdict found"
    try:
        score = _normalize_score(judge_format.loads(scores[-1]))
    except ValueError:
        score = None
    if score is None:
        return f"'Overall Score' must be 0 or 1, got {scores[-1].strip()[:100]!r}"
    rationale, statuses = _RATIONALE.search(text), _STATUS_LIST.search(text)
    said = {"Overall Score": score, "Grading Rationale": rationale.group(1).replace('\\"', '"') if rationale else ""}
    said[JUDGE_KEYS[1]] = re.findall(r'"(yes|no)"', statuses.group(1), re.I) if statuses else []
    return _verdict_from(said, "score_only", n_rubrics)


# ---- asking the judge
@dataclass
class Asked:
    value: Any  # what `parse` made of the reply, or None when no reply could be used
    status: str  # OK, or why there is no value: API_ERROR, PARSE_ERROR, JUDGE_CONTEXT_LENGTH, JUDGE_TRUNCATED
    usage: dict
    latencies: list  # of the replies; None for one from a batch (nothing to measure)
    attempts: int = 0
    error: str | None = None
    mode: str | None = None  # the response_format mode of the last reply (judge_format.MODES)
    field: str = "content"  # where the last reply was read: content, or reasoning (content empty)
    enforced: bool | None = None  # False: the last reply broke the schema its structured mode asked for
    served: dict[str, str] | None = None  # the model the last reply says answered (llm.served)

    def route(self, how: str) -> str:
        return how if self.field == "content" else f"{self.field}:{how}"

    def accounts(self, prefix: str, model: str) -> dict:
        """The row's record of the calls, each key under `prefix`; `format_enforced` only when False."""
        latency = None if not self.latencies or None in self.latencies else round(sum(self.latencies), 3)
        out = {"model": model, "usage": self.usage or None, "latency_s": latency, "attempts": self.attempts}
        out |= {"format": self.mode} | ({"format_enforced": False} if self.enforced is False else {})
        return {prefix + k: v for k, v in (out | (self.served or {})).items()}


@dataclass(frozen=True)
class Contract:
    """The JSON a judge call asks for: the response_format name and schema, how a reply is read (`parse` returns a
    reason string for one it cannot use), and for a verdict the number of rubrics its status list must match."""

    name: str
    schema: dict
    parse: Callable[[str], Any]
    rubrics: int | None = None

    def problems(self, obj: Any) -> list[str]:
        """Why a reply breaks the schema or the rubric count exactly (empty: it keeps both; only that counts)."""
        kept = _keeps(obj, self.schema) and (self.rubrics is None or len(obj[JUDGE_KEYS[1]]) == self.rubrics)
        return [] if kept else [f"breaks the {self.name} schema or its rubric count"]


def _keeps(obj: Any, schema: dict) -> bool:
    """Whether `obj` keeps `schema`, in the subset of JSON Schema that ours use (no `enum` holds a bool)."""
    if schema["type"] == "object":
        fields = schema["properties"]
        return isinstance(obj, dict) and sorted(obj) == sorted(fields) and all(_keeps(obj[k], fields[k]) for k in obj)
    if schema["type"] == "array":
        items = schema["items"]
        return isinstance(obj, list) and len(obj) >= schema.get("minItems", 0) and all(_keeps(x, items) for x in obj)
    return obj in schema["enum"] and not isinstance(obj, bool) if "enum" in schema else isinstance(obj, str)


# ---- error types of failed solutions
ERROR_TYPES = ("Context Ignored", "Context Misused", "Format Error", "Refusal")
ANALYSIS_TASK_CHARS = 8000  # of the last user turn shown to the analyst; longer turns are cut, visibly
SLIMMED_TASK = (  # the task of a judge row without messages
    "(not available: the inference rows were written with --slim; `python -m evalpipe.expand` joins the messages back)"
)

ERROR_ANALYSIS_PROMPT = """\
A model was given a task that comes with its own context (documents, rules, procedures or data
to learn from) and its response failed the task: a strict grader marked at least one rubric as
not met. Say why it failed.

Choose every type that applies (at least one):
- "Context Ignored": the response does not use what the context provides; it answers from
  general knowledge or overlooks the part of the context that matters.
- "Context Misused": the response draws on the context but misreads, misapplies or reasons
  wrongly from it.
- "Format Error": the response breaks a format, structure or output requirement of the task.
- "Refusal": the response declines or says it cannot answer instead of attempting the task.

The task (its last user turn):
<<<TASK
{task}
TASK>>>

Rubrics, each with the grader's verdict:
{rubrics}

The grader's rationale:
{rationale}

The response:
<<<RESPONSE
{response}
RESPONSE>>>

Answer with one JSON object and nothing else:
{{"Error Types": ["<one or more of the four types>"], "Reason": "<one or two sentences>"}}
"""

_TYPE_BY_NAME = {t.lower(): t for t in ERROR_TYPES}
ERROR_ANALYSIS_SCHEMA = {
    "type": "object",
    "properties": {
        "Error Types": {"type": "array", "items": {"type": "string", "enum": list(ERROR_TYPES)}, "minItems": 1},
        "Reason": {"type": "string"},
    },
    "required": ["Error Types", "Reason"],
    "additionalProperties": False,
}


def parse_error_types(text: str) -> tuple[list[str], str, str] | str:
    """(types, reason, how) from an analyst's reply, read as a judge's (`_candidates`), or why it could not be."""
    if not text.strip():
        return "empty reply"
    try:
        candidates, _ = _candidates(text)
    except judge_format.TooDeep as exc:
        return f"JSON in the reply {exc.msg}"
    reasons = []
    for obj, how in candidates:
        if how == "fenced_json" or not isinstance(obj, dict):
            continue  # an analysis is read whole, then from the prose, the last object stated first
        fields = {str(k).lower().replace("_", " "): v for k, v in obj.items()}
        types = fields.get("error types")
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list):
            reasons.append("no 'Error Types' list")
            continue
        named = [_TYPE_BY_NAME.get(str(t).strip().lower()) for t in types]
        known = [t for t in named if t is not None]
        if not types or len(known) < len(named):
            reasons.append(f"'Error Types' must be one or more of {list(ERROR_TYPES)}, got {types!r}")
            continue
        reason = fields.get("reason", "")
        return list(dict.fromkeys(known)), reason if isinstance(reason, str) else json.dumps(reason), how
    return "; ".join(dict.fromkeys(reasons)) or "no JSON object in the reply"


ANALYSIS_CONTRACT = Contract("clbench_error_analysis", ERROR_ANALYSIS_SCHEMA, parse_error_types)


# ---- the benchmark
def _graded(row: dict, status: str, rationale: str, statuses: list | None = None, score: int = 0, **extra) -> dict:
    """Upstream's keys first (inference keys, then its three judge keys), then ours; by default a zero score."""
    out = {"idx": row_id(row)}
    out.update((k, row[k]) for k in ("messages", "model_output", "rubrics", "metadata") if k in row)
    out.update(grading_rationale=rationale, requirement_status=statuses or [], score=score)
    out.update((k, v) for k, v in row.items() if k not in out and not k.startswith("judge_"))
    out["judge_status"] = status
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


@dataclass(frozen=True)
class CLBenchOptions:
    judge_prompt: Path | None = flag(None, "prompt file used verbatim; {rubrics}, {response} replaced", stage="judge")
    parse_attempts: int = flag(3, "judge calls while a reply does not parse (default 3, as upstream)", stage="judge")
    rejudge_parse_errors: bool = flag(False, "also judge again the rows whose reply could not be parsed", stage="judge")
    judge_format: str = flag(
        "auto",
        "response_format the judge is asked for: auto tries json_schema, then json_object with a schema, "
        "then json_object, then none, and keeps what the endpoint takes; none sends upstream's exact request",
        stage="judge",
        choices=judge_format.CHOICES,
    )
    judge_max_tokens: int = flag(
        16384, "the judge's token budget without --max-tokens (0 or --judge-format none: none is sent)", stage="judge"
    )
    rejudge_truncated: bool = flag(False, "also judge again the replies cut at the token limit", stage="judge")
    prompt_cache_key: str = flag(
        "auto",
        "send the task's context_id as prompt_cache_key (online calls): auto to OpenAI's API only; on: any; off: never",
        choices=("auto", "on", "off"),
    )


class CLBench(ErrorAnalysis, Benchmark):
    name = "clbench"
    default_data = PROJECT / "data" / "clbench" / "sample.jsonl"
    Options = CLBenchOptions
    score_fields = ("score", "judge_status", "judge_format", "judge_parse")
    aggregate_note = "Solving rate over all selected tasks: a task without a judge row counts as 0."
    prefix_group = "context_id"  # a context's tasks share its system message and long context, and their error bars
    # solving rates over all selected tasks; the categories in score.json's order (CATEGORIES first)
    figures = (
        ItemFigure("Overall", "solved", key="overall/solving_rate"),
        ItemFigure("{}", "solved", by="category", key="by_category/{}/solving_rate"),
        ItemFigure("{}", "solved", by="sub_category", table="Sub-categories", key="by_sub_category/{}/solving_rate"),
    )
    options: CLBenchOptions

    def __init__(self, options: CLBenchOptions | None = None):
        super().__init__(options)
        self.judge_template = JUDGE_PROMPT
        prompt_file = self.options.judge_prompt
        if prompt_file is not None:
            try:
                self.judge_template = prompt_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise BadInput(f"cannot read the judge prompt: {exc.strerror}", prompt_file) from None
            if "{response}" not in self.judge_template:
                raise BadInput("the judge prompt has no {response} placeholder", prompt_file)
        # what this run learns of the judge endpoints' response_format (judge.py saves it in the manifest)
        self.judge_formats = judge_format.Formats(self.options.judge_format, self.options.judge_max_tokens or None)

    def load(self, path: Path) -> list[Task]:
        tasks: list[Task] = []
        seen: dict[str | int, int] = {}
        for line, row in jsonl.iter_rows(path):
            messages = row.get("messages")
            if messages is None:
                raise BadInput("no 'messages' key", path, line)
            if not isinstance(messages, list) or not messages:
                raise BadInput("'messages' must be a non-empty list of chat messages", path, line)
            for i, msg in enumerate(messages):
                if not isinstance(msg, dict) or not isinstance(msg.get("content"), (str, list)):
                    raise BadInput(f"messages[{i}] must be an object with a 'content' string", path, line)
                if msg.get("role") not in VALID_ROLES:
                    raise BadInput(
                        f"messages[{i}] has role {msg.get('role')!r}; expected one of {sorted(VALID_ROLES)}", path, line
                    )
            if messages[-1]["role"] != "user":
                raise BadInput("'messages' must end with a user turn", path, line)
            rubrics = row.get("rubrics", [])
            if not isinstance(rubrics, list) or not all(isinstance(r, (str, dict)) for r in rubrics):
                raise BadInput("'rubrics' must be a list of strings or objects with 'rubric_criteria'", path, line)
            meta = row.get("metadata")
            task_id = meta.get("task_id") if isinstance(meta, dict) else None
            if not isinstance(task_id, (str, int)) or task_id == "":
                raise BadInput("no 'metadata.task_id'", path, line)
            if task_id in seen:
                raise BadInput(f"task_id {task_id!r} appears again (first on line {seen[task_id]})", path, line)
            seen[task_id] = line
            tasks.append(Task(id=task_id, row=row, line=line))
        if not tasks:
            raise BadInput("no tasks in the file", path)
        return tasks

    async def solve(self, task: Task, model: "ChatClient", steps=None) -> dict:
        # --prompt-cache-key auto: only to OpenAI's API, whose field it is; online only, as a batch's request lines
        # (and their custom ids) stay as earlier runs wrote them
        choice = self.options.prompt_cache_key
        sends = choice == "on" or (
            choice == "auto" and urllib.parse.urlsplit(model.endpoint.url).hostname == "api.openai.com"
        )
        key = group_of(self, task.row) if sends and not model.batched else None
        fields = {"prompt_cache_key": key} if key else None
        upstream = {"rubrics": task.row.get("rubrics", []), "metadata": task.row.get("metadata", {})}
        return await chat_row(task, model, task.row["messages"], fields, **upstream)

    def is_judged(self, row: dict) -> bool:
        return self._is_final(row.get("judge_status")) and not stand_in(row)

    def _is_final(self, status: Any) -> bool:
        """Whether a judge or analysis status stands: not an API error, nor what --rejudge-* asks to redo."""
        options = self.options
        redo = {API_ERROR: True, PARSE_ERROR: options.rejudge_parse_errors, JUDGE_TRUNCATED: options.rejudge_truncated}
        return not redo.get(status, False)

    async def _ask(self, judge: "ChatClient", prompt: str, contract: Contract) -> Asked:
        """Ask until `parse` takes a reply, at most --parse-attempts times. A reply that breaks its structured mode
        marks the mode not enforced; empty content is read from the reasoning field; a cut, incomplete one is final."""
        asked = Asked(None, PARSE_ERROR, {}, [])

        def done(value, status, n, error=None) -> Asked:
            asked.value, asked.status, asked.attempts, asked.error = value, status, n, error
            return asked

        attempts = 1 if judge.batched else max(1, self.options.parse_attempts)  # a batch answers one call per task
        messages = [{"role": "user", "content": prompt}]
        for n in range(1, attempts + 1):
            try:
                answer = await judge_format.ask(
                    self.judge_formats, judge, messages, name=contract.name, schema=contract.schema
                )
            except ContextTooLong as exc:
                return done(None, JUDGE_CONTEXT_LENGTH, n, str(exc))
            except CallFailed as exc:
                return done(None, API_ERROR, n, str(exc))
            reply, asked.mode = answer.completion, answer.mode
            cost.add_counts(asked.usage, reply.usage)
            asked.latencies.append(reply.latency_s)
            asked.served = reply.served
            text, asked.field = reply.text, "content"
            if not text.strip() and reply.reasoning.strip():
                text, asked.field = reply.reasoning, "reasoning"
            truncated = reply.finish_reason == "length"
            asked.enforced = None
            if answer.mode in judge_format.STRUCTURED and not truncated:
                asked.enforced = not judge_format.check(text, contract.problems)
                self.judge_formats.ladder(judge).mark(answer.mode, asked.enforced)
            if truncated and judge_format.check(text, lambda obj: []):  # not even complete JSON
                tokens = reply.usage.get("completion_tokens")
                after = f" after {tokens} tokens" if tokens else ""
                return done(None, JUDGE_TRUNCATED, n, f"reply cut at the token limit{after}; it ended {text[-200:]!r}")
            parsed = contract.parse(text)
            if not isinstance(parsed, str):
                return done(parsed, OK, n)
            asked.error = f"{parsed}; reply began {text[:200]!r}"
        return done(None, PARSE_ERROR, attempts, asked.error)

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        output = self.graded_text(row)
        if not output.strip():
            why = "empty model output: score 0 without a judge call"
            if row.get("status") == "context_length":
                why = "the prompt exceeded the model's context: score 0 without a judge call"
            elif row.get("status") == THINKING_TRUNCATED:
                why = "the token budget ran out while the model was thinking: no final answer, score 0 (no judge call)"
            return _graded(row, EMPTY_OUTPUT, why)
        assert judge is not None  # judge prompts: the judge stage always passes the judge model
        rubrics, template = row.get("rubrics", []), self.judge_template
        n_rubrics = len(rubric_lines(rubrics))
        if template is JUDGE_PROMPT:  # the others are used verbatim, their braces too
            prompt = JUDGE_PROMPT.format(rubrics=rubrics_text(rubrics), response=output)
        else:
            prompt = template.replace("{rubrics}", rubrics_text(rubrics)).replace("{response}", output)
        contract = Contract("clbench_judge", JUDGE_SCHEMA, lambda text: parse_judge_reply(text, n_rubrics), n_rubrics)
        asked = await self._ask(judge, prompt, contract)
        accounts = asked.accounts("judge_", judge.endpoint.model)
        verdict = asked.value
        if verdict is not None:
            salvage = None if verdict.how == "json" else verdict.how
            notes, route = verdict.notes or None, asked.route(verdict.how)
            extra = {"judge_salvage": salvage, "judge_notes": notes, "judge_parse": route, **accounts}
            status = SALVAGED if salvage else OK
            return _graded(row, status, verdict.rationale, verdict.statuses, verdict.score, **extra)
        why = {
            JUDGE_CONTEXT_LENGTH: "the judge prompt exceeded the judge's context: score 0",
            API_ERROR: "judge API call failed after retries: score 0 (judged again on the next run)",
            PARSE_ERROR: f"judge reply unparseable after {asked.attempts} attempts: score 0",
            JUDGE_TRUNCATED: "judge reply cut at the token limit: score 0 (--rejudge-truncated with a larger "
            "--judge-max-tokens judges it again)",
        }[asked.status]
        return _graded(row, asked.status, why, judge_error=asked.error, **accounts)

    # ---- why failed solutions failed (optional: judge.py --error-analysis)
    def needs_error_analysis(self, judge_row: dict) -> bool:
        """A real failure: the judge read the response and gave 0 (not a fallback zero)."""
        return judge_row.get("judge_status") in (OK, SALVAGED) and _normalize_score(judge_row.get("score")) == 0

    def is_analyzed(self, row: dict) -> bool:
        return self._is_final(row.get("analysis_status"))

    async def analyze_error(self, judge_row: dict, judge: "ChatClient") -> dict:
        messages = judge_row.get("messages") or [{"role": "user", "content": SLIMMED_TASK}]
        task = next(
            (m.get("content") for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), ""
        )
        task = task if isinstance(task, str) else json.dumps(task, ensure_ascii=False)
        if len(task) > ANALYSIS_TASK_CHARS:
            cut = len(task) - ANALYSIS_TASK_CHARS
            task = task[:ANALYSIS_TASK_CHARS] + f"\n[... {cut} more characters not shown ...]"
        statuses = judge_row.get("requirement_status") or []
        rubric_rows = [
            f"{i}. [{statuses[i - 1] if i <= len(statuses) else '?'}] {text}"
            for i, text in enumerate(rubric_lines(judge_row.get("rubrics")), 1)
        ]
        prompt = ERROR_ANALYSIS_PROMPT.format(
            task=task,
            rubrics="\n".join(rubric_rows) or NO_RUBRICS,
            rationale=judge_row.get("grading_rationale") or "(none)",
            response=self.graded_text(judge_row),
        )
        asked = await self._ask(judge, prompt, ANALYSIS_CONTRACT)
        out = {"idx": row_id(judge_row), "error_types": [], "error_reason": ""}
        if asked.value is not None:
            types, reason, how = asked.value
            out.update(error_types=types, error_reason=reason, analysis_status=OK if how == "json" else SALVAGED)
            out["analysis_parse"] = asked.route(how)
        else:
            out.update(analysis_status=asked.status, analysis_error=asked.error)
        return out | asked.accounts("analysis_", judge.endpoint.model)

    def error_analysis_metrics(
        self, tasks: Iterable[Task], judged: Mapping[Any, dict], analyses: dict[Any, dict]
    ) -> dict:
        counts = Counter(dict.fromkeys(ERROR_TYPES, 0))
        statuses: Counter[str] = Counter()  # of the failed solutions' analyses
        for task in tasks:
            row = judged.get(task.id)
            if row is None or not self.needs_error_analysis(row):
                continue
            analysis = analyses.get(task.id)
            status = str(analysis.get("analysis_status")) if analysis else "not_analyzed"
            statuses[status] += 1
            if analysis and status in (OK, SALVAGED):
                counts.update(analysis.get("error_types", []))
        analyzed = statuses[OK] + statuses[SALVAGED]
        return {
            "denominator": "failed solutions (judged 0 by a parsed verdict) that have a parsed analysis; "
            "multi-label, so the shares may sum to more than 100%",
            "failed": statuses.total(),
            "analyzed": analyzed,
            "status": dict(sorted(statuses.items())),
            "counts": dict(counts),
            "share": {t: (counts[t] / analyzed if analyzed else None) for t in ERROR_TYPES},
        }

    def error_analysis_tables(self, metrics: dict) -> dict[str, dict[str, float | None]]:
        analysis = metrics.get(self.error_analysis_name)
        if analysis and analysis["analyzed"]:
            return {"Error types (share of failed solutions)": dict(analysis["share"])}
        return {}

    def prompts(self) -> dict[str, list[str]]:
        return {"judge": [self.judge_template]}

    def error_analysis_prompts(self) -> list[str]:
        return [ERROR_ANALYSIS_PROMPT]

    def details(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> dict:
        overall: Counter[str] = Counter()
        by_cat: dict[str, Counter[str]] = {c: Counter() for c in CATEGORIES}
        by_sub: dict[str, Counter[str]] = {}
        for task in tasks:
            meta = task.row.get("metadata") or {}
            row = judged.get(task.id)
            outcome = "missing" if row is None else "score_1" if _normalize_score(row.get("score")) == 1 else "score_0"
            category, sub = str(meta.get("context_category", "(none)")), str(meta.get("sub_category", "(none)"))
            for tally in (overall, by_cat.setdefault(category, Counter()), by_sub.setdefault(sub, Counter())):
                tally[outcome] += 1
        return {
            "denominator": "solving_rate counts missing rows as 0 (all selected tasks); "
            "solving_rate_graded is upstream's rate over graded rows only",
            "overall": _rates(overall),
            "by_category": {k: _rates(v) for k, v in by_cat.items() if v},
            "by_sub_category": {k: _rates(by_sub[k]) for k in sorted(by_sub)},
        }

    def item_columns(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> ItemColumns:
        """Each task an item, solved 0/1 (None: no final grade in this run), clustered by its context."""
        keys, solved, clusters, categories, subs = [], [], [], [], []
        for task in tasks:
            meta = task.row.get("metadata") or {}
            row = judged.get(task.id)
            keys.append(task.id)
            solved.append(None if row is None or stand_in(row) else int(_normalize_score(row.get("score")) == 1))
            clusters.append(meta.get("context_id"))  # None: this task is a cluster of its own
            categories.append(str(meta.get("context_category", "(none)")))
            subs.append(str(meta.get("sub_category", "(none)")))
        independent = all(c is None for c in clusters)  # a dataset without context ids
        clustered = None if independent else [f"task:{k}" if c is None else c for c, k in zip(clusters, keys)]
        groups = {"category": categories, "sub_category": subs}
        return {"keys": keys, "clusters": clustered, "groups": groups, "columns": {"solved": solved}}

    def format_metrics(self, metrics: dict) -> str:
        cov = metrics["coverage"]
        lines = [
            f"CL-bench: {cov['graded']}/{cov['expected']} tasks graded, {cov['missing']} missing (counted as 0)",
            f"{'':36} {'tasks':>6} {'solved':>7} {'rate':>7} {'rate (graded)':>14}",
        ]

        def line(name: str, t: dict) -> str:
            rates = f"{tables.pct(t['solving_rate']):>7} {tables.pct(t['solving_rate_graded']):>14}"
            return f"{name[:36]:36} {t['total']:6d} {t['score_1']:7d} {rates}"

        lines.append(line("Overall", metrics["overall"]))
        lines += [line(k, v) for k, v in metrics["by_category"].items()]
        lines.append("Sub-categories:")
        lines += [line("  " + k, v) for k, v in metrics["by_sub_category"].items()]
        lines.append("Judge status: " + ", ".join(f"{k} {v}" for k, v in metrics["judge_status"].items()))
        for key, title in (("judge_format", "Judge format"), ("judge_parse", "Judge parse route")):
            if metrics.get(key):
                lines.append(f"{title}: " + ", ".join(f"{k} {v}" for k, v in metrics[key].items()))
        return "\n".join(lines)


def _rates(tally: Counter) -> dict:
    """The counts and upstream's rate over graded rows (`solving_rate`, over all tasks, is a figure)."""
    graded = tally["score_1"] + tally["score_0"]
    counts = {k: tally[k] for k in ("score_1", "score_0", "missing")}
    return {"total": tally.total(), **counts, "solving_rate_graded": tally["score_1"] / graded if graded else 0.0}
