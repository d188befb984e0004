"""Judge agreement: κ values by hand, the figures of two judge files, and a second opinion end to end."""

import json
import subprocess
import sys

import pytest

from evalpipe import benchmarks, pipeline
from evalpipe.results import agreement, render
from evalpipe.stages import agreement as judge_files

from .conftest import ROOT, SAMPLE, read_jsonl, write_jsonl

CLBENCH = benchmarks.get("clbench")


def test_cohen_kappa_of_a_table_by_hand():
    # n 50: po = (20 + 15) / 50 = 0.7; judge a passes 25/50 = 0.5, judge b 30/50 = 0.6;
    # pe = 0.5·0.6 + 0.5·0.4 = 0.5; κ = (0.7 − 0.5) / (1 − 0.5) = 0.4
    pairs = [(1, 1)] * 20 + [(1, 0)] * 5 + [(0, 1)] * 10 + [(0, 0)] * 15
    assert agreement._table_figures(pairs)["cohen_kappa"] == pytest.approx(0.4)


def test_raw_agreement_flatters_a_judge_when_most_tasks_fail():
    # 100 tasks, each judge passes 5 and they share 1: raw agreement 92%, yet
    # pe = 0.05² + 0.95² = 0.905, κ = (0.92 − 0.905) / 0.095 = 3/19 ≈ 0.158
    figures = agreement._table_figures([(1, 1)] + [(1, 0)] * 4 + [(0, 1)] * 4 + [(0, 0)] * 91)
    assert figures["raw_agreement"] == pytest.approx(0.92)
    assert figures["cohen_kappa"] == pytest.approx(3 / 19)
    assert figures["pass_rate_a"] == figures["pass_rate_b"] == pytest.approx(0.05)


def test_kappa_is_undefined_when_both_judges_give_one_score_only():
    assert agreement._table_figures([(0, 0)] * 7)["cohen_kappa"] is None
    assert agreement._table_figures([])["cohen_kappa"] is None


def test_fleiss_kappa_by_hand():
    # 4 items × 3 raters. P_i = (Σ n_ij² − 3) / 6: 1, 1, 1/3, 1/3 → P̄ = 2/3;
    # p_1 = 6/12 = 0.5 → P̄e = 0.5; κ = (2/3 − 1/2) / (1/2) = 1/3
    assert agreement.fleiss_kappa([[1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 0, 0]]) == pytest.approx(1 / 3)
    # perfect agreement with both scores present: 1
    assert agreement.fleiss_kappa([[1, 1], [0, 0]]) == pytest.approx(1.0)
    assert agreement.fleiss_kappa([[0, 0], [0, 0]]) is None


def _row(i, score, statuses, category, status="ok", fmt="json_schema"):
    rubrics = [{"rubric_criteria": f"r{j}"} for j in range(3)]
    return {
        "idx": f"t{i}",
        "rubrics": rubrics,
        "metadata": {"context_category": category},
        "requirement_status": statuses,
        "score": score,
        "judge_status": status,
        "judge_format": fmt,
    }


def test_two_judge_files_compared(tmp_path):
    yes, no1 = ["yes"] * 3, ["yes", "yes", "no"]
    a = [
        _row(0, 0, no1, "A"),  # replaced by the next row for t0
        _row(0, 1, yes, "A"),
        _row(1, 1, yes, "A"),
        _row(2, 0, no1, "B"),
        _row(3, 0, no1, "B"),
        _row(4, 0, [], "B", status="parse_error"),  # final (a conservative zero), no rubric verdicts
        _row(5, 1, yes, "B"),
    ]
    b = [
        _row(0, 1, yes, "A", fmt="none"),
        _row(1, 0, ["no", "yes", "no"], "A", fmt="none"),
        _row(2, 0, no1, "B", fmt="none"),
        _row(3, 1, yes, "B", fmt="none"),
        _row(4, 0, no1, "B", fmt="none"),
        _row(5, 0, [], "B", status="api_error", fmt="none"),  # provisional: left out
    ]
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    rows_a, prov_a = judge_files.load(CLBENCH, tmp_path / "a.jsonl")
    rows_b, prov_b = judge_files.load(CLBENCH, tmp_path / "b.jsonl")
    assert (len(rows_a), prov_a, len(rows_b), prov_b) == (6, 0, 5, 1)
    pair = agreement.compare(rows_a, rows_b)
    overall = pair["overall"]
    # t0 1/1, t1 1/0, t2 0/0, t3 0/1, t4 0/0: po = 3/5; pa = pb = 2/5; pe = 0.16 + 0.36 = 0.52
    assert overall["table"] == {"1/1": 1, "1/0": 1, "0/1": 1, "0/0": 2}
    assert overall["raw_agreement"] == pytest.approx(0.6)
    assert overall["cohen_kappa"] == pytest.approx((0.6 - 0.52) / 0.48)
    assert pair["by_category"]["A"]["table"] == {"1/1": 1, "1/0": 1, "0/1": 0, "0/0": 0}
    assert pair["by_category"]["B"]["n"] == 3
    # rubric items where both lists have 3 verdicts: t0..t3 (t4's a-side is empty) → 12 items, 9 agree
    rubric = pair["rubric_items"]
    assert rubric["tasks"] == 4 and rubric["n"] == 12
    assert rubric["raw_agreement"] == pytest.approx(9 / 12)
    assert pair["only_a"] == 1 and pair["only_b"] == 0
    assert pair["formats"] == {"a": {"json_schema": 5}, "b": {"none": 5}} and pair["format_ab"]
    text = agreement.format_report(agreement.report({"a": (rows_a, 0, "j"), "b": (rows_b, 1, "k")}))
    assert "raw 60.0%" in text and "(format A/B)" in text and "repeated" not in text


def test_repeated_judgments_by_one_judge(tmp_path):
    files = {}
    for name, scores in (("x", [1, 0, 1, 0]), ("y", [1, 0, 0, 0]), ("z", [1, 1, 0, 0])):
        write_jsonl(tmp_path / f"{name}.jsonl", [_row(i, s, [], "A") for i, s in enumerate(scores)])
        files[name] = (*judge_files.load(CLBENCH, tmp_path / f"{name}.jsonl"), "same-judge")
    section = agreement.report(files)
    (rep,) = section["repeated"]
    # items [1,1,1], [0,0,1], [1,0,0], [0,0,0]: 2 of 4 flip; Fleiss: P_i 1, 1/3, 1/3, 1 → 2/3; p1 = 5/12
    p1 = 5 / 12
    pe = p1**2 + (1 - p1) ** 2
    assert rep["files"] == ["x", "y", "z"] and rep["n"] == 4
    assert rep["flip_rate"] == pytest.approx(0.5)
    assert rep["fleiss_kappa"] == pytest.approx((2 / 3 - pe) / (1 - pe))
    md = render.agreement_table("clbench", [{"model": "m", "agreement": section}])
    assert "Fleiss' κ" in md and "Cohen's κ" in md and "x vs y" in md


def test_bad_judge_line_names_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        json.dumps(_row(0, 1, [], "A")) + "\n{oops\n" + json.dumps(_row(1, 1, [], "A")) + "\n"
    )
    with pytest.raises(Exception) as info:
        judge_files.load(CLBENCH, tmp_path / "a.jsonl")
    assert "a.jsonl" in str(info.value) and "2" in str(info.value)


def test_judge_label_passes_through_the_pipeline():
    plan = pipeline.parse(["judge", "score", "aggregate", "JUDGE_LABEL=again"])
    assert pipeline.command(plan, "judge")[-2:] == ["--judge-label", "again"]
    assert pipeline.command(plan, "score")[-2:] == ["--judge-label", "again"]
    assert "--judge-label" not in pipeline.command(plan, "aggregate")
    with pytest.raises(pipeline.UsageError, match="JUDGE_LABEL=../x"):
        pipeline.parse(["judge", "JUDGE_LABEL=../x"])


@pytest.mark.e2e
def test_second_opinion_end_to_end(stage, tmp_path, server):
    run = tmp_path / "out" / "clbench" / "m" / "run-1"
    common = ("--model", "m", "--outputs-dir", "out", "--run", "1")
    stage("infer", *common, "--input", SAMPLE, "--max-samples", "4", check=0)
    stage("judge", *common, "--judge-model", "j", check=0)
    first = (run / "judge.jsonl").read_bytes()
    proc = stage("judge", *common, "--judge-model", "j", "--judge-label", "again", check=0)
    assert "judge-again.jsonl" in proc.stderr
    assert (run / "judge.jsonl").read_bytes() == first  # untouched
    assert len(read_jsonl(run / "judge-again.jsonl")) == 4
    assert json.loads((run / "judge-again.jsonl.manifest.json").read_text())["judge_model"] == "j"
    # resumable: a rerun has nothing to do and sends no judge call
    calls = len(server.requests)
    proc = stage("judge", *common, "--judge-model", "j", "--judge-label", "again", check=0)
    assert "4 already done, 0 to do" in proc.stderr and len(server.requests) == calls
    assert stage("judge", *common, "--judge-label", "../x").returncode == 2

    # the second opinion scored on its own; judge.jsonl's score gets the agreement section
    stage("score", *common, "--judge-label", "again", check=0)
    assert (run / "judge-again_score.json").exists() and (run / "judge-again_items.json").exists()
    proc = stage("score", *common, check=0)
    section = json.loads((run / "score.json").read_text())["agreement"]
    (pair,) = section["pairs"]
    assert (pair["a"], pair["b"], pair["overall"]["n"]) == ("judge.jsonl", "judge-again.jsonl", 4)
    assert pair["overall"]["raw_agreement"] == 1.0  # the scripted judge is deterministic
    assert section["repeated"][0]["flip_rate"] == 0.0
    assert "Judge agreement" in proc.stdout

    cli = subprocess.run(
        [sys.executable, "-m", "evalpipe.stages.agreement", run / "judge.jsonl", run / "judge-again.jsonl"],
        cwd=ROOT,
        env=stage.env,
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and "Cohen's κ" in cli.stdout

    stage("aggregate", "--outputs-dir", "out", "--no-plots", check=0)
    assert "judge agreement" in (tmp_path / "out" / "clbench" / "aggregate.md").read_text()
    summary = json.loads((tmp_path / "out" / "clbench" / "aggregate.json").read_text())
    assert summary["models"][0]["agreement"]["pooled_over_runs"] == ["run-1"]
