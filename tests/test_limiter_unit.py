"""evalpipe.limiter.AdaptiveLimit in process: the ceiling, cuts on 429, Retry-After pauses and regrowth,
measured with real asyncio tasks (and one real 429 from the loopback server)."""

import asyncio
import time

from evalpipe.devtools.testserver import Reply
from evalpipe.limiter import AdaptiveLimit
from evalpipe.llm import ChatClient, Endpoint

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


def test_a_real_429_with_retry_after_cuts_and_pauses_the_client(server):
    replies = iter([Reply.error(429, "slow down", headers={"Retry-After": "0.3"})])
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
