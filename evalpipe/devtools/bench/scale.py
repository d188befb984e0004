"""`make bench`'s scale part: resume's pending set over a 1,000,000-row infer file and a CL-bench-sized
one, the size of slim rows, and score.py and aggregate.py over 1,000,000 judged CoinFlip rows."""

import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ...paths import PROJECT
from .report import Figure


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    n = 20_000 if tiny else 1_000_000
    big = work / "big-infer.jsonl"
    write_big_infer(big, n, 330)
    seconds, mb = resume_time(big)
    size_mb = big.stat().st_size / 1e6
    yield Figure(
        f"resume: pending set over {n:,} rows ({size_mb:.0f} MB)",
        f"{seconds:.2f} s, {mb:.0f} MB extra",
        "<= 2.5 s, ids only",
        seconds <= 2.5 and mb < size_mb / 3,
    )
    big.unlink()
    cl = work / "clbench-sized.jsonl"
    write_big_infer(cl, 200 if tiny else 1899, 80_000)
    seconds, _ = resume_time(cl)
    yield Figure(
        f"resume: CL-bench-sized file ({cl.stat().st_size / 1e6:.0f} MB)",
        f"{seconds:.2f} s",
        "<= 0.5 s",
        seconds <= 0.5,
    )

    slim = work / "slim.jsonl"
    with open(cl, "rb") as src, open(slim, "wb") as dst:
        for line in src:
            row = json.loads(line)
            row.pop("messages")
            dst.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
    ratio = slim.stat().st_size / cl.stat().st_size
    yield Figure("slim rows (--slim) on the CL-bench-sized file", f"{ratio:.3f} of the full size", "reported", True)
    cl.unlink()

    score_s, aggregate_s = score_times(work, n)
    yield Figure(f"score.py over {n:,} judged rows", f"{score_s:.1f} s", "<= 10 s", score_s <= 10)
    yield Figure(
        f"aggregate.py over 3 runs × 2 models × {n:,} rows (item-level figures and comparisons)",
        f"{aggregate_s:.1f} s",
        "<= 5 s",
        aggregate_s <= 5,
        reference="5 s target",
        ratio=aggregate_s / 5,
    )


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


def score_times(work: Path, n: int) -> tuple[float, float]:
    """Seconds of score.py over n CoinFlip judged rows (a small row, as most judged files), and of
    aggregate.py over 3 runs of 2 models of them (the other five runs' files are made from the first)."""
    import random
    import shutil

    from ...benchmarks.coin_flip import CoinFlip
    from ...results import items

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
