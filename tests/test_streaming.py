"""Stages that stream their files: score joins judge rows to the dataset in whatever order they were written,
judge reads the latest row of an id that has several, each as when the whole file was held by id."""

import asyncio
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


@pytest.mark.parametrize("order", ["dataset", "a little out of order", "one far behind", "reversed"])
def test_score_joins_judge_rows_in_any_order_with_repeats_extras_and_gaps(tmp_path, order):
    src = (ROOT / "data" / "coin_flip" / "test.jsonl").read_text().splitlines(keepends=True)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(src[i % len(src)] for i in range(N)))
    bench = CoinFlip()
    tasks = list(bench.load(data))
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
    # a row of no selected task, tasks judged again, both or neither: the calls counted are those of the rows kept
    extra = order in ("a little out of order", "reversed")
    if extra:
        rows.insert(100, {"idx": "not-in-the-dataset", "prediction": "YES", "usage": {"prompt_tokens": 5}})
    if order in ("a little out of order", "one far behind"):
        for again in (1, 11):  # judged again: the last row counts
            rows.append(judge_row(bench, tasks[again], "ANSWER: YES", 10**6 + again))
    write_jsonl(tmp_path / "judge.jsonl", rows)

    got = score_missing_one(tmp_path, data)

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
    expected = {"format": items.FORMAT, "benchmark": bench.name, "cluster": bench.prefix_group, **columns}
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


def test_a_bad_judge_line_is_named_by_its_line_in_the_file(tmp_path):
    bench = CoinFlip()
    data = ROOT / "data" / "coin_flip" / "test.jsonl"
    tasks = list(bench.load(data))
    rows = [judge_row(bench, t, "ANSWER: YES", 1) for t in tasks] * 4
    lines = [orjson.dumps(row) + b"\n" for row in rows]
    bad = len(lines) * 5 // 6  # in a later chunk of the file
    lines[bad] = b'{"idx": "x", "prediction": \n'
    (tmp_path / "judge.jsonl").write_bytes(b"".join(lines))
    command = [sys.executable, str(ROOT / "score.py"), "--bench", "coin_flip", "--input", "judge.jsonl"]
    done = subprocess.run([*command, "--data", str(data)], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert f"judge.jsonl:{bad + 1}: invalid JSON" in done.stderr
    assert not (tmp_path / "score.json").exists() and not (tmp_path / "items.json").exists()
