"""CoinFlip (as in EvalScope's `coin_flip`): track a coin through flips, answer YES or NO. EvalScope's prompts, its
answer rule (`parse_answer`, no judge model) and `temperature: 0`; F1 is the headline (docs/benchmarks.md#coinflip)."""

import json
import random
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache
from itertools import count
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from ..results import tables
from ..results.figures import headline
from ..results.items import ItemColumns, ItemFigure
from ..store import jsonl
from ..store.paths import PROJECT
from .base import Benchmark, Task, flag, one_call
from .grading import exact_match

if TYPE_CHECKING:  # the openai SDK is imported only by stages that call an API
    from ..client.llm import ChatClient

ZERO_SHOT = (
    "\nSolve the following coin flip problem step by step. The last line of your response should be of the form "
    '"ANSWER: [ANSWER]" (without quotes) where [ANSWER] is the answer to the problem.\n\n{question}\n\n'
    'Remember to put your answer on its own line at the end in the form "ANSWER: [ANSWER]" (without quotes) '
    "where [ANSWER] is the answer YES or NO to the problem.\n\nReasoning:\n"
)
FEW_SHOT_HEADER = "Here are some examples of how to solve similar problems:"
DATA_DIR = PROJECT / "data" / "coin_flip"

_STRICT = re.compile(r"ANSWER:\s*(.*)")
# EvalScope 1.14.1 (SPEC §2): the answer marker alone (case-insensitive, bold allowed after the colon),
# then the verdict words: an exact lower-case reply, else exactly one kind of whole capitalised word.
_MARKER = re.compile(r"ANSWER\s*:\s*\**\s*", re.IGNORECASE)
_EXACT = re.compile(r"(yes|no)[.!]?")
_YES_WORD = re.compile(r"\b(?:Yes|YES)\b")
_NO_WORD = re.compile(r"\b(?:No|NO)\b")
_PERSON = re.compile(r" ([^ .]+) (flips|does not flip) the coin\.")


def worked_example(question: str, answer: str) -> str:
    """A demo that tracks the coin through every person and ends with the ANSWER line."""
    steps, heads = ["The coin starts heads up."], True
    for name, action in _PERSON.findall(question):
        if action == "flips":
            heads = not heads
            steps.append(f"{name} flips the coin, so it is now {'heads' if heads else 'tails'} up.")
        else:
            steps.append(f"{name} does not flip the coin, so it stays {'heads' if heads else 'tails'} up.")
    verdict = "YES" if heads else "NO"
    if verdict != answer:
        raise ValueError(f"demo answer {answer} disagrees with the flips in {question!r}")
    steps.append(f"The coin ends {'heads' if heads else 'tails'} up, so it is {'' if heads else 'not '}still heads up.")
    return f"{question}\n\nReasoning:\n{' '.join(steps)}\nANSWER: {verdict}"


def parse_answer(text: str, mode: str = "evalscope") -> str | None:
    """YES, NO, or None when unparsed, by the --parse rule of `mode` (docs/benchmarks.md#coinflip)."""
    if mode == "strict":
        found = _STRICT.findall(text or "")
        verdict = found[-1].strip().upper() if found else None
        return verdict if verdict in ("YES", "NO") else None
    answer = evalscope_extract(text or "")
    exact = _EXACT.fullmatch(answer.strip())
    if exact:
        return exact.group(1).upper()
    has_yes, has_no = _YES_WORD.search(answer) is not None, _NO_WORD.search(answer) is not None
    return None if has_yes == has_no else "YES" if has_yes else "NO"


def evalscope_extract(text: str) -> str:
    """The answer as EvalScope 1.14.1 extracts it (step 1 of the rule in docs/benchmarks.md#coinflip)."""
    markers = list(_MARKER.finditer(text))
    if not markers:
        return text
    line = text[markers[-1].end() :].split("\n", 1)[0]
    return line.strip().strip("*").strip()


_GOLD = {"yes": "YES", "no": "NO", "YES": "YES", "NO": "NO", "Yes": "YES", "No": "NO"}  # the usual spellings
_QUESTION, _ANSWER = itemgetter("question"), itemgetter("answer")
# an item's values: TP, predicted YES, parsed gold YES (TP + FN), correct, parsed, and F1's numerator and denominator
_COLUMNS = ("tp", "yes", "positive", "correct", "parsed", "f1_num", "f1_den")
_UNGRADED = (None,) * len(_COLUMNS)


def _checked_gold(row: Any, path: Path, line: int) -> str:
    """A row's gold answer (a bool, or yes/no in any case and spacing), else a BadInput saying what the row lacks."""
    if not isinstance(row, dict):
        raise BadInput("expected an object with 'question' and 'answer'", path, line)
    question, answer = row.get("question"), row.get("answer")
    gold = _GOLD.get(answer.strip().upper()) if isinstance(answer, str) else None
    if isinstance(answer, bool):
        gold = "YES" if answer else "NO"
    if gold is None or type(question) is not str or not question:
        if not isinstance(question, str) or not question.strip():
            raise BadInput("no 'question' string", path, line)
        raise BadInput(f"'answer' must be yes or no, got {answer!r}", path, line)
    return gold


def load_rows(path: Path) -> list:
    """The rows of a JSON array / {"rows": [...]} file, or of a Parquet file (JSONL is read a chunk at a time)."""
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise BadInput(
                "reading Parquet needs pyarrow (pip install pyarrow), or export the split to JSONL", path
            ) from None
        return pq.read_table(path).to_pylist()
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read as JSON: {exc}", path) from None
    if isinstance(data, dict):
        data = data.get("rows") or data.get("data") or []
        data = [r.get("row", r) for r in data]  # the datasets-server shape {"rows": [{"row": {...}}]}
    if not isinstance(data, list):
        raise BadInput("expected a JSON array of rows", path)
    return data


@cache  # a handful of outcomes: a million tasks share their tuples
def _item_values(gold: str | None, pred: str | None) -> tuple[int, ...]:
    gold_yes = gold == "YES"
    tp, yes, positive = int(pred == "YES" and gold_yes), int(pred == "YES"), int(pred is not None and gold_yes)
    return tp, yes, positive, int(pred is not None and pred == gold), int(pred is not None), 2 * tp, yes + positive


def _f1(metrics: dict) -> float:
    precision, recall = metrics["precision"], metrics["recall"]
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def answered_share(metrics: dict) -> float | None:
    """Parsed answers / selected tasks (None when a score.json does not tell)."""
    confusion, expected = metrics.get("confusion"), metrics.get("coverage", {}).get("expected")
    return sum(confusion.values()) / expected if confusion and expected else None


@dataclass(frozen=True)
class CoinFlipOptions:
    fewshot: int = flag(0, "number of worked demos in the prompt (default 0)")
    fewshot_seed: int = flag(42, "seed that picks the demos (default 42)")
    fewshot_data: Path = flag(
        DATA_DIR / "validation.jsonl", "split the demos come from (default data/coin_flip/validation.jsonl)"
    )
    parse: str = flag(
        "evalscope",
        "answer parsing: evalscope (default: EvalScope 1.14.1's rule exactly), strict (a case-sensitive "
        "ANSWER: line that is exactly YES or NO, for format-following studies), or lenient (the same as evalscope)",
        stage="judge",
        choices=("evalscope", "strict", "lenient"),  # lenient: an alias of evalscope, kept for old command lines
    )


class CoinFlip(Benchmark):
    name = "coin_flip"
    default_data = DATA_DIR / "test.jsonl"
    Options = CoinFlipOptions
    score_fields = ("prediction", "target")
    aggregate_note = (
        "F1 (positive class YES, over parsed answers) is the headline; accuracy and YES ratio are over all "
        "selected tasks, with unparsed and missing answers counted as wrong. Answered is the share of selected tasks "
        "with a parsed YES or NO."
    )
    # what EvalScope sends for coin_flip; infer uses it unless --temperature is given (docs/upstream.md)
    generation_defaults = {"temperature": 0.0}
    options: CoinFlipOptions

    def __init__(self, options: CoinFlipOptions | None = None):
        super().__init__(options)
        if self.options.parse == "lenient":  # one name per rule: rows and fingerprints say evalscope
            self.options = replace(self.options, parse="evalscope")
        self.demos = ""
        fewshot, data = self.options.fewshot, self.options.fewshot_data
        if fewshot:
            pool = list(self.load(data))
            if fewshot > len(pool):
                raise BadInput(f"--fewshot {fewshot} is more than the {len(pool)} rows", data)
            picked = random.Random(self.options.fewshot_seed).sample(pool, fewshot)
            self.demos = "\n\n".join(worked_example(t.row["question"], t.row["target"]) for t in picked)

    def load(self, path: Path) -> Iterator[Task]:
        """The tasks, a chunk of consecutive lines at a time (a JSON array or Parquet file is one chunk)."""
        if path.suffix.lower() in (".json", ".parquet"):
            chunks = iter([(1, load_rows(path))])
        else:
            chunks = jsonl.iter_row_chunks(path)
        position = 0
        for first, rows in chunks:
            try:
                questions, golds = list(map(_QUESTION, rows)), list(map(_GOLD.get, map(_ANSWER, rows)))
                valid = None not in golds and set(map(type, questions)) == {str} and "" not in questions
            except (KeyError, TypeError):  # a row that is no object or lacks a key, or an answer that is a list
                valid = False
            if not valid:  # answers in other spellings, or a row to reject
                golds = [_checked_gold(row, path, line) for line, row in enumerate(rows, first)]
                questions = [row["question"] for row in rows]
            # position + content: stable under --max-samples, and a different file cannot match old rows
            crcs = map(zlib.crc32, map(str.encode, questions))
            ids = map("%05d-%08x".__mod__, zip(count(position), crcs))
            rows = [{"question": question, "target": gold} for question, gold in zip(questions, golds)]
            yield from map(Task, ids, rows, count(first))
            position += len(rows)
        if not position:
            raise BadInput("no rows in the file", path)

    def prompts(self) -> dict[str, list[str]]:
        return {"infer": [self.prompt("{question}")]}

    def prompt(self, question: str) -> str:
        zero_shot = ZERO_SHOT.format(question=question)
        return f"{FEW_SHOT_HEADER}\n\n{self.demos}\n\n{zero_shot}" if self.demos else zero_shot

    async def solve(self, task: Task, model: "ChatClient", steps=None) -> dict:
        metadata = {"fewshot": self.options.fewshot}
        return await one_call(task, model, self.prompt(task.row["question"]), task.row["target"], metadata)

    def is_judged(self, row: dict) -> bool:
        return row.get("parse_mode") == self.options.parse  # another parse mode: grade again (it is free)

    async def grade(self, row: dict, judge: "ChatClient | None") -> dict:
        prediction = parse_answer(self.graded_text(row), self.options.parse)
        return exact_match({**row, "prediction": prediction}, prediction) | {"parse_mode": self.options.parse}

    figures = (
        # 2·TP / (2·TP + FP + FN); the run's value is 2PR / (P + R), as score.json has always had it (to the last digit)
        ItemFigure("F1", "f1_num", "f1_den", proportion=False, key="f1", run=_f1),
        ItemFigure("Answered", "parsed", run=answered_share),  # not in score.json: from the confusion
        ItemFigure("Accuracy", "correct", key="accuracy"),
        ItemFigure("Precision", "tp", "yes", key="precision"),
        ItemFigure("Recall", "tp", "positive", key="recall"),
        ItemFigure("YES ratio", "yes", key="yes_ratio"),
    )

    def details(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> dict:
        # the selected tasks' rows (their gold answer is the dataset's), by prediction and gold: YES or not
        seen = Counter((row.get("prediction"), row.get("target") == "YES") for row in judged.values())
        confusion = {"tp": seen["YES", True], "fp": seen["YES", False], "fn": seen["NO", True], "tn": seen["NO", False]}
        return {
            "denominator": "accuracy and yes_ratio over all selected tasks (unparsed and missing count as wrong); "
            "precision, recall and F1 over parsed predictions, positive class YES",
            "confusion": confusion,
            "unparsed": seen[None, True] + seen[None, False],
        }

    def flagged(self, runs: list[dict]) -> str:
        shares = [s for s in map(answered_share, runs) if s is not None]
        if shares and sum(shares) / len(shares) < 0.5:
            return (
                "† Most answers unparsed (Answered below 50% on average over runs): F1 covers only the parsed "
                "answers, so it can be high while the model mostly fails to answer; read it with Answered and Accuracy."
            )
        return ""

    def format_metrics(self, metrics: dict) -> str:
        cov, c = metrics["coverage"], metrics["confusion"]
        lines = [
            f"CoinFlip: {cov['graded']}/{cov['expected']} tasks graded, {cov['missing']} missing, "
            f"{metrics['unparsed']} unparsed (both count as wrong)"
        ]
        lines += [f"  {name:10} {tables.pct(value):>6}" for name, value in headline(self.figures, metrics).items()]
        if self.flagged([metrics]):
            lines.append("  most answers unparsed: F1 covers only the parsed ones")
        lines.append(f"  confusion (positive YES): TP {c['tp']}  FP {c['fp']}  FN {c['fn']}  TN {c['tn']}")
        return "\n".join(lines)

    def item_columns(self, tasks: Iterable[Task], judged: Mapping[Any, dict]) -> ItemColumns:
        keys, values = [], []
        for task in tasks:
            row = judged.get(task.id)
            keys.append(task.id)
            values.append(_UNGRADED if row is None else _item_values(task.row.get("target"), row.get("prediction")))
        columns = dict(zip(_COLUMNS, map(list, zip(*values)))) if values else {name: [] for name in _COLUMNS}
        return {"keys": keys, "clusters": None, "groups": {}, "columns": columns}
