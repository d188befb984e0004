"""`make bench`: the pipeline's own cost, measured against a loopback server, each figure beside its target.

Figures are ratios measured in the same run where they can be (a shared machine is noisy):
  overhead      infer.py vs a bare `openai` loop, concurrency 64, 100 ms server latency
  wide          1,000 requests in flight, 2 s latency, and memory per task
  rate-limited  a 50 requests/s token bucket (burst 50) answering the rest 429, with and without Retry-After
  resume        the pending set over a 1,000,000-row infer file and a CL-bench-sized one
  score         score.py and aggregate.py over 1,000,000 judged rows
  slim          the size of slim rows (no copied messages) on a CL-bench-sized file
  viewer        report.html of 100,000 CoinFlip samples and of a CL-bench-shaped set: built, then opened,
                filtered and searched in headless chromium (viewerbench.py)

    python -m evalpipe.devtools.bench [--tiny]
"""

import argparse
import asyncio
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..paths import PROJECT
from . import viewerbench
from .testserver import FakeOpenAI, Reply, Request

SAMPLE = PROJECT / "data" / "clbench" / "sample.jsonl"


# ---- the servers


def fixed_latency(seconds: float):
    def handler(request: Request) -> Reply:
        return Reply(content="ok " + request.last_content[-20:], delay=seconds)

    return handler


class TokenBucket:
    """Admits `rate` requests per second (burst `burst`); the rest get 429."""

    def __init__(self, rate: float, burst: int, latency: float, retry_after: bool):
        self.rate, self.burst, self.latency, self.retry_after = rate, burst, latency, retry_after
        self.tokens, self.at = float(burst), time.monotonic()
        self.admitted = self.rejected = 0
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                self.admitted += 1
                return Reply(content="ok", delay=self.latency)
            self.rejected += 1
            wait = (1 - self.tokens) / self.rate
        headers = (
            {"retry-after-ms": str(int(wait * 1000) + 1), "Retry-After": str(max(1, round(wait)))}
            if self.retry_after
            else {}
        )
        return Reply.error(429, "rate limit reached", headers=headers)


# ---- what is measured


def dataset(path: Path, n: int) -> Path:
    base = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    with open(path, "w") as f:
        for i in range(n):
            row = base[i % len(base)]
            f.write(json.dumps({**row, "metadata": {**row["metadata"], "task_id": f"b{i:07d}"}}) + "\n")
    return path


def run_child(args: list[str], env: dict, watch: Path | None = None) -> tuple[int, str, int, list]:
    """Exit code, stderr, peak RSS in KB of one child process, and (rows in `watch`, RSS KB) samples."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[int, int]] = []

    def sample() -> None:
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                match = re.search(r"VmRSS:\s+(\d+)", status)
                if match is not None:  # no VmRSS line once the child is a zombie
                    rss = int(match.group(1))
                    rows = watch.read_bytes().count(b"\n") if watch is not None and watch.exists() else 0
                    samples.append((rows, rss))
            except (OSError, AttributeError):
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stderr is not None  # stderr=PIPE
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.join()
    return proc.returncode, err, usage.ru_maxrss, samples


def infer_rate(server: FakeOpenAI, data: Path, out: Path, workers: int, extra=()) -> dict:
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
    code, err, rss, samples = run_child(
        [
            sys.executable,
            str(PROJECT / "infer.py"),
            "--model",
            "bench",
            "--input",
            str(data),
            "--output",
            str(out),
            "--workers",
            str(workers),
            "--progress",
            "bar",
            *extra,
        ],
        env,
        watch=out,
    )
    m = re.search(r"wrote (\d+) rows, (\d+) failed, .* ([\d.]+)s \(([\d.]+) tasks/s\)", err)
    if code == 0 and not m and "0 to run" in err:  # nothing left to do
        return {"rows": 0, "failed": 0, "seconds": 0.0, "rate": 0.0, "rss_kb": rss, "samples": samples}
    if code not in (0, 3) or not m:
        raise RuntimeError(f"infer.py exited {code}: {err[-1500:]}")
    return {
        "rows": int(m.group(1)),
        "failed": int(m.group(2)),
        "seconds": float(m.group(3)),
        "rate": float(m.group(4)),
        "rss_kb": rss,
        "samples": samples,
    }


def bare_rate(server: FakeOpenAI, data: Path, concurrency: int) -> float:
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe.devtools.bench", "--bare", str(data), str(concurrency)],
        env=env,
        capture_output=True,
        text=True,
        cwd=PROJECT,
        check=True,
    )
    return float(proc.stdout.split()[-1])


def bare_loop(data: Path, concurrency: int) -> None:
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

    print(f"bare tasks/s {asyncio.run(go()):.2f}")


def resume_time(path: Path) -> tuple[float, float]:
    """Seconds to compute the done set over an infer file, and the MB it holds (in a child process)."""
    code = (
        "import re,time;from evalpipe import jsonl;from evalpipe.benchmarks import row_id\n"
        "rss=lambda:int(re.search(r'VmRSS:\\s+(\\d+)',open('/proc/self/status').read()).group(1))\n"
        f"r0=rss();t=time.monotonic();ids=jsonl.ids_in({str(path)!r}, row_id);dt=time.monotonic()-t\n"
        "print(len(ids), dt, (rss()-r0)/1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT, check=True)
    _, seconds, mb = out.stdout.split()
    return float(seconds), float(mb)


def write_big_infer(path: Path, n: int, message_bytes: int) -> None:
    filler = "x" * message_bytes
    with open(path, "wb") as f:
        for i in range(n):
            row = {
                "idx": f"t{i:07d}",
                "messages": [{"role": "user", "content": filler}],
                "model_output": "an answer",
                "rubrics": ["r"],
                "metadata": {"task_id": f"t{i:07d}", "context_category": "Rule System Application"},
                "model": "m",
                "status": "ok",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 120, "completion_tokens": 30},
                "latency_s": 0.5,
            }
            f.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")


# ---- the report


class Report:
    def __init__(self):
        self.rows = []

    def add(self, name: str, figure: str, target: str, ok: bool) -> None:
        self.rows.append((name, figure, target, ok))
        print(f"  {'PASS' if ok else 'MISS'}  {name}: {figure}   (target: {target})", flush=True)

    def table(self) -> str:
        lines = ["| figure | measured | target | met |", "|---|---|---|---|"]
        lines += [f"| {n} | {f} | {t} | {'yes' if ok else 'no'} |" for n, f, t, ok in self.rows]
        return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="Measure the pipeline against its performance targets.")
    parser.add_argument(
        "--tiny", action="store_true", help="a seconds-long run of every part (for CI), not the targets' sizes"
    )
    parser.add_argument("--bare", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_loop(Path(args.bare[0]), int(args.bare[1]))
        return 0
    t = args.tiny
    report = Report()
    with tempfile.TemporaryDirectory(prefix="evalpipe-bench-") as tmp:
        work = Path(tmp)
        server = FakeOpenAI(fixed_latency(0.1)).start()
        try:
            # 1. overhead
            n = 300 if t else 4000
            data = dataset(work / "overhead.jsonl", n)
            bare = bare_rate(server, data, 64)
            ours = infer_rate(server, data, work / "overhead-out.jsonl", 64)
            report.add(
                "overhead: infer.py / bare SDK loop, 64 in flight, 100 ms",
                f"{ours['rate']:.0f} / {bare:.0f} tasks/s = {ours['rate'] / bare:.2f}",
                ">= 0.90",
                ours["rate"] >= 0.9 * bare,
            )

            # 2. wide
            server.handler = fixed_latency(2.0)
            c, n = (100, 300) if t else (1000, 6000)
            data = dataset(work / "wide.jsonl", n)
            bare_wide = bare_rate(server, data, c)
            ours = infer_rate(server, data, work / "wide-out.jsonl", c)
            ceiling = min(c / 2.0, bare_wide)
            report.add(
                f"wide: {c} in flight, 2 s latency",
                f"{ours['rate']:.0f} tasks/s vs min({c / 2:.0f}, bare {bare_wide:.0f}) = {ours['rate'] / ceiling:.2f}",
                ">= 0.90",
                ours["rate"] >= 0.9 * ceiling,
            )
            # memory while the run goes on: from a quarter of the rows written to the end, RSS must
            # not grow with the rows (the dataset is loaded before the first row)
            during = [(rows, kb) for rows, kb in ours["samples"] if rows >= n // 4]
            if len(during) >= 2:
                (r0, m0), (r1, m1) = during[0], during[-1]
                per_task = (m1 - m0) * 1024 / max(1, r1 - r0)
                report.add(
                    "wide: memory growth while rows are written",
                    f"{m0 / 1024:.0f} MB at {r0} rows, {m1 / 1024:.0f} MB at {r1} rows "
                    f"({per_task:.0f} bytes per task); peak {ours['rss_kb'] / 1024:.0f} MB",
                    "no growth per task",
                    per_task < 1024,
                )

            # 3. rate limited
            for with_header in (True, False):
                bucket = TokenBucket(50, 50, 0.1, with_header)
                server.handler = bucket
                n = 200 if t else 3000
                data = dataset(work / f"limited-{with_header}.jsonl", n)
                ours = infer_rate(server, data, work / f"limited-{with_header}-out.jsonl", 64)
                share = bucket.rejected / max(1, bucket.admitted + bucket.rejected)
                goodput = ours["rows"] / ours["seconds"]
                label = "with" if with_header else "without"
                report.add(
                    f"rate-limited ({label} Retry-After): goodput at 50/s",
                    f"{goodput:.1f}/s = {goodput / 50:.2f}",
                    ">= 0.90",
                    goodput >= 45,
                )
                report.add(
                    f"rate-limited ({label} Retry-After): requests answered 429",
                    f"{100 * share:.1f}% ({bucket.rejected} of {bucket.admitted + bucket.rejected})",
                    "<= 10%",
                    share <= 0.10,
                )
                report.add(
                    f"rate-limited ({label} Retry-After): tasks given up", str(ours["failed"]), "0", ours["failed"] == 0
                )
        finally:
            server.stop()

        # 4. resume
        n = 20_000 if t else 1_000_000
        big = work / "big-infer.jsonl"
        write_big_infer(big, n, 330)
        seconds, mb = resume_time(big)
        size_mb = big.stat().st_size / 1e6
        report.add(
            f"resume: pending set over {n:,} rows ({size_mb:.0f} MB)",
            f"{seconds:.2f} s, {mb:.0f} MB extra",
            "<= 2.5 s, ids only",
            seconds <= 2.5 and mb < size_mb / 3,
        )
        cl = work / "clbench-sized.jsonl"
        write_big_infer(cl, 1899 if not t else 200, 80_000)
        seconds, _ = resume_time(cl)
        report.add(
            f"resume: CL-bench-sized file ({cl.stat().st_size / 1e6:.0f} MB)",
            f"{seconds:.2f} s",
            "<= 0.5 s",
            seconds <= 0.5,
        )
        big.unlink()

        # 6. slim rows
        slim = work / "slim.jsonl"
        with open(cl, "rb") as src, open(slim, "wb") as dst:
            for line in src:
                row = json.loads(line)
                row.pop("messages")
                dst.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
        ratio = slim.stat().st_size / cl.stat().st_size
        report.add("slim rows (--slim) on the CL-bench-sized file", f"{ratio:.3f} of the full size", "reported", True)
        n = 20_000 if t else 1_000_000
        score_s, aggregate_s = score_times(work, n)
        report.add(f"score.py over {n:,} judged rows", f"{score_s:.1f} s", "<= 10 s", score_s <= 10)
        report.add(
            f"aggregate.py over 3 runs × 2 models × {n:,} rows (item-level figures and comparisons)",
            f"{aggregate_s:.1f} s = {aggregate_s / 5:.2f} of the target",
            "<= 5 s",
            aggregate_s <= 5,
        )
        for row in viewerbench.figures(work, t):
            report.add(*row)
        clustered = clbench_error_bars(work / "error-bars")
        report.add(
            "CL-bench-shaped run set (1,899 tasks / 500 contexts, 3 runs × 2 models): clustered / naive SE of Overall",
            f"{clustered['se']:.4f} / {clustered['se_naive']:.4f} = {clustered['se'] / clustered['se_naive']:.2f} "
            f"(design effect {clustered['design_effect']:.2f})",
            "reported",
            True,
        )
        report.add(
            "  minimum detectable difference (80% power, α 0.05)",
            f"{100 * clustered['mde']:.1f} points unpaired, {100 * clustered['pair_mde']:.1f} paired "
            f"(correlation {clustered['correlation']:.2f}); with 1 / 10 runs per task: "
            f"{100 * clustered['mde_runs']['1']:.1f} / {100 * clustered['mde_runs']['10']:.1f}",
            "reported",
            True,
        )
    print("\n" + report.table())
    return 0 if all(ok for *_, ok in report.rows) else 1


def clbench_error_bars(work: Path, tasks: int = 1899, contexts: int = 500) -> dict:
    """Item-level figures of a synthetic CL-bench-shaped run set made by the real score and aggregate
    stages: tasks share contexts whose difficulty they share, two models 3 points apart, 3 runs each."""
    import random

    rng = random.Random(2026)
    base = json.loads(SAMPLE.read_text().splitlines()[0])
    sizes = [1] * contexts
    for _ in range(tasks - contexts):
        sizes[rng.randrange(contexts)] += 1
    rows: list[dict] = []
    ease: list[float] = []
    for c, size in enumerate(sizes):
        context_ease = rng.betavariate(0.7, 2.0)
        for _ in range(size):
            i = len(rows)
            meta = {
                "task_id": f"t{i:04d}",
                "context_id": f"c{c:03d}",
                "context_category": base["metadata"]["context_category"],
            }
            rows.append({**base, "metadata": meta})
            ease.append(min(1.0, max(0.0, context_ease + rng.gauss(0, 0.1))))
    work.mkdir(parents=True)
    data = work / "clbench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for model, shift in (("a", 0.0), ("b", -0.03)):
        for k in (1, 2, 3):
            run = work / "out" / "clbench" / model / f"run-{k}"
            run.mkdir(parents=True)
            with open(run / "judge.jsonl", "w") as f:
                for r, x in zip(rows, ease):
                    score = int(rng.random() < max(0.0, x + shift))
                    f.write(json.dumps({"idx": r["metadata"]["task_id"], "score": score, "judge_status": "ok"}) + "\n")
            subprocess.run(
                [sys.executable, str(PROJECT / "score.py"), "--input", str(run / "judge.jsonl"), "--data", str(data)],
                check=True,
                capture_output=True,
            )
    subprocess.run(
        [sys.executable, str(PROJECT / "aggregate.py"), "--outputs-dir", str(work / "out"), "--no-plots"],
        check=True,
        capture_output=True,
    )
    summary = json.loads((work / "out" / "clbench" / "aggregate.json").read_text())
    first = summary["models"][0]["figures"]["Overall"]["items"]
    (pair,) = [c for c in summary["comparisons"] if c["figure"] == "Overall" and not c["table"]]
    return {**first, "pair_mde": pair["mde"], "correlation": pair["correlation"]}


def score_times(work: Path, n: int) -> tuple[float, float]:
    """Seconds of score.py over n CoinFlip judged rows (a small row, as most judged files), and of
    aggregate.py over 3 runs of 2 models of them (the other five runs' files are made from the first)."""
    import random
    import shutil

    from ..benchmarks.coin_flip import CoinFlip
    from ..results import items

    src = (PROJECT / "data" / "coin_flip" / "test.jsonl").read_bytes().splitlines(keepends=True)
    data = work / "cf-data.jsonl"
    data.write_bytes(b"".join(src[i % len(src)] for i in range(n)))
    run = work / "out" / "coin_flip" / "m" / "run-1"
    run.mkdir(parents=True)
    with open(run / "judge.jsonl", "wb") as f:
        for i, task in enumerate(CoinFlip().load(data)):
            pred = task.row["target"] if i % 4 else "YES"
            f.write(
                json.dumps(
                    {
                        "idx": task.id,
                        "messages": [],
                        "model_output": f"ANSWER: {pred}",
                        "target": task.row["target"],
                        "usage": {"prompt_tokens": 120, "completion_tokens": 40},
                        "prediction": pred,
                        "score": int(pred == task.row["target"]),
                        "judge_status": "ok",
                        "parse_mode": "strict",
                    },
                    separators=(",", ":"),
                ).encode()
                + b"\n"
            )
    gc.collect()  # give the tasks' memory back before timing the child

    def timed(part: str, args: list[str]) -> float:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, str(PROJECT / part), "--bench", "coin_flip", *args],
            check=True,
            capture_output=True,
            cwd=PROJECT,
        )
        return time.monotonic() - started

    score_s = timed("score.py", ["--input", str(run / "judge.jsonl"), "--data", str(data)])
    bench, tasks = CoinFlip(), CoinFlip().load(data)
    rng = random.Random(0)
    for model, right in (("m", 0.75), ("n", 0.7)):
        for k in (1, 2, 3):
            other = work / "out" / "coin_flip" / model / f"run-{k}"
            if other == run:
                continue
            other.mkdir(parents=True, exist_ok=True)
            shutil.copy(run / "score.json", other / "score.json")
            judged = {
                t.id: {
                    "prediction": t.row["target"]
                    if rng.random() < right
                    else ("NO" if t.row["target"] == "YES" else "YES")
                }
                for t in tasks
            }
            (other / "items.json").write_bytes(
                items.dumps(bench.name, bench.item_cluster, bench.item_columns(tasks, judged))
            )
    del tasks
    gc.collect()
    return score_s, timed("aggregate.py", ["--outputs-dir", str(work / "out"), "--no-plots"])


if __name__ == "__main__":
    sys.exit(main())
