"""`make report` over several results roots, and CoinFlip's leaderboard marking mostly-unparsed models."""

import json
import re

import pytest

from evalpipe.devtools.testserver import Reply
from evalpipe.errors import BadInput
from evalpipe.stages import report

from .conftest import ROOT, module, read_jsonl

N = 16  # CoinFlip questions per run
QUESTIONS = [r["question"] for r in read_jsonl(ROOT / "data" / "coin_flip" / "test.jsonl")[:N]]


def people(question):
    return question.count(" flips the coin.") + question.count(" does not flip the coin.")


def truth(question):
    return "YES" if question.count(" flips the coin.") % 2 == 0 else "NO"


def steady_reply(question):
    """Answers every question: right, except with 3 people."""
    verdict = truth(question) if people(question) != 3 else {"YES": "NO", "NO": "YES"}[truth(question)]
    return f"Counting.\nANSWER: {verdict}"


def shy_reply(question):
    """Answers only questions with 4 people, and those right; the rest cannot be parsed."""
    return f"Counting.\nANSWER: {truth(question)}" if people(question) == 4 else "I am not sure."


REPLIES = {"steady": steady_reply, "shy": shy_reply}


def by_model(request):
    prompt = request.last_content
    question = next(q for q in QUESTIONS if q in prompt)
    return Reply(content=REPLIES[request.body["model"]](question))


def answered_share(model):
    return sum(re.search(r"^ANSWER: (YES|NO)$", REPLIES[model](q), re.M) is not None for q in QUESTIONS) / N


def run_pipeline(stage, root, model, runs):
    for k in range(1, runs + 1):
        common = ["--bench", "coin_flip", "--outputs-dir", root, "--model", model, "--run", k]
        stage("infer", *common, "--max-samples", N, "--workers", 4, check=0)
        stage("judge", *common, check=0)
        scored = stage("score", *common, check=0)
    return scored


def leaderboard_run(env, cwd, outputs):
    return module({**env, "PYTHONPATH": str(ROOT)}, "evalpipe.stages.report", "--outputs-dir", outputs, cwd=cwd)


@pytest.mark.e2e
def test_report_over_two_roots(server, stage, env, tmp_path):
    """Real outputs in outputs/ (steady 1 run, shy 2 runs) and outputs/demo/ (shy 1 run), then the report."""
    server.handler = by_model
    assert answered_share("shy") < 0.5 <= answered_share("steady")
    run_pipeline(stage, "outputs", "steady", 1)
    score_out = run_pipeline(stage, "outputs", "shy", 2)
    run_pipeline(stage, "outputs/demo", "shy", 1)
    proc = leaderboard_run(env, tmp_path, "outputs")
    assert proc.returncode == 0, proc.stderr
    check_report(tmp_path / "outputs")
    check_coin_flip_leaderboard(tmp_path / "outputs", score_out)


def check_report(outputs):
    report = (outputs / "report.md").read_text()
    assert re.findall(r"^## .*$", report, re.M) == ["## coin_flip", "## demo / coin_flip"]
    assert "### coin_flip: run-to-run, mean ± sample std (ddof 1) over runs" in report
    demo_part = report.split("## demo / coin_flip", 1)[1]
    assert "![demo / coin_flip aggregate.png](demo/coin_flip/aggregate.png)" in demo_part
    assert "[LaTeX](demo/coin_flip/aggregate.tex)" in demo_part and "| shy | 1 |" in demo_part
    assert "steady" not in demo_part
    links = re.findall(r"\]\(([^)]+)\)", report)
    assert len(links) == 2 * 4 and all((outputs / link).is_file() for link in links)
    for root in (outputs, outputs / "demo"):
        assert all((root / "coin_flip" / f"aggregate.{ext}").exists() for ext in ("md", "csv", "json", "tex", "png"))


def check_coin_flip_leaderboard(outputs, score_out):
    shy, steady = answered_share("shy"), answered_share("steady")
    assert re.search(rf"^  Answered +{100 * shy:.1f}$", score_out.stdout, re.M)
    assert "most answers unparsed" in score_out.stdout
    bench_dir = outputs / "coin_flip"
    md = (bench_dir / "aggregate.md").read_text()
    assert "| Model | Runs | F1 | Answered | Accuracy | Precision | Recall | YES ratio |" in md
    # shy answers little but all of it right: it tops the F1 sort, marked
    runs_table = md.split("run-to-run", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (shy|steady) \| .*$", runs_table, re.M)
    assert rows == ["shy", "steady"]
    assert f"| shy | 2 | 100.0 ± 0.0 † | {100 * shy:.1f} ± 0.0 |" in md
    assert re.search(rf"\| steady \| 1 \| [\d.]+ ± 0\.0 \| {100 * steady:.1f} ± 0\.0 \|", md)
    # the mark in the leaderboard and in the run-to-run table, and the note under the leaderboard
    assert md.count("†") == 3 and "\n† Most answers unparsed" in md
    assert re.search(r"^\| shy \| 2 \| \d+ \| - \| 100\.0 \(0\.0\) \[[\d.]+, 100\.0\] ‡ †", md, re.M)
    summary = json.loads((bench_dir / "aggregate.json").read_text())
    entries = {m["model"]: m for m in summary["models"]}
    assert entries["shy"]["flagged"] is True and entries["steady"]["flagged"] is False
    assert entries["shy"]["figures"]["Answered"]["values"] == [shy, shy]
    csv_lines = (bench_dir / "aggregate.csv").read_text().splitlines()
    header = csv_lines[0].split(",")
    shy_row = next(line.split(",") for line in csv_lines if line.startswith("shy,"))
    assert float(shy_row[header.index("Answered mean %")]) == round(100 * shy, 4)
    tex = (bench_dir / "aggregate.tex").read_text()
    assert re.search(r"^shy & 2 & \$100\.0 \\pm 0\.0\$\\textsuperscript\{\\dag\} &", tex, re.M)
    assert "\\textsuperscript{\\dag} Most answers unparsed (Answered below 50\\%" in tex
    assert "†" not in tex
    demo_md = (outputs / "demo" / "coin_flip" / "aggregate.md").read_text()
    assert f"| shy | 1 | 100.0 ± 0.0 † | {100 * shy:.1f} ± 0.0 |" in demo_md


# ---- which folders count as results roots (no API calls: score.json files written by hand)


def put_score(root, bench="coin_flip", model="m", run=1):
    d = root / bench / model / f"run-{run}"
    d.mkdir(parents=True)
    (d / "score.json").write_text(
        json.dumps(
            {
                "f1": 1.0,
                "accuracy": 1.0,
                "precision": 1.0,
                "recall": 1.0,
                "yes_ratio": 0.5,
                "coverage": {"expected": 2, "missing": 0},
            }
        )
    )


def test_discovery_bounds(tmp_path):
    outputs = tmp_path / "outputs"
    for where in ("", "demo", "a/b/c", "a/b/c/too-deep", ".hidden", "m/run-1"):
        put_score(outputs / where)
    put_score(outputs / "demo", bench="clbench")
    put_score(outputs / "unknown-bench-only", bench="not_a_bench")
    (outputs / "link").symlink_to(outputs / "demo", target_is_directory=True)
    found = [(root.relative_to(outputs).as_posix(), benches) for root, benches in report.find_results(outputs)]
    assert found == [(".", ["coin_flip"]), ("a/b/c", ["coin_flip"]), ("demo", ["clbench", "coin_flip"])]


def test_nothing_found_names_the_folder(tmp_path):
    (tmp_path / "outputs" / "coin_flip" / "m").mkdir(parents=True)
    with pytest.raises(BadInput, match=re.escape(f"score.json in {tmp_path / 'outputs'} or up to 3 folder levels")):
        report.main(["--outputs-dir", str(tmp_path / "outputs")])
