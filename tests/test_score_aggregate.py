"""score and aggregate on real files: denominators, coverage, mean ± std by hand."""

import json
import math

import pytest

from .conftest import SAMPLE, judged_rows, write_jsonl

pytestmark = pytest.mark.e2e

CATS = [
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
]


def test_missing_rows_count_as_zero_and_the_graded_rate_is_beside_it(stage, tmp_path):
    # 8 of 12 tasks graded, 5 solved; a stale duplicate row for task 0 is overridden by its last row
    rows = judged_rows([0, 1, 1, 1, 0, 1, 0, 1])
    write_jsonl(tmp_path / "judge.jsonl", [{**rows[0], "score": 1}] + rows)
    proc = stage("score", "--input", "judge.jsonl", "--data", SAMPLE)
    assert proc.returncode == 3 and "4 selected tasks have no judge row" in proc.stderr
    score = json.loads((tmp_path / "score.json").read_text())
    assert score["overall"] == {
        "total": 12,
        "score_1": 5,
        "score_0": 3,
        "missing": 4,
        "solving_rate": 5 / 12,
        "solving_rate_graded": 5 / 8,
    }
    assert score["coverage"]["missing"] == 4 and score["coverage"]["graded"] == 8
    # the sample interleaves the categories (DKR, RSA, PTE, EDS, DKR, ...): DKR [0, 0, missing],
    # RSA [1, 1, missing], PTE [1, 0, missing], EDS [1, 1, missing]
    assert score["by_category"][CATS[0]]["score_1"] == 0
    assert score["by_category"][CATS[2]] == {
        "total": 3,
        "score_1": 1,
        "score_0": 1,
        "missing": 1,
        "solving_rate": 1 / 3,
        "solving_rate_graded": 1 / 2,
    }
    assert score["by_category"][CATS[3]]["solving_rate"] == 2 / 3
    assert sum(v["total"] for v in score["by_sub_category"].values()) == 12
    assert "rate (graded)" in proc.stdout and "41.7" in proc.stdout


def test_max_samples_limits_the_expected_set(stage, tmp_path):
    write_jsonl(tmp_path / "judge.jsonl", judged_rows([1, 0, 1]))
    proc = stage("score", "--input", "judge.jsonl", "--data", SAMPLE, "--max-samples", "3", check=0)
    assert json.loads((tmp_path / "score.json").read_text())["overall"]["solving_rate"] == 2 / 3
    assert proc.returncode == 0


def write_run(root, model, run, overall, cats):
    d = root / "clbench" / model / f"run-{run}"
    d.mkdir(parents=True)
    metrics = {
        "overall": {"solving_rate": overall},
        "by_category": {c: {"solving_rate": r} for c, r in zip(CATS, cats)},
        "coverage": {"expected": 10, "missing": 0},
    }
    (d / "score.json").write_text(json.dumps(metrics))


def test_aggregate_mean_and_both_stds(stage, tmp_path):
    root = tmp_path / "outputs"
    for run, overall in enumerate([0.50, 0.60, 0.70], 1):
        write_run(root, "model-a", run, overall, [overall, 0.2, 0.3, 0.4])
    for run, overall in enumerate([0.80, 0.80], 1):
        write_run(root, "model-b", run, overall, [0.9, 0.9, 0.7, 0.7])
    proc = stage("aggregate", "--outputs-dir", root)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((root / "clbench" / "aggregate.json").read_text())
    a = next(m for m in summary["models"] if m["model"] == "model-a")
    overall = a["figures"]["Overall"]
    assert math.isclose(overall["mean"], 0.6)
    assert math.isclose(overall["std_sample"], 0.1)  # sqrt((0.01 + 0 + 0.01) / 2)
    assert math.isclose(overall["std_population"], math.sqrt(0.02 / 3))
    assert math.isclose(overall["stderr"], 0.1 / math.sqrt(3))
    assert [m["model"] for m in summary["models"]] == ["model-b", "model-a"]  # best overall first
    md = (root / "clbench" / "aggregate.md").read_text()
    assert "| model-a | 3 | 60.0 ± 10.0 | 60.0 ± 10.0 | 20.0 ± 0.0 |" in md
    assert "mean ± sample std (ddof 1) over runs" in md
    csv_lines = (root / "clbench" / "aggregate.csv").read_text().splitlines()
    assert csv_lines[0].startswith("model,runs,Overall mean %,Overall std % (sample)")
    stage("aggregate", "--outputs-dir", root, "--std", "population", check=0)
    assert f"60.0 ± {100 * math.sqrt(0.02 / 3):.1f}" in (root / "clbench" / "aggregate.md").read_text()


def test_aggregate_warns_about_missing_runs(stage, tmp_path):
    root = tmp_path / "outputs"
    write_run(root, "m", 1, 0.5, [0.5] * 4)
    proc = stage("aggregate", "--outputs-dir", root, "--runs", "3")
    assert proc.returncode == 3 and "no score.json for run(s) [2, 3]" in proc.stderr
    assert stage("aggregate", "--outputs-dir", tmp_path / "empty").returncode == 2
