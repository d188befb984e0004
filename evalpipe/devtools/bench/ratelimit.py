"""`make bench`'s rate-limit part: infer.py against a server with OpenAI-style limits (testserver.RateLimit),
announced in x-ratelimit-* headers (limited by requests, then by tokens), or only answered 429 with
Retry-After, or 429 with nothing.

The reference is what the limit allows over the run: a full bucket at the start plus the refill
over the run's seconds (burst + rate * seconds), so a run that gets every admission it could is 1.00.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..plainserver import Behaviour, PlainServer
from ..testserver import FakeOpenAI, FixedWindow, RateLimit
from .common import dataset, fixed_latency, infer_rate
from .report import Figure

LATENCY_S = 0.1
WORKERS = 64
MAX_TOKENS = 100  # sent with every request of the tokens-limited case, counted against its limit


@dataclass
class Case:
    name: str
    rpm: float
    tpm: float | None
    burst_s: float
    headers: bool
    retry_after: bool
    tasks: int
    tiny_tasks: int
    shape: str = "bucket"  # bucket: testserver.RateLimit; window: testserver.FixedWindow; plain: plainserver's bucket
    per_minute_limit: bool = False  # the bucket announces the per-minute limit as limit-requests, not its size

    @property
    def by_tokens(self) -> bool:
        return self.tpm is not None

    @property
    def goodput_target(self) -> float:
        return 0.97 if self.headers else 0.95

    @property
    def rejected_target(self) -> float:
        return 0.02 if self.headers else 0.05


CASES = (
    # OpenAI's shape: a minute's allowance up front, then 50/s
    Case("headers, requests-limited", 3000, None, 60.0, True, True, tasks=4500, tiny_tasks=50),
    # about 40 requests/s of CL-bench prompts plus max_tokens; requests to spare
    Case("headers, tokens-limited", 6000, 540_000, 1.0, True, True, tasks=1600, tiny_tasks=30),
    Case("Retry-After only", 3000, None, 1.0, False, True, tasks=2000, tiny_tasks=30),
    Case("429 with nothing", 3000, None, 1.0, False, False, tasks=2000, tiny_tasks=30),
    # a token bucket of 50 refilling at 50/s whose limit-requests says the per-minute limit (3000)
    Case("headers, bucket of 50 announced per minute", 3000, None, 1.0, True, True, 2000, 30, per_minute_limit=True),
    Case("headers, fixed windows of 50 a second", 3000, None, 1.0, True, True, 2000, 30, shape="window"),
    Case("headers, bucket of 50 per minute, second server", 3000, None, 1.0, True, True, 2000, 30, shape="plain"),
)


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    server = FakeOpenAI().start()
    try:
        for number, case in enumerate(CASES):
            tiny_case = tiny and case.burst_s > 1  # a minute's burst would be the whole tiny run
            data = dataset(work / f"limited-{number}.jsonl", case.tiny_tasks if tiny else case.tasks)
            extra = ("--max-tokens", str(MAX_TOKENS)) if case.by_tokens else ()
            out = work / f"limited-{number}-out.jsonl"
            if case.shape == "plain":
                behaviour = Behaviour(latency=LATENCY_S, bucket=int(case.rpm / 60 * case.burst_s), rpm=case.rpm)
                with PlainServer(behaviour) as plain:
                    ours = infer_rate(plain.base_url, data, out, WORKERS, extra)
                seconds = ours["seconds"]
                admitted, rejected = plain.counters.ok, plain.counters.limited
                unit, allowed = "req/s", case.rpm / 60 * (case.burst_s + seconds)
            else:
                if case.shape == "window":
                    limit: RateLimit | FixedWindow = FixedWindow(
                        fixed_latency(LATENCY_S), int(case.rpm / 60), window_s=1.0
                    )
                else:
                    limit = RateLimit(
                        fixed_latency(LATENCY_S),
                        rpm=case.rpm,
                        tpm=case.tpm,
                        burst_s=1.0 if tiny_case else case.burst_s,
                        headers=case.headers,
                        retry_after=case.retry_after,
                        per_minute_limit=case.per_minute_limit,
                    )
                server.handler = limit
                ours = infer_rate(server.base_url, data, out, WORKERS, extra)
                seconds = ours["seconds"]
                rejected = limit.rejected
                if isinstance(limit, FixedWindow):
                    unit, admitted, allowed = "req/s", ours["rows"], limit.allowed(seconds)
                elif case.by_tokens:
                    unit, admitted, allowed = "tokens/s", limit.admitted_tokens, limit.allowed("tokens", seconds)
                else:
                    unit, admitted, allowed = "req/s", ours["rows"], limit.allowed("requests", seconds)
            ratio = min(admitted, allowed) / allowed if case.shape == "window" else admitted / allowed
            yield Figure(
                f"rate-limited ({case.name}): goodput",
                f"{admitted / seconds:,.1f} {unit}",
                f">= {case.goodput_target:.2f}",
                ratio >= case.goodput_target,
                reference=f"{allowed / seconds:,.1f} {unit} allowed",
                ratio=ratio,
            )
            attempts = ours["rows"] + rejected
            share = rejected / max(1, attempts)
            yield Figure(
                f"rate-limited ({case.name}): requests answered 429",
                f"{100 * share:.1f}% ({rejected} of {attempts})",
                f"<= {100 * case.rejected_target:.0f}%",
                share <= case.rejected_target,
            )
            yield Figure(f"rate-limited ({case.name}): tasks given up", str(ours["failed"]), "0", ours["failed"] == 0)
    finally:
        server.stop()
