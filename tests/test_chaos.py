"""Faults, kills, overlaps, hostile input, secrets and paths (make chaos runs the long version)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from evalpipe.benchmarks import get
from evalpipe.devtools import chaos
from evalpipe.devtools.testserver import Reply

from .conftest import API_KEY, ROOT, SAMPLE, read_jsonl, scripted

pytestmark = pytest.mark.e2e
ORACLE = chaos.oracle_for(get("clbench"))


@pytest.mark.parametrize("bench", chaos.BENCHES)
def test_short_chaos_loses_nothing(tmp_path, bench):
    run = chaos.Chaos(tmp_path, kills=2, rate=0.3, seed=len(bench), size=60)
    try:
        result = run.bench(bench)
    finally:
        run.close()
    assert result["lost"] == 0 and result["infer_duplicates"] == 0 and result["rows"] > 0
    assert run.kills_done >= 1 and sum(run.faults.values()) > 0
    assert run.leaked() == []


def test_every_fault_kind_is_survived(tmp_path):
    """Each fault alone, against one short infer run: all rows arrive, the key never shows."""
    run = chaos.Chaos(tmp_path, kills=0, rate=1.0, seed=3)
    try:
        for kind in chaos.FAULTS:
            served = {"n": 0}

            def once_then_good(request, kind=kind, served=served):
                served["n"] += 1
                if served["n"] % 2:  # every other request gets the fault
                    handler = chaos.faulty(ORACLE, 1.0, _Fixed(kind), run.faults)
                    return handler(request)
                return ORACLE(request)

            run.server.handler = once_then_good
            out = tmp_path / kind.replace(" ", "_")
            run.run_killing(run.cmd("infer", "clbench", out, ["--max-samples", "4"]))
            rows = read_jsonl(out / "clbench" / "chaos-model" / "run-1" / "infer.jsonl")
            assert len(rows) == 4, kind
        assert set(run.faults) == set(chaos.FAULTS)
        assert run.leaked() == []
    finally:
        run.close()


class _Fixed:
    """A stand-in random source that always injects one fault kind."""

    def __init__(self, kind):
        self.kind = kind

    def random(self):
        return 0.0

    def choice(self, _):
        return self.kind


def test_hostile_inputs_fail_cleanly_and_odd_ones_run(server, env, tmp_path):
    assert chaos.try_hostile(tmp_path, env) == len(chaos.hostile_inputs()) + len(chaos.handled_inputs())


def test_a_50_mb_line_is_read_and_becomes_a_context_length_row(server, stage, tmp_path):
    rows = read_jsonl(SAMPLE)[:2]
    rows[1]["messages"][-1]["content"] = "x" * 50_000_000
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    server.handler = lambda r: (
        Reply.error(400, "maximum context length exceeded", code="context_length_exceeded")
        if len(r.last_content) > 1_000_000
        else scripted(r)
    )
    stage("infer", "--model", "m", "--input", "big.jsonl", "--output", "o.jsonl", check=0, timeout=300)
    statuses = sorted(r["status"] for r in read_jsonl(tmp_path / "o.jsonl"))
    assert statuses == ["context_length", "ok"]


def test_sigint_mid_run_keeps_finished_rows(server, stage, tmp_path):
    server.handler = lambda r: Reply(content="a", delay=0.3)
    proc = stage.popen("infer", "--model", "m", "--output", "o.jsonl", "--workers", "2")
    deadline = time.monotonic() + 20
    while (
        time.monotonic() < deadline
        and not (tmp_path / "o.jsonl").exists()
        or (tmp_path / "o.jsonl").stat().st_size == 0
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "SIGINT received" in err
    assert 1 <= len(read_jsonl(tmp_path / "o.jsonl")) < 12


def test_two_overlapping_runs_one_proceeds_one_exits_locked(server, stage, tmp_path):
    server.handler = lambda r: Reply(content="a", delay=1.5)  # the first run lasts ~3 s: long past the second's start
    first = stage.popen("infer", "--model", "m", "--output", "o.jsonl")
    deadline = time.monotonic() + 30
    while not server.chat_requests() and time.monotonic() < deadline:  # the first run holds the lock
        time.sleep(0.02)
    second = stage.popen("infer", "--model", "m", "--output", "o.jsonl")
    assert (first.wait(60), second.wait(60)) == (0, 5)
    ids = [r["idx"] for r in read_jsonl(tmp_path / "o.jsonl")]
    assert len(ids) == len(set(ids)) == 12


@pytest.mark.parametrize("model, folder", [("org/model:tag", "org_model_tag"), ("../../x", "x"), ("..", "model")])
def test_model_names_map_to_safe_folders_inside_outputs(server, stage, tmp_path, model, folder):
    stage("infer", "--model", model, "--max-samples", "1", check=0)
    made = [p for p in tmp_path.rglob("infer.jsonl")]
    assert made == [tmp_path / "outputs" / "clbench" / folder / "run-1" / "infer.jsonl"]


def test_outputs_follow_the_umask_but_are_never_world_writable(server, env, tmp_path):
    def run(mask, out):
        for script, *args in [("infer.py", "--max-samples", "2"), ("judge.py", "--judge-model", "j")]:
            subprocess.run(
                [sys.executable, str(ROOT / script), "--model", "m", *args, "--outputs-dir", str(out)],
                env=env,
                cwd=tmp_path,
                check=True,
                capture_output=True,
                preexec_fn=lambda: os.umask(mask),
            )
        return [p for p in out.rglob("*")]

    for path in run(0o000, tmp_path / "open"):
        assert path.stat().st_mode & 0o002 == 0, path
    for path in run(0o077, tmp_path / "private"):
        assert path.stat().st_mode & 0o077 == 0, path


def test_the_key_never_leaves_even_when_echoed(server, stage, tmp_path):
    server.handler = lambda r: Reply.error(503, f"upstream said: Authorization: {r.headers['authorization']}")
    proc = stage("infer", "--model", "m", "--output", "o.jsonl", "--max-retries", "1", "--backoff", "0.01")
    assert proc.returncode == 3
    assert API_KEY not in proc.stdout + proc.stderr
    assert "[REDACTED]" in (tmp_path / "o.jsonl.failed.jsonl").read_text()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
