"""Batch engines: export/import round trips for every benchmark, idempotent import, file limits,
and --backend batch against the test server's Batch API (resume after a kill, partial expiry)."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest

from evalpipe.devtools.testserver import Reply

from .conftest import API_KEY, ROOT, read_jsonl, scripted
from .test_coin_flip import answer_by_parity
from .test_error_recovery import er_handler

pytestmark = pytest.mark.e2e

# what an imported row has differently: no measured latency, and a flag saying a batch served it
NOT_COMPARED = ("latency_s", "judge_latency_s", "batch", "judge_batch")


def engine(server, request_file, output_file, error_file):
    """An offline batch runner (as vLLM's run_batch): every request line to the chat endpoint,
    each answer as an OpenAI batch output line, each failure as an error-file line."""
    outputs, errors = [], []
    for n, line in enumerate(read_jsonl(request_file)):
        assert line["method"] == "POST" and line["url"] == "/v1/chat/completions"
        request = urllib.request.Request(
            server.base_url + "/chat/completions",
            data=json.dumps(line["body"]).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, body = response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            status, body = exc.code, json.loads(exc.read())
        result = {
            "id": f"batch_req_{n}",
            "custom_id": line["custom_id"],
            "response": {"status_code": status, "request_id": f"req_{n}", "body": body},
            "error": None,
        }
        (outputs if status == 200 else errors).append(result)
    output_file.write_text("".join(json.dumps(r) + "\n" for r in outputs))
    error_file.write_text("".join(json.dumps(r) + "\n" for r in errors))
    return len(outputs), len(errors)


def without_latency(row):
    row = {k: v for k, v in row.items() if k not in NOT_COMPARED}
    if isinstance(row.get("calls"), dict):
        row["calls"] = {
            name: {k: v for k, v in call.items() if k != "latency_s"} for name, call in row["calls"].items()
        }
    return row


def rows_by_id(path):
    return {r["idx"]: without_latency(r) for r in read_jsonl(path)}


def round_trip(stage, server, tmp_path, script, out, *flags, rounds=1):
    """Export → engine → import, `rounds` times (chained calls need one round each)."""
    for n in range(rounds):
        req = tmp_path / f"{out}.req{n}.jsonl"
        stage(script, *flags, "--output", out, "--export-batch", req, check=0)
        engine(server, req, tmp_path / f"{out}.out{n}.jsonl", tmp_path / f"{out}.err{n}.jsonl")
        stage(
            script,
            *flags,
            "--output",
            out,
            "--import-batch",
            tmp_path / f"{out}.err{n}.jsonl",
            tmp_path / f"{out}.out{n}.jsonl",
        )


def test_clbench_export_import_gives_the_rows_of_an_online_run(server, stage, tmp_path):
    stage("infer", "--model", "m", "--output", "online.jsonl", "--temperature", "0.5", check=0)
    stage("judge", "--input", "online.jsonl", "--judge-model", "j", "--output", "online-judge.jsonl", check=0)
    online_calls = len(server.chat_requests())
    round_trip(stage, server, tmp_path, "infer", "infer.jsonl", "--model", "m", "--temperature", "0.5")
    lines = read_jsonl(tmp_path / "infer.jsonl.req0.jsonl")
    assert len(lines) == 12 and lines[0]["body"]["temperature"] == 0.5 and lines[0]["body"]["model"] == "m"
    ids = [t["metadata"]["task_id"] for t in read_jsonl(ROOT / "data" / "clbench" / "sample.jsonl")]
    assert [line["custom_id"].split("~")[0] for line in lines] == ids
    assert rows_by_id(tmp_path / "infer.jsonl") == rows_by_id(tmp_path / "online.jsonl")
    assert all(r["batch"] is True and r["latency_s"] is None for r in read_jsonl(tmp_path / "infer.jsonl"))
    round_trip(stage, server, tmp_path, "judge", "judge.jsonl", "--input", "infer.jsonl", "--judge-model", "j")
    assert rows_by_id(tmp_path / "judge.jsonl") == rows_by_id(tmp_path / "online-judge.jsonl")
    assert len(server.chat_requests()) == 2 * online_calls  # the engine's calls; import sent nothing
    # the same tokens; batch calls are priced with the table's batch discount
    (tmp_path / "prices.json").write_text(
        json.dumps(
            {"batch_discount": 0.5, "models": {"m": {"input": 1.0, "output": 2.0}, "j": {"input": 3.0, "output": 4.0}}}
        )
    )
    costs = {}
    for name in ("judge.jsonl", "online-judge.jsonl"):
        stage("score", "--input", name, "--prices", "prices.json", "--output", "s.json", check=0)
        costs[name] = json.loads((tmp_path / "s.json").read_text())["cost"]
    assert costs["judge.jsonl"]["stages"]["judge"]["batch_calls"] == 12
    assert costs["online-judge.jsonl"]["stages"]["judge"]["batch_calls"] == 0
    assert costs["judge.jsonl"]["cost_usd"] == pytest.approx(costs["online-judge.jsonl"]["cost_usd"] / 2, abs=2e-6)


def test_coin_flip_export_import_and_a_rule_judge_has_nothing_to_export(server, stage, tmp_path):
    server.handler = answer_by_parity
    flags = ["--bench", "coin_flip", "--model", "m", "--max-samples", "20", "--fewshot", "2"]
    stage("infer", *flags, "--output", "online.jsonl", check=0)
    round_trip(stage, server, tmp_path, "infer", "infer.jsonl", *flags)
    assert rows_by_id(tmp_path / "infer.jsonl") == rows_by_id(tmp_path / "online.jsonl")
    proc = stage("judge", "--bench", "coin_flip", "--input", "infer.jsonl", "--export-batch", "x.jsonl")
    assert proc.returncode == 2 and "no API calls" in proc.stderr
    # in cron with --backend batch everywhere, a rule judge simply runs
    proc = stage("judge", "--bench", "coin_flip", "--input", "infer.jsonl", "--backend", "batch", check=0)
    assert "graded by a rule" in proc.stderr and len(read_jsonl(tmp_path / "judge.jsonl")) == 20


def test_error_recovery_chains_reasoning_then_extraction_batches(server, stage, tmp_path):
    server.handler = er_handler()
    flags = ["--bench", "error_recovery", "--model", "m"]
    stage("infer", *flags, "--output", "online.jsonl", check=0)
    req = tmp_path / "r1.jsonl"
    stage("infer", *flags, "--output", "infer.jsonl", "--export-batch", req, check=0)
    assert all("There might be" not in json.dumps(line) for line in read_jsonl(req)) and len(read_jsonl(req)) == 30
    engine(server, req, tmp_path / "o1.jsonl", tmp_path / "e1.jsonl")
    proc = stage("infer", *flags, "--output", "infer.jsonl", "--import-batch", tmp_path / "o1.jsonl")
    assert proc.returncode == 3 and not read_jsonl(tmp_path / "infer.jsonl")  # reasoning kept as steps, no rows yet
    assert len(read_jsonl(tmp_path / "infer.jsonl.steps.jsonl")) == 30
    stage("infer", *flags, "--output", "infer.jsonl", "--export-batch", tmp_path / "r2.jsonl", check=0)
    extraction = read_jsonl(tmp_path / "r2.jsonl")
    assert len(extraction) == 30 and all(line["body"]["messages"][-1]["role"] == "system" for line in extraction)
    engine(server, tmp_path / "r2.jsonl", tmp_path / "o2.jsonl", tmp_path / "e2.jsonl")
    # both output files, in any order: the reasoning answers are not mistaken for extraction answers
    stage(
        "infer",
        *flags,
        "--output",
        "infer.jsonl",
        "--import-batch",
        tmp_path / "o2.jsonl",
        tmp_path / "o1.jsonl",
        check=0,
    )
    assert rows_by_id(tmp_path / "infer.jsonl") == rows_by_id(tmp_path / "online.jsonl")


def test_import_is_idempotent_and_errors_go_to_the_side_file(server, stage, tmp_path):
    failing = read_jsonl(ROOT / "data" / "clbench" / "sample.jsonl")[3]["messages"][-1]["content"]
    server.handler = lambda r: Reply.error(500, "engine broke") if r.last_content == failing else scripted(r)
    req, out, err = tmp_path / "req.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    stage.infer("--export-batch", req, check=0)
    assert engine(server, req, out, err) == (11, 1)
    first = stage.infer("--import-batch", out, err)
    assert first.returncode == 3
    rows, side = (tmp_path / "infer.jsonl").read_bytes(), (tmp_path / "infer.jsonl.failed.jsonl").read_bytes()
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 11
    assert "HTTP 500" in read_jsonl(tmp_path / "infer.jsonl.failed.jsonl")[0]["error"]
    for files in ([out, err], [err, out], [out], [err]):
        stage.infer("--import-batch", *files)
        assert (tmp_path / "infer.jsonl").read_bytes() == rows
        assert (tmp_path / "infer.jsonl.failed.jsonl").read_bytes() == side
    # the failed task is exported again, alone
    stage.infer("--export-batch", "again.jsonl", check=0)
    assert len(read_jsonl(tmp_path / "again.jsonl")) == 1


def test_judge_import_is_idempotent_for_provisional_rows(server, stage, tmp_path):
    stage.infer("--max-samples", "3", check=0)
    server.handler = lambda r: Reply.error(503, "judge busy") if "Response to grade" in r.last_content else scripted(r)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--export-batch", "req.jsonl", check=0)
    engine(server, tmp_path / "req.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    for _ in range(2):
        proc = stage(
            "judge", "--input", "infer.jsonl", "--judge-model", "j", "--import-batch", "err.jsonl", "out.jsonl"
        )
        assert proc.returncode == 3
    rows = read_jsonl(tmp_path / "judge.jsonl")
    assert len(rows) == 3 and {r["judge_status"] for r in rows} == {"api_error"}


def test_export_splits_at_the_file_limits(server, stage, tmp_path):
    stage.infer("--export-batch", "b.jsonl", "--batch-max-requests", "5", check=0)
    parts = sorted(tmp_path.glob("b-*.jsonl"))
    assert [p.name for p in parts] == ["b-001.jsonl", "b-002.jsonl", "b-003.jsonl"]
    assert [len(read_jsonl(p)) for p in parts] == [5, 5, 2]
    sizes = [len(line) + 1 for p in parts for line in p.read_text().splitlines()]
    limit = max(sizes) * 2 + 1
    stage.infer("--export-batch", "s.jsonl", "--batch-max-bytes", limit, check=0)
    parts = sorted(tmp_path.glob("s-*.jsonl"))
    assert all(p.stat().st_size <= limit for p in parts) and sum(len(read_jsonl(p)) for p in parts) == 12


# ---------------------------------------------------------------- --backend batch


POLL_QUICKLY = ("--batch-wait", "30", "--batch-poll", "0.05")  # the batches polled every 50 ms, for 30 s at most


def backend(stage, *flags):
    return stage.infer("--backend", "batch", *flags)


def test_backend_batch_cron_steps_exit_75_until_done(server, stage, tmp_path):
    server.batch_polls_to_finish = 2
    assert backend(stage).returncode == 75  # submitted
    state = json.loads((tmp_path / "infer.jsonl.batch.json").read_text())
    assert len(state["batches"]) == 1 and state["batches"][0]["id"].startswith("batch_")
    assert backend(stage).returncode == 75  # in progress
    assert backend(stage).returncode == 0  # completed and imported
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 12 and len(server.batches()) == 1
    assert server.chat_requests() == []
    assert backend(stage).returncode == 0 and len(server.batches()) == 1  # nothing more to do
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes()


def test_backend_batch_resumes_polling_after_a_kill(server, stage, tmp_path):
    server.batch_polls_to_finish = 6
    args = [
        sys.executable,
        str(ROOT / "infer.py"),
        "--model",
        "m",
        "--output",
        "infer.jsonl",
        "--backend",
        "batch",
        "--batch-wait",
        "60",
        "--batch-poll",
        "0.2",
    ]
    proc = subprocess.Popen(args, cwd=tmp_path, env=stage.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    state = tmp_path / "infer.jsonl.batch.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (state.exists() and "in_progress" in state.read_text()):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "in_progress" in state.read_text()  # killed while polling
    assert not (tmp_path / "infer.jsonl").exists() or read_jsonl(tmp_path / "infer.jsonl") == []
    done = backend(stage, "--batch-wait", "60", "--batch-poll", "0.05")
    assert done.returncode == 0, done.stderr
    assert len(server.batches()) == 1  # polling resumed; nothing was submitted twice
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 12


def test_backend_batch_adopts_a_batch_created_before_a_crash_saved_its_id(server, stage, tmp_path):
    stage.infer("--export-batch", "req.jsonl", check=0)
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY)
    uploaded = client.files.create(file=("req.jsonl", (tmp_path / "req.jsonl").read_bytes()), purpose="batch")
    client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    entry = {"input": str(tmp_path / "req.jsonl"), "input_file_id": uploaded.id, "requests": 12}
    (tmp_path / "infer.jsonl.batch.json").write_text(json.dumps({"batches": [entry]}))
    done = backend(stage, *POLL_QUICKLY)
    assert done.returncode == 0, done.stderr
    assert len(server.batches()) == 1 and len(read_jsonl(tmp_path / "infer.jsonl")) == 12


def test_backend_batch_keeps_partial_results_of_expired_batches_and_resubmits_the_rest(server, stage, tmp_path):
    server.batch_polls_to_finish, server.batch_expire_after = 1, 5
    done = backend(stage, *POLL_QUICKLY)
    assert done.returncode == 0, done.stderr
    assert [(b["status"], b["request_counts"]["total"]) for b in server.batches()] == [
        ("expired", 12),
        ("expired", 7),
        ("completed", 2),
    ]
    rows = read_jsonl(tmp_path / "infer.jsonl")
    assert len(rows) == 12 and len({r["idx"] for r in rows}) == 12


def test_backend_batch_for_the_judge_and_error_recovery_chains(server, stage, tmp_path):
    server.batch_polls_to_finish = 1
    backend(stage, *POLL_QUICKLY)
    proc = stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--backend", "batch", *POLL_QUICKLY)
    assert proc.returncode == 0, proc.stderr
    assert {r["judge_status"] for r in read_jsonl(tmp_path / "judge.jsonl")} == {"ok"}
    server.handler = er_handler()
    er_run = ["--bench", "error_recovery", "--model", "m", "--output", "er.jsonl"]
    proc = stage("infer", *er_run, "--backend", "batch", *POLL_QUICKLY)
    assert proc.returncode == 0, proc.stderr
    assert len(read_jsonl(tmp_path / "er.jsonl")) == 30 and server.chat_requests() == []
    assert [b["request_counts"]["total"] for b in server.batches()][-2:] == [30, 30]  # reasoning, then extraction


def test_backend_batch_without_a_batch_api_is_exit_4(server, stage, tmp_path):
    stage.env["OPENAI_BASE_URL"] = server.base_url.replace("/v1", "/no-batches-here")  # every call: 404
    proc = backend(stage)
    assert proc.returncode == 4 and "Batch API refused" in proc.stderr and API_KEY not in proc.stderr
    assert not (tmp_path / "infer.jsonl.batch.json").exists()


def test_vllm_style_error_lines_are_read(server, stage, tmp_path):
    stage.infer("--max-samples", "2", "--export-batch", "req.jsonl", check=0)
    lines = read_jsonl(tmp_path / "req.jsonl")
    errors = [
        {
            "id": "vllm-1",
            "custom_id": lines[0]["custom_id"],
            "response": {"status_code": 400, "request_id": "r"},
            "error": "This model's maximum context length is 2048 tokens",
        },
        {
            "id": "vllm-2",
            "custom_id": lines[1]["custom_id"],
            "response": {"status_code": 500, "request_id": "r", "body": {"error": "engine crashed"}},
            "error": None,
        },
    ]
    (tmp_path / "err.jsonl").write_text("".join(json.dumps(e) + "\n" for e in errors))
    proc = stage.infer("--max-samples", "2", "--import-batch", "err.jsonl")
    assert proc.returncode == 3, proc.stderr
    [row] = read_jsonl(tmp_path / "infer.jsonl")
    assert row["status"] == "context_length"  # final, as online
    assert "engine crashed" in read_jsonl(tmp_path / "infer.jsonl.failed.jsonl")[0]["error"]


def test_open_batches_keep_other_engines_and_other_configurations_out(server, stage, tmp_path):
    server.batch_polls_to_finish = 5
    assert backend(stage, "--temperature", "0.2").returncode == 75
    proc = backend(stage, "--temperature", "0.9")  # no rows yet, but paid-for calls in flight
    assert proc.returncode == 2 and "temperature: 0.2 → 0.9" in proc.stderr
    for flags in ([], ["--export-batch", "x.jsonl"]):
        proc = stage.infer("--temperature", "0.2", *flags)
        assert proc.returncode == 2 and "still open" in proc.stderr and "--backend batch" in proc.stderr
    assert stage.infer("--temperature", "0.2", "--dry-run").returncode == 0  # a dry run sends nothing
    assert server.chat_requests() == [] and len(server.batches()) == 1


def test_a_batch_that_fails_validation_stops_with_its_reasons(server, stage, tmp_path):
    server.batch_fail_validation = True
    proc = backend(stage, "--batch-wait", "10", "--batch-poll", "0.05")
    assert proc.returncode == 2 and "failed validation" in proc.stderr and "batch_fail_validation" in proc.stderr
    assert len(server.batches()) == 1  # not resubmitted in a loop


def test_a_request_that_keeps_failing_is_given_up_after_three_batches(server, stage, tmp_path):
    failing = read_jsonl(ROOT / "data" / "clbench" / "sample.jsonl")[0]["messages"][-1]["content"]
    server.handler = lambda r: Reply.error(400, "unsupported content") if r.last_content == failing else scripted(r)
    server.batch_polls_to_finish = 1
    proc = backend(stage, *POLL_QUICKLY)
    assert proc.returncode == 3 and "failed in 3 batches" in proc.stderr
    assert [b["request_counts"]["total"] for b in server.batches()] == [12, 1, 1]
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 11
    assert backend(stage).returncode == 3 and len(server.batches()) == 3  # and not again on the next run
