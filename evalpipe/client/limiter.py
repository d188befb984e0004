"""How many requests may be in flight (AIMD), and when the next may start: paced to a server's x-ratelimit-* headers
or to a rate measured between its 429s, never past `max_wait_s` (docs/design.md#concurrency says how and why)."""

import asyncio
import bisect
import contextlib
import datetime
import math
import re
import time
from collections import deque
from collections.abc import Callable, Mapping

_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
LIMITS = ("requests", "tokens")
Announce = Callable[[float, str], None]  # told of each long wait: its seconds and why
CUT = 0.7  # a rate limit's 429 leaves this share of the slots (at most once per round trip)
GROWTH_PER_S = 1.0  # slots regrown a second while attempts succeed, up to the ceiling
RESERVE_S = 0.05  # kept unspent in each bucket, in seconds of refill: slack for when the server counts an attempt
RATE_MEMORY = 0.9  # weight of the older samples in the refill-rate estimate
MEASURE_ADMITTED = 10  # two 429s measure a rate when this many requests were admitted between them,
MEASURE_SPAN_S = 2.0  # or when they are this far apart (a slow server)
LEARNED_MARGIN = 0.98  # a measured rate is paced at this much of itself (measuring is accurate to a request or two)
PROBE_PER_S = 0.02  # the learned rate grows this much a second without a 429, to find out if it has grown
SENT_MEMORY_S = 60.0  # how long the times of sent attempts are kept to measure from
MIN_FIT_POINTS = 5  # replies before their (reset, remaining) points tell a bucket's size and rate, or windows
FIT_MEMORY = 0.97  # weight of the older points in that fit
OUTCOMES = 200  # a 429 is a limit's when LIMIT_SHARE of the last OUTCOMES attempts were answered 429,
LIMIT_SHARE = 0.05
LIMIT_REJECTS = 4  # and at least this many


def parse_duration(text: str) -> float | None:
    """Seconds in a reset value: a Go duration ("20ms", "6m0s", "1m30.5s"), a bare number of seconds, or None."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _GO_DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def announced_limits(headers: Mapping[str, str]) -> dict[str, tuple[float, float, float]]:
    """{kind: (limit, remaining, seconds until full)} for each limit whose x-ratelimit-* headers are readable."""
    found = {}
    for kind in LIMITS:
        try:
            limit = float(headers[f"x-ratelimit-limit-{kind}"])
            remaining = float(headers[f"x-ratelimit-remaining-{kind}"])
            reset_s = parse_duration(headers[f"x-ratelimit-reset-{kind}"])
        except (KeyError, ValueError):
            continue
        if reset_s is not None and math.isfinite(reset_s) and 1 <= limit < math.inf:  # below 1: none to pace to
            found[kind] = (limit, max(0.0, remaining), reset_s)
    return found


def wall_clock(seconds_from_now: float) -> str:
    try:
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    except OverflowError:
        return "never (past the year 9999)"
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


class PacedPastLimit(Exception):
    """The pacing would hold an attempt `wait_s` seconds, past max_wait_s, for what the server `said`."""

    def __init__(self, wait_s: float, said: str):
        super().__init__(f"{wait_s:.0f}s: {said}")
        self.wait_s, self.said = wait_s, said


class ServerBudget:
    """One limit of the server (requests or tokens) as a bucket we spend from before it does; unknown (never
    paces) until a reply announces it. `spent` counts everything taken: a reply tells what was taken after it."""

    def __init__(self) -> None:
        self.limit, self.rate = 0.0, 0.0  # the bucket's size and its refill per second
        self.level = 0.0  # what the server has left now, by our account; below zero: owed to waiting attempts
        self.at = time.monotonic()
        self.spent, self.unsent = 0.0, 0.0  # taken in all; taken by attempts still waiting to go
        self._deficit_sum = self._reset_sum = 0.0  # decayed sums of (limit - remaining) and of reset seconds
        self._fit = [0.0] * 5  # decayed sums over the points: weight, reset, remaining, reset², reset·remaining
        self.window_end: float | None = None  # fixed windows: when the current one ends (None: a refilling bucket)
        self._latest_end = float("-inf")  # the latest window end a reply has told
        self._window_over = float("-inf")  # the end of the last window refilled
        self._last_point: tuple[float, float] | None = None  # the last reply's (reset, remaining)
        self._votes = 0.0  # decayed: +1 for each pair of replies that look like windows, -1 like a bucket
        self._last_said: tuple[float, float, float, float] | None = None  # limit, remaining, reset_s; when (epoch)

    @property
    def said(self) -> str:
        if self._last_said is None:
            return "429s"
        limit, remaining, reset_s, at = self._last_said
        whole = wall_clock(at + reset_s - time.time())
        return f"limit {limit:g}, remaining {remaining:g}, reset {reset_s:g}s: whole again {whole}"

    @property
    def known(self) -> bool:
        return self.limit > 0 and (self.rate > 0 or self.window_end is not None)

    @property
    def reserve(self) -> float:  # none in windows: their count is exact, nothing refills unseen in between
        return 0.0 if self.window_end is not None else min(self.rate * RESERVE_S, 0.1 * self.limit)

    def _refill(self, now: float) -> None:
        if self.window_end is not None:
            if now >= self.window_end:  # a new window: whole again, less what the attempts waiting to go take
                self.level = self.limit - self.unsent
                self._window_over = self.window_end  # replies counted in it are stale now
                self.window_end = float("inf")  # the next reply says when the new one ends
        else:
            self.level = min(self.limit, self.level + self.rate * (now - self.at))
        self.at = now

    def take(self, cost: float, now: float) -> float:
        """Spends `cost` and returns the mark an attempt waits on (wait_s)."""
        if self.known:
            self._refill(now)
            self.level -= min(cost, self.limit)  # more than the whole limit goes when the bucket is full, if ever
        self.spent += cost
        self.unsent += cost
        return self.spent

    def wait_s(self, mark: float, now: float) -> float:
        """Seconds until what is left, not counting what attempts after `mark` took, is back above the reserve."""
        if not self.known:
            return 0.0
        self._refill(now)
        short = self.reserve - (self.level + self.spent - mark)
        if short <= 0:
            return 0.0
        if self.window_end is not None:
            return max(self.window_end - now, 0.001) if self.window_end != float("inf") else 0.05
        return short / self.rate

    def _fitted(self, remaining: float, reset_s: float) -> tuple[float, float] | None:
        """(size, rate) of a refilling bucket fitted to the replies' points, (0, 0) for fixed windows, or None
        while the points do not tell (docs/design.md: less left means a longer reset in a bucket only)."""
        if self._last_point is not None and remaining != self._last_point[1] and reset_s != self._last_point[0]:
            opposite = (remaining - self._last_point[1]) * (reset_s - self._last_point[0]) < 0
            self._votes = FIT_MEMORY * self._votes + (-1.0 if opposite else 1.0)
        self._last_point = (reset_s, remaining)
        fit = self._fit
        for i, value in enumerate((1.0, reset_s, remaining, reset_s * reset_s, reset_s * remaining)):
            fit[i] = FIT_MEMORY * fit[i] + value
        weight, t, r, tt, tr = fit
        if weight < MIN_FIT_POINTS * 0.9 or abs(self._votes) < 2:
            return None
        if self._votes > 0:
            return 0.0, 0.0  # what is left falls with the time to reset: windows, not a bucket
        spread = tt / weight - (t / weight) ** 2
        if spread <= (0.02 * max(t / weight, 1e-3)) ** 2:
            return None  # resets too alike to draw a line through
        slope = (tr / weight - t * r / weight**2) / spread
        return None if slope >= 0 else (r / weight - slope * t / weight, -slope)

    def announced(self, limit: float, remaining: float, reset_s: float, mark: float, sent_at: float, now: float):
        """A reply's headers for the attempt that took up to `mark` and started at `sent_at`."""
        self._last_said = (limit, remaining, reset_s, time.time())
        fitted = self._fitted(remaining, reset_s)
        if fitted == (0.0, 0.0):  # fixed windows: this one ends `reset_s` after the attempt reached the server
            self.limit, self.rate = limit, 0.0
            end = sent_at + reset_s
            if end < self._latest_end - 0.01 or end <= self._window_over + 0.01:
                return  # a late reply from a window already over
            windows_before = self.window_end is not None
            self._latest_end = max(self._latest_end, end)
            self.window_end = self._latest_end
            if windows_before:
                # our count is exact within a window; the server's `remaining` tells of less (other clients), not more
                self._refill(now)
                self.level = min(self.level, remaining - self.unsent)
            else:
                self.level = remaining - (self.spent - mark)
        else:
            self.window_end = None
            if fitted is not None:
                self.limit, self.rate = max(fitted[0], remaining, 1.0), fitted[1]
            else:
                self.limit = limit
                if reset_s > 0 and remaining < limit:
                    self._deficit_sum = RATE_MEMORY * self._deficit_sum + (limit - remaining)
                    self._reset_sum = RATE_MEMORY * self._reset_sum + reset_s
                # never seen short: OpenAI's limits are per minute
                self.rate = self._deficit_sum / self._reset_sum if self._reset_sum > 0 else limit / 60
            refilled = self.rate * max(0.0, now - sent_at)
            self.level = min(self.limit, remaining + refilled) - (self.spent - mark)
        self.at = now

    def found_empty(self, rate: float, taken_after: float, sent_at: float, now: float) -> None:
        """A 429 without headers for an attempt sent at `sent_at`: empty then, `taken_after` admitted since."""
        self.rate, self.limit = rate, max(1.0, rate * 0.5)
        self.level = min(self.limit, rate * max(0.0, now - sent_at)) - taken_after
        self.at = now

    def grow(self, factor: float, now: float) -> None:
        self._refill(now)
        self.rate, self.limit = self.rate * factor, self.limit * factor


class AdaptiveLimit:
    def __init__(self, ceiling: int):
        self.ceiling = max(1, ceiling)
        self.limit = float(self.ceiling)
        self.latency_s = 0.1  # smoothed round trip of successful attempts
        self.in_flight = self.cuts = 0
        self.budgets = {kind: ServerBudget() for kind in LIMITS}
        self.learned = ServerBudget()  # the rate of a server that only answers 429, once measured
        self._sent: deque[float] = deque()  # when recent attempts were sent, in order
        self._rejected: deque[float] = deque()  # when those answered 429 were sent
        self._empty_since: float | None = None  # when the first 429 since the last measurement was sent
        self._probed_at = 0.0
        self._waiting = 0  # attempts waiting for the pacing to let them go
        self._first_answer_at = float("inf")
        self.chars_per_token = 4.0  # learned from the prompt_tokens of replies
        self._prompt_chars_seen = self._prompt_tokens_seen = 0.0
        self._outcomes: deque[bool] = deque(maxlen=OUTCOMES)  # the last attempts' answers: True, 429
        self._last_cut, self._paused_until = float("-inf"), 0.0
        self._changed = asyncio.Condition()

    async def __aenter__(self):
        async with self._changed:
            while True:
                wait = self._paused_until - time.monotonic()
                if wait <= 0 and self.in_flight < int(self.limit):
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait if wait > 0 else None)
            self.in_flight += 1
        return self

    async def __aexit__(self, *exc):
        async with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    def estimated_tokens(self, prompt_chars: int, max_tokens: int) -> float:
        return prompt_chars / self.chars_per_token + max_tokens

    def learn_prompt_tokens(self, prompt_chars: int, prompt_tokens: int) -> None:
        if prompt_chars <= 0 or prompt_tokens <= 0:
            return
        self._prompt_chars_seen = RATE_MEMORY * self._prompt_chars_seen + prompt_chars
        self._prompt_tokens_seen = RATE_MEMORY * self._prompt_tokens_seen + prompt_tokens
        self.chars_per_token = self._prompt_chars_seen / self._prompt_tokens_seen

    @property
    def paced(self) -> bool:
        """Whether the server announces its limits in headers (and the pacing keeps us within them)."""
        return any(budget.known for budget in self.budgets.values())

    @property
    def pacing(self) -> bool:
        """Whether attempts are paced: from the server's headers, or at a rate measured between its 429s."""
        return self.paced or self.learned.known

    def _sending(self, sent_at: float) -> None:
        self._sent.append(sent_at)
        while self._sent[0] < sent_at - SENT_MEMORY_S:
            self._sent.popleft()
        while self._rejected and self._rejected[0] < sent_at - SENT_MEMORY_S:
            self._rejected.popleft()

    def _found_empty(self, sent_at: float) -> None:
        """A 429 without headers for the attempt sent at `sent_at`: measure the rate since the last such one."""
        since = self._empty_since
        self._rejected.append(sent_at)
        if sent_at < self._first_answer_at:
            return  # the first attempts all start at once: when each reached the server is anyone's guess
        if since is None or sent_at < since:
            self._empty_since = sent_at
            return
        span = sent_at - since
        sent = bisect.bisect_left(self._sent, sent_at) - bisect.bisect_right(self._sent, since)
        admitted = sent - sum(1 for at in self._rejected if since < at < sent_at)
        if span <= 0 or admitted < (MEASURE_ADMITTED if span < MEASURE_SPAN_S else 1):
            return
        # what the server admitted after it (not the attempts answered 429 as well), and what waits to go
        sent_after = len(self._sent) - bisect.bisect_right(self._sent, sent_at)
        taken_after = sent_after - sum(1 for at in self._rejected if at > sent_at) + self._waiting
        now = time.monotonic()
        self.learned.found_empty(LEARNED_MARGIN * admitted / span, taken_after, sent_at, now)
        self._probed_at = now
        self._empty_since = sent_at

    def limit_reached(self, announced: dict[str, tuple[float, float, float]]) -> bool:
        """Whether a 429 (already counted) is a rate limit's, not an overloaded server's (docs/design.md)."""
        if any(remaining < 1 for _, remaining, _ in announced.values()) or self.learned.known:
            return True  # said empty, or a limit's rate already measured between 429s (each 429 corrects it)
        # out of the attempts answered and those still in flight: a 429 comes back at once, an answer after the
        # model's time, so at the start of a run the answered alone are mostly the 429s of the first burst
        seen, rejects = len(self._outcomes) + self.in_flight, sum(self._outcomes)
        return rejects >= LIMIT_REJECTS and rejects >= LIMIT_SHARE * max(seen, OUTCOMES // 4)

    def succeeded(self, latency_s: float) -> None:
        self.latency_s += 0.2 * (latency_s - self.latency_s)
        # `limit` slots finish about limit/latency requests a second: this adds GROWTH_PER_S a second
        self.limit = min(self.ceiling, self.limit + GROWTH_PER_S * self.latency_s / self.limit)

    def rate_limited(self, retry_after: float | None) -> None:
        now = time.monotonic()
        if retry_after:
            self._paused_until = max(self._paused_until, now + retry_after)
        if self.learned.known and not self.paced:
            return  # the pacing at the measured rate holds the requests back, not fewer slots
        if now - self._last_cut >= self.latency_s:
            self._last_cut = now
            self.limit = max(1.0, self.limit * CUT)
            self.cuts += 1


class Attempt:
    """A slot and the pacing's go-ahead for one HTTP attempt, whose reply's headers go back to the budgets."""

    def __init__(self, limit: AdaptiveLimit, prompt_chars: int, max_tokens: int, max_wait_s: float, announce: Announce):
        self.limit, self.prompt_chars, self.max_wait_s, self.announce = limit, prompt_chars, max_wait_s, announce
        self.costs = {"requests": 1.0, "tokens": limit.estimated_tokens(prompt_chars, max_tokens)}
        self.marks: dict[str, float] = {}
        self.sent_at = 0.0

    async def __aenter__(self) -> "Attempt":
        limit = self.limit
        await limit.__aenter__()
        try:
            budgets = limit.budgets if limit.paced else {**limit.budgets, "learned": limit.learned}
            now = time.monotonic()
            self.marks = {kind: budget.take(self.costs.get(kind, 1.0), now) for kind, budget in budgets.items()}
            limit._waiting += 1
            try:
                while (wait := max(budget.wait_s(self.marks[kind], now) for kind, budget in budgets.items())) > 0:
                    kind = max(budgets, key=lambda kind: budgets[kind].wait_s(self.marks[kind], now))
                    said = (
                        f"{kind} limit ({budgets[kind].said})" if kind in LIMITS else "rate measured between its 429s"
                    )
                    if wait > self.max_wait_s:
                        raise PacedPastLimit(wait, said)
                    self.announce(wait, f"pacing to the endpoint's {said}")
                    await asyncio.sleep(wait)
                    now = time.monotonic()
            finally:
                limit._waiting -= 1
                for kind, budget in budgets.items():  # gone, or given up waiting
                    budget.unsent -= self.costs.get(kind, 1.0)
            self.sent_at = now
            limit._sending(now)
        except BaseException:
            await limit.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.limit.__aexit__()

    def _announced(self, headers: Mapping[str, str]) -> dict[str, tuple[float, float, float]]:
        now = time.monotonic()
        self.limit._first_answer_at = min(self.limit._first_answer_at, now)
        announced = announced_limits(headers)
        for kind, (limit, remaining, reset_s) in announced.items():
            self.limit.budgets[kind].announced(limit, remaining, reset_s, self.marks[kind], self.sent_at, now)
        return announced

    def succeeded(self, headers: Mapping[str, str], prompt_tokens: int | None) -> None:
        limit, now = self.limit, time.monotonic()
        limit._outcomes.append(False)
        if not self._announced(headers):  # a learned rate grows slowly, to find out if the server's has
            if limit.learned.known:
                limit.learned.grow(1 + PROBE_PER_S * (now - limit._probed_at), now)
            limit._probed_at = now
        if prompt_tokens:
            limit.learn_prompt_tokens(self.prompt_chars, prompt_tokens)
        limit.succeeded(time.monotonic() - self.sent_at)

    def rate_limited(self, headers: Mapping[str, str], retry_after: float | None) -> None:
        self.limit._outcomes.append(True)
        announced = self._announced(headers)
        if not self.limit.limit_reached(announced):
            # an overloaded server's sporadic 429: only this request waits (and it counts as not admitted)
            self.limit._rejected.append(self.sent_at)
            return
        if not announced and "learned" in self.marks:
            self.limit._found_empty(self.sent_at)
        self.limit.rate_limited(retry_after)
