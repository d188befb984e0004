"""What the parts of `make bench` share: datasets, the child processes they time, and infer.py's run."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from ...store.paths import PROJECT
from ..testserver import Reply, Request

SAMPLE = PROJECT / "data" / "clbench" / "sample.jsonl"


def fixed_latency(seconds: float):
    def handler(request: Request) -> Reply:
        return Reply(content="ok " + request.last_content[-20:], delay=seconds)

    return handler


def dataset(path: Path, n: int) -> Path:
    """n CL-bench tasks, the bundled sample's rows over and over, with task ids of their own."""
    base = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    with open(path, "w") as f:
        for i in range(n):
            row = base[i % len(base)]
            f.write(json.dumps({**row, "metadata": {**row["metadata"], "task_id": f"b{i:07d}"}}) + "\n")
    return path


def tree_pss_kb(pid: int) -> int:
    """The summed proportional set size (KB) of a process and its descendants: what they hold in memory, the
    pages they share (a forked child's with its parent) counted once between them."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text()
            total += int(re.search(r"^Pss:\s+(\d+)", rollup, re.MULTILINE).group(1))  # type: ignore[union-attr]
            for children in Path(f"/proc/{current}/task").glob("*/children"):
                pending += map(int, children.read_text().split())
        except (OSError, AttributeError):  # it ended meanwhile
            continue
    return total


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


def infer_rate(base_url: str, data: Path, out: Path, workers: int, extra=()) -> dict:
    """infer.py over `data` against the server at `base_url`: rows written, failed, seconds and tasks/s of its
    run as it reports them, `wall_s` and `wall_rate` of the whole process (start, read, run, exit), peak RSS,
    RSS samples."""
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "bench"}
    started = time.monotonic()
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
    wall_s = time.monotonic() - started
    m = re.search(r"wrote (\d+) rows, (\d+) failed, .* ([\d.]+)s \(([\d.]+) tasks/s\)", err)
    nothing_to_do = code == 0 and not m and "0 to run" in err
    if code not in (0, 3) or not (m or nothing_to_do):
        raise RuntimeError(f"infer.py exited {code}: {err[-1500:]}")
    rows, failed, seconds, rate = (int(m[1]), int(m[2]), float(m[3]), float(m[4])) if m else (0, 0, 0.0, 0.0)
    return {
        "rows": rows,
        "failed": failed,
        "seconds": seconds,
        "rate": rate,
        "rss_kb": rss,
        "samples": samples,
        "wall_s": wall_s,
        "wall_rate": rows / wall_s,
    }
