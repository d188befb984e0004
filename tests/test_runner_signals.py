"""The pipeline runner as a job: killed whole (a CI cancel, `timeout -s KILL`, a scheduler), its stage killed, or
misspelt on make's command line."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalpipe.devtools.testserver import FakeOpenAI, Reply
from evalpipe.store import lock

from .conftest import ROOT

pytestmark = pytest.mark.e2e


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie (it holds no lock; nobody here may reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def slow_server():
    srv = FakeOpenAI(lambda request: Reply(content="YES", delay=1.0)).start()
    yield srv
    srv.stop()


def start_job(env: dict, out: Path) -> subprocess.Popen:
    """`make infer`'s runner in a process group (a session) of its own, as a job is; returns once its stage calls."""
    return subprocess.Popen(
        [sys.executable, "-m", "evalpipe.pipeline", "infer", "BENCH=coin_flip", "MODEL=m", "RUNS=1"]
        + ["MAX_SAMPLES=40", "WORKERS=2", f"OUTPUTS={out}"],
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )


def stage_pid(output: Path) -> int:
    until(lambda: Path(f"{output}.lock").exists() and Path(f"{output}.lock").read_text().strip())
    return int(Path(f"{output}.lock").read_text())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_signal_to_the_job_s_process_group_ends_its_stage(slow_server, env, tmp_path, sig):
    env = {**env, "OPENAI_BASE_URL": slow_server.base_url}
    output = tmp_path / "coin_flip" / "m" / "run-1" / "infer.jsonl"
    job = start_job(env, tmp_path)
    pid = stage_pid(output)
    until(lambda: slow_server.chat_requests())
    os.killpg(job.pid, sig)
    code = job.wait(30)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 130), job.stderr.read() if job.stderr else ""
    until(lambda: gone(pid), timeout=15)  # SIGKILL: at once; SIGTERM: once its calls in flight are answered
    asked = len(slow_server.chat_requests())
    time.sleep(1.5)
    assert len(slow_server.chat_requests()) == asked  # no paid call after the job ended
    with lock.exclusive(output):  # the next run takes the lock at once
        pass


def test_a_stage_killed_by_a_signal_makes_the_runner_exit_128_plus_its_number(slow_server, env, tmp_path):
    env = {**env, "OPENAI_BASE_URL": slow_server.base_url}
    job = start_job(env, tmp_path)
    os.kill(stage_pid(tmp_path / "coin_flip" / "m" / "run-1" / "infer.jsonl"), signal.SIGKILL)
    _, stderr = job.communicate(timeout=30)
    assert job.returncode == 128 + signal.SIGKILL, stderr
    assert "infer.py was killed by signal 9 (SIGKILL)" in stderr


def test_make_refuses_a_misspelt_variable_and_names_the_nearest(server, env):
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "infer", "judge", "score", "BENCH=coin_flip", "RUN=1", "MAX_SAMPLE=5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "RUN= (did you mean RUNS?)" in done.stderr, done.stderr
    assert "MAX_SAMPLE= (did you mean MAX_SAMPLES?)" in done.stderr
    assert not server.chat_requests()  # refused before any stage ran
