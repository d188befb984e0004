"""CL-bench: context learning, graded by an LLM judge against rubrics, all-or-nothing.

Rows stay compatible with upstream (Tencent-Hunyuan/CL-bench): an inference row starts with
idx, messages, model_output, rubrics, metadata; a judge row adds grading_rationale,
requirement_status and score. Our extra keys come after those.
"""

import json
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..client import cost, judge_format
from ..errors import BadInput, CallFailed, ContextTooLong
from ..results import tables
from ..results.items import ItemColumns, ItemFigure
from ..results.shapes import CLBenchShape
from ..store import jsonl
from ..store.paths import PROJECT
from ..store.rows import THINKING_TRUNCATED, row_id
from .base import VALID_ROLES, Benchmark, ErrorAnalysis, Task, answer_into, flag, group_of

if TYPE_CHECKING:  # the openai SDK is imported only by stages that call an API
    from ..client.llm import ChatClient, Endpoint, Served

CATEGORIES = (
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
)
NO_RUBRICS = "No specific rubrics provided."
OPENAI_HOST = "api.openai.com"  # where --prompt-cache-key auto sends the key (the field is OpenAI's)
SUB_CATEGORIES = "Sub-categories"  # the title of aggregate's table of solving rates per sub-category

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
EMPTY_OUTPUT, API_ERROR, PARSE_ERROR, JUDGE_CONTEXT_LENGTH, JUDGE_TRUNCATED = (
    "empty_output",
    "api_error",
    "parse_error",
    "judge_context_length",
    "judge_truncated",
)

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


def schema_problems(obj: Any, n_rubrics: int) -> list[str]:
    """How a reply breaks JUDGE_SCHEMA or the rubric count (empty: it keeps both)."""
    if not isinstance(obj, dict):
        return [f"JSON {type(obj).__name__}, not an object"]
    problems = []
    if sorted(obj) != sorted(JUDGE_KEYS):
        problems.append(f"keys {sorted(obj)}")
    statuses = obj.get(JUDGE_KEYS[1])
    if not isinstance(statuses, list) or any(s not in ("yes", "no") for s in statuses):
        problems.append("status list is not a list of 'yes'/'no'")
    elif len(statuses) != n_rubrics:
        problems.append(f"{len(statuses)} statuses for {n_rubrics} rubrics")
    score = obj.get(JUDGE_KEYS[2])
    if isinstance(score, bool) or score not in (0, 1):
        problems.append(f"'Overall Score' {score!r}")
    if not isinstance(obj.get(JUDGE_KEYS[0]), str):
        problems.append("'Grading Rationale' is not a string")
    return problems


def rubric_lines(rubrics: Any) -> list[str]:
    lines = []
    for rubric in rubrics or []:
        text = rubric.get("rubric_criteria", "") if isinstance(rubric, dict) else rubric
        text = str(text or "").strip()
        if text:
            lines.append(text)
    return lines


def rubrics_text(rubrics: Any) -> str:
    lines = rubric_lines(rubrics)
    if not lines:
        return NO_RUBRICS
    return "\n".join(f"{i}. {text}" for i, text in enumerate(lines, 1))


# ---------------------------------------------------------------- judge reply parsing


class Verdict:
    def __init__(self, score: int, rationale: str, statuses: list, how: str, notes: list[str]):
        self.score, self.rationale, self.statuses, self.how, self.notes = score, rationale, statuses, how, notes


_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.DOTALL)
_SCORE = re.compile(r'"Overall Score"\s*:([^,}]*)')  # the stated value: up to where a JSON value ends
_STATED_SCORE = re.compile(r'\s*(?:([01])(?:\.0)?|"([01])(?:\.0)?")\s*')  # 0 or 1 and nothing else: not 1/2, 1e-9
_RATIONALE = re.compile(r'"Grading Rationale"\s*:\s*"((?:[^"\\]|\\.)*)')
_STATUS_LIST = re.compile(r'"List of Requirement Satisfaction Status"\s*:\s*\[([^\]]*)')


def _strip_outer_fence(text: str) -> str:
    text = text.strip()
    if text.startswith("```json"):
        text = text[7:]
    elif text.startswith("```"):
        text = text[3:]
    if text.endswith("```"):
        text = text[:-3]
    return text.strip()


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


def _normalize_score(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip() in ("0", "1", "0.0", "1.0"):
        return int(float(value.strip()))
    return None


def _verdict_from(obj: dict, how: str, n_rubrics: int) -> Verdict | str:
    if "Overall Score" not in obj:
        return "no 'Overall Score' key"
    score = _normalize_score(obj["Overall Score"])
    if score is None:
        return f"'Overall Score' must be 0 or 1, got {obj['Overall Score']!r}"
    notes = []
    rationale = obj.get("Grading Rationale", "")
    if not isinstance(rationale, str):
        rationale = json.dumps(rationale, ensure_ascii=False)
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
    """A Verdict, or the reason the reply could not be read.

    Tries, in order: the reply as JSON after stripping an outer code fence (what upstream
    accepts: how="json"); then salvages a fenced block inside the reply, a JSON object inside
    prose, and finally a clearly stated "Overall Score": 0|1 in a truncated reply.
    """
    if not text or not text.strip():
        return "empty judge reply"
    reasons = []
    try:
        obj = judge_format.loads(_strip_outer_fence(text))
    except judge_format.TooDeep as exc:
        return f"not JSON ({exc.msg})"  # a reply nested that deep is no verdict, whatever it states
    except json.JSONDecodeError as exc:
        reasons.append(f"not JSON ({exc.msg})")
    else:
        if isinstance(obj, dict):
            verdict = _verdict_from(obj, "json", n_rubrics)
            if isinstance(verdict, Verdict):
                return verdict
            reasons.append(verdict)
        else:
            reasons.append(f"JSON {type(obj).__name__}, not an object")
    try:
        fenced = [(m, "fenced_json") for block in _FENCE.findall(text) for m in _json_objects(block)]
        in_prose = [(m, "json_in_prose") for m in _json_objects(text)]
    except judge_format.TooDeep as exc:
        return f"JSON in the reply {exc.msg}"
    for obj, how in fenced[::-1] + in_prose[::-1]:  # a fenced block first; the last stated verdict wins
        verdict = _verdict_from(obj, how, n_rubrics)
        if isinstance(verdict, Verdict):
            return verdict
        reasons.append(verdict)
    scores = _SCORE.findall(text)
    if scores:
        stated = _STATED_SCORE.fullmatch(scores[-1])
        if stated is None:
            return f"'Overall Score' must be 0 or 1, got {scores[-1].strip()[:100]!r}"
        score = int(stated.group(1) or stated.group(2))
        rationale = _RATIONALE.search(text)
        statuses = _STATUS_LIST.search(text)
        obj = {
            "Overall Score": score,
            "Grading Rationale": rationale.group(1).replace('\\"', '"') if rationale else "",
            "List of Requirement Satisfaction Status": re.findall(r'"(yes|no)"', statuses.group(1), re.I)
            if statuses
            else [],
        }
        return _verdict_from(obj, "score_only", n_rubrics)
    return "; ".join(dict.fromkeys(reasons)) or "no verdict found"


# ---------------------------------------------------------------- asking the judge


@dataclass
class Asked:
    value: Any  # what `parse` made of the reply, or None when no reply could be used
    status: str  # OK, or why there is no value: API_ERROR, PARSE_ERROR, JUDGE_CONTEXT_LENGTH, JUDGE_TRUNCATED
    usage: dict
    latency_s: float | None  # None when a reply came from a batch (no latency to measure)
    attempts: int
    error: str | None = None
    mode: str | None = None  # the response_format mode of the last reply (judge_format.MODES)
    field: str = "content"  # where the last reply was read: content, or reasoning (content empty)
    enforced: bool | None = None  # False: the last reply broke the schema its structured mode asked for
    served: "Served | None" = None  # the model the last reply says answered

    def served_fields(self, prefix: str) -> dict[str, str]:
        return self.served.fields(prefix) if self.served is not None else {}

    @property
    def latency_rounded(self) -> float | None:
        return None if self.latency_s is None else round(self.latency_s, 3)


@dataclass(frozen=True)
class Contract:
    """The JSON a judge call asks for: the response_format name, its schema, and the exact check of a reply."""

    name: str
    schema: dict
    problems: Callable[[Any], list[str]]


async def ask_judge(
    judge: "ChatClient",
    prompt: str,
    parse: Callable[[str], Any],
    attempts: int,
    formats: judge_format.Formats | None = None,
    contract: Contract | None = None,
) -> Asked:
    """Ask until `parse` accepts a reply (it returns a reason string to reject one), at most `attempts` times.

    With `formats` and `contract`, the call asks for the contract's JSON through response_format
    (judge_format), and a reply in a structured mode that breaks it marks the mode not enforced. A
    reply with empty content is read from the reasoning field; one cut at the token limit that is
    not complete JSON is JUDGE_TRUNCATED at once."""
    usage: dict = {}
    latencies: list = []  # of the replies; the latency is unknown when there was none or one came from a batch
    last = Asked(None, PARSE_ERROR, usage, None, 0)

    def asked(value, status, n, error=None) -> Asked:
        latency = None if not latencies or None in latencies else sum(latencies)
        return Asked(value, status, usage, latency, n, error, last.mode, last.field, last.enforced, last.served)

    attempts = 1 if judge.batched else max(1, attempts)  # a batch answers one call per task
    messages = [{"role": "user", "content": prompt}]
    failure = None
    for n in range(1, attempts + 1):
        try:
            if formats is not None and contract is not None:
                answer = await judge_format.ask(formats, judge, messages, name=contract.name, schema=contract.schema)
                reply, last.mode = answer.completion, answer.mode
            else:
                reply = await judge.complete(messages)
        except ContextTooLong as exc:
            return asked(None, JUDGE_CONTEXT_LENGTH, n, str(exc))
        except CallFailed as exc:
            return asked(None, API_ERROR, n, str(exc))
        cost.add_counts(usage, reply.usage)
        latencies.append(reply.latency_s)
        last.served = reply.served
        text, last.field = reply.text, "content"
        if not text.strip() and reply.reasoning.strip():
            text, last.field = reply.reasoning, "reasoning"
        truncated = reply.finish_reason == "length"
        last.enforced = None
        if formats is not None and contract is not None and last.mode in judge_format.STRUCTURED and not truncated:
            last.enforced = not judge_format.check(text, contract.problems)
            formats.ladder(judge).mark(last.mode or "", last.enforced)
        if truncated and judge_format.check(text, lambda obj: []):  # not even complete JSON
            tokens = reply.usage.get("completion_tokens")
            return asked(
                None,
                JUDGE_TRUNCATED,
                n,
                f"reply cut at the token limit{f' after {tokens} tokens' if tokens else ''}; it ended {text[-200:]!r}",
            )
        parsed = parse(text)
        if not isinstance(parsed, str):
            return asked(parsed, OK, n)
        failure = f"{parsed}; reply began {text[:200]!r}"
    return asked(None, PARSE_ERROR, attempts, failure)


def parse_route(how: str, field: str) -> str:
    """How a reply was read: the parser's route, prefixed `reasoning:` when read from the reasoning field."""
    return how if field == "content" else f"{field}:{how}"


# ---------------------------------------------------------------- error types of failed solutions

ERROR_TYPES = ("Context Ignored", "Context Misused", "Format Error", "Refusal")
ANALYSIS_TASK_CHARS = 8000  # of the last user turn shown to the analyst; longer turns are cut, visibly

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


def analysis_problems(obj: Any) -> list[str]:
    """How an analyst's reply breaks ERROR_ANALYSIS_SCHEMA (empty: it keeps it)."""
    if not isinstance(obj, dict):
        return [f"JSON {type(obj).__name__}, not an object"]
    problems = [] if sorted(obj) == ["Error Types", "Reason"] else [f"keys {sorted(obj)}"]
    types = obj.get("Error Types")
    if not isinstance(types, list) or not types or any(t not in ERROR_TYPES for t in types):
        problems.append("'Error Types' is not a list of the four types")
    if not isinstance(obj.get("Reason"), str):
        problems.append("'Reason' is not a string")
    return problems


ANALYSIS_CONTRACT = Contract("clbench_error_analysis", ERROR_ANALYSIS_SCHEMA, analysis_problems)


def _whole_then_in_prose(text: str) -> list[tuple[Any, str]]:
    """The reply as JSON, then each JSON object inside it, the last first; judge_format.TooDeep for deep nesting."""
    whole = []
    try:
        whole.append((judge_format.loads(_strip_outer_fence(text)), "json"))
    except judge_format.TooDeep:
        raise
    except ValueError:
        pass
    return whole + [(obj, "json_in_prose") for obj in list(_json_objects(text))[::-1]]


def parse_error_types(text: str) -> tuple[list[str], str, str] | str:
    """(types, reason, how) from an analyst's reply, or the reason it could not be read."""
    if not text or not text.strip():
        return "empty reply"
    try:
        candidates = _whole_then_in_prose(text)
    except judge_format.TooDeep as exc:
        return f"JSON in the reply {exc.msg}"
    reasons = []
    for obj, how in candidates:
        if not isinstance(obj, dict):
            continue
        fields = {str(k).lower().replace("_", " "): v for k, v in obj.items()}
        types = fields.get("error types")
        if isinstance(types, str):
            types = [types]
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


# ---------------------------------------------------------------- the benchmark

UPSTREAM_INFER_KEYS = ("idx", "messages", "model_output", "rubrics", "metadata")


def _graded(row: dict, *, rationale: str, statuses: list, score: int, status: str, **extra) -> dict:
    """Upstream's keys first (inference keys, then its three judge keys), then ours."""
    out = {"idx": row_id(row)}
    out.update((k, row[k]) for k in UPSTREAM_INFER_KEYS[1:] if k in row)
    out.update(grading_rationale=rationale, requirement_status=statuses, score=score)
    out.update((k, v) for k, v in row.items() if k not in out and not k.startswith("judge_"))
    out["judge_status"] = status
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


@dataclass(frozen=True)
class CLBenchOptions:
    judge_prompt: Path | None = flag(
        None, "prompt template file used verbatim; {rubrics} and {response} are replaced", stage="judge"
    )
    parse_attempts: int = flag(
        3, "judge calls per task while the reply cannot be parsed (default 3, as upstream)", stage="judge"
    )
    rejudge_parse_errors: bool = flag(
        False, "also judge again the rows whose judge reply could not be parsed", stage="judge"
    )
    judge_format: str = flag(
        "auto",
        "response_format the judge is asked for: auto tries json_schema, then json_object with a schema, "
        "then json_object, then none, and keeps what the endpoint takes; none sends upstream's exact request",
        stage="judge",
        choices=judge_format.CHOICES,
    )
    judge_max_tokens: int = flag(
        16384,
        "the judge's token budget when --max-tokens is not given (sent as max_tokens, or max_completion_tokens "
        "where the endpoint needs it; 0 sends none; --judge-format none sends none)",
        stage="judge",
    )
    rejudge_truncated: bool = flag(
        False,
        "also judge again the rows whose judge reply was cut at the token limit (raise the budget)",
        stage="judge",
    )
    prompt_cache_key: str = flag(
        "auto",
        "send the task's context_id as prompt_cache_key, which routes the requests of one context to the same "
        "prompt cache (online calls, not batches): auto sends it to OpenAI's API only (no --base-url), on to any "
        "endpoint, off never (the request as upstream sends it)",
        choices=("auto", "on", "off"),
    )


class CLBench(ErrorAnalysis, Benchmark):
    name = "clbench"
    default_data = PROJECT / "data" / "clbench" / "sample.jsonl"
    Options = CLBenchOptions
    judge_uses_llm = True
    score_fields = ("score", "judge_status", "judge_format", "judge_parse")
    aggregate_note = "Solving rate over all selected tasks: a task without a judge row counts as 0."
    demo = {
        "MAX_SAMPLES": "6",
        "ARGS": "--max-tokens 64 --temperature 0.8",
        "JUDGE_ARGS": "--max-tokens 128 --parse-attempts 1",
    }
    # tasks that share a context are not independent: their error bars are clustered by it
    prefix_group = "context_id"  # a context's tasks share the system message and the long context after it
    # solving rates over all selected tasks; the categories in score.json's order (CATEGORIES first)
    viewer_shape = CLBenchShape
    figures = (
        ItemFigure("Overall", "solved", key="overall/solving_rate"),
        ItemFigure("{}", "solved", by="category", key="by_category/{}/solving_rate"),
        ItemFigure("{}", "solved", by="sub_category", table=SUB_CATEGORIES, key="by_sub_category/{}/solving_rate"),
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

    # ---- which tasks

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

    # ---- how a task is solved

    async def solve(self, task: Task, model: "ChatClient", steps=None) -> dict:
        row = task.row
        out = {
            "idx": task.id,
            "messages": row["messages"],
            "model_output": "",
            "rubrics": row.get("rubrics", []),
            "metadata": row.get("metadata", {}),
            "model": model.endpoint.model,
        }
        # online only: a batch's request lines (and their custom ids) stay as earlier runs wrote them
        key = group_of(self, task.row) if not model.batched and self._sends_cache_key(model.endpoint) else None
        return await answer_into(out, model, row["messages"], {"prompt_cache_key": key} if key else None)

    def _sends_cache_key(self, endpoint: "Endpoint") -> bool:
        """--prompt-cache-key: auto sends it where the field is known to be taken, OpenAI's API."""
        choice = self.options.prompt_cache_key
        return choice == "on" or (choice == "auto" and urllib.parse.urlsplit(endpoint.url).hostname == OPENAI_HOST)

    # ---- how a solution is graded

    def is_provisional(self, row: dict) -> bool:
        return row.get("judge_status") == API_ERROR or row.get("analysis_status") == API_ERROR

    def is_judged(self, row: dict) -> bool:
        if row.get("judge_status") == PARSE_ERROR and self.options.rejudge_parse_errors:
            return False
        if row.get("judge_status") == JUDGE_TRUNCATED and self.options.rejudge_truncated:
            return False
        return not self.is_provisional(row)

    def judge_prompt(self, rubrics: Any, response: str) -> str:
        if self.judge_template is JUDGE_PROMPT:
            return JUDGE_PROMPT.format(rubrics=rubrics_text(rubrics), response=response)
        return self.judge_template.replace("{rubrics}", rubrics_text(rubrics)).replace("{response}", response)

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        output = self.graded_text(row)
        if not output.strip():
            why = "empty model output: score 0 without a judge call"
            if row.get("status") == "context_length":
                why = "the prompt exceeded the model's context: score 0 without a judge call"
            elif row.get("status") == THINKING_TRUNCATED:
                why = "the token budget ran out while the model was thinking: no final answer, score 0 (no judge call)"
            return _graded(row, rationale=why, statuses=[], score=0, status=EMPTY_OUTPUT)
        assert judge is not None  # judge_uses_llm: the judge stage always passes the judge model
        rubrics = row.get("rubrics", [])
        n_rubrics = len(rubric_lines(rubrics))
        contract = Contract("clbench_judge", JUDGE_SCHEMA, lambda obj: schema_problems(obj, n_rubrics))
        asked = await ask_judge(
            judge,
            self.judge_prompt(rubrics, output),
            lambda text: parse_judge_reply(text, n_rubrics),
            self.options.parse_attempts,
            self.judge_formats,
            contract,
        )
        accounts = dict(
            judge_model=judge.endpoint.model,
            judge_usage=asked.usage or None,
            judge_latency_s=asked.latency_rounded,
            judge_attempts=asked.attempts,
            judge_format=asked.mode,
            judge_format_enforced=False if asked.enforced is False else None,
            **asked.served_fields("judge_"),
        )
        verdict = asked.value
        if verdict is not None:
            return _graded(
                row,
                rationale=verdict.rationale,
                statuses=verdict.statuses,
                score=verdict.score,
                status=OK if verdict.how == "json" else SALVAGED,
                judge_salvage=None if verdict.how == "json" else verdict.how,
                judge_notes=verdict.notes or None,
                judge_parse=parse_route(verdict.how, asked.field),
                **accounts,
            )
        why = {
            JUDGE_CONTEXT_LENGTH: "the judge prompt exceeded the judge's context: score 0",
            API_ERROR: "judge API call failed after retries: score 0 (judged again on the next run)",
            PARSE_ERROR: f"judge reply unparseable after {asked.attempts} attempts: score 0",
            JUDGE_TRUNCATED: "judge reply cut at the token limit: score 0 (--rejudge-truncated with a larger "
            "--judge-max-tokens judges it again)",
        }[asked.status]
        return _graded(
            row, rationale=why, statuses=[], score=0, status=asked.status, judge_error=asked.error, **accounts
        )

    # ---- why failed solutions failed (optional: judge.py --error-analysis)

    def needs_error_analysis(self, judge_row: dict) -> bool:
        """A real failure: the judge read the response and gave 0 (not a fallback zero)."""
        return judge_row.get("judge_status") in (OK, SALVAGED) and _normalize_score(judge_row.get("score")) == 0

    def is_analyzed(self, row: dict) -> bool:
        status = row.get("analysis_status")
        if status == PARSE_ERROR and self.options.rejudge_parse_errors:
            return False
        if status == JUDGE_TRUNCATED and self.options.rejudge_truncated:
            return False
        return status != API_ERROR

    def error_analysis_prompt(self, judge_row: dict) -> str:
        messages = judge_row.get("messages") or [
            {
                "role": "user",
                "content": "(not available: the inference rows were written with --slim; "
                "`python -m evalpipe.expand` joins the messages back)",
            }
        ]
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
        return ERROR_ANALYSIS_PROMPT.format(
            task=task,
            rubrics="\n".join(rubric_rows) or NO_RUBRICS,
            rationale=judge_row.get("grading_rationale") or "(none)",
            response=self.graded_text(judge_row),
        )

    async def analyze_error(self, judge_row: dict, judge: "ChatClient") -> dict:
        asked = await ask_judge(
            judge,
            self.error_analysis_prompt(judge_row),
            parse_error_types,
            self.options.parse_attempts,
            self.judge_formats,
            ANALYSIS_CONTRACT,
        )
        out = {"idx": row_id(judge_row), "error_types": [], "error_reason": ""}
        if asked.value is not None:
            types, reason, how = asked.value
            out.update(
                error_types=types,
                error_reason=reason,
                analysis_status=OK if how == "json" else SALVAGED,
                analysis_parse=parse_route(how, asked.field),
            )
        else:
            out.update(analysis_status=asked.status, analysis_error=asked.error)
        out.update(
            analysis_model=judge.endpoint.model,
            analysis_usage=asked.usage or None,
            analysis_latency_s=asked.latency_rounded,
            analysis_attempts=asked.attempts,
            analysis_format=asked.mode,
            **asked.served_fields("analysis_"),
        )
        if asked.enforced is False:
            out["analysis_format_enforced"] = False
        return out

    def error_analysis_metrics(
        self, tasks: Iterable[Task], judged: Mapping[Any, dict], analyses: dict[Any, dict]
    ) -> dict:
        counts = {t: 0 for t in ERROR_TYPES}
        statuses: dict[str, int] = {}
        failed = analyzed = 0
        for task in tasks:
            row = judged.get(task.id)
            if row is None or not self.needs_error_analysis(row):
                continue
            failed += 1
            analysis = analyses.get(task.id)
            status = str(analysis.get("analysis_status")) if analysis else "not_analyzed"
            statuses[status] = statuses.get(status, 0) + 1
            if analysis and status in (OK, SALVAGED):
                analyzed += 1
                for t in analysis.get("error_types", []):
                    counts[t] = counts.get(t, 0) + 1
        return {
            "denominator": "failed solutions (judged 0 by a parsed verdict) that have a parsed analysis; "
            "multi-label, so the shares may sum to more than 100%",
            "failed": failed,
            "analyzed": analyzed,
            "status": dict(sorted(statuses.items())),
            "counts": counts,
            "share": {t: (counts[t] / analyzed if analyzed else None) for t in ERROR_TYPES},
        }

    def error_analysis_tables(self, metrics: dict) -> dict[str, dict[str, float | None]]:
        analysis = metrics.get(self.error_analysis_name)
        if analysis and analysis["analyzed"]:
            return {"Error types (share of failed solutions)": dict(analysis["share"])}
        return {}

    def judge_prompts(self) -> list[str]:
        return [self.judge_template]

    def error_analysis_prompts(self) -> list[str]:
        return [ERROR_ANALYSIS_PROMPT]

    # ---- for the test server, chaos runs and contract tests

    def sample_rows(self, tasks: int) -> list[dict]:
        """The bundled sample's rows repeated, each copy a new task (`metadata.task_id` is the id)."""
        rows = []
        for i, row in enumerate(super().sample_rows(tasks)):
            rows.append({**row, "metadata": {**row.get("metadata", {}), "task_id": f"copy-{i:04d}"}})
        return rows

    def example_reply(self, prompt: str, seed: int) -> str:
        """A verdict for our judge prompt (score from the seed), error types for the analysis prompt."""
        if "Response to grade:" in prompt and "Rubrics:" in prompt:
            listed = prompt.split("Rubrics:", 1)[1].split("Response to grade:", 1)[0]
            n, score = len(re.findall(r"^\d+\. ", listed, re.M)), seed % 2
            return json.dumps(
                {
                    "Grading Rationale": f"r{seed}",
                    "List of Requirement Satisfaction Status": ["yes" if score else "no"] * n,
                    "Overall Score": score,
                }
            )
        if '"Error Types"' in prompt:
            return json.dumps({"Error Types": [ERROR_TYPES[seed % len(ERROR_TYPES)]], "Reason": f"r{seed}"})
        return f"answer {seed}"

    # ---- which metrics a run has

    def details(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> dict:
        overall = _Tally()
        by_cat: dict[str, _Tally] = {c: _Tally() for c in CATEGORIES}
        by_sub: dict[str, _Tally] = {}
        for task in tasks:
            meta = task.row.get("metadata") or {}
            row = judged.get(task.id)
            score = None if row is None else 1 if _normalize_score(row.get("score")) == 1 else 0
            for tally in (
                overall,
                by_cat.setdefault(str(meta.get("context_category", "(none)")), _Tally()),
                by_sub.setdefault(str(meta.get("sub_category", "(none)")), _Tally()),
            ):
                tally.add(score)
        return {
            "denominator": "solving_rate counts missing rows as 0 (all selected tasks); "
            "solving_rate_graded is upstream's rate over graded rows only",
            "overall": overall.as_dict(),
            "by_category": {k: v.as_dict() for k, v in by_cat.items() if v.total},
            "by_sub_category": {k: by_sub[k].as_dict() for k in sorted(by_sub)},
        }

    def item_columns(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> ItemColumns:
        """Each task an item, solved 0/1 (None: no final grade in this run), clustered by its context."""
        keys, solved, clusters, categories, subs = [], [], [], [], []
        for task in tasks:
            meta = task.row.get("metadata") or {}
            row = judged.get(task.id)
            keys.append(task.id)
            solved.append(
                None if row is None or self.is_provisional(row) else int(_normalize_score(row.get("score")) == 1)
            )
            clusters.append(meta.get("context_id"))  # None: this task is a cluster of its own
            categories.append(str(meta.get("context_category", "(none)")))
            subs.append(str(meta.get("sub_category", "(none)")))
        if all(c is None for c in clusters):  # a dataset without context ids: items are independent
            clustered = None
        else:
            clustered = [f"task:{k}" if c is None else c for c, k in zip(clusters, keys)]
        return {
            "keys": keys,
            "clusters": clustered,
            "groups": {"category": categories, "sub_category": subs},
            "columns": {"solved": solved},
        }

    def format_metrics(self, metrics: dict) -> str:
        cov = metrics["coverage"]
        lines = [
            f"CL-bench: {cov['graded']}/{cov['expected']} tasks graded, {cov['missing']} missing (counted as 0)",
            f"{'':36} {'tasks':>6} {'solved':>7} {'rate':>7} {'rate (graded)':>14}",
        ]

        def line(name: str, t: dict) -> str:
            return (
                f"{name[:36]:36} {t['total']:6d} {t['score_1']:7d} {tables.pct(t['solving_rate']):>7}"
                f" {tables.pct(t['solving_rate_graded']):>14}"
            )

        lines.append(line("Overall", metrics["overall"]))
        lines += [line(k, v) for k, v in metrics["by_category"].items()]
        lines.append("Sub-categories:")
        lines += [line("  " + k, v) for k, v in metrics["by_sub_category"].items()]
        lines.append("Judge status: " + ", ".join(f"{k} {v}" for k, v in metrics["judge_status"].items()))
        for key, title in (("judge_format", "Judge format"), ("judge_parse", "Judge parse route")):
            if metrics.get(key):
                lines.append(f"{title}: " + ", ".join(f"{k} {v}" for k, v in metrics[key].items()))
        return "\n".join(lines)


class _Tally:
    def __init__(self):
        self.total = self.score_1 = self.score_0 = self.missing = 0

    def add(self, score: int | None) -> None:
        self.total += 1
        if score is None:
            self.missing += 1
        elif score == 1:
            self.score_1 += 1
        else:
            self.score_0 += 1

    def as_dict(self) -> dict:
        """The counts and upstream's rate over graded rows (`solving_rate`, over all tasks, is a figure)."""
        graded = self.score_1 + self.score_0
        return {
            "total": self.total,
            "score_1": self.score_1,
            "score_0": self.score_0,
            "missing": self.missing,
            "solving_rate_graded": self.score_1 / graded if graded else 0.0,
        }
