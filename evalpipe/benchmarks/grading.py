"""What rule-graded benchmarks share: reading a dataset into tasks, a multiple-choice prompt and the letter of
its answer, grading by exact match. docs/adding-a-benchmark.md's worked example (capitals.py) is made of them."""

import json
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import BadInput
from ..store import jsonl
from .base import Task

# simple-evals' QUERY_TEMPLATE_MULTICHOICE, for any number of choices
MULTIPLE_CHOICE = (
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'Answer: $LETTER' (without quotes) where LETTER is one of {letters}. Think step by step before "
    "answering.\n\n{question}\n\n{choices}"
)
LETTERS = "ABCDEFGHIJ"
_ANSWER_LINE = re.compile(r"(?i)answer[ \t]*:[ \t*$(]*([A-J])\b")
_BARE_LETTER = re.compile(r"\(?([A-J])[).]?")


def read_tasks(path: Path, **fields: type) -> list[Task]:
    """The tasks of a file (read_rows) whose rows hold `fields` of the given types, else a BadInput naming the line;
    a task's id is the row's `id` (seen once), else its position and a hash of its content (another file's differ)."""
    tasks: list[Task] = []
    seen: set = set()
    for line, row in read_rows(path):
        for key, kind in fields.items():
            if not isinstance(row.get(key), kind):
                raise BadInput(f"expected {key!r} to be a {kind.__name__}, got {row.get(key)!r:.60}", path, line)
        if "id" in row:
            task_id = row["id"]
            if not isinstance(task_id, str | int) or isinstance(task_id, bool) or task_id in seen:
                raise BadInput(f"'id' must be a string or number seen once, got {task_id!r}", path, line)
            seen.add(task_id)
        else:
            task_id = f"{len(tasks):05d}-{zlib.crc32(jsonl.dumps(row)):08x}"
        tasks.append(Task(id=task_id, row=row, line=line))
    if not tasks:
        raise BadInput("no tasks in the file", path)
    return tasks


def read_multiple_choice(path: Path) -> list[Task]:
    """read_tasks of rows of `question`, 2 to 10 `choices` (strings) and `answer`, the right choice's letter."""
    tasks = read_tasks(path, question=str, choices=list, answer=str)
    for task in tasks:
        choices, answer = task.row["choices"], task.row["answer"]
        if not 2 <= len(choices) <= len(LETTERS) or not all(isinstance(choice, str) for choice in choices):
            raise BadInput(f"'choices' must be 2 to {len(LETTERS)} strings, got {choices!r:.60}", path, task.line)
        if answer not in LETTERS[: len(choices)]:
            raise BadInput(f"'answer' must be one of {LETTERS[: len(choices)]}, got {answer!r:.20}", path, task.line)
    return tasks


def multiple_choice(question: str, choices: Sequence[str]) -> str:
    lettered = "\n".join(f"{letter}) {choice}" for letter, choice in zip(LETTERS, choices))
    return MULTIPLE_CHOICE.format(letters=LETTERS[: len(choices)], question=question, choices=lettered)


def choice_letter(reply: str) -> str | None:
    """The letter after a reply's last `Answer:` (any case; `**`, `$`, `(` allowed), else a one-letter reply."""
    found = _ANSWER_LINE.findall(reply)
    if found:
        return found[-1].upper()
    bare = _BARE_LETTER.fullmatch(reply.strip())
    return bare.group(1) if bare else None


def exact_match(row: dict, answer: str | None, unread: str = "unparsed") -> dict:
    """The judge row: `score` 1 if `answer` equals the row's `target`; `judge_status` `unread` if no answer was read."""
    return {
        **row,
        "score": int(bool(answer) and answer == row.get("target")),
        "judge_status": "ok" if answer else unread,
    }


def read_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(line, row) for each row of a JSONL file, or of a `.json` array of objects (the line each starts on)."""
    return _json_array(path) if path.suffix.lower() == ".json" else jsonl.iter_rows(path)


def _json_array(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read: {exc}", path) from None
    decoder, line, counted = json.JSONDecoder(), 1, 0
    at = _skip(text, 0)
    if text[at : at + 1] != "[":
        where = text.count("\n", 0, at) + 1
        raise BadInput("expected a JSON array of objects, or JSONL (one object per line)", path, where)
    at = _skip(text, at + 1)
    sep = text[at : at + 1]
    while sep != "]":
        line, counted = line + text.count("\n", counted, at), at  # from the last row's start: each newline once
        try:
            row, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise BadInput(f"invalid JSON ({exc.msg})", path, exc.lineno) from None
        if not isinstance(row, dict):
            raise BadInput(f"expected a JSON object, got {type(row).__name__}", path, line)
        yield line, row
        at = _skip(text, at)
        sep = text[at : at + 1]
        if sep not in (",", "]"):
            raise BadInput("expected ',' or ']' after a row", path, line + text.count("\n", counted, at))
        at = _skip(text, at + 1)


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at
