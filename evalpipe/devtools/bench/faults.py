"""`make bench`'s faults part: infer.py at 256 in flight against a provider that fails a few replies, each run
timed as a whole process (start, read, run, exit) and compared with the same run without faults.

  sporadic 429s    1% of replies 429 + Retry-After: 1, an overloaded provider (no x-ratelimit-*): target 0.7
                   of the fault-free rate, on our test server and on the second server (plainserver.py)
  500s and resets  1% HTTP 500, 0.5% connections dropped: reported beside the fault-free rate
  exactly once     every task has one row, none twice

The tasks are CoinFlip's test split (3,333; 3,000 of them), answered after 0 to 100 ms.
"""

import json
import random
from collections.abc import Iterator
from pathlib import Path

from ...store.paths import PROJECT
from ..plainserver import Behaviour, PlainServer
from ..testserver import FakeOpenAI, Faults, Reply, Request
from .common import infer_rate
from .report import Figure

WORKERS = 256
TASKS, TINY_TASKS = 3000, 200
SPORADIC_TARGET = 0.7


def varied_latency(seed: int = 0):
    """Answers after 0 to 100 ms (uniform), each one YES."""
    draws = random.Random(seed)

    def handler(request: Request) -> Reply:
        return Reply(content="ANSWER: YES", delay=0.1 * draws.random())

    return handler


def run(server_url: str, work: Path, name: str, n: int) -> dict:
    out = work / f"{name}.jsonl"
    ran = infer_rate(
        server_url,
        PROJECT / "data" / "coin_flip" / "test.jsonl",
        out,
        WORKERS,
        ("--bench", "coin_flip", "--max-samples", str(n)),
    )
    ids = [json.loads(line)["idx"] for line in out.read_text().splitlines()]
    ran["once"] = len(ids) == len(set(ids)) == n
    return ran


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    n = TINY_TASKS if tiny else TASKS
    with FakeOpenAI(varied_latency()) as server:
        clean = run(server.base_url, work, "clean", n)
        server.handler = Faults(varied_latency(), overloaded=0.01, retry_after=1.0)
        sporadic = run(server.base_url, work, "sporadic-429", n)
        server.handler = Faults(varied_latency(), errors=0.01, resets=0.005)
        broken = run(server.base_url, work, "500s-resets", n)
    with PlainServer(Behaviour(latency=0.05)) as plain:
        plain_clean = run(plain.base_url, work, "plain-clean", n)
    with PlainServer(Behaviour(latency=0.05, overloaded=0.01)) as plain:
        plain_sporadic = run(plain.base_url, work, "plain-sporadic-429", n)

    def share(name: str, ran: dict, reference: dict, where: str, target: float | None) -> Figure:
        ratio = ran["wall_rate"] / reference["wall_rate"]
        return Figure(
            f"faults: {name}, {WORKERS} in flight, {where}",
            f"{ran['wall_rate']:.0f} tasks/s ({ran['wall_s']:.1f} s)",
            f">= {target:.2f}" if target else "reported",
            ratio >= target if target else True,
            reference=f"fault-free {reference['wall_rate']:.0f} tasks/s",
            ratio=ratio,
        )

    yield share("1% 429 + Retry-After: 1", sporadic, clean, "test server", SPORADIC_TARGET)
    yield share("1% 429 + Retry-After: 1", plain_sporadic, plain_clean, "second server", SPORADIC_TARGET)
    yield share("1% 500 + 0.5% resets", broken, clean, "test server", None)
    runs = (clean, sporadic, broken, plain_clean, plain_sporadic)
    yield Figure(
        "faults: every task written exactly once",
        f"{sum(r['once'] for r in runs)} of {len(runs)} runs",
        "all",
        all(r["once"] for r in runs),
    )
