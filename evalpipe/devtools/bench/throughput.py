"""`make bench`'s throughput part: infer.py against a bare loop over the `openai` SDK, same server.

overhead  64 in flight, 100 ms server latency
wide      1,000 in flight, 2 s latency, and memory per task while rows are written

  python -m evalpipe.devtools.bench.throughput --bare DATA CONCURRENCY   (the bare loop alone)
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ...paths import PROJECT
from ..testserver import FakeOpenAI
from .common import dataset, fixed_latency, infer_rate
from .report import Figure


def bare_rate(server: FakeOpenAI, data: Path, concurrency: int) -> float:
    """Tasks/s of the bare loop, in a child process of its own as infer.py is."""
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe.devtools.bench.throughput", "--bare", str(data), str(concurrency)],
        env=env,
        capture_output=True,
        text=True,
        cwd=PROJECT,
        check=True,
    )
    return float(proc.stdout.split()[-1])


def bare_loop(data: Path, concurrency: int) -> float:
    """The baseline: the SDK alone, same requests and concurrency, no retries, nothing written."""
    import openai

    rows = [json.loads(line) for line in data.read_text().splitlines()]

    async def go() -> float:
        client = openai.AsyncOpenAI(max_retries=0, timeout=600)  # as infer.py's default --timeout
        gate = asyncio.Semaphore(concurrency)

        async def one(row):
            async with gate:
                await client.chat.completions.create(model="bench", messages=row["messages"])

        started = time.monotonic()
        await asyncio.gather(*(one(r) for r in rows))
        elapsed = time.monotonic() - started
        await client.close()
        return len(rows) / elapsed

    return asyncio.run(go())


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    server = FakeOpenAI(fixed_latency(0.1)).start()
    try:
        n = 300 if tiny else 4000
        data = dataset(work / "overhead.jsonl", n)
        bare = bare_rate(server, data, 64)
        ours = infer_rate(server, data, work / "overhead-out.jsonl", 64)
        yield Figure(
            "overhead: infer.py, 64 in flight, 100 ms",
            f"{ours['rate']:.0f} tasks/s",
            ">= 0.90",
            ours["rate"] >= 0.9 * bare,
            reference=f"bare SDK loop {bare:.0f} tasks/s",
            ratio=ours["rate"] / bare,
        )

        server.handler = fixed_latency(2.0)
        c, n = (100, 300) if tiny else (1000, 6000)
        data = dataset(work / "wide.jsonl", n)
        bare_wide = bare_rate(server, data, c)
        ours = infer_rate(server, data, work / "wide-out.jsonl", c)
        ceiling = min(c / 2.0, bare_wide)
        yield Figure(
            f"wide: {c} in flight, 2 s latency",
            f"{ours['rate']:.0f} tasks/s",
            ">= 0.90",
            ours["rate"] >= 0.9 * ceiling,
            reference=f"min({c / 2:.0f}, bare {bare_wide:.0f}) tasks/s",
            ratio=ours["rate"] / ceiling,
        )
        # memory while the run goes on: from a quarter of the rows written to the end, RSS must
        # not grow with the rows (the dataset is loaded before the first row)
        during = [(rows, kb) for rows, kb in ours["samples"] if rows >= n // 4]
        if len(during) >= 2:
            (r0, m0), (r1, m1) = during[0], during[-1]
            per_task = (m1 - m0) * 1024 / max(1, r1 - r0)
            yield Figure(
                "wide: memory growth while rows are written",
                f"{m0 / 1024:.0f} MB at {r0} rows, {m1 / 1024:.0f} MB at {r1} rows "
                f"({per_task:.0f} bytes per task); peak {ours['rss_kb'] / 1024:.0f} MB",
                "no growth per task",
                per_task < 1024,
            )
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.devtools.bench.throughput")
    parser.add_argument("--bare", nargs=2, metavar=("DATA", "CONCURRENCY"), required=True)
    args = parser.parse_args(argv)
    print(f"bare tasks/s {bare_loop(Path(args.bare[0]), int(args.bare[1])):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
