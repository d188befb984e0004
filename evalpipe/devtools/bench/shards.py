"""`make bench`'s shards part: 4 shard processes against one loopback server beside one process at the same total
concurrency (docs/scale.md). Sharding adds processes, not speed against one server: the 4 together should go as
fast as the one (ratio at least 0.9), whole processes timed against whole processes, start-up included, from the
first start to the last exit.

The tasks are CL-bench-shaped (about 4 to a context: throughput.clbench_shaped), so a shard takes whole contexts
and its share of the tasks is about, not exactly, a quarter: the slowest shard sets the pace.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ...store import shards
from ...store.paths import PROJECT
from ..testserver import FakeOpenAI
from .common import fixed_latency
from .report import Figure
from .throughput import clbench_shaped

SHARDS = 4


def timed(commands: list[list[str]], env: dict) -> float:
    """Seconds from starting every command at once to the last one's exit (each must exit 0)."""
    started = time.monotonic()
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    errors = [proc.communicate()[1] for proc in procs]
    elapsed = time.monotonic() - started
    for proc, err in zip(procs, errors):
        if proc.returncode != 0:
            raise RuntimeError(f"infer.py exited {proc.returncode}: {err[-1500:]}")
    return elapsed


def infer(data: Path, out: Path, workers: int, *extra: str) -> list[str]:
    return [sys.executable, str(PROJECT / "infer.py"), "--model", "bench", "--input", str(data)] + [
        *("--output", str(out), "--workers", str(workers), "--progress", "log", *extra)
    ]


def rows(out: Path) -> list[int]:
    """The rows of each part of a run's file."""
    return [part.read_bytes().count(b"\n") for part in shards.parts(out)]


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    latency = 0.1
    server = FakeOpenAI(fixed_latency(latency)).start()
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
    concurrency, n = (64, 400) if tiny else (256, 8000)
    try:
        data = clbench_shaped(work / "tasks.jsonl", n)
        one_out, cut_out = work / "one" / "infer.jsonl", work / "cut" / "infer.jsonl"
        one = timed([infer(data, one_out, concurrency)], env)
        cut = timed(
            [infer(data, cut_out, concurrency // SHARDS, "--shard", f"{k}/{SHARDS}") for k in range(SHARDS)], env
        )
        written, cut_parts = sum(rows(one_out)), rows(cut_out)
        if written != n or sum(cut_parts) != n:
            raise RuntimeError(f"rows written: one process {written}, {SHARDS} shards {sum(cut_parts)}, of {n}")
        largest = max(cut_parts)
        yield Figure(
            f"shards: {SHARDS} processes of {concurrency // SHARDS} in flight, one server, {latency * 1000:.0f} ms",
            f"{n / cut:.0f} tasks/s (largest shard {largest / n:.0%} of {n})",
            ">= 0.90",
            n / cut >= 0.9 * n / one,
            reference=f"one process of {concurrency} in flight {n / one:.0f} tasks/s",
            ratio=one / cut,
        )
    finally:
        server.stop()
