"""Manifests, judge refusal, tokens and cost, --dry-run, CL-bench error analysis, leaderboard and plots."""

import json
import math
import re
import struct
import subprocess

import pytest

from evalpipe.client import cost
from evalpipe.devtools.testserver import Reply
from evalpipe.results import stats

from .conftest import API_KEY, ROOT, SAMPLE, read_jsonl, scripted, write_jsonl

TASKS = read_jsonl(SAMPLE)


def is_analysis(request) -> bool:
    return "Say why it failed." in request.last_content


def analyst(request) -> Reply:
    """Error types from the failed response's character-sum parity: the test can predict them."""
    response = request.last_content.split("<<<RESPONSE\n", 1)[1].split("\nRESPONSE>>>", 1)[0]
    types = ["Context Misused"] if sum(map(ord, response)) % 3 else ["Context Ignored", "Format Error"]
    return Reply(content=json.dumps({"Error Types": types, "Reason": "scripted"}))


def expected_types(judge_row) -> list[str]:
    return ["Context Misused"] if sum(map(ord, judge_row["model_output"])) % 3 else ["Context Ignored", "Format Error"]


def with_analyst(fallback=scripted, analysis=analyst):
    return lambda r: analysis(r) if is_analysis(r) else fallback(r)


def prices_file(tmp_path, **models):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"as_of": "2026-11-21", "models": models}))
    return path


# ---------------------------------------------------------------- manifests


@pytest.mark.e2e
def test_manifest_records_what_when_and_how_many_and_keeps_history(server, stage, tmp_path):
    stage.infer("--max-samples", "4", "--temperature", "0.3", check=0)
    path = tmp_path / "infer.jsonl.manifest.json"
    first = json.loads(path.read_text())
    assert first["benchmark"] == "clbench" and first["model"] == "m" and first["params"] == {"temperature": 0.3}
    assert first["counts"] == {
        "selected": 4,
        "done_before": 0,
        "pending": 4,
        "written": 4,
        "failed": 0,
        "interrupted": False,
        "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in read_jsonl(tmp_path / "infer.jsonl")),
        "cached_prompt_tokens": 0,
    }
    assert first["started_at"] <= first["ended_at"] and first["endpoint"] == server.base_url
    assert "git_commit" in first and "prompt_sha256" in first["fingerprint"]
    stage.infer("--max-samples", "6", "--temperature", "0.3", check=0)
    second = json.loads(path.read_text())
    assert [h["counts"]["written"] for h in second["history"]] == [4, 2]
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    judge = json.loads((tmp_path / "judge.jsonl.manifest.json").read_text())
    assert judge["judge_model"] == "j" and judge["counts"]["written"] == 6
    assert judge["fingerprint"]["judge_model"] == "j"
    from evalpipe.client.llm import Endpoint

    assert Endpoint("m", base_url="http://user:pw@10.0.0.1:8000/v1?key=k").host == "http://10.0.0.1:8000/v1"
    for name in ("infer.jsonl.manifest.json", "judge.jsonl.manifest.json"):
        assert API_KEY not in (tmp_path / name).read_text()


@pytest.mark.e2e
def test_judge_refuses_to_mix_judge_configurations(server, stage, tmp_path):
    stage.infer("--max-samples", "4", check=0)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    before = (tmp_path / "judge.jsonl").read_bytes()
    stage.infer("--max-samples", "6", check=0)
    proc = stage("judge", "--input", "infer.jsonl", "--judge-model", "k", "--temperature", "0")
    assert proc.returncode == 2, proc.stderr
    assert "judge_model: 'j' → 'k'" in proc.stderr and "temperature: None → 0.0" in proc.stderr
    assert (tmp_path / "judge.jsonl").read_bytes() == before
    # operational flags and the re-judging switches are not a different configuration
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--workers", "2", "--parse-attempts", "1", check=0)
    assert len(read_jsonl(tmp_path / "judge.jsonl")) == 6
    stage(
        "judge",
        "--input",
        "infer.jsonl",
        "--judge-model",
        "k",
        "--allow-config-change",
        "--rejudge-parse-errors",
        check=0,
    )


# ---------------------------------------------------------------- tokens, latency and cost


def test_cost_arithmetic_and_price_lookup():
    prices = cost.Prices(
        models={
            "gpt-x": {"input": 2.0, "cached_input": 0.5, "output": 8.0},
            "gpt-x-mini": {"input": 0.2, "output": 0.8},
        }
    )
    usage = {
        "prompt_tokens": 1_000_000,
        "cached_tokens": 400_000,
        "completion_tokens": 250_000,
        "reasoning_tokens": 100_000,
    }
    # 600k uncached × 2 + 400k cached × 0.5 + 250k × 8 (reasoning is inside completion) per million
    assert math.isclose(prices.cost("gpt-x", usage), 1.2 + 0.2 + 2.0)
    assert prices.price_for("gpt-x-mini-2026-01-01") == prices.models["gpt-x-mini"]  # longest listed stem
    assert prices.price_for("openai/gpt-x") == prices.models["gpt-x"]
    assert prices.price_for("gpt-xl") is None and prices.cost("unknown", usage) is None
    assert prices.price_for("gpt-x-pro") is None  # another model, not a snapshot of gpt-x
    assert math.isclose(prices.cost("gpt-x-mini", {"prompt_tokens": 500, "completion_tokens": 500}), (100 + 400) / 1e6)
    assert cost.percentiles([0.4, 0.1, 0.3, 0.2, 5.0]) == {"p50": 0.3, "p90": 5.0, "p99": 5.0, "max": 5.0}
    assert cost.percentiles(list(range(1, 101))) == {"p50": 50, "p90": 90, "p99": 99, "max": 100}


def test_the_bundled_price_table_is_dated_and_marked_for_review():
    prices = cost.load_prices(cost.DEFAULT_PRICES)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", prices.as_of) and "REVIEW" in prices.status
    assert prices.price_for("gpt-4o-mini") is not None


@pytest.mark.e2e
def test_score_reports_tokens_latency_and_cost_per_stage(server, stage, tmp_path):
    stage.infer(check=0)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    prices = prices_file(tmp_path, m={"input": 3.0, "output": 15.0}, j={"input": 1.0, "output": 4.0})
    proc = stage("score", "--input", "judge.jsonl", "--prices", prices, check=0)
    rows = read_jsonl(tmp_path / "judge.jsonl")
    infer_in = sum(r["usage"]["prompt_tokens"] for r in rows)
    infer_out = sum(r["usage"]["completion_tokens"] for r in rows)
    judge_in = sum(r["judge_usage"]["prompt_tokens"] for r in rows)
    judge_out = sum(r["judge_usage"]["completion_tokens"] for r in rows)
    c = json.loads((tmp_path / "score.json").read_text())["cost"]
    assert c["stages"]["infer"]["calls"] == 12 and c["stages"]["judge"]["calls"] == 12
    assert c["stages"]["infer"]["tokens"] == {"prompt_tokens": infer_in, "completion_tokens": infer_out}
    assert math.isclose(c["stages"]["infer"]["cost_usd"], (infer_in * 3 + infer_out * 15) / 1e6, abs_tol=1e-6)
    assert math.isclose(c["cost_usd"], (infer_in * 3 + infer_out * 15 + judge_in + judge_out * 4) / 1e6, abs_tol=1e-6)
    lat = c["stages"]["judge"]["latency_s"]
    assert 0 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert "calls" in proc.stdout and "p90" in proc.stdout
    # an unknown model is reported, not priced as free
    stage("score", "--input", "judge.jsonl", "--prices", prices_file(tmp_path, m={"input": 1, "output": 1}), check=0)
    c = json.loads((tmp_path / "score.json").read_text())["cost"]
    assert c["cost_usd"] is None and c["unpriced_models"] == ["j"] and c["stages"]["judge"]["cost_usd"] is None


@pytest.mark.e2e
def test_a_bad_price_table_names_the_file(server, stage, tmp_path):
    write_jsonl(tmp_path / "judge.jsonl", [])
    (tmp_path / "p.json").write_text('{"models": {"m": {"input": -1, "output": 1}}}')
    proc = stage("score", "--input", "judge.jsonl", "--prices", "p.json")
    assert proc.returncode == 2 and "p.json" in proc.stderr and "'m'" in proc.stderr


# ---------------------------------------------------------------- --dry-run


def dry_run_figures(stderr: str) -> dict:
    calls = int(re.search(r"→ ([\d,]+) calls", stderr).group(1).replace(",", ""))
    prompt = int(re.search(r"prompt tokens\s+≈ ([\d,]+)", stderr).group(1).replace(",", ""))
    completion = int(re.search(r"completion tokens ≈ ([\d,]+)", stderr).group(1).replace(",", ""))
    dollars = re.search(r"≈ \$([\d,.]+)", stderr)
    return {
        "calls": calls,
        "prompt": prompt,
        "completion": completion,
        "cost": float(dollars.group(1).replace(",", "")) if dollars else None,
    }


@pytest.mark.e2e
def test_dry_run_counts_and_prices_without_sending_anything(server, stage, tmp_path):
    prices = prices_file(tmp_path, m={"input": 2.0, "output": 10.0})
    proc = stage.infer("--max-tokens", "100", "--dry-run", "--prices", prices)
    assert proc.returncode == 0, proc.stderr
    chars = sum(len(m["content"]) for t in TASKS for m in t["messages"])
    got = dry_run_figures(proc.stderr)
    assert got == {
        "calls": 12,
        "prompt": chars // 4,
        "completion": 1200,
        "cost": round((chars // 4 * 2 + 1200 * 10) / 1e6, 4),
    }
    assert server.requests == [] and not (tmp_path / "infer.jsonl").exists()
    # after a partial run only the pending tasks count; the judge estimates one call per non-empty answer
    stage.infer("--max-samples", "5", check=0)
    sent = len(server.requests)
    got = dry_run_figures(stage.infer("--dry-run", check=0).stderr)
    assert got["calls"] == 7 and got["completion"] == 7 * 1000 and got["cost"] is None  # no price for "m"
    got = dry_run_figures(
        stage("judge", "--input", "infer.jsonl", "--judge-model", "gpt-4o-mini", "--dry-run", check=0).stderr
    )
    assert got["calls"] == 5 and got["cost"] is not None
    assert len(server.requests) == sent and not (tmp_path / "judge.jsonl").exists()


@pytest.mark.e2e
def test_dry_run_follows_error_recovery_two_calls(server, stage, tmp_path):
    proc = stage("infer", "--bench", "error_recovery", "--model", "m", "--output", "er.jsonl", "--dry-run", check=0)
    problems = len(read_jsonl(ROOT / "data" / "error_recovery" / "sample.jsonl"))
    assert dry_run_figures(proc.stderr)["calls"] == problems * 3 * 2
    assert server.requests == []


# ---------------------------------------------------------------- CL-bench error analysis


def run_judged(stage, tmp_path, run=1):
    stage("infer", "--model", "m", "--outputs-dir", "out", "--run", run, check=0)
    stage("judge", "--model", "m", "--outputs-dir", "out", "--run", run, "--judge-model", "j", check=0)
    return tmp_path / "out" / "clbench" / "m" / f"run-{run}"


@pytest.mark.e2e
def test_error_analysis_classifies_each_failed_solution_and_score_reports_shares(server, stage, tmp_path):
    server.handler = with_analyst()
    run = run_judged(stage, tmp_path)
    failed = [r for r in read_jsonl(run / "judge.jsonl") if r["score"] == 0]
    assert 0 < len(failed) < 12
    before = len(server.requests)
    stage("judge", "--model", "m", "--outputs-dir", "out", "--error-analysis", "--judge-model", "j", check=0)
    assert len(server.requests) - before == len(failed)  # only failures, one call each
    rows = {r["idx"]: r for r in read_jsonl(run / "error_analysis.jsonl")}
    assert set(rows) == {r["idx"] for r in failed}
    for r in failed:
        assert rows[r["idx"]]["error_types"] == expected_types(r)
        assert rows[r["idx"]]["analysis_status"] == "ok" and rows[r["idx"]]["analysis_model"] == "j"
    # resumable: nothing left to do
    stage("judge", "--model", "m", "--outputs-dir", "out", "--error-analysis", "--judge-model", "j", check=0)
    assert len(server.requests) - before == len(failed)
    stage("score", "--model", "m", "--outputs-dir", "out", check=0)
    score = json.loads((run / "score.json").read_text())
    ea = score["error_analysis"]
    ignored = sum("Context Ignored" in expected_types(r) for r in failed)
    assert (ea["failed"], ea["analyzed"]) == (len(failed), len(failed))
    assert ea["share"]["Context Ignored"] == ignored / len(failed) and ea["share"]["Refusal"] == 0
    assert math.isclose(ea["share"]["Context Misused"] + ea["share"]["Context Ignored"], 1.0)  # a partition here
    assert score["cost"]["stages"]["error_analysis"]["calls"] == len(failed)
    proc = stage("aggregate", "--outputs-dir", "out", check=0)
    assert "Error types (share of failed solutions)" in proc.stdout and "Context Misused" in proc.stdout


@pytest.mark.e2e
def test_error_analysis_fallbacks_match_the_judge(server, stage, tmp_path):
    run = run_judged(stage, tmp_path)
    failed = [r for r in read_jsonl(run / "judge.jsonl") if r["score"] == 0]
    analyze = [
        "judge",
        "--model",
        "m",
        "--outputs-dir",
        "out",
        "--error-analysis",
        "--judge-model",
        "j",
        "--max-retries",
        "0",
        "--backoff",
        "0.01",
    ]
    server.handler = with_analyst(analysis=lambda r: Reply.error(503, "analyst down"))
    proc = stage(*analyze)
    assert proc.returncode == 3 and "done again on the next run" in proc.stderr
    rows = read_jsonl(run / "error_analysis.jsonl")
    assert {r["analysis_status"] for r in rows} == {"api_error"} and all(r["error_types"] == [] for r in rows)
    server.handler = with_analyst(analysis=lambda r: Reply(content="It ignored the context, I believe."))
    stage(*analyze, "--parse-attempts", "2", check=0)
    latest = {r["idx"]: r for r in read_jsonl(run / "error_analysis.jsonl")}
    assert {(r["analysis_status"], r["analysis_attempts"]) for r in latest.values()} == {("parse_error", 2)}
    assert "It ignored the context" in next(iter(latest.values()))["analysis_error"]
    calls = len(server.chat_requests())
    stage(*analyze, check=0)
    assert len(server.chat_requests()) == calls  # parse errors stay unless asked
    server.handler = with_analyst(
        analysis=lambda r: Reply(content='Sure.\n```json\n{"error_types": ["refusal"], "reason": "declined"}\n```')
    )
    stage(*analyze, "--rejudge-parse-errors", check=0)
    latest = {r["idx"]: r for r in read_jsonl(run / "error_analysis.jsonl")}
    assert {(r["analysis_status"], tuple(r["error_types"])) for r in latest.values()} == {("salvaged", ("Refusal",))}
    assert len(latest) == len(failed)
    server.handler = with_analyst(
        analysis=lambda r: Reply.error(
            400, "This model's maximum context length is 8 tokens", code="context_length_exceeded"
        )
    )
    stage(*analyze, "--output", run / "ea2.jsonl", check=0)
    assert {r["analysis_status"] for r in read_jsonl(run / "ea2.jsonl")} == {"judge_context_length"}


# ---------------------------------------------------------------- aggregate, leaderboard, plots


def write_score(root, bench, model, run, metrics, infer_fp=None, judge_fp=None):
    d = root / bench / model / f"run-{run}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "score.json").write_text(json.dumps(metrics))
    for name, fp in (("infer", infer_fp), ("judge", judge_fp)):
        if fp is not None:
            (d / f"{name}.jsonl.manifest.json").write_text(json.dumps({"fingerprint": fp}))


def clbench_metrics(overall, expected=10, shares=None):
    cats = [
        "Domain Knowledge Reasoning",
        "Rule System Application",
        "Procedural Task Execution",
        "Empirical Discovery & Simulation",
    ]
    m = {
        "overall": {"solving_rate": overall},
        "by_category": {c: {"solving_rate": overall} for c in cats},
        "coverage": {"expected": expected, "missing": 0},
        "cost": {"cost_usd": 0.25},
    }
    if shares:
        m["error_analysis"] = {"analyzed": 5, "share": shares}
    return m


@pytest.mark.e2e
def test_aggregate_interval_warnings_and_leaderboard_formats(stage, tmp_path):
    root = tmp_path / "outputs"
    shares = {"Context Ignored": 0.6, "Context Misused": 0.4, "Format Error": 0.2, "Refusal": 0.0}
    # model, run, metrics, temperature
    runs = [("a", run, clbench_metrics(overall, shares=shares), 0.0) for run, overall in enumerate([0.5, 0.6, 0.7], 1)]
    runs += [("b", 1, clbench_metrics(0.8), 0.0), ("b", 2, clbench_metrics(0.9, expected=8), 0.7)]
    for model, run, metrics, temperature in runs:
        infer_fp = {"model": model, "temperature": temperature}
        write_score(root, "clbench", f"model-{model}", run, metrics, infer_fp=infer_fp, judge_fp={"judge_model": "j"})
    proc = stage("aggregate", "--outputs-dir", root, "--runs-ci")
    assert proc.returncode == 3
    assert "model-b: run-2 infer configuration differs from run-1 (temperature: 0.0 → 0.7)" in proc.stderr
    assert "model-b: runs cover different task sets" in proc.stderr
    summary = json.loads((root / "clbench" / "aggregate.json").read_text())
    a = next(m for m in summary["models"] if m["model"] == "model-a")
    low, high = a["figures"]["Overall"]["ci95"]
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert math.isclose(low, 0.6 - half, rel_tol=1e-6) and math.isclose(high, 0.6 + half, rel_tol=1e-6)
    assert a["extra_tables"]["Error types (share of failed solutions)"]["Context Ignored"]["mean"] == 0.6
    assert a["cost_usd_per_run"] == 0.25
    md = (root / "clbench" / "aggregate.md").read_text()
    assert f"| model-a | 3 | 60.0 ± 10.0 [{100 * (0.6 - half):.1f}, {100 * (0.6 + half):.1f}] |" in md
    assert "Error types" in md and "conditional on the task set" in md
    # score.json written by hand, without items.json: no item-level figures, and the note says why
    assert "have no items.json" in proc.stderr and "run score again" in md
    tex = (root / "clbench" / "aggregate.tex").read_text()
    assert "\\begin{tabular}" in tex and "Empirical Discovery \\& Simulation" in tex and "$60.0 \\pm 10.0$" in tex
    assert "\\caption{clbench: mean $\\pm$ sample std ($n-1$) over runs, in percent}" in tex and "−" not in tex
    header = (root / "clbench" / "aggregate.csv").read_text().splitlines()[0].split(",")
    assert header[:7] == [
        "model",
        "runs",
        "Overall mean %",
        "Overall std % (sample)",
        "Overall stderr %",
        "Overall ci95 low %",
        "Overall ci95 high %",
    ]
    # a different judge for another model: the leaderboard is not comparable, and says so
    write_score(root, "clbench", "model-c", 1, clbench_metrics(0.1), judge_fp={"judge_model": "other"})
    assert "different judge configurations" in stage("aggregate", "--outputs-dir", root).stderr


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.e2e
def test_plots_are_valid_pngs(stage, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need requirements-report.txt (make test installs it)")
    from PIL import Image

    root = tmp_path / "outputs"
    shares = {"Context Ignored": 0.5, "Context Misused": 0.5, "Format Error": 0.1, "Refusal": 0.0}
    for run, overall in enumerate([0.2, 0.3], 1):
        write_score(root, "clbench", "model-a", run, clbench_metrics(overall, shares=shares))
        write_score(root, "clbench", "model-b", run, clbench_metrics(overall + 0.1))
    stage("aggregate", "--outputs-dir", root, check=0)
    pngs = sorted((root / "clbench").glob("*.png"))
    assert [p.name for p in pngs] == ["aggregate-error-types-share-of-failed-solutions.png", "aggregate.png"]
    for p in pngs:
        width, height = png_size(p)
        assert width > 300 and height > 200
        with Image.open(p) as img:
            img.verify()  # the whole stream decodes (CRCs and zlib data)


@pytest.mark.e2e
def test_without_matplotlib_the_tables_still_come_out(stage, tmp_path):
    root = tmp_path / "outputs"
    write_score(root, "clbench", "model-a", 1, clbench_metrics(0.5))
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    stage.env["PYTHONPATH"] = str(tmp_path / "shim")
    proc = stage("aggregate", "--outputs-dir", root, check=0)
    assert "no plots: matplotlib is not installed; `make report` installs it" in proc.stderr
    assert (root / "clbench" / "aggregate.md").exists() and not list((root / "clbench").glob("*.png"))


@pytest.mark.e2e
def test_make_report_builds_every_benchmark(tmp_path, env):
    root = tmp_path / "outputs"
    write_score(root, "clbench", "model-a", 1, clbench_metrics(0.5))
    write_score(
        root,
        "coin_flip",
        "model-a",
        1,
        {
            "f1": 0.5,
            "accuracy": 0.5,
            "precision": 0.5,
            "recall": 0.5,
            "yes_ratio": 0.5,
            "coverage": {"expected": 4, "missing": 0},
        },
    )
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "report", f"OUTPUTS={root}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = (root / "report.md").read_text()
    assert "## clbench" in report and "## coin_flip" in report and "(coin_flip/aggregate.tex)" in report
    assert "![clbench aggregate.png](clbench/aggregate.png)" in report
    assert all(
        (root / b / f"aggregate.{ext}").exists()
        for b in ("clbench", "coin_flip")
        for ext in ("md", "csv", "json", "tex", "png")
    )


def test_t_quantiles():
    # Student's t 97.5% quantiles as printed in tables (e.g. NIST/SEMATECH e-Handbook, Table 1.3.6.7.2)
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (10, 2.228), (30, 2.042), (60, 2.000), (120, 1.980)):
        assert round(stats.t_quantile(0.975, df), 3) == t
    assert abs(stats.t_quantile(0.975, 10**6) - 1.959966) < 1e-6
    assert stats.ci95([0.5]) is None


def test_fingerprints_of_another_format_are_compared_on_shared_keys():
    from evalpipe.store import manifest

    # an older evalpipe recorded keys this one does not, and the other way round: not a change
    assert manifest.differences({"model": "m", "extra_body": None}, {"model": "m", "request_extra_body": {}}) == []
    assert manifest.differences({"model": "m", "top_p": None}, {"model": "m", "top_p": 0.9}) == ["top_p: None → 0.9"]
