"""What a newcomer meets first: a dead endpoint, exit codes through make and the runner, make
variables, run variants, dry runs and the local server's lines."""

import json
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from evalpipe import pipeline
from evalpipe.devtools import demo, localmodel
from evalpipe.devtools.testserver import FakeOpenAI, Reply
from evalpipe.store import lock

from .conftest import ROOT, SAMPLE, closed_port, make, plain_http_port, read_jsonl, runner, scripted

COIN_FLIP = ROOT / "data" / "coin_flip" / "test.jsonl"


# ---- 1. a dead endpoint fails in seconds, with its own exit code


@pytest.mark.e2e
@pytest.mark.parametrize(
    "url, reason",
    [
        (f"http://127.0.0.1:{closed_port()}/v1", "connection refused"),
        ("http://no-such-host.invalid/v1", "unknown host"),
    ],
)
def test_a_dead_endpoint_stops_in_seconds(stage, tmp_path, url, reason):
    stage.env["OPENAI_BASE_URL"] = url
    started = time.monotonic()
    proc = stage.infer()
    assert proc.returncode == 69, proc.stderr
    assert time.monotonic() - started < 20
    [line] = [said for said in proc.stderr.splitlines() if "error" in said]
    assert line.startswith(f"infer: error: cannot reach {url}: {reason}") and "OPENAI_BASE_URL" in line
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "infer.jsonl.failed.jsonl").exists()  # no task is blamed for it


@pytest.mark.e2e
def test_tls_to_a_plain_http_server_is_unreachable(stage):
    with plain_http_port() as port:
        stage.env["OPENAI_BASE_URL"] = f"https://127.0.0.1:{port}/v1"
        started = time.monotonic()
        proc = stage.infer()
    assert proc.returncode == 69 and "TLS failed" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 20


@pytest.mark.e2e
def test_a_url_without_v1_gets_the_hint(server, stage):
    root_url = server.base_url.removesuffix("/v1")
    stage.env["OPENAI_BASE_URL"] = root_url
    proc = stage.infer()
    assert proc.returncode == 69, proc.stderr
    assert f"no OpenAI-compatible API at {root_url}" in proc.stderr
    assert f"the URL may be missing /v1: try {root_url}/v1" in proc.stderr
    assert "refused model" not in proc.stderr


@pytest.mark.e2e
def test_an_unknown_model_is_still_a_refusal(server, stage):
    server.handler = lambda request: Reply.error(404, "The model `m` does not exist.", code="model_not_found")
    proc = stage.infer()
    assert proc.returncode == 4 and "refused model 'm'" in proc.stderr


@pytest.mark.e2e
def test_an_endpoint_that_goes_away_after_answering_is_retried(tmp_path, stage):
    def slow(request):
        reply = scripted(request)
        reply.delay = 0.05
        return reply

    first = FakeOpenAI(slow).start()
    stage.env["OPENAI_BASE_URL"] = first.base_url
    proc = stage.popen("infer", "--model", "m", "--output", "infer.jsonl", "--workers", "1", "--backoff", "0.5")
    try:
        deadline = time.monotonic() + 30
        while len(first.chat_requests()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        first.stop()  # connections refused from now on, after the endpoint has answered
        time.sleep(1.5)
        second = FakeOpenAI(slow, port=first.port).start()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    second.stop()
    assert proc.returncode == 0, err
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 12 and second.chat_requests()


@pytest.mark.e2e
def test_make_stops_at_a_dead_endpoint_and_shows_its_code(env, tmp_path):
    env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{closed_port()}/v1"
    proc = make(env, "infer", "judge", "score", f"OUTPUTS={tmp_path}", "RUNS=1", timeout=120)
    assert proc.returncode == 2 and "Error 69" in proc.stderr and "cannot reach" in proc.stderr
    assert "judge first" not in proc.stderr and not list(tmp_path.rglob("judge.jsonl"))
    proc = runner(env, "infer", "judge", "score", f"OUTPUTS={tmp_path}", "RUNS=1", timeout=120)
    assert proc.returncode == 69, proc.stderr


# ---- 2. the runner's exit code is the stage's


@pytest.mark.e2e
def test_the_runner_exits_5_when_another_run_holds_the_lock(server, env, tmp_path):
    output = tmp_path / "clbench" / "m" / "run-1" / "infer.jsonl"
    with lock.exclusive(output):
        proc = runner(env, "infer", "judge", "score", "MODEL=m", f"OUTPUTS={tmp_path}", "RUNS=1", "MAX_SAMPLES=2")
    assert proc.returncode == 5, proc.stderr
    assert "pipeline: infer stopped with exit code 5" in proc.stderr


@pytest.mark.e2e
def test_an_incomplete_infer_lets_judge_and_score_go_on_and_ends_with_3(server, env, tmp_path):
    failing = read_jsonl(SAMPLE)[1]["messages"][-1]["content"]

    def one_task_fails(request):
        return Reply.error(400, "unsupported") if request.last_content == failing else scripted(request)

    server.handler = one_task_fails
    words = ["infer", "judge", "score", "aggregate", "MODEL=m", "JUDGE_MODEL=j", f"OUTPUTS={tmp_path}", "RUNS=2"]
    proc = runner(env, *words)
    assert proc.returncode == 3, proc.stderr
    assert "pipeline: incomplete (exit 3)" in proc.stderr
    for k in (1, 2):
        run = tmp_path / "clbench" / "m" / f"run-{k}"
        assert len(read_jsonl(run / "judge.jsonl")) == 11
        assert json.loads((run / "score.json").read_text())["coverage"]["missing"] == 1
    assert (tmp_path / "clbench" / "aggregate.json").exists()
    server.handler = scripted
    proc = runner(env, *words)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.e2e
def test_waiting_batches_stop_before_the_next_stage_with_75(env, tmp_path):
    with FakeOpenAI(scripted, batch_polls_to_finish=5) as srv:
        env["OPENAI_BASE_URL"] = srv.base_url
        proc = runner(
            env,
            "infer",
            "judge",
            "score",
            "MODEL=m",
            f"OUTPUTS={tmp_path}",
            "RUNS=2",
            "MAX_SAMPLES=2",
            "ARGS=--backend batch",
        )
    assert proc.returncode == 75, proc.stderr
    assert len(list(tmp_path.rglob("infer.jsonl.batch.json"))) == 2  # both runs submitted
    assert not list(tmp_path.rglob("judge.jsonl*"))


@pytest.mark.e2e
def test_sigterm_to_the_runner_stops_the_stage_cleanly(server, env, tmp_path):
    def slow(request):
        reply = scripted(request)
        reply.delay = 0.3
        return reply

    server.handler = slow
    words = ["infer", "judge", "score", "MODEL=m", "JUDGE_MODEL=j", f"OUTPUTS={tmp_path}", "RUNS=1", "WORKERS=2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalpipe.pipeline", *words],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    infer_rows = tmp_path / "clbench" / "m" / "run-1" / "infer.jsonl"
    deadline = time.monotonic() + 30
    while not (infer_rows.exists() and infer_rows.read_bytes().count(b"\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # to the runner only: it passes the signal on
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGTERM received" in err and not (tmp_path / "clbench" / "m" / "run-1" / "judge.jsonl").exists()
    kept = read_jsonl(infer_rows)
    assert 2 <= len(kept) < 12
    server.handler = scripted
    proc = runner(env, *words)
    assert proc.returncode == 0, proc.stderr
    ids = [r["idx"] for r in read_jsonl(infer_rows)]
    assert len(ids) == len(set(ids)) == 12


# ---- 3. make variables are checked and quoted


@pytest.mark.e2e
@pytest.mark.parametrize(
    "word, message",
    [
        ("RUNS=-1", "RUNS=-1: expected a whole number of 1 or more"),
        ("RUNS=three", "RUNS=three: expected a whole number of 1 or more"),
        ("RUNS=0", "RUNS=0: expected a whole number of 1 or more"),
        ("MAX_SAMPLES=0", "MAX_SAMPLES=0: expected a whole number of 1 or more"),
        ("WORKERS=many", "WORKERS=many: expected a whole number of 1 or more"),
        ("BENCH=nope", "BENCH=nope: unknown benchmark"),
        ("ARGS=--x 'open", "ARGS=--x 'open: No closing quotation"),
        ("MAX_COST=inf", "MAX_COST=inf: expected an amount in USD above 0"),  # no cap at all is no amount
    ],
)
def test_bad_make_variables_get_one_line_and_exit_2(env, tmp_path, word, message):
    proc = make(env, "infer", "judge", "score", "aggregate", f"OUTPUTS={tmp_path}", word)
    assert proc.returncode == 2
    assert f"pipeline: error: {message}" in proc.stderr
    assert not list(tmp_path.iterdir())
    assert runner(env, "infer", word).returncode == 2


@pytest.mark.e2e
def test_paths_with_spaces_work_in_every_target(server, env, tmp_path):
    data = tmp_path / "my data" / "coin flip.jsonl"
    data.parent.mkdir()
    data.write_bytes(COIN_FLIP.read_bytes())
    out = tmp_path / "out dir"
    proc = make(
        env,
        "infer",
        "judge",
        "score",
        "aggregate",
        "BENCH=coin_flip",
        "MODEL=m",
        "RUNS=1",
        "MAX_SAMPLES=5",
        f"DATA={data}",
        f"OUTPUTS={out}",
    )
    assert proc.returncode == 0, proc.stderr
    assert len(read_jsonl(out / "coin_flip" / "m" / "run-1" / "judge.jsonl")) == 5
    proc = make(env, "report", f"OUTPUTS={out}")
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").exists()


# ---- 4. two configurations of one model


@pytest.mark.e2e
def test_a_label_gives_a_variant_its_own_folder_and_row(server, env, tmp_path):
    common = ["BENCH=coin_flip", "MODEL=m", "RUNS=1", "MAX_SAMPLES=6", f"OUTPUTS={tmp_path}"]
    assert make(env, "infer", "judge", "score", "aggregate", *common).returncode == 0
    refused = make(env, "infer", *common, "ARGS=--fewshot 3")
    assert refused.returncode == 2 and "another configuration" in refused.stderr
    proc = make(env, "infer", "judge", "score", "aggregate", *common, "LABEL=3shot", "ARGS=--fewshot 3")
    assert proc.returncode == 0, proc.stderr
    shots = read_jsonl(tmp_path / "coin_flip" / "m@3shot" / "run-1" / "infer.jsonl")
    assert len(shots) == 6 and all(len(r["messages"][-1]["content"]) > 1000 for r in shots)  # the demos are in
    aggregate = json.loads((tmp_path / "coin_flip" / "aggregate.json").read_text())
    assert sorted(m["model"] for m in aggregate["models"]) == ["m", "m@3shot"]


@pytest.mark.e2e
def test_allow_config_change_that_adds_no_row_changes_nothing(server, stage, tmp_path):
    stage.infer("--max-samples", "3", check=0)
    manifest = tmp_path / "infer.jsonl.manifest.json"
    recorded = json.loads(manifest.read_text())["fingerprint"]
    stage.infer("--max-samples", "3", "--temperature", "0.5", "--allow-config-change", check=0)
    assert json.loads(manifest.read_text())["fingerprint"] == recorded
    stage.infer("--max-samples", "3", check=0)  # not refused
    # adds a row: the new configuration is the record now
    stage.infer("--max-samples", "4", "--temperature", "0.5", "--allow-config-change", check=0)
    assert json.loads(manifest.read_text())["fingerprint"]["temperature"] == 0.5


# ---- 6. smaller things


@pytest.mark.e2e
def test_aggregate_uses_the_runs_that_exist_unless_runs_is_given(server, env, tmp_path):
    common = ["BENCH=coin_flip", "MODEL=m", "MAX_SAMPLES=4", f"OUTPUTS={tmp_path}"]
    assert make(env, "infer", "judge", "score", *common, "RUNS=2").returncode == 0
    proc = make(env, "aggregate", *common)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "coin_flip" / "aggregate.json").read_text())["models"][0]["runs"] == [1, 2]
    proc = runner(env, "aggregate", *common, "RUNS=3")
    assert proc.returncode == 3 and "no score.json for run(s) [3]" in proc.stderr


@pytest.mark.e2e
def test_dry_run_writes_nothing(server, stage, tmp_path):
    proc = stage("infer", "--model", "m", "--outputs-dir", "out", "--dry-run", check=0)
    assert "calls" in proc.stdout + proc.stderr
    assert not (tmp_path / "out").exists()
    stage("infer", "--model", "m", "--outputs-dir", "out", "--max-samples", "2", check=0)
    before = sorted(p.name for p in (tmp_path / "out").rglob("*"))
    stage("judge", "--model", "m", "--outputs-dir", "out", "--judge-model", "j", "--dry-run", check=0)
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == before
    assert len(server.chat_requests()) == 2


@pytest.mark.e2e
def test_the_judge_model_default_is_judge_py_s(server, env, tmp_path):
    proc = make(env, "infer", "judge", "MODEL=m", "RUNS=1", "MAX_SAMPLES=2", f"OUTPUTS={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads((tmp_path / "clbench" / "m" / "run-1" / "judge.jsonl.manifest.json").read_text())
    assert recorded["judge_model"] == "gpt-5.1"


# ---- 5. the local server's lines


def test_serve_local_prints_commands_the_runner_accepts():
    for bench in demo.PLAN:
        words = shlex.split(demo.make_line(bench))
        assert words[:4] == ["make", "infer", "judge", "score"]
        plan = pipeline.parse(words[1:])
        assert plan.get("WORKERS") == "1" and plan.get("MODEL") == localmodel.MODEL_NAME


def test_serve_local_says_when_its_port_is_taken():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit, match=f"port {port} is in use.*LOCAL_PORT="):
            localmodel.free_port(port)
    assert localmodel.free_port(port) == port
