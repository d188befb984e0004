"""evalpipe.client.limiter.AdaptiveLimit in process: the ceiling, cuts on 429, Retry-After pauses and regrowth,
measured with real asyncio tasks (and one real 429 from the loopback server); the arithmetic of pacing
from x-ratelimit-* headers (tests/test_ratelimit.py runs it against the rate-limited server)."""

import asyncio
import time

from evalpipe.client.limiter import LEARNED_MARGIN, AdaptiveLimit, ServerBudget, announced_limits, parse_duration
from evalpipe.client.llm import ChatClient, Endpoint, max_tokens_of, prompt_chars
from evalpipe.devtools.testserver import Reply, go_duration

from .conftest import API_KEY


async def most_in_flight(limit: AdaptiveLimit, n: int, hold: float = 0.01) -> int:
    """Start n tasks that each hold a slot for `hold` seconds; the most that held one at once."""
    now = peak = 0

    async def one():
        nonlocal now, peak
        async with limit:
            now += 1
            peak = max(peak, now)
            assert limit.in_flight == now
            await asyncio.sleep(hold)
            now -= 1

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), 10)
    assert limit.in_flight == 0  # every slot was given back
    return peak


def test_never_more_than_the_ceiling_in_flight():
    async def main():
        return [await most_in_flight(AdaptiveLimit(ceiling), 25) for ceiling in (1, 4, 10)]

    assert asyncio.run(main()) == [1, 4, 10]


def test_a_ceiling_below_one_still_lets_one_call_through():
    async def main():
        return await most_in_flight(AdaptiveLimit(0), 5)

    assert asyncio.run(main()) == 1


def test_a_429_cuts_the_limit_and_fewer_calls_go_out():
    async def main():
        limit = AdaptiveLimit(10)
        limit.rate_limited(None)
        assert limit.cuts == 1 and abs(limit.limit - 7.0) < 1e-9
        return await most_in_flight(limit, 25)

    assert asyncio.run(main()) == 7


def test_a_burst_of_429s_within_one_round_trip_counts_once():
    limit = AdaptiveLimit(10)
    for _ in range(5):
        limit.rate_limited(None)
    assert limit.cuts == 1 and abs(limit.limit - 7.0) < 1e-9
    time.sleep(limit.latency_s + 0.02)  # a round trip later: the next 429 is news
    limit.rate_limited(None)
    assert limit.cuts == 2 and abs(limit.limit - 4.9) < 1e-9


def test_cuts_never_go_below_one_slot():
    limit = AdaptiveLimit(3)
    limit.latency_s = 0.0  # every 429 is a new round trip
    for _ in range(20):
        limit.rate_limited(None)
    assert limit.limit == 1.0

    async def main():
        return await most_in_flight(limit, 4)

    assert asyncio.run(main()) == 1


def test_retry_after_pauses_every_new_attempt_then_lets_them_go():
    async def main():
        limit = AdaptiveLimit(4)
        limit.rate_limited(0.3)  # plenty of free slots, but the server asked us to wait
        began = time.monotonic()
        entered = []

        async def one():
            async with limit:
                entered.append(time.monotonic() - began)

        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(3))), 5)
        return entered

    entered = asyncio.run(main())
    assert len(entered) == 3 and min(entered) >= 0.28 and max(entered) < 2


def test_a_pause_does_not_hold_back_attempts_already_in_flight():
    async def main():
        limit = AdaptiveLimit(4)
        order = []

        async def inside():
            async with limit:
                limit.rate_limited(0.3)
                order.append("in flight finished")

        async def later():
            await asyncio.sleep(0.01)
            async with limit:
                order.append("new attempt")

        await asyncio.gather(inside(), later())
        return order

    assert asyncio.run(main()) == ["in flight finished", "new attempt"]


def test_successes_regrow_the_limit_up_to_the_ceiling_and_no_further():
    limit = AdaptiveLimit(10)
    limit.latency_s = 0.0
    for _ in range(2):
        limit.rate_limited(None)
    assert limit.limit < 5
    before = limit.limit
    limit.succeeded(0.1)
    assert limit.limit > before
    for _ in range(2000):
        limit.succeeded(0.1)
    assert limit.limit == 10.0

    async def main():
        return await most_in_flight(limit, 25)

    assert asyncio.run(main()) == 10


def test_regrowth_is_about_one_slot_per_second_whatever_the_request_rate():
    """Simulated traffic: `limit` slots each answering in L seconds finish limit/L calls a second."""
    grown = {}
    for latency in (0.02, 0.1, 0.5):
        limit = AdaptiveLimit(100)
        limit.latency_s = latency
        limit.limit = 20.0
        clock = 0.0
        while clock < 3.0:
            limit.succeeded(latency)
            clock += latency / limit.limit
        grown[latency] = limit.limit - 20.0
    assert all(2.5 < g < 3.5 for g in grown.values()), grown


EMPTY = {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}


def test_a_real_429_that_says_the_limit_is_empty_cuts_and_pauses_the_client(server):
    replies = iter([Reply.error(429, "slow down", headers={"Retry-After": "0.3", **EMPTY})])
    server.handler = lambda request: next(replies, Reply(content="fine"))
    endpoint = Endpoint("m", base_url=server.base_url, api_key=API_KEY, max_retries=2, backoff_initial=0.01)

    async def main():
        limit = AdaptiveLimit(5)
        client = ChatClient(endpoint, limit)
        began = time.monotonic()
        try:
            done = await client.complete([{"role": "user", "content": "hi"}])
        finally:
            await client.aclose()
        return limit, done, time.monotonic() - began

    limit, done, elapsed = asyncio.run(main())
    assert done.text == "fine" and done.attempts == 2
    assert limit.cuts == 1 and limit.limit < 5 and limit.in_flight == 0
    assert elapsed >= 0.28
    assert len(server.chat_requests()) == 2


# ---- pacing from x-ratelimit-* headers


def test_reset_durations_read_as_go_prints_them_or_as_bare_seconds():
    cases = {"20ms": 0.02, "1s": 1.0, "6m0s": 360.0, "1m30.5s": 90.5, "0s": 0.0, "2h3m": 7380.0, "1.5": 1.5}
    cases |= {"250us": 0.00025, "1h0m0.001s": 3600.001}
    for text, seconds in cases.items():
        parsed = parse_duration(text)
        assert parsed is not None and abs(parsed - seconds) < 1e-9, text
    for text in ("", "soon", "1m30.5", "ms", "-1s", "1 s"):
        assert parse_duration(text) is None, text


def test_the_test_servers_reset_values_read_back():
    for seconds in (0.0, 0.02, 0.5, 1.0, 59.25, 60.0, 90.5, 360.0, 3725.125):
        assert abs(parse_duration(go_duration(seconds)) - seconds) < 1e-3, go_duration(seconds)


def test_announced_limits_are_read_only_when_all_three_headers_are_there():
    headers = {
        "x-ratelimit-limit-requests": "3000",
        "x-ratelimit-remaining-requests": "2999",
        "x-ratelimit-reset-requests": "20ms",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149000",
    }
    assert announced_limits(headers) == {"requests": (3000.0, 2999.0, 0.02)}
    assert announced_limits({**headers, "x-ratelimit-reset-tokens": "1m0s"})["tokens"] == (150000.0, 149000.0, 60.0)
    assert announced_limits({**headers, "x-ratelimit-reset-requests": "later"}) == {}
    assert announced_limits({}) == {}


def test_a_budget_learns_its_refill_rate_from_what_is_missing_and_the_reset():
    budget = ServerBudget()
    # 60 of 3000 missing, back in 1.2s: 50 a second
    budget.announced(3000, 2940, 1.2, mark=budget.take(1, 0.0), sent_at=0.0, now=0.0)
    assert abs(budget.rate - 50) < 1e-9
    # a bucket never seen short: a per-minute limit
    full = ServerBudget()
    full.announced(600, 600, 0.0, mark=full.take(1, 0.0), sent_at=0.0, now=0.0)
    assert full.rate == 10


def test_a_reply_sets_what_is_left_less_what_was_spent_after_its_attempt_plus_the_refill():
    budget = ServerBudget()
    mark = budget.take(1, 0.0)  # our attempt
    for _ in range(3):  # three more started after it, not yet counted by the server
        budget.take(1, 0.0)
    budget.announced(100, 20, 1.6, mark=mark, sent_at=0.0, now=0.1)  # 80 missing, back in 1.6s: 50/s
    assert abs(budget.level - (20 + 50 * 0.1 - 3)) < 1e-9
    assert budget.wait_s(budget.take(1, 0.1), 0.1) == 0  # 21 left: go at once
    # never above the bucket's size, however long ago the attempt started
    budget.announced(100, 90, 0.2, mark=budget.spent, sent_at=0.0, now=100.0)
    assert budget.level == 100


def test_an_attempt_waits_until_the_refill_covers_it_and_those_before_it():
    budget = ServerBudget()
    budget.announced(50, 0, 1.0, mark=budget.take(1, 0.0), sent_at=0.0, now=0.0)  # empty, 50/s
    reserve = budget.reserve
    first, second = budget.take(1, 0.0), budget.take(1, 0.0)
    assert abs(budget.wait_s(first, 0.0) - (1 + reserve) / 50) < 1e-9
    assert abs(budget.wait_s(second, 0.0) - (2 + reserve) / 50) < 1e-9  # behind the first, whatever came after
    assert budget.wait_s(first, (1 + reserve) / 50 + 1e-6) == 0
    # a cost above the whole bucket waits for a full bucket, not forever
    huge = budget.take(500, 1.0)
    assert 0 < budget.wait_s(huge, 1.0) <= (50 + reserve) / 50 + 1e-9


def test_an_unannounced_budget_never_paces_but_counts_what_is_spent():
    budget = ServerBudget()
    marks = [budget.take(10, 0.0) for _ in range(1000)]
    assert budget.wait_s(marks[-1], 0.0) == 0 and budget.spent == 10_000


def test_token_estimates_learn_the_characters_per_token_and_count_max_tokens():
    limit = AdaptiveLimit(4)
    assert limit.estimated_tokens(400, 0) == 100 and limit.estimated_tokens(400, 50) == 150
    for _ in range(50):
        limit.learn_prompt_tokens(300, 100)  # 3 characters a token
    assert abs(limit.chars_per_token - 3) < 1e-9
    assert abs(limit.estimated_tokens(300, 20) - 120) < 1e-9
    assert max_tokens_of({"max_tokens": 20}) == 20 and max_tokens_of({"max_completion_tokens": 30}) == 30
    assert max_tokens_of({}) == 0 and prompt_chars([{"role": "user", "content": "abcd"}, {"role": "x"}]) == 4


def test_without_headers_the_rate_admitted_between_two_429s_is_learned_and_paced_below():
    limit = AdaptiveLimit(8)
    limit._first_answer_at = 0.0
    limit._found_empty(0.0)  # empty here
    for i in range(1, 50):
        limit._sending(i / 50)  # 50 a second, the one sent at 0.5 answered 429
    limit._found_empty(0.5)  # empty again: 24 admitted in 0.5 s
    limit._sending(1.0)
    limit._found_empty(1.0)  # and again: 24 more in 0.5 s
    assert abs(limit.learned.rate - LEARNED_MARGIN * 48) < 1e-9
    assert not limit.paced  # the headers' budgets stay unknown
    cuts = limit.cuts
    limit.rate_limited(None)
    assert limit.cuts == cuts  # while paced at a learned rate, a 429 no longer cuts the slots


def test_429s_too_close_together_or_from_the_first_wave_measure_nothing():
    limit = AdaptiveLimit(8)
    limit._first_answer_at = 0.5
    limit._sending(0.0)
    limit._found_empty(0.0)  # sent before any answer: not a measuring point
    for i in range(3):
        limit._sending(0.6 + i / 100)
    limit._found_empty(0.6)
    limit._found_empty(0.7)  # 2 admitted between: too few, and far too soon
    assert not limit.learned.known


def test_429s_are_a_limits_when_frequent_or_said_empty_and_an_overloads_when_sporadic():
    limit = AdaptiveLimit(64)
    for _ in range(99):
        limit._outcomes.append(False)
    limit._outcomes.append(True)
    assert not limit.limit_reached({})  # 1 in 100, nothing said: an overloaded server's
    assert limit.limit_reached({"requests": (60.0, 0.0, 1.0)})  # the headers say the limit is empty
    for _ in range(9):
        limit._outcomes.append(True)
    assert limit.limit_reached({})  # 10 in 109: frequent
    assert not AdaptiveLimit(64).limit_reached({})  # nothing seen yet: a first 429 alone says nothing


def test_the_first_burst_s_429s_are_counted_against_every_attempt_sent_not_the_few_answered():
    """A 429 comes back at once, an answer after the model's time: at the start of a run at 256 in flight the
    first answers are the burst's few 429s (1% of it), which alone looked frequent and paused every call."""
    limit = AdaptiveLimit(256)
    limit.in_flight = 252  # sent with them, not answered yet
    for _ in range(4):
        limit._outcomes.append(True)
    assert not limit.limit_reached({})  # 4 of 256 sent
    limit.in_flight = 0
    assert limit.limit_reached({})  # 4 of 4: the same 429s with nothing else out would be frequent


def test_a_bucket_smaller_than_its_announced_per_minute_limit_is_fitted_from_the_replies():
    """limit-requests 3000 (per minute), remaining in a bucket of 50, reset: until it is full at 50/s."""
    budget, now = ServerBudget(), 0.0
    for remaining in [49, 40, 30, 20, 10, 0, 5, 25]:
        budget.announced(3000, remaining, (50 - remaining) / 50, mark=budget.take(1, now), sent_at=now, now=now)
        budget.unsent -= 1
        now += 0.01
    assert abs(budget.limit - 50) < 1 and abs(budget.rate - 50) < 1 and budget.window_end is None


def test_fixed_windows_refill_only_when_the_window_ends():
    """50 a window: remaining counts down as the reset does; nothing comes back before the window ends."""
    budget, now = ServerBudget(), 0.0
    for remaining in range(49, 39, -1):
        budget.announced(50, remaining, 1.0 - now, mark=budget.take(1, now), sent_at=now, now=now)
        budget.unsent -= 1
        now += 0.01
    assert budget.window_end is not None and abs(budget.window_end - 1.0) < 0.02
    marks = [budget.take(1, now) for _ in range(45)]
    assert budget.wait_s(marks[38], now) == 0  # 40 were left
    assert budget.wait_s(marks[44], now) > 0.8  # the rest wait for the next window, not a refill rate
    for _ in marks[:40]:
        budget.unsent -= 1
    assert budget.wait_s(marks[44], 1.01) == 0  # a new window: whole again
