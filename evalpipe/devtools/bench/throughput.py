"""`make bench`'s throughput part: infer.py against bare loops over the `openai` SDK, same server.

overhead  64, 256 and 1,000 in flight, 100 ms server latency: infer.py against a bare loop over the
          SDK's aiohttp transport (infer.py's default), with the bare loop over its httpx transport
          beside it (reported only); at 256, infer.py against upstream CL-bench's design, a pool of
          256 threads each making one blocking call with the synchronous client
wide      1,000 in flight, 2 s latency, and memory per task while rows are written

The tasks are the bundled CL-bench sample's, over and over, about 4 to a context as in CL-bench.
Every contender is timed as a whole process (start, imports, reading the tasks, the run, exit), as a
user's command would be: tasks over the process's wall time.

  python -m evalpipe.devtools.bench.throughput --bare {aiohttp,httpx,threads} DATA CONCURRENCY
                                                      (one bare loop alone; its tasks/s on stdout)
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...store.paths import PROJECT
from ..testserver import FakeOpenAI
from .common import dataset, fixed_latency, infer_rate
from .report import Figure

BARE_LOOPS = ("aiohttp", "httpx", "threads")


def bare_rate(server: FakeOpenAI, data: Path, concurrency: int, loop: str) -> float:
    """Tasks/s of one bare loop, in a child process of its own as infer.py is, over that process's whole time."""
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "evalpipe.devtools.bench.throughput", "--bare", loop, str(data), str(concurrency)],
        env=env,
        capture_output=True,
        text=True,
        cwd=PROJECT,
        check=True,
    )
    seconds = time.monotonic() - started  # before the tasks are counted: that is no part of the loop's time
    return data.read_bytes().count(b"\n") / seconds


def bare_loop(loop: str, data: Path, concurrency: int) -> float:
    """The baselines: the SDK alone, same requests and concurrency, no retries, nothing written."""
    import openai

    rows = [json.loads(line) for line in data.read_text().splitlines()]
    if loop == "threads":  # upstream CL-bench: one blocking call per worker thread
        client = openai.OpenAI(max_retries=0, timeout=600)

        def call(row: dict) -> None:
            client.chat.completions.create(model="bench", messages=row["messages"])

        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(call, rows))
        elapsed = time.monotonic() - started
        client.close()
        return len(rows) / elapsed

    async def go() -> float:
        http_client = openai.DefaultAioHttpClient() if loop == "aiohttp" else None
        client = openai.AsyncOpenAI(max_retries=0, timeout=600, http_client=http_client)  # as infer.py's --timeout
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


def clbench_shaped(path: Path, n: int) -> Path:
    """common.dataset's n tasks with contexts shared as in CL-bench (1,899 tasks, about 500 contexts: about 4
    tasks each), not all n by the sample's 11: infer sends each context's first task alone
    (scheduler.PrefixSchedule), which with 11 contexts would leave it a round trip with 11 calls in flight."""
    dataset(path, n)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    with open(path, "w") as f:
        for i, row in enumerate(rows):
            row["metadata"]["context_id"] = f"{row['metadata']['context_id']}-{i // 48}"  # 48: 4 x the 12 rows
            f.write(json.dumps(row) + "\n")
    return path


def share_figure(name: str, rate: float, reference: str, reference_rate: float) -> Figure:
    """infer's rate against a reference rate: at least 0.9 of it."""
    return Figure(
        name,
        f"{rate:.0f} tasks/s",
        ">= 0.90",
        rate >= 0.9 * reference_rate,
        reference=reference,
        ratio=rate / reference_rate,
    )


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    server = FakeOpenAI(fixed_latency(0.1)).start()
    try:
        ours_at: dict[int, float] = {}
        # each measurement lasts several seconds at full size: the slow start and end weigh little
        points = ((64, 150),) if tiny else ((64, 3000), (256, 4000), (1000, 4000))
        threads_at = points[-1][0] if tiny else 256
        for concurrency, n in points:
            data = clbench_shaped(work / f"overhead-{concurrency}.jsonl", n)
            bare = bare_rate(server, data, concurrency, "aiohttp")
            # the httpx loop is the slow one (a third of the rate at 1,000 in flight): fewer tasks last as long
            fewer = clbench_shaped(work / f"httpx-{concurrency}.jsonl", n if tiny else 1500)
            bare_httpx = bare_rate(server, fewer, concurrency, "httpx")
            ours = infer_rate(server.base_url, data, work / f"overhead-{concurrency}-out.jsonl", concurrency)
            ours_at[concurrency] = ours["wall_rate"]
            yield share_figure(
                f"overhead: infer.py, {concurrency} in flight, 100 ms, whole processes",
                ours["wall_rate"],
                f"bare aiohttp SDK loop {bare:.0f} tasks/s",
                bare,
            )
            yield Figure(
                f"overhead: bare httpx SDK loop, {concurrency} in flight, 100 ms",
                f"{bare_httpx:.0f} tasks/s",
                "reported",
                True,
                reference=f"infer.py {ours['wall_rate']:.0f} tasks/s",
                ratio=bare_httpx / ours["wall_rate"],
            )

        data = clbench_shaped(work / "threads.jsonl", 150 if tiny else 3000)
        threads = bare_rate(server, data, threads_at, "threads")
        yield Figure(
            f"overhead: infer.py vs upstream's thread pool, {threads_at} in flight, 100 ms",
            f"{ours_at[threads_at]:.0f} tasks/s",
            ">= 1.8",
            ours_at[threads_at] >= 1.8 * threads,
            reference=f"ThreadPoolExecutor({threads_at}) over openai.OpenAI {threads:.0f} tasks/s",
            ratio=ours_at[threads_at] / threads,
        )

        latency = 0.5 if tiny else 2.0
        server.handler = fixed_latency(latency)
        c, n = (100, 100) if tiny else (1000, 6000)
        data = clbench_shaped(work / "wide.jsonl", n)
        bare_wide = bare_rate(server, data, c, "aiohttp")
        ours = infer_rate(server.base_url, data, work / "wide-out.jsonl", c)
        ceiling = min(c / latency, bare_wide)
        yield share_figure(
            f"wide: {c} in flight, {latency:g} s latency, whole processes",
            ours["wall_rate"],
            f"min({c / latency:.0f}, bare aiohttp {bare_wide:.0f}) tasks/s",
            ceiling,
        )
        # memory while the run goes on: from a quarter of the rows written to the end, RSS must
        # not grow with the rows (the dataset is loaded before the first row)
        during = [(rows, kb) for rows, kb in ours["samples"] if rows >= n // 4]
        if len(during) >= 2:
            (r0, m0), (r1, m1) = during[0], during[-1]
            per_task = (m1 - m0) * 1024 / max(1, r1 - r0)
            # the largest RSS sampled, not ru_maxrss: that counts this process's pages the child had before exec
            peak = max(kb for _, kb in ours["samples"])
            yield Figure(
                "wide: memory growth while rows are written",
                f"{m0 / 1024:.0f} MB at {r0} rows, {m1 / 1024:.0f} MB at {r1} rows "
                f"({per_task:.0f} bytes per task); peak {peak / 1024:.0f} MB",
                "no growth per task",
                per_task < 1024,
            )
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.devtools.bench.throughput")
    parser.add_argument("--bare", nargs=3, metavar=("LOOP", "DATA", "CONCURRENCY"), required=True)
    args = parser.parse_args(argv)
    loop, data, concurrency = args.bare
    if loop not in BARE_LOOPS:
        parser.error(f"LOOP must be one of {', '.join(BARE_LOOPS)}")
    print(f"bare tasks/s {bare_loop(loop, Path(data), int(concurrency)):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
