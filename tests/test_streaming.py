"""Stages that stream their files: score joins judge rows to the dataset in whatever order they were written,
judge reads the latest row of an id that has several, each as when the whole file was held by id."""

import asyncio
import os
import random
import subprocess
import sys

import orjson
import pytest

from evalpipe.benchmarks.coin_flip import CoinFlip
from evalpipe.results import items
from evalpipe.stages import score

from .conftest import ROOT, read_jsonl, score_missing_one, write_jsonl

N = 3000


def judge_row(bench, task, output: str, tokens: int) -> dict:
    row = {"idx": task.id, "model_output": output, "target": task.row["target"]}
    row["usage"] = {"prompt_tokens": tokens, "completion_tokens": 1}
    return asyncio.run(bench.grade(row, None))


# score as it runs over large files, on small ones: the dataset, three parts of the judge file and the items
# file each in a forked process
FORKED = "import sys, score; from evalpipe import task_cache; from evalpipe.stages import joined, score as s; "
FORKED += "s.FORK_ABOVE_TASKS = 0; joined.FORK_ABOVE_BYTES = 0; joined.JUDGE_PARTS = 3; "
# chunks and lookup windows small beside the file: rows come before and after the window about them
FORKED += "task_cache.CHUNK = 50; joined._WINDOW = 8; sys.exit(score.run_stage('score', s.main))"
# the same where there is no fork (Windows): every part is read in this process, as it is needed
NO_FORK = "import os; del os.fork; " + FORKED
HOW = {"in one process": None, "forked": FORKED, "parts, no fork": NO_FORK}


@pytest.mark.parametrize("how", list(HOW))
@pytest.mark.parametrize("order", ["dataset", "a little out of order", "one far behind", "reversed"])
def test_score_joins_judge_rows_in_any_order_with_repeats_extras_and_gaps(tmp_path, order, how):
    src = (ROOT / "data" / "coin_flip" / "test.jsonl").read_text().splitlines(keepends=True)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(src[i % len(src)] for i in range(N)))
    bench = CoinFlip()
    tasks = bench.load(data)
    rng = random.Random(order)
    rows = [judge_row(bench, t, rng.choice(["ANSWER: YES", "ANSWER: NO", "?"]), i) for i, t in enumerate(tasks)]
    del rows[7]  # a task without a row
    if order == "reversed":
        rows.reverse()
    elif order == "one far behind":
        rows.append(rows.pop(20))
    elif order != "dataset":
        for start in range(0, len(rows), 64):
            block = rows[start : start + 64]
            rng.shuffle(block)
            rows[start : start + 64] = block
    # a row of no selected task makes the table of ids; without one, the row far behind is found among the tasks
    # passed over
    extra = order != "one far behind"
    if extra:
        rows.insert(100, {"idx": "not-in-the-dataset", "prediction": "YES", "usage": {"prompt_tokens": 5}})
    for again in (1, 11):  # judged again: the last row counts (reversed, task 1's comes when it is next in order)
        rows.append(judge_row(bench, tasks[again], "ANSWER: YES", 10**6 + again))
    write_jsonl(tmp_path / "judge.jsonl", rows)

    got = score_missing_one(tmp_path, data, {"PYTHONPATH": str(ROOT)}, ["-c", HOW[how]] if HOW[how] else None)

    latest = {row["idx"]: row for row in rows}  # held whole, by id
    expected = score.summarize(bench, tasks, latest)
    for key in ("f1", "accuracy", "confusion", "unparsed", "coverage", "judge_status"):
        assert got[key] == expected[key], key
    assert got["coverage"]["missing_ids"] == [tasks[7].id] and got["coverage"]["extra_rows_ignored"] == extra
    selected = {t.id for t in tasks}
    tokens = sum(row["usage"]["prompt_tokens"] for key, row in latest.items() if key in selected)
    assert got["cost"]["stages"]["infer"]["calls"] == N - 1
    assert got["cost"]["stages"]["infer"]["tokens"]["prompt_tokens"] == tokens
    columns = bench.item_columns(tasks, latest)
    expected = {"format": items.FORMAT, "benchmark": bench.name, "cluster": bench.item_cluster, **columns}
    assert (tmp_path / "items.json").read_bytes() == orjson.dumps(expected)  # written a column at a time


def test_judge_grades_the_latest_row_of_a_repeated_id_in_first_seen_order(tmp_path):
    answers = [
        {"idx": "a", "model_output": "ANSWER: YES", "target": "YES"},
        {"idx": "b", "model_output": "ANSWER: NO", "target": "YES"},
        {"idx": "c", "model_output": "ANSWER: NO", "target": "NO"},
        {"idx": "b", "model_output": "ANSWER: YES", "target": "YES"},  # b answered again
    ]
    write_jsonl(tmp_path / "infer.jsonl", answers)
    command = [sys.executable, str(ROOT / "judge.py"), "--bench", "coin_flip", "--input", "infer.jsonl"]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "3 rows to cover, 0 already done, 3 to do" in first.stderr
    graded = read_jsonl(tmp_path / "judge.jsonl")
    assert [(r["idx"], r["prediction"]) for r in graded] == [("a", "YES"), ("b", "YES"), ("c", "NO")]
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0 and "3 already done, 0 to do" in again.stderr
    assert orjson.loads((tmp_path / "judge.jsonl").read_bytes().splitlines()[1]) == graded[1]


def test_a_bad_judge_line_read_by_a_later_part_is_named_by_its_line_in_the_file(tmp_path):
    bench = CoinFlip()
    data = ROOT / "data" / "coin_flip" / "test.jsonl"
    tasks = bench.load(data)
    rows = [judge_row(bench, t, "ANSWER: YES", 1) for t in tasks] * 4
    lines = [orjson.dumps(row) + b"\n" for row in rows]
    bad = len(lines) * 5 // 6  # in the third of three parts
    lines[bad] = b'{"idx": "x", "prediction": \n'
    (tmp_path / "judge.jsonl").write_bytes(b"".join(lines))
    command = [sys.executable, "-c", FORKED, "--bench", "coin_flip", "--input", "judge.jsonl"]
    done = subprocess.run(
        [*command, "--data", str(data)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2, done.stderr
    assert f"judge.jsonl:{bad + 1}: invalid JSON" in done.stderr
    assert not (tmp_path / "score.json").exists() and not (tmp_path / "items.json").exists()
