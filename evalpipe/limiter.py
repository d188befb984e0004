"""How many requests may be in flight, adapted to an endpoint's rate limit (AIMD).

Every HTTP attempt takes a slot. A 429 cuts the limit by 30%, at most once per round trip (so
one burst of 429s counts once), and, when the server says Retry-After, pauses every new attempt
until then. Successes regrow the limit slowly — about one slot per second, whatever the request
rate — never above the user's ceiling (--workers).
"""

import asyncio
import time


class AdaptiveLimit:
    def __init__(self, ceiling: int, decrease: float = 0.7, growth_per_s: float = 1.0):
        self.ceiling = max(1, ceiling)
        self.limit = float(self.ceiling)
        self.decrease, self.growth_per_s = decrease, growth_per_s
        self.latency_s = 0.1  # smoothed round trip of successful attempts
        self.in_flight = 0
        self.cuts = 0
        self._last_cut = float("-inf")
        self._paused_until = 0.0
        self._changed = asyncio.Condition()

    async def __aenter__(self):
        async with self._changed:
            while True:
                wait = self._paused_until - time.monotonic()
                if wait <= 0 and self.in_flight < int(self.limit):
                    break
                try:
                    await asyncio.wait_for(self._changed.wait(), wait if wait > 0 else None)
                except TimeoutError:
                    pass
            self.in_flight += 1
        return self

    async def __aexit__(self, *exc):
        async with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    def succeeded(self, latency_s: float) -> None:
        self.latency_s += 0.2 * (latency_s - self.latency_s)
        # `limit` slots finish about limit/latency requests a second: this adds growth_per_s a second
        self.limit = min(self.ceiling, self.limit + self.growth_per_s * self.latency_s / self.limit)

    def rate_limited(self, retry_after: float | None) -> None:
        now = time.monotonic()
        if retry_after:
            self._paused_until = max(self._paused_until, now + retry_after)
        if now - self._last_cut >= self.latency_s:
            self._last_cut = now
            self.limit = max(1.0, self.limit * self.decrease)
            self.cuts += 1
