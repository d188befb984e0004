"""Killed, interrupted, overlapping and failing runs: nothing paid for is lost or written twice."""

import os
import signal
import time
from collections import Counter

import pytest

from evalpipe.devtools.testserver import Reply
from evalpipe.store import lock

from .conftest import API_KEY, SAMPLE, is_judge, read_jsonl, scripted

pytestmark = pytest.mark.e2e


def slow(delay):
    def handler(request):
        reply = scripted(request)
        reply.delay = delay
        return reply

    return handler


def wait_for_rows(path, n, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {n} rows")


def by_id(rows):
    return {r["idx"]: r for r in rows}


def clean_run(stage, tmp_path, server):
    server.handler = scripted
    stage("infer", "--model", "m", "--output", "clean/infer.jsonl", check=0)
    stage("judge", "--input", "clean/infer.jsonl", "--judge-model", "j", check=0)
    return read_jsonl(tmp_path / "clean" / "infer.jsonl"), read_jsonl(tmp_path / "clean" / "judge.jsonl")


def comparable(row):
    return {k: v for k, v in row.items() if k not in ("latency_s", "judge_latency_s")}


def test_kill_9_mid_run_then_resume_gives_the_uninterrupted_result(server, stage, tmp_path):
    clean_infer, clean_judge = clean_run(stage, tmp_path, server)
    out = tmp_path / "run" / "infer.jsonl"
    for script, args, target in (
        ("infer", ("--model", "m", "--output", out), out),
        ("judge", ("--input", out, "--judge-model", "j"), out.with_name("judge.jsonl")),
    ):
        server.handler = slow(0.15)
        proc = stage.popen(script, *args, "--workers", "3")
        wait_for_rows(target, 4, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        written = len(read_jsonl(target))
        assert 4 <= written < 12
        server.handler = scripted
        before = len(server.chat_requests())
        stage(script, *args, check=0)
        # only the tasks without a row were asked again (plus at most the ones in flight at the kill)
        assert len(server.chat_requests()) - before == 12 - written
        rows = read_jsonl(target)
        assert Counter(r["idx"] for r in rows) == Counter(
            r["idx"] for r in (clean_infer if script == "infer" else clean_judge)
        )
    assert {k: comparable(v) for k, v in by_id(read_jsonl(out)).items()} == {
        k: comparable(v) for k, v in by_id(clean_infer).items()
    }
    judged = by_id(read_jsonl(out.with_name("judge.jsonl")))
    assert {k: v["score"] for k, v in judged.items()} == {k: v["score"] for k, v in by_id(clean_judge).items()}


def test_torn_last_line_is_repaired_before_appending(server, stage, tmp_path):
    stage.infer("--max-samples", "5", check=0)
    path = tmp_path / "infer.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3]) + lines[3][:40])  # as if killed while writing row 4
    proc = stage.infer("--max-samples", "5", check=0)
    assert "torn last line" in proc.stderr
    rows = read_jsonl(path)  # every line parses
    assert len(rows) == 5 and len({r["idx"] for r in rows}) == 5


def test_sigterm_stops_cleanly_and_the_rerun_finishes(server, stage, tmp_path):
    server.handler = slow(0.3)
    proc = stage.popen("infer", "--model", "m", "--output", "infer.jsonl", "--workers", "2", "--grace", "5")
    wait_for_rows(tmp_path / "infer.jsonl", 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "SIGTERM received" in err
    rows = read_jsonl(tmp_path / "infer.jsonl")
    assert len(rows) < 12
    server.handler = scripted
    stage.infer(check=0)
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 12


def test_a_second_run_on_the_same_output_exits_with_the_lock_code(server, stage, tmp_path):
    out = tmp_path / "infer.jsonl"
    out.write_bytes(b'{"idx": "x"}\n')
    with lock.exclusive(out):
        proc = stage("infer", "--model", "m", "--output", out)
    assert proc.returncode == 5
    assert f"pid {os.getpid()}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert out.read_bytes() == b'{"idx": "x"}\n'
    assert server.chat_requests() == []


def test_failed_tasks_go_to_the_side_file_and_are_retried_next_run(server, stage, tmp_path):
    bad = read_jsonl(SAMPLE)[2]["messages"][-1]["content"]

    def flaky(request):
        if request.last_content == bad:
            return Reply.error(503, "overloaded")
        return scripted(request)

    server.handler = flaky
    proc = stage.infer("--max-retries", "1", "--backoff", "0.01")
    assert proc.returncode == 3, proc.stderr
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 11
    (failure,) = read_jsonl(tmp_path / "infer.jsonl.failed.jsonl")
    assert failure["idx"] == read_jsonl(SAMPLE)[2]["metadata"]["task_id"] and "HTTP 503" in failure["error"]
    server.handler = scripted
    before = len(server.chat_requests())
    stage.infer(check=0)
    assert len(server.chat_requests()) - before == 1
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 12


def test_context_length_is_a_final_row_judged_zero_without_a_call(server, stage, tmp_path):
    long_task = read_jsonl(SAMPLE)[0]["messages"][-1]["content"]

    def handler(request):
        if request.last_content == long_task:
            return Reply.error(
                400, "This model's maximum context length is 4096 tokens", code="context_length_exceeded"
            )
        return scripted(request)

    server.handler = handler
    stage.infer("--max-samples", "3", check=0)
    rows = by_id(read_jsonl(tmp_path / "infer.jsonl"))
    row = rows[read_jsonl(SAMPLE)[0]["metadata"]["task_id"]]
    assert (row["model_output"], row["status"]) == ("", "context_length") and "maximum context" in row["error"]
    stage.infer("--max-samples", "3", check=0)  # final: not retried
    assert sum(r.last_content == long_task for r in server.chat_requests()) == 1
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    judged = by_id(read_jsonl(tmp_path / "judge.jsonl"))[row["idx"]]
    assert (judged["score"], judged["judge_status"]) == (0, "empty_output")
    assert sum(is_judge(r) for r in server.chat_requests()) == 2


def test_auth_failure_stops_the_run_with_one_line_and_no_key(server, stage, tmp_path):
    server.handler = lambda r: Reply.error(401, f"Incorrect API key provided: {API_KEY}")
    proc = stage.infer("--workers", "4")
    assert proc.returncode == 4
    assert API_KEY not in proc.stderr + proc.stdout
    assert "infer: error:" in proc.stderr and "HTTP 401" in proc.stderr and "Traceback" not in proc.stderr
    assert len(server.chat_requests()) <= 4  # the ones already in flight, nothing after
    assert read_jsonl(tmp_path / "infer.jsonl") == []


def test_a_rerun_under_another_configuration_is_refused(server, stage, tmp_path):
    stage.infer("--max-samples", "3", "--temperature", "0.2", check=0)
    before = (tmp_path / "infer.jsonl").read_bytes()
    # more samples, other workers and retries: the same run, resumed
    stage.infer("--max-samples", "5", "--temperature", "0.2", "--workers", "3", "--max-retries", "2", check=0)
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 5
    before = (tmp_path / "infer.jsonl").read_bytes()
    proc = stage.infer("--temperature", "0.7")
    assert proc.returncode == 2
    assert "temperature: 0.2 → 0.7" in proc.stderr and "--allow-config-change" in proc.stderr
    assert (tmp_path / "infer.jsonl").read_bytes() == before
    other = tmp_path / "other.jsonl"
    other.write_text((tmp_path / "infer.jsonl").read_text())
    (tmp_path / "other.jsonl.manifest.json").write_text((tmp_path / "infer.jsonl.manifest.json").read_text())
    proc = stage("infer", "--model", "m2", "--output", "other.jsonl", "--temperature", "0.2")
    assert proc.returncode == 2 and "model: 'm' → 'm2'" in proc.stderr
    other.write_text("")  # no row, but finished calls of chained tasks in the step cache: paid for all the same
    (tmp_path / "other.jsonl.steps.jsonl").write_text('{"task": "t0", "step": 0}\n')
    proc = stage("infer", "--model", "m2", "--output", "other.jsonl", "--temperature", "0.2")
    assert proc.returncode == 2 and "model: 'm' → 'm2'" in proc.stderr
    stage.infer("--temperature", "0.7", "--allow-config-change", check=0)
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 12
