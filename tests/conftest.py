import json
import os
import re
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from evalpipe.devtools.slurmcluster import SlurmCluster, SlurmUnavailable
from evalpipe.devtools.testserver import FakeOpenAI, Reply

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "clbench" / "sample.jsonl"
SHARED = ROOT.parent / "shared"
API_KEY = "sk-test-SECRET-0123456789abcdef"


def judge_json(score: int, n: int, rationale: str = "checked") -> str:
    status = ["yes"] * n if score else ["yes"] * (n - 1) + ["no"]
    return json.dumps(
        {"Grading Rationale": rationale, "List of Requirement Satisfaction Status": status, "Overall Score": score}
    )


def is_judge(request) -> bool:
    return "Response to grade:" in request.last_content


def rubric_count(prompt: str) -> int:
    section = prompt.split("Rubrics:\n", 1)[1].split("\n\nResponse to grade:", 1)[0]
    return sum(1 for line in section.splitlines() if re.match(r"\d+\. ", line))


def scripted(request) -> Reply:
    """Model: echoes the end of the last turn. Judge: 1 when the answer's character sum is even."""
    prompt = request.last_content
    if is_judge(request):
        answer = prompt.split("<<<RESPONSE\n", 1)[1].split("\nRESPONSE>>>", 1)[0]
        return Reply(content=judge_json(1 - sum(map(ord, answer)) % 2, rubric_count(prompt)))
    return Reply(content="Answer: " + prompt[-60:])


@pytest.fixture
def server():
    srv = FakeOpenAI(scripted).start()
    yield srv
    srv.stop()


@pytest.fixture
def env(server):
    # (and no scheduler's shard: the suite run inside a Slurm array task or an Indexed Job's pod runs whole runs)
    e = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "JUDGE_", "SLURM_ARRAY_", "JOB_COMPLETION"))
    }
    e.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY=API_KEY, PYTHONUNBUFFERED="1")
    return e


class Stage:
    """Runs the real stage scripts as subprocesses."""

    def __init__(self, env, cwd):
        self.env, self.cwd = env, cwd

    def __call__(self, script, *args, timeout=120, check=None):
        proc = subprocess.run(
            [sys.executable, str(ROOT / f"{script}.py"), *map(str, args)],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check is not None:
            assert proc.returncode == check, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def infer(self, *args, timeout=120, check=None):
        """infer.py of model m into infer.jsonl, with these further arguments: the run most tests make."""
        return self("infer", "--model", "m", "--output", "infer.jsonl", *args, timeout=timeout, check=check)

    def popen(self, script, *args):
        return subprocess.Popen(
            [sys.executable, str(ROOT / f"{script}.py"), *map(str, args)],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def stage(env, tmp_path):
    return Stage(env, tmp_path)


def make(env, *words, timeout=300):
    """`make -s` of the repo with these targets and variables."""
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), *map(str, words)], env=env, capture_output=True, text=True, timeout=timeout
    )


def module(env, name, *args, cwd=ROOT, timeout=300):
    """`python -m name args` run as a user would, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", name, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def runner(env, *words, timeout=300):
    """The pipeline runner (what make's stage targets call) with these stages and variables."""
    return module(env, "evalpipe.pipeline", *words, timeout=timeout)


def read_jsonl(path):
    # lines end at "\n" only: str.splitlines would also cut at U+2028 and friends, which JSON strings may hold
    return [json.loads(line) for line in Path(path).read_text().split("\n") if line.strip()]


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


def judged_rows(scores):
    """Judge rows for the first len(scores) sample tasks with the given scores."""
    rows = []
    for row, score in zip(read_jsonl(SAMPLE), scores):
        rows.append(
            {
                "idx": row["metadata"]["task_id"],
                "messages": row["messages"],
                "model_output": "x",
                "rubrics": row["rubrics"],
                "metadata": row["metadata"],
                "grading_rationale": "",
                "requirement_status": [],
                "score": score,
                "judge_status": "ok",
            }
        )
    return rows


def score_missing_one(folder, data, env=None, command=None) -> dict:
    """score.json of CoinFlip's score.py (or python `command`, which runs it) over folder/judge.jsonl, with
    --data: a run where a task has no row (exit 3)."""
    done = subprocess.run(
        [sys.executable, *(command or [str(ROOT / "score.py")]), "--bench", "coin_flip", "--input", "judge.jsonl"]
        + ["--data", str(data)],
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 3, done.stderr  # a task has no row
    return json.loads((Path(folder) / "score.json").read_text())


def closed_port() -> int:
    """A loopback port nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def plain_http_port():
    """A loopback port whose server answers any connection as plain HTTP would a TLS hello."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@pytest.fixture(scope="module")
def slurm():
    """The throwaway single-node Slurm cluster (evalpipe/devtools/slurmcluster.py), one per test module that asks
    for it (not per session: its daemons, children of this process, would stay for every later test, and count
    in test_slim_and_bench's memory of this process's tree); the test skips, saying why, where it cannot start."""
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmUnavailable as e:
        pytest.skip(f"no Slurm cluster: {e}")
    try:
        yield cluster
    finally:
        cluster.close()
