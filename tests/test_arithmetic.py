"""Arithmetic, the smallest benchmark: its grader on a table of replies, its figure on a hand-counted run, and
one run through the stage scripts."""

import asyncio
import json
import re

import pytest

from evalpipe import benchmarks
from evalpipe.benchmarks.arithmetic import Arithmetic, ArithmeticOptions
from evalpipe.devtools.testserver import Reply

REPLIES = [
    # reply, target, score by whole reply, score by last number
    ("42", "42", 1, 1),
    (" 42\n", "42", 1, 1),
    ("-7", "-7", 1, 1),
    ("The answer is 42", "42", 0, 1),
    ("42 or 43", "42", 0, 0),
    ("", "42", 0, 0),
    ("4 2", "42", 0, 0),
]


@pytest.mark.parametrize("reply, target, whole, last", REPLIES)
def test_grading_by_exact_match_and_by_the_last_number(reply, target, whole, last):
    row = {"idx": "t", "model_output": reply, "target": target}
    graded = asyncio.run(Arithmetic().grade(row, None))
    assert graded["score"] == whole
    assert graded["judge_status"] == ("ok" if reply.strip() else "empty_output")
    assert asyncio.run(Arithmetic(ArithmeticOptions(last_number=True)).grade(row, None))["score"] == last


def solver(request):
    """Right on even left operands, one off otherwise: a known share of the sample solved."""
    a, op, b = re.search(r"What is (-?\d+) ([-+*]) (-?\d+)\?", request.last_content).groups()
    value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    return Reply(content=str(value if int(a) % 2 == 0 else value + 1))


@pytest.mark.e2e
def test_the_bundled_sample_through_the_stages(stage, server, tmp_path):
    bench = benchmarks.get("arithmetic")
    tasks = bench.load(bench.default_data)
    assert len(tasks) == 24 and len({t.id for t in tasks}) == 24
    expected = sum(int(t.row["question"].split()[2]) % 2 == 0 for t in tasks[:12])
    server.handler = solver
    common = ["--bench", "arithmetic", "--outputs-dir", tmp_path, "--model", "m"]
    stage("infer", *common, "--max-samples", 12, check=0)
    stage("judge", *common, check=0)
    stage("score", *common, check=0)
    metrics = json.loads((tmp_path / "arithmetic" / "m" / "run-1" / "score.json").read_text())
    assert 0 < expected < 12
    assert metrics["score"] == expected / 12 and metrics["coverage"]["graded"] == 12
