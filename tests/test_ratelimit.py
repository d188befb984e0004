"""Calls through ChatClient and AdaptiveLimit, in process, against the loopback server behind
OpenAI-style rate limits (testserver.RateLimit) over real HTTP: paced from the x-ratelimit-*
headers, they all succeed and almost none is answered 429."""

import asyncio

from evalpipe.client.limiter import AdaptiveLimit
from evalpipe.client.llm import ChatClient, Endpoint
from evalpipe.devtools.testserver import FakeOpenAI, RateLimit, Reply, Request

from .conftest import API_KEY


def answer(request: Request) -> Reply:
    return Reply(content="ok", delay=0.02)


def run_calls(server: FakeOpenAI, calls: int, ceiling: int, params: dict | None = None) -> tuple[list, AdaptiveLimit]:
    endpoint = Endpoint("m", base_url=server.base_url, api_key=API_KEY, backoff_initial=0.05, params=params or {})

    async def main():
        limit = AdaptiveLimit(ceiling)
        client = ChatClient(endpoint, limit)
        try:
            prompts = [[{"role": "user", "content": f"question {i} " + "x" * (40 * (i % 5))}] for i in range(calls)]
            done = await asyncio.wait_for(asyncio.gather(*(client.complete(p) for p in prompts)), 60)
        finally:
            await client.aclose()
        return done, limit

    return asyncio.run(main())


def test_calls_paced_from_request_headers_all_succeed_with_few_429s():
    limited = RateLimit(answer, rpm=600, burst_s=1.0)  # 10 a second, 10 at once
    with FakeOpenAI(limited) as server:
        done, limit = run_calls(server, calls=40, ceiling=16)  # 16 at once: more than the bucket holds
    assert [c.text for c in done] == ["ok"] * 40
    assert limited.admitted == 40
    # the first wave, sent before any reply announced the limit, overruns it by 6; a retry or two may race
    # the first announcements on a loaded machine, no more
    assert limited.rejected <= 10, limited.rejected
    assert limit.paced and abs(limit.budgets["requests"].rate - 10) < 1
    assert limit.in_flight == 0


def test_calls_paced_from_token_headers_count_max_tokens_too():
    # 50 tokens + up to 40 prompt tokens a call, 1,500 tokens a second: about 20 calls a second
    limited = RateLimit(answer, rpm=60_000, tpm=90_000, burst_s=1.0)
    with FakeOpenAI(limited) as server:
        done, limit = run_calls(server, calls=60, ceiling=8, params={"max_tokens": 50})
    assert len(done) == 60 and limited.admitted == 60
    assert limited.rejected <= 2, limited.rejected
    assert limit.budgets["tokens"].known and abs(limit.budgets["tokens"].rate - 1500) < 150


def test_without_headers_429s_with_retry_after_still_end_in_answers():
    limited = RateLimit(answer, rpm=1200, burst_s=0.5, headers=False)  # 20 a second, 10 at once
    with FakeOpenAI(limited) as server:
        done, limit = run_calls(server, calls=30, ceiling=16)
    assert len(done) == 30 and limited.admitted == 30 and limited.rejected > 0
    assert not limit.paced and limit.cuts >= 1
