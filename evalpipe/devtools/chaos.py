"""Nothing lost under faults: kill the stages at random against a faulty server, compare with a clean run.

For each benchmark, infer and judge run against a loopback server that injects faults (5xx, 429
bursts with and without Retry-After, resets, hangs past the timeout, truncated, non-JSON and HTML
bodies with status 200, trickled bodies, errors that echo the Authorization header) while the
stage process is SIGKILLed at random moments and restarted with the same command until it exits
0. The result must equal a clean run against the same deterministic answers: the same task ids,
each once after last-row-wins, no torn line in any file, identical scores, and no API key in any
file or output. Then hostile datasets: each must fail with exit 2 and one line naming the file
and line, leaving an existing output byte for byte unchanged.

    python -m evalpipe.devtools.chaos --kills 20      (make chaos)
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import orjson

from ..benchmarks import REGISTRY, Benchmark, get, row_id
from ..results.figures import headline
from ..store import jsonl
from ..store.paths import PROJECT
from . import fakes
from .testserver import FakeOpenAI, Reply, Request, example_replies

KEY = "sk-chaos-" + "7f3a9c" * 4
FAULTS = (
    "500",
    "502",
    "503",
    "429 Retry-After",
    "429 no Retry-After",
    "reset",
    "hang",
    "truncated body",
    "non-JSON body",
    "HTML with 200",
    "trickled body",
    "echoed key",
)
BENCHES = tuple(REGISTRY)
ANSWER_DELAY = 0.05  # seconds per request: long enough that a random kill lands mid-run


def oracle_for(bench: Benchmark):
    """A handler that gives deterministic, well-formed answers to every request the benchmark makes."""
    return example_replies(bench, ANSWER_DELAY)


def faulty(handler, rate: float, rng: random.Random, counts: Counter):
    def serve(request: Request) -> Reply:
        if rng.random() >= rate:
            return handler(request)
        kind = rng.choice(FAULTS)
        counts[kind] += 1
        good = handler(request)
        if kind in ("500", "502", "503"):
            return Reply.error(int(kind), "injected server error")
        if kind == "429 Retry-After":
            return Reply.error(429, "slow down", headers={"Retry-After": "0.2"})
        if kind == "429 no Retry-After":
            return Reply.error(429, "slow down")
        if kind == "reset":
            return Reply(reset=True)
        if kind == "hang":
            return Reply(hang=True)
        if kind == "truncated body":
            return Reply(body=b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assis')
        if kind == "non-JSON body":
            return Reply(body=b"upstream timeout", content_type="application/json")
        if kind == "HTML with 200":
            return Reply(body=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        if kind == "trickled body":
            good.trickle = 0.01
            return good
        auth = request.headers.get("authorization", "")
        return Reply.error(500, f"could not route request with header Authorization: {auth}")

    return serve


def dataset(bench: str, work: Path, size: int) -> Path:
    """A dataset of about `size` tasks, made by the benchmark from its bundled data."""
    path = work / f"{bench}-data.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in fakes.sample_rows(get(bench), size)))
    return path


class Chaos:
    def __init__(self, work: Path, kills: int, rate: float, seed: int, size: int = 200, log=print):
        self.work, self.kills, self.rate, self.size = work, kills, rate, size
        self.rng = random.Random(seed)
        self.faults: Counter = Counter()
        self.kills_done = 0
        self.kills_by_stage: Counter = Counter()
        self.outputs: list[str] = []
        self.log = log
        self.server = FakeOpenAI(oracle_for(get(BENCHES[0]))).start()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "JUDGE_"))}
        self.env.update(OPENAI_BASE_URL=self.server.base_url, OPENAI_API_KEY=KEY)

    def close(self) -> None:
        self.server.stop()

    def cmd(self, script: str, bench: str, out: Path, extra: Sequence[str] = ()) -> list[str]:
        flags = ["--bench", bench, "--outputs-dir", str(out), "--model", "chaos-model"]
        if script in ("infer", "judge"):
            flags += [
                "--timeout",
                "1",
                "--max-retries",
                "3",
                "--backoff",
                "0.05",
                "--backoff-max",
                "0.3",
                "--workers",
                "4",
            ]
        if script == "judge":
            flags += ["--judge-model", "chaos-judge"]
        return [sys.executable, str(PROJECT / f"{script}.py"), *flags, *extra]

    def run_clean(self, args: list[str]) -> None:
        proc = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=300)
        self.outputs.append(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise AssertionError(f"clean run failed ({proc.returncode}): {proc.stderr[-2000:]}")

    def run_killing(self, args: list[str], label: str = "") -> int:
        """Restart the command until it exits 0, SIGKILLing it at random moments up to `kills` times.

        A stage that finishes before its kill is started again (with nothing left, it exits at
        once), so fast stages are killed at every point of their short life too; it stops trying
        after max(5, kills // 2) clean exits. Returns the number of starts.
        """
        kills_left, starts, clean_exits = self.kills, 0, 0
        while True:
            starts += 1
            if starts > 3 * self.kills + 40:
                raise AssertionError("the stage never finished: " + " ".join(args))
            with tempfile.TemporaryFile("w+") as out:
                proc = subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)
                if kills_left:
                    try:
                        proc.wait(self.rng.uniform(0.1, 1.5))
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        self.kills_done += 1
                        self.kills_by_stage[label] += 1
                        kills_left -= 1
                code = proc.wait()
                out.seek(0)
                self.outputs.append(out.read())
            if code == 0:
                clean_exits += 1
                if not kills_left or clean_exits >= max(5, self.kills // 2):
                    return starts
            elif code not in (-9, 3, 130):
                raise AssertionError(f"unexpected exit {code}: {self.outputs[-1][-2000:]}")

    def bench(self, bench: str) -> dict:
        extra = ["--input", str(dataset(bench, self.work, self.size))]
        clean, chaotic = self.work / bench / "clean", self.work / bench / "chaos"
        oracle = self.server.handler = oracle_for(get(bench))
        self.run_clean(self.cmd("infer", bench, clean, extra))
        self.run_clean(self.cmd("judge", bench, clean))
        self.run_clean(self.cmd("score", bench, clean))
        self.server.handler = faulty(oracle, self.rate, self.rng, self.faults)
        self.run_killing(self.cmd("infer", bench, chaotic, extra), f"{bench} infer")
        self.run_killing(self.cmd("judge", bench, chaotic), f"{bench} judge")
        self.server.handler = oracle
        self.run_clean(self.cmd("score", bench, chaotic))
        return self.compare(bench, clean, chaotic)

    def compare(self, bench: str, clean: Path, chaotic: Path) -> dict:
        run = Path(bench) / "chaos-model" / "run-1"
        lost = dup = 0
        for name in ("infer.jsonl", "judge.jsonl"):
            for path in (chaotic / run).glob("*.jsonl"):
                list(jsonl.iter_rows(path))  # raises on any torn or corrupt line
            want = jsonl.latest_rows(clean / run / name, row_id)
            got = jsonl.latest_rows(chaotic / run / name, row_id)
            raw = Counter(row_id(r) for _, r in jsonl.iter_rows(chaotic / run / name))
            lost += len(set(want) - set(got))
            dup += sum(1 for k in got if raw[k] > 1 and name == "infer.jsonl")
            if set(got) != set(want):
                raise AssertionError(f"{bench} {name}: ids differ: {sorted(set(want) ^ set(got))[:5]}")
        a = json.loads((clean / run / "score.json").read_text())
        b = json.loads((chaotic / run / "score.json").read_text())
        declared = get(bench).figures
        if headline(declared, a) != headline(declared, b) or a["coverage"]["missing"] or b["coverage"]["missing"]:
            raise AssertionError(f"{bench}: scores differ: {headline(declared, a)} vs {headline(declared, b)}")
        return {"rows": len(want), "lost": lost, "infer_duplicates": dup}

    def leaked(self) -> list[str]:
        hits = [str(p) for p in self.work.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
        hits += [f"stage output #{i}" for i, text in enumerate(self.outputs) if KEY in text]
        return hits


# ---- hostile datasets


def _clbench_rows(n: int = 3) -> list[dict]:
    return [json.loads(line) for line in (PROJECT / "data" / "clbench" / "sample.jsonl").read_text().splitlines()[:n]]


def hostile_inputs() -> list[tuple[str, bytes, int | None, str]]:
    """(name, file content, line the error must name (None: whole file), words the error must contain)."""
    rows = _clbench_rows()
    good = [json.dumps(r).encode() for r in rows]

    def doc(*lines: bytes) -> bytes:
        return b"\n".join(lines) + b"\n"

    def edited(i, fn):
        r = json.loads(good[i])
        fn(r)
        return json.dumps(r).encode()

    return [
        ("empty file", b"", None, "no tasks"),
        ("invalid JSON line in the middle", doc(good[0], b'{"messages": [', good[2]), 2, "invalid JSON"),
        ("non-UTF-8 byte", doc(good[0], good[1].replace(b"Context", b"Cont\xffext", 1)), 2, "UTF-8"),
        ("JSON array instead of JSONL", json.dumps(rows).encode(), 1, "JSON array"),
        ("missing messages", doc(good[0], edited(1, lambda r: r.pop("messages"))), 2, "'messages'"),
        ("messages of the wrong type", doc(edited(0, lambda r: r.update(messages={"role": "user"}))), 1, "'messages'"),
        (
            "unknown role",
            doc(good[0], good[1], edited(2, lambda r: r["messages"].insert(1, {"role": "robot", "content": "x"}))),
            3,
            "role 'robot'",
        ),
        ("missing task id", doc(good[0], edited(1, lambda r: r["metadata"].pop("task_id"))), 2, "task_id"),
        ("duplicate task id", doc(good[0], good[1], good[0]), 3, "first on line 1"),
        ("rubrics of the wrong type", doc(good[0], edited(1, lambda r: r.update(rubrics={"a": 1}))), 2, "'rubrics'"),
    ]


def handled_inputs() -> list[tuple[str, bytes]]:
    """Inputs that are odd but valid: they must run (documented behaviour)."""
    rows = _clbench_rows()
    good = [json.dumps(r).encode() for r in rows]
    mixed = json.loads(good[0])
    mixed["rubrics"] = ["plain", {"rubric_criteria": "as a dict"}]
    return [
        ("CRLF line ends", b"\r\n".join(good) + b"\r\n"),
        ("UTF-8 BOM", b"\xef\xbb\xbf" + b"\n".join(good) + b"\n"),
        ("rubrics of mixed types", json.dumps(mixed).encode() + b"\n"),
    ]


def try_hostile(work: Path, env: dict) -> int:
    tried = 0
    out = work / "hostile" / "infer.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    before = b'{"idx": "paid-for", "model_output": "keep me"}\n'
    for name, content, line, words in hostile_inputs():
        data = work / "hostile" / "data.jsonl"
        data.write_bytes(content)
        out.write_bytes(before)
        proc = subprocess.run(
            [sys.executable, str(PROJECT / "infer.py"), "--model", "m", "--input", str(data), "--output", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        where = f"{data}:{line}:" if line else f"{data}:"
        lines = proc.stderr.strip().splitlines()
        if proc.returncode != 2 or len(lines) != 1 or where not in lines[0] or words not in lines[0]:
            raise AssertionError(f"hostile input {name!r}: exit {proc.returncode}, said {proc.stderr!r}")
        if out.read_bytes() != before:
            raise AssertionError(f"hostile input {name!r} changed the existing output")
        tried += 1
    for name, content in handled_inputs():
        data = work / "hostile" / "odd.jsonl"
        data.write_bytes(content)
        proc = subprocess.run(
            [
                sys.executable,
                str(PROJECT / "infer.py"),
                "--model",
                "m",
                "--input",
                str(data),
                "--output",
                str(work / "hostile" / f"odd-{tried}.jsonl"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise AssertionError(f"odd but valid input {name!r}: exit {proc.returncode}: {proc.stderr}")
        tried += 1
    return tried


def main() -> int:
    parser = argparse.ArgumentParser(description="Kill the stages under injected faults; nothing may be lost.")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs per stage and benchmark (default 20)")
    parser.add_argument("--fault-rate", type=float, default=0.3, help="share of requests given a fault (default 0.3)")
    parser.add_argument("--size", type=int, default=200, help="tasks per benchmark (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evalpipe-chaos-") as tmp:
        work = args.work or Path(tmp)
        chaos = Chaos(work, args.kills, args.fault_rate, args.seed, args.size)
        started = time.monotonic()
        try:
            results = {}
            for bench in BENCHES:
                print(f"chaos: {bench}: clean run, then infer and judge with {args.kills} kills each...", flush=True)
                results[bench] = chaos.bench(bench)
            hostile = try_hostile(work, chaos.env)
            leaks = chaos.leaked()
        finally:
            chaos.close()
    faults = ", ".join(f"{k} {v}" for k, v in sorted(chaos.faults.items()))
    lost = sum(r["lost"] for r in results.values())
    dups = sum(r["infer_duplicates"] for r in results.values())
    print("chaos: kills per stage: " + ", ".join(f"{k} {v}" for k, v in chaos.kills_by_stage.items()))
    print(
        f"chaos: kills survived {chaos.kills_done}; faults injected {sum(chaos.faults.values())} ({faults}); "
        f"hostile inputs tried {hostile}; rows lost {lost}; duplicates after last-row-wins {dups}; "
        f"key leaks {len(leaks)}; {time.monotonic() - started:.0f}s"
    )
    return 0 if lost == dups == len(leaks) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
