"""`make bench`'s scale part: resume's pending set over a 1,000,000-row infer file and a CL-bench-sized
one, the size of slim rows; score.py and aggregate.py over 1,000,000 judged CoinFlip rows beside a bare
orjson loop over the same files (the floor); and the peak memory of infer, judge and score at 1,000,000
CoinFlip tasks, which must not grow with the dataset."""

import gc
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from ...benchmarks.coin_flip import CoinFlip
from ...results import items
from ...store.paths import PROJECT
from ..testserver import FakeOpenAI
from .common import fixed_latency, tree_pss_kb
from .report import Figure

SCORE_TARGET_S = 8.0  # one plain pass over each file (issue 39): real runs are 2,000 to 10,000 rows
SCORE_MEMORY_MB = 400
AGGREGATE_TARGET_S = 5.0
PEAK_MEMORY_TARGET_MB = 250
# the share of tasks infer and judge still have to do on the resumed runs
RESUME_PENDING = 2_000
# rows written by concurrent workers come a little out of dataset order: shuffled within blocks this long
OUT_OF_ORDER = 64


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    n = 20_000 if tiny else 1_000_000
    yield from resume_figures(work, n, tiny)
    run = coin_flip_files(work, n)
    yield from score_figures(work, run, n)
    yield from stage_memory_figures(work, run, n, tiny)
    yield from aggregate_figure(work, run, n)  # last: it holds the tasks in this process to make the other runs


def resume_figures(work: Path, n: int, tiny: bool) -> Iterator[Figure]:
    big = work / "big-infer.jsonl"
    write_big_infer(big, n, 330)
    seconds, mb = resume_time(big)
    size_mb = big.stat().st_size / 1e6
    floor = floor_seconds([big])
    yield Figure(
        f"resume: pending set over {n:,} rows ({size_mb:.0f} MB)",
        f"{seconds:.2f} s, {mb:.0f} MB extra",
        "<= 2.5 s, ids only",
        seconds <= 2.5 and mb < size_mb / 3,
        reference=f"bare orjson loop {floor:.2f} s",
        ratio=seconds / floor,
    )
    big.unlink()
    cl = work / "clbench-sized.jsonl"
    write_big_infer(cl, 200 if tiny else 1899, 80_000)
    seconds, _ = resume_time(cl)
    floor = floor_seconds([cl])
    yield Figure(
        f"resume: CL-bench-sized file ({cl.stat().st_size / 1e6:.0f} MB)",
        f"{seconds:.2f} s",
        "<= 0.5 s",
        seconds <= 0.5,
        reference=f"bare orjson loop {floor:.2f} s",
        ratio=seconds / floor,
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
    slim.unlink()


def resume_time(path: Path) -> tuple[float, float]:
    """Seconds to compute the done set over an infer file, and the MB it holds (in a child process)."""
    code = (
        "import re,time;from evalpipe.store import jsonl;from evalpipe.store.rows import row_id\n"
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


# ---- one CoinFlip run of n tasks: the dataset, its infer rows and its judge rows


def coin_flip_files(work: Path, n: int) -> Path:
    """outputs/coin_flip/m/run-1 under `work` with n tasks' infer.jsonl and judge.jsonl, and the dataset beside
    (cf-data.jsonl): the bundled rows over and over; rows in the order concurrent workers write them."""
    src = (PROJECT / "data" / "coin_flip" / "test.jsonl").read_bytes().splitlines(keepends=True)
    data = work / "cf-data.jsonl"
    data.write_bytes(b"".join(src[i % len(src)] for i in range(n)))
    run = work / "out" / "coin_flip" / "m" / "run-1"
    run.mkdir(parents=True)
    bench, rng = CoinFlip(), random.Random(0)
    # written as made: this process stays small, as the children measured are forked from it
    infer_out, judge_out = open(run / "infer.jsonl", "wb"), open(run / "judge.jsonl", "wb")
    infer_lines: list[bytes] = []
    judge_lines: list[bytes] = []
    for i, task in enumerate(bench.load(data)):
        gold = task.row["target"]
        pred = gold if i % 4 else "YES"
        infer_row = {
            "idx": task.id,
            "messages": [{"role": "user", "content": bench.prompt(task.row["question"])}],
            "model_output": f"Tracking the coin.\nANSWER: {pred}",
            "target": gold,
            "metadata": {"fewshot": 0},
            "model": "m",
            "status": "ok",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 120, "completion_tokens": 40},
            "latency_s": round(0.2 + rng.random(), 3),
        }
        infer_lines.append(orjson.dumps(infer_row) + b"\n")
        judged = {**infer_row, "messages": [], "prediction": pred, "score": int(pred == gold)}
        judge_lines.append(orjson.dumps({**judged, "judge_status": "ok", "parse_mode": "evalscope"}) + b"\n")
        if len(infer_lines) == OUT_OF_ORDER:
            _write_shuffled(infer_out, infer_lines, rng)
            _write_shuffled(judge_out, judge_lines, rng)
    _write_shuffled(infer_out, infer_lines, rng)
    _write_shuffled(judge_out, judge_lines, rng)
    infer_out.close()
    judge_out.close()
    return run


def _write_shuffled(out, lines: list[bytes], rng: random.Random) -> None:
    """Write a block of lines in the order concurrent workers might finish them, and empty it."""
    rng.shuffle(lines)
    out.write(b"".join(lines))
    lines.clear()


def head(src: Path, dst: Path, lines: int) -> None:
    """The first `lines` lines of src into dst, a line at a time."""
    with open(src, "rb") as f, open(dst, "wb") as out:
        for _, line in zip(range(lines), f):
            out.write(line)


def floor_seconds(files: list[Path], whole: bool = False) -> float:
    """The floor: a bare loop over the files, every line read and orjson.loads-ed (with `whole`, each file as one
    JSON document), nothing kept; in a child process, as the stage runs."""
    read = "loads(f.read())" if whole else "for line in f: loads(line)"
    code = (
        "import sys,time,orjson\nloads=orjson.loads\nt=time.monotonic()\n"
        f"for p in sys.argv[1:]:\n    with open(p,'rb') as f:\n        {read}\n"
        "print(time.monotonic()-t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, files)], capture_output=True, text=True, cwd=PROJECT, check=True
    )
    return float(out.stdout)


# Runs a stage script and writes its peak RSS (VmHWM) at exit. A child's ru_maxrss is no use here: the kernel
# counts the parent's memory in it (the child runs in the parent's pages between vfork and exec).
_PEAK_RSS = (
    "import atexit,pathlib,re,runpy,sys\n"
    "out,script=sys.argv[1],sys.argv[2]\n"
    "def peak():\n"
    "    pathlib.Path(out).write_text(re.search(r'VmHWM:\\s+(\\d+)',open('/proc/self/status').read()).group(1))\n"
    "atexit.register(peak)\n"
    "sys.argv=sys.argv[2:]\nsys.path[0]=str(pathlib.Path(script).parent)\n"
    "runpy.run_path(script,run_name='__main__')\n"
)
PSS_EVERY_S = 0.05


def stage(part: str, args: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """Seconds, peak memory (MB) and stderr of one stage script over CoinFlip. Peak memory is the larger of the
    script's peak RSS and the summed PSS of it and any processes it starts, sampled."""
    with tempfile.NamedTemporaryFile("r", suffix=".peak") as peak:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _PEAK_RSS, peak.name, str(PROJECT / part), "--bench", "coin_flip", *args],
            env=env,
            cwd=PROJECT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        tree_peak_kb = 0

        def sample() -> None:
            nonlocal tree_peak_kb
            while proc.poll() is None:
                tree_peak_kb = max(tree_peak_kb, tree_pss_kb(proc.pid))
                time.sleep(PSS_EVERY_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate()
        seconds = time.monotonic() - started
        sampler.join()
        if proc.returncode not in (0, 3):
            raise RuntimeError(f"{part} exited {proc.returncode}: {err[-1500:]}")
        return seconds, max(int(peak.read()), tree_peak_kb) / 1024, err


def peak_memory_figure(name: str, mb: float, limit_mb: int = PEAK_MEMORY_TARGET_MB) -> Figure:
    """A stage's peak memory against its target (the flat-memory one unless said)."""
    return Figure(name, f"{mb:.0f} MB", f"<= {limit_mb} MB", mb <= limit_mb)


def seconds_figure(name: str, seconds: float, target_s: float, files: str, floor: float) -> Figure:
    """A stage's time against its target, beside the floor: a bare orjson loop over `files`."""
    return Figure(
        name,
        f"{seconds:.1f} s",
        f"<= {target_s:.0f} s",
        seconds <= target_s,
        reference=f"bare orjson loop over {files} {floor:.1f} s",
        ratio=seconds / floor,
    )


# score's runs, of which the best is the figure: this machine's speed varies by 20% from one second to the next
# (other tenants); the others are printed beside it
SCORE_REPEATS = 3


def score_figures(work: Path, run: Path, n: int) -> Iterator[Figure]:
    """score.py from a cold start (it keeps nothing between runs): its time, beside the floor over the same two
    files, and its peak memory."""
    data, judged = work / "cf-data.jsonl", run / "judge.jsonl"
    args = ["--input", str(judged), "--data", str(data)]
    floors, runs = [], []
    for _ in range(SCORE_REPEATS):  # taken in turns, so that both see the same moments of the machine
        floors.append(floor_seconds([judged, data]))
        runs.append(stage("score.py", args)[:2])
    floor = min(floors)  # best of each, as the two are compared
    seconds = sorted(s for s, _ in runs)
    ratio = seconds[0] / floor
    yield Figure(
        f"score.py over {n:,} judged rows (best of {SCORE_REPEATS}: " + ", ".join(f"{s:.1f}" for s in seconds) + " s)",
        f"{seconds[0]:.1f} s",
        f"<= {SCORE_TARGET_S:.0f} s",
        seconds[0] <= SCORE_TARGET_S,
        reference=f"bare orjson loop over judge + dataset {floor:.2f} s (best of {SCORE_REPEATS})",
        ratio=ratio,
    )
    mb = max(mb for _, mb in runs)
    yield peak_memory_figure(f"score.py peak memory at {n:,} tasks", mb, SCORE_MEMORY_MB)


def aggregate_figure(work: Path, run: Path, n: int) -> Iterator[Figure]:
    """aggregate.py over 3 runs of 2 models: the other five runs' score.json is run-1's, their items.json
    made from the dataset with other predictions."""
    bench = CoinFlip()
    tasks = list(bench.load(work / "cf-data.jsonl"))
    rng = random.Random(0)
    read = [run / "score.json", run / "items.json"]
    for model, right in (("m", 0.75), ("n", 0.7)):
        for k in (1, 2, 3):
            other = work / "out" / "coin_flip" / model / f"run-{k}"
            if other == run:
                continue
            other.mkdir(parents=True, exist_ok=True)
            (other / "score.json").write_bytes((run / "score.json").read_bytes())
            flipped = {"YES": "NO", "NO": "YES"}
            judged = {
                t.id: {"prediction": t.row["target"] if rng.random() < right else flipped[t.row["target"]]}
                for t in tasks
            }
            (other / "items.json").write_bytes(
                b"".join(items.encoded(bench.name, bench.prefix_group, bench.item_columns(tasks, judged)))
            )
            read += [other / "score.json", other / "items.json"]
    del tasks, judged
    gc.collect()  # give the tasks' memory back before the child is forked
    floor = floor_seconds(read, whole=True)
    seconds, _, _ = stage("aggregate.py", ["--outputs-dir", str(work / "out"), "--no-plots"])
    yield seconds_figure(
        f"aggregate.py over 3 runs × 2 models × {n:,} rows (item-level figures and comparisons)",
        seconds,
        AGGREGATE_TARGET_S,
        "its score.json and items.json",
        floor,
    )


def stage_memory_figures(work: Path, run: Path, n: int, tiny: bool) -> Iterator[Figure]:
    """Peak memory of judge and infer at n CoinFlip tasks: judge fresh (every row to grade) and resumed, infer
    resumed (RESUME_PENDING tasks left) and fresh over a smaller set, against the loopback server."""
    data, answers = work / "cf-data.jsonl", run / "infer.jsonl"
    pending = 500 if tiny else RESUME_PENDING  # tiny: every step runs, in seconds
    judged = work / "judge-fresh.jsonl"
    seconds, fresh_mb, _ = stage("judge.py", ["--input", str(answers), "--output", str(judged)])
    yield peak_memory_figure(f"judge.py peak memory, {n:,} rows all to grade (rule judge, {seconds:.0f} s)", fresh_mb)
    resumed = work / "judge-resumed.jsonl"
    head(judged, resumed, n - pending)
    judged.unlink()
    seconds, resumed_mb, _ = stage("judge.py", ["--input", str(answers), "--output", str(resumed)])
    yield peak_memory_figure(
        f"judge.py peak memory, {n:,} rows, {pending:,} left to grade ({seconds:.0f} s)", resumed_mb
    )
    server = FakeOpenAI(fixed_latency(0.0)).start()
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
    try:
        resumed = work / "infer-resumed.jsonl"
        head(answers, resumed, n - pending)
        small = work / "cf-small.jsonl"
        fresh_n = 500 if tiny else 10_000
        head(data, small, fresh_n)
        for dataset, output, label in (
            (data, resumed, f"{n:,} tasks, {pending:,} left to run"),
            (small, work / "infer-fresh.jsonl", f"{fresh_n:,} tasks all to run"),
        ):
            server.requests.clear()  # the server keeps what it was asked; this process stays small
            flags = ["--model", "bench", "--input", str(dataset), "--output", str(output), "--workers", "64"]
            seconds, peak_mb, err = stage("infer.py", [*flags, "--allow-config-change"], env)
            wrote = re.search(r"wrote (\d+) rows", err)
            rows = int(wrote.group(1)) if wrote else 0
            yield Figure(
                f"infer.py peak memory, {label} (loopback server, {rows:,} rows written in {seconds:.0f} s)",
                f"{peak_mb:.0f} MB",
                f"<= {PEAK_MEMORY_TARGET_MB} MB",
                peak_mb <= PEAK_MEMORY_TARGET_MB and rows == (pending if output == resumed else fresh_n),
            )
    finally:
        server.stop()
