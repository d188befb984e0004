"""CoinFlip answer parsing, reply shape by reply shape, as SPEC §2 states EvalScope 1.14.1's rule.

Each row: a reply, the verdict of `evalscope` (the default) and of `strict`, and which rule decides.
The evalscope column is written from the SPEC's rules, not from our code:
  1. the last marker `ANSWER\\s*:\\s*\\**\\s*` (any case) and the rest of its line, stripped of
     whitespace, then of `*` at both ends, then of whitespace; no marker: the whole reply;
  2. exactly `yes`/`no` in lower case (one optional `.`/`!`) is a verdict; otherwise exactly one of
     the whole words Yes/YES and No/NO decides; both or neither: unparsed (None).
strict: the text after the last case-sensitive `ANSWER:` to the end of its line, stripped, must be
YES or NO in any case.
"""

import json

import pytest

from evalpipe.benchmarks.coin_flip import CoinFlip, CoinFlipOptions, evalscope_extract, parse_answer
from evalpipe.devtools.testserver import Reply

from .conftest import ROOT, read_jsonl

# reply, evalscope, strict, what decides (evalscope)
# same shape row after row on purpose: a table of cases, one reply a line, is what SPEC §2's rules are checked by
TABLE = [
    ("Reasoning...\nANSWER: YES", "YES", "YES", "marker, exact capital word"),
    ("ANSWER: NO", "NO", "NO", "marker, exact capital word"),
    ("ANSWER: yes", "YES", "YES", "lower-case exact verdict"),
    ("ANSWER: no.", "NO", None, "lower-case exact verdict with a period"),
    ("ANSWER: yes!", "YES", None, "lower-case exact verdict with !"),
    ("ANSWER: yes..", None, None, "two periods: not exact, and lower-case words never count"),
    ("ANSWER: Yes", "YES", "YES", "whole word Yes"),
    ("ANSWER: No.", "NO", None, "whole word No"),
    ("answer: YES", "YES", None, "marker in any case"),
    ("Answer: no", "NO", None, "marker in any case, lower-case exact"),
    ("answer : yes", "YES", None, "spaces before the colon"),
    ("**ANSWER: YES**", "YES", None, "bold around the line is stripped"),
    ("**ANSWER:** NO", "NO", None, "bold after the colon belongs to the marker"),
    ("ANSWER: **yes**", "YES", None, "bold around a lower-case exact verdict"),
    ("ANSWER: **NO**.", "NO", None, "a period after the bold keeps the stars; the word still counts"),
    ("ANSWER:\nNO", "NO", "NO", "the marker's whitespace runs onto the next line"),
    ("ANSWER: NO\nwait, let me recount\nANSWER: YES", "YES", "YES", "the last marker wins"),
    ("ANSWER: YES ANSWER: NO", "NO", None, "two markers on one line: the last"),
    ("ANSWER: No\nANSWER:", None, None, "the last marker has nothing after it"),
    ("ANSWER: YES\nActually no.", "YES", "YES", "only the marker's line is read"),
    ("Answer: YES\n\nExplanation: No coin was flipped twice.", "YES", None, "only the marker's line is read"),
    ("ANSWER: YES, the coin is still heads up", "YES", None, "extra words after a capital verdict"),
    ("ANSWER: NO, it is not heads up", "NO", None, "`not` is not `No`"),
    ("ANSWER: YES (no flip changed it)", "YES", None, "lower-case `no` inside a sentence never counts"),
    ("ANSWER: YES or NO", None, None, "both words: unparsed"),
    ("ANSWER: Yes. No, wait.", None, None, "both words: unparsed"),
    ("ANSWER: MAYBE", None, None, "neither word"),
    ("ANSWER: The coin is still heads up.", None, None, "neither word"),
    ("ANSWER: [YES]", "YES", None, "brackets are not word characters"),
    ("ANSWER: `NO`", "NO", None, "backticks are not word characters"),
    ("ANSWER: _YES_", None, None, "underscores are word characters: no whole word"),
    ("ANSWER: nO", None, "NO", "mixed case is neither exact nor a whole word (strict upper-cases)"),
    ("ANSWER: yEs", None, "YES", "mixed case is neither exact nor a whole word (strict upper-cases)"),
    ("ANSWER: Not heads up", None, None, "`Not` is not `No`"),
    ("ANSWER: I know", None, None, "`know` is not `No`"),
    ("ANSWER: Yesterday", None, None, "`Yesterday` is not `Yes`"),
    ("ANSWERS: YES", "YES", None, "no marker (`ANSWERS:`): the whole reply has one verdict word"),
    ("FINAL ANSWER: NO", "NO", "NO", "the marker inside a longer phrase"),
    ("ANSWER: YES\r\n", "YES", "YES", "a CRLF line end is whitespace"),
    ("ANSWER:", None, None, "an empty marker line"),
    ("The coin is heads up, so the answer is Yes.", "YES", None, "no marker: the whole reply, one word"),
    ("No. The coin was flipped once.", "NO", None, "no marker: the whole reply, one word"),
    ("yes", "YES", None, "no marker: the whole reply is a lower-case exact verdict"),
    ("  no!  ", "NO", None, "no marker: whitespace around a lower-case exact verdict"),
    ("The coin is not heads up, so no.", None, None, "no marker: lower-case prose never counts"),
    ("YES. Let me double-check: No flips changed it.", None, None, "no marker: both words"),
    ("", None, None, "an empty reply"),
]


def test_the_table_is_large_and_varied():
    assert len(TABLE) >= 30 and len({reply for reply, *_ in TABLE}) == len(TABLE)
    assert {e for _, e, _, _ in TABLE} == {"YES", "NO", None}
    assert sum(e != s for _, e, s, _ in TABLE) >= 20  # the two rules really differ


@pytest.mark.parametrize("reply, evalscope, strict, why", TABLE, ids=[w for *_, w in TABLE])
def test_verdict_per_rule(reply, evalscope, strict, why):
    assert parse_answer(reply) == evalscope  # the default
    assert parse_answer(reply, "evalscope") == evalscope
    assert parse_answer(reply, "lenient") == evalscope  # an alias
    assert parse_answer(reply, "strict") == strict


@pytest.mark.parametrize(
    "reply, extracted",
    [
        ("x\nANSWER: **YES** \nmore", "YES"),
        ("ANSWER: ** no **", "no"),
        ("ANSWER: **NO**.", "NO**."),
        ("no marker here", "no marker here"),
        ("answer:\n\n  Yes, heads", "Yes, heads"),
    ],
)
def test_extraction_step(reply, extracted):
    assert evalscope_extract(reply) == extracted


@pytest.mark.parametrize("mode", ["evalscope", "strict"])
def test_grade_uses_the_same_verdict_for_the_row_and_the_matrix(mode):
    bench = CoinFlip(CoinFlipOptions(parse=mode))
    column = 1 if mode == "evalscope" else 2
    for reply, *verdicts, _ in TABLE:
        for gold in ("YES", "NO"):
            row = _grade(bench, {"idx": "t", "model_output": reply, "target": gold})
            expected = verdicts[column - 1]
            assert row["prediction"] == expected and row["parse_mode"] == mode
            assert row["score"] == int(expected == gold) and row["judge_status"] == ("ok" if expected else "unparsed")


def _grade(bench, row):
    import asyncio

    return asyncio.run(bench.grade(row, None))


# ---- end to end: a server that answers in every shape of the table, through infer, judge and score


@pytest.mark.e2e
def test_pipeline_verdicts_per_reply_match_the_table(server, stage, tmp_path):
    questions = [r["question"] for r in read_jsonl(ROOT / "data" / "coin_flip" / "test.jsonl")[: len(TABLE)]]
    replies = {q: reply for q, (reply, *_) in zip(questions, TABLE)}
    server.handler = lambda request: Reply(content=next(r for q, r in replies.items() if q in request.last_content))
    n = str(len(TABLE))
    stage("infer", "--bench", "coin_flip", "--model", "m", "--output", "infer.jsonl", "--max-samples", n, check=0)
    stage("judge", "--bench", "coin_flip", "--input", "infer.jsonl", check=0)
    stage("score", "--bench", "coin_flip", "--input", "judge.jsonl", check=0)
    judged = {row["model_output"]: row for row in read_jsonl(tmp_path / "judge.jsonl")}
    assert len(judged) == len(TABLE)
    for reply, evalscope, _, why in TABLE:
        assert judged[reply]["prediction"] == evalscope, why
        assert judged[reply]["parse_mode"] == "evalscope"
    score = json.loads((tmp_path / "score.json").read_text())
    assert score["unparsed"] == sum(e is None for _, e, _, _ in TABLE)
    assert all(r.body["temperature"] == 0 for r in server.chat_requests())
