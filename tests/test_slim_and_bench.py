"""Slim rows, joining messages back, and the benchmark script in its tiny mode."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, SAMPLE, read_jsonl

pytestmark = pytest.mark.e2e

UPSTREAM_INFER = ["idx", "messages", "model_output", "rubrics", "metadata"]


def test_slim_rows_judge_the_same_and_expand_back(server, stage, tmp_path):
    stage("infer", "--model", "m", "--output", "full/infer.jsonl", check=0)
    stage("infer", "--model", "m", "--output", "slim/infer.jsonl", "--slim", check=0)
    full, slim = read_jsonl(tmp_path / "full/infer.jsonl"), read_jsonl(tmp_path / "slim/infer.jsonl")
    assert all("messages" not in r for r in slim)
    assert (tmp_path / "slim/infer.jsonl").stat().st_size < (tmp_path / "full/infer.jsonl").stat().st_size
    for d in ("full", "slim"):
        stage("judge", "--input", f"{d}/infer.jsonl", "--judge-model", "j", check=0)
    scores = [{r["idx"]: r["score"] for r in read_jsonl(tmp_path / d / "judge.jsonl")} for d in ("full", "slim")]
    assert scores[0] == scores[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalpipe.expand",
            "--data",
            str(SAMPLE),
            "--input",
            str(tmp_path / "slim/infer.jsonl"),
            "--output",
            str(tmp_path / "expanded.jsonl"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    expanded = {r["idx"]: r for r in read_jsonl(tmp_path / "expanded.jsonl")}
    for row in full:
        assert list(expanded[row["idx"]])[:5] == UPSTREAM_INFER
        assert expanded[row["idx"]]["messages"] == row["messages"]


def test_the_benchmark_script_runs_in_tiny_mode():
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe.devtools.bench", "--tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # tiny sizes are too small for the targets: only that every part ran and printed its figure
    assert "| figure | measured | reference | ratio | target | met |" in proc.stdout, proc.stdout + proc.stderr
    for part in (
        "overhead",
        "wide",
        "rate-limited (headers, requests-limited)",
        "rate-limited (headers, tokens-limited)",
        "rate-limited (Retry-After only)",
        "rate-limited (429 with nothing)",
        "prefix: cached share",
        "prefix: throughput",
        "resume",
        "slim rows",
        "score.py",
        "aggregate.py",
        "viewer CoinFlip",
        "viewer CL-bench-shaped",
        "shards: 4 processes",
    ):
        assert part in proc.stdout, part


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="no /proc/<pid>/smaps_rollup here")
def test_the_benchmarks_memory_figure_counts_forked_processes_once():
    from evalpipe.devtools.bench.common import tree_pss_kb

    ready, go = os.pipe()
    pid = os.fork()
    if pid == 0:  # holds 64 MB of its own, besides the pages it shares with this process
        held = bytearray(64 << 20)
        for i in range(0, len(held), 4096):
            held[i] = 1
        os.write(go, b"x")
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"x"
        child, tree = tree_pss_kb(pid), tree_pss_kb(os.getpid())
        rollup = Path("/proc/self/smaps_rollup").read_text()
        this = int(re.search(r"^Pss:\s+(\d+)", rollup, re.MULTILINE).group(1))
        assert child > 60 << 10  # the child's own 64 MB, and its share of the pages it has from this process
        assert abs(tree - (this + child)) < 8 << 10  # both counted, what they share split between them
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
