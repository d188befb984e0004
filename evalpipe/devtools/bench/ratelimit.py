"""`make bench`'s rate-limit part: infer.py against a server that admits 50 requests/s and answers
the rest 429, with and without Retry-After."""

import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..testserver import FakeOpenAI, Reply, Request
from .common import dataset, infer_rate
from .report import Figure


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


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    server = FakeOpenAI().start()
    try:
        for with_header in (True, False):
            bucket = TokenBucket(50, 50, 0.1, with_header)
            server.handler = bucket
            n = 200 if tiny else 3000
            data = dataset(work / f"limited-{with_header}.jsonl", n)
            ours = infer_rate(server, data, work / f"limited-{with_header}-out.jsonl", 64)
            share = bucket.rejected / max(1, bucket.admitted + bucket.rejected)
            goodput = ours["rows"] / ours["seconds"]
            label = "with" if with_header else "without"
            yield Figure(
                f"rate-limited ({label} Retry-After): goodput",
                f"{goodput:.1f}/s",
                ">= 0.90",
                goodput >= 45,
                reference="50/s allowed",
                ratio=goodput / 50,
            )
            yield Figure(
                f"rate-limited ({label} Retry-After): requests answered 429",
                f"{100 * share:.1f}% ({bucket.rejected} of {bucket.admitted + bucket.rejected})",
                "<= 10%",
                share <= 0.10,
            )
            yield Figure(
                f"rate-limited ({label} Retry-After): tasks given up", str(ours["failed"]), "0", ours["failed"] == 0
            )
    finally:
        server.stop()
