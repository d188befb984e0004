"""`make bench`'s peers part: CoinFlip end to end (answers, grades, the score) by evalpipe (infer.py, judge.py,
score.py, each a whole process) against inspect_ai (one `inspect_ai.eval` process), the tool users would pick
instead, on the same 3,000 tasks at 256 connections, fault-free and with 1% of replies 429 + Retry-After: 1.

inspect_ai lives in a venv of its own (`make peers`: .venv-peers, from requirements-peers.txt); without it
this part prints why and measures nothing.

  .venv-peers/bin/python evalpipe/devtools/bench/inspect_coin_flip.py BASE_URL DATA N LOG_DIR
                                                   (the inspect_ai run alone, as the bench starts it)
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ...store.paths import PROJECT
from ..testserver import FakeOpenAI, Faults
from .faults import WORKERS, varied_latency
from .report import Figure

PEERS_PYTHON = PROJECT / ".venv-peers" / "bin" / "python"
DATA = PROJECT / "data" / "coin_flip" / "test.jsonl"
TASKS = 3000
TARGET = 2.0


def ours(url: str, work: Path, n: int) -> float:
    """Seconds of infer.py, judge.py and score.py over the first n tasks, each a whole process."""
    env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "bench"}
    common = ["--bench", "coin_flip", "--model", "bench", "--outputs-dir", str(work)]
    started = time.monotonic()
    for script, extra in (
        ("infer", ["--max-samples", str(n), "--workers", str(WORKERS), "--progress", "log"]),
        ("judge", []),
        ("score", ["--max-samples", str(n)]),
    ):
        done = subprocess.run(
            [sys.executable, str(PROJECT / f"{script}.py"), *common, *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode not in (0, 3):  # a stage that failed would only make ours look faster
            raise RuntimeError(f"{script}.py exited {done.returncode}: {done.stderr[-1500:]}")
    return time.monotonic() - started


def theirs(url: str, work: Path, n: int) -> float:
    """Seconds of one inspect_ai process over the same n tasks, from its start to its exit."""
    env = {**os.environ, "LOOPBACK_API_KEY": "bench", "LOOPBACK_BASE_URL": url, "INSPECT_LOG_DIR": str(work)}
    started = time.monotonic()
    subprocess.run(
        [str(PEERS_PYTHON), str(Path(__file__).with_name("inspect_coin_flip.py")), url, str(DATA), str(n), str(work)],
        env=env,
        cwd=PROJECT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return time.monotonic() - started


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    if not PEERS_PYTHON.exists():
        print("  peers: skipped: inspect_ai is not installed (make peers installs it into .venv-peers)", flush=True)
        return
    if tiny:
        print("  peers: skipped with --tiny (inspect_ai's start-up alone outweighs a toy run)", flush=True)
        return
    n = TASKS
    with FakeOpenAI(varied_latency()) as server:
        for name, handler in (
            ("fault-free", varied_latency),
            ("1% 429 + Retry-After: 1", lambda: Faults(varied_latency(), overloaded=0.01, retry_after=1.0)),
        ):
            slug = "clean" if name == "fault-free" else "sporadic"
            server.handler = handler()  # each contender from the same seed: the same latencies and faults
            our_s = ours(server.base_url, work / f"ours-{slug}", n)
            server.handler = handler()
            their_s = theirs(server.base_url, work / f"inspect-{slug}", n)
            ratio = their_s / our_s
            yield Figure(
                f"peers: CoinFlip end to end, {n:,} tasks, {WORKERS} connections, {name}",
                f"{n / our_s:.0f} tasks/s ({our_s:.1f} s)",
                f">= {TARGET:.1f}",
                ratio >= TARGET,
                reference=f"inspect_ai {n / their_s:.0f} tasks/s ({their_s:.1f} s)",
                ratio=ratio,
            )
