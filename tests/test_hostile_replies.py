"""What a hostile or broken server can send, over real HTTP: every wait it asks for is bounded by
--max-retry-seconds and said when long, every reply is bounded in size, nothing it sends gives a traceback
or reaches the terminal raw (issue 38, rows 1-4, 7, 17, 18)."""

import asyncio
import datetime
import email.utils
import re
import time
import tracemalloc
import zlib

import pytest

from evalpipe.client import llm
from evalpipe.client.limiter import AdaptiveLimit
from evalpipe.client.llm import MAX_FIELD_CHARS, MAX_REPLY_BYTES, ChatClient, Endpoint
from evalpipe.devtools.testserver import Reply, completion_body

from .conftest import API_KEY, read_jsonl

MSGS = [{"role": "user", "content": "hi"}]
HTTP_CLIENTS = ("aiohttp", "httpx")  # --http-client
# infer over the first tasks of the bundled Arithmetic sample, one call at a time, with short retry settings
INFER = ["--bench", "arithmetic", "--model", "m", "--output", "infer.jsonl", "--timeout", "5"]
QUICK_RETRIES = ["--max-retries", "1", "--backoff", "0.01", "--backoff-max", "0.02"]


def calls(server, n=1, ceiling=4, **settings):
    """`n` concurrent calls through ChatClient and AdaptiveLimit (as a stage makes them); each its Completion or
    the exception it raised."""
    defaults = dict(base_url=server.base_url, api_key=API_KEY, timeout=5, backoff_initial=0.05, backoff_max=0.2)
    endpoint = Endpoint("m", **{**defaults, **settings})

    async def go():
        client = ChatClient(endpoint, AdaptiveLimit(ceiling))
        try:
            return await asyncio.gather(*(client.complete(MSGS) for _ in range(n)), return_exceptions=True)
        finally:
            await client.aclose()

    return asyncio.run(go())


def answered_after(good: int, then):
    """A handler: `good` plain answers, then `then(request)` for every later request."""
    count = iter(range(10**9))

    def handler(request):
        return Reply(content="42") if next(count) < good else then(request)

    return handler


def then_answers(times: int, first):
    """A handler: `first(request)` for the first `times` requests, then plain answers."""
    count = iter(range(10**9))
    return lambda request: first(request) if next(count) < times else Reply(content="42")


def answers_saying_requests(**said: str):
    """A handler: plain answers, each with x-ratelimit-{limit,remaining,reset}-requests as given."""
    headers = {f"x-ratelimit-{name}-requests": value for name, value in said.items()}
    return lambda request: Reply(content="42", headers=headers)


def said_until(stderr: str) -> datetime.datetime:
    """The time a message says a wait lasts until ("until 2026-11-26 15:04:05 UTC")."""
    found = re.search(r"until (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", stderr)
    assert found, stderr
    return datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.UTC)


def in_seconds(seconds: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)


# ---- row 1: a Retry-After past --max-retry-seconds ends the stage (3) at once and says until when


@pytest.mark.e2e
@pytest.mark.parametrize("ahead_s, header", [(86400, "86400"), (3600, "date"), (86400, "date")])
def test_a_retry_after_past_the_retry_cap_ends_the_stage_with_3_and_says_until_when(stage, server, ahead_s, header):
    def too_busy(request):
        value = email.utils.formatdate(time.time() + ahead_s, usegmt=True) if header == "date" else header
        return Reply.error(429, "come back later", headers={"Retry-After": value})

    server.handler = answered_after(3, too_busy)
    started = time.monotonic()
    done = stage("infer", *INFER, "--max-samples", 8, "--workers", 1, "--max-retry-seconds", 60)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 30  # not the hour or the day asked for, nor the 60 s allowed
    assert "past --max-retry-seconds 60; run again after then" in done.stderr
    assert abs((said_until(done.stderr) - in_seconds(ahead_s)).total_seconds()) < 30
    assert len(read_jsonl(stage.cwd / "infer.jsonl")) == 3  # the answers before it are kept
    assert "Traceback" not in done.stderr
    assert len(server.chat_requests()) == 4  # one 429 was enough to know


def test_a_long_wait_is_said_and_never_longer_than_the_most_one_wait_gets(server, monkeypatch, capsys):
    monkeypatch.setattr(llm, "LONG_WAIT_S", 0.5)
    monkeypatch.setattr(llm, "MAX_RETRY_AFTER", 1.0)
    server.handler = then_answers(1, lambda request: Reply.error(429, "slow", headers={"Retry-After": "30"}))
    started = time.monotonic()
    [done] = calls(server, max_retry_seconds=60)
    assert done.text == "42" and done.attempts == 2
    assert time.monotonic() - started < 5  # 1 s (MAX_RETRY_AFTER), not the 30 s asked for
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("waiting")]
    assert len(lines) == 1 and "the endpoint asks so (HTTP 429, Retry-After: 30)" in lines[0], lines
    assert abs((said_until(lines[0]) - in_seconds(0)).total_seconds()) < 5


def test_a_long_pacing_wait_is_said(server, monkeypatch, capsys):
    monkeypatch.setattr(llm, "LONG_WAIT_S", 0.5)
    # 2 requests refilling over 2 s, none left: each next call waits about a second
    server.handler = answers_saying_requests(limit="2", remaining="0", reset="2s")
    done = calls(server, n=3, ceiling=1, max_retry_seconds=30)
    assert [each.text for each in done] == ["42"] * 3
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("waiting")]
    assert lines and "pacing to the endpoint's requests limit (limit 2, remaining 0, reset 2s" in lines[0], lines


# ---- row 2: a rate limit whose reset is past --max-retry-seconds ends the stage (3) and says when it resets


@pytest.mark.e2e
def test_a_quota_that_resets_past_the_retry_cap_ends_the_stage_with_3_and_says_when(stage, server):
    server.handler = answers_saying_requests(limit="10", remaining="0", reset="999999h")
    started = time.monotonic()
    done = stage("infer", *INFER, "--max-samples", 8, "--workers", 2, "--max-retry-seconds", 30)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 30
    assert "requests limit (limit 10, remaining 0, reset 3.6e+09s" in done.stderr
    assert "past --max-retry-seconds 30; run again after then" in done.stderr
    assert f"whole again {in_seconds(999999 * 3600).year}-" in done.stderr  # when it resets
    assert len(read_jsonl(stage.cwd / "infer.jsonl")) >= 2  # the first calls' answers are kept
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_a_limit_below_one_request_is_not_paced_to(stage, server):
    server.handler = answers_saying_requests(limit="1e-300", remaining="0", reset="1s")
    done = stage("infer", *INFER, "--max-samples", 8, "--workers", 2, "--max-retry-seconds", 30, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(read_jsonl(stage.cwd / "infer.jsonl")) == 8


# ---- row 3: a Retry-After of 0, negative or in the past still backs off


@pytest.mark.parametrize("value", ["0", "-5", "Thu, 01 Jan 1970 00:00:00 GMT"])
def test_a_zero_negative_or_past_retry_after_still_backs_off(server, value):
    server.handler = lambda request: Reply.error(429, "slow down", headers={"Retry-After": value})
    started = time.monotonic()
    done = calls(server, n=4, max_retry_seconds=1.5, backoff_initial=0.2, backoff_max=1.0)
    elapsed = time.monotonic() - started
    assert all(isinstance(each, llm.CallFailed) for each in done), done
    # backing off (0.2 s doubling, with jitter): a few tries per call, not a request every few milliseconds
    assert len(server.chat_requests()) <= 8 * 4, (len(server.chat_requests()), elapsed)


# ---- row 4: an invalid chunked body, JSON nested 100,000 deep, lone surrogates: never a traceback

BAD_CHUNK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
)
DEEP = b"[" * 100_000 + b"]" * 100_000


def with_lone_surrogates(request) -> Reply:
    body = completion_body(request, Reply(content="SURROGATES"))
    return Reply(body=body.replace(b"SURROGATES", rb"\ud800 42 \udfff"))


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
@pytest.mark.parametrize("reply", [Reply(raw=BAD_CHUNK), Reply(body=DEEP)], ids=["invalid-chunk", "deep-json"])
def test_a_broken_body_is_a_malformed_reply_retried_over_each_transport(server, kind, reply):
    server.handler = lambda request: reply
    [failed] = calls(server, http_client=kind, max_retries=1)
    assert isinstance(failed, llm.CallFailed) and "(after 2 attempts)" in str(failed), failed


@pytest.mark.e2e
def test_broken_bodies_fail_their_tasks_keep_the_others_and_a_rerun_works(stage, server):
    hostile = [Reply(raw=BAD_CHUNK), Reply(body=DEEP), None]  # the first three tasks' replies, then answers
    seen: list[str] = []

    def handler(request):
        if request.last_content not in seen:
            seen.append(request.last_content)
        which = seen.index(request.last_content)
        if which < 2:
            return hostile[which]
        return with_lone_surrogates(request) if which == 2 else Reply(content="42")

    server.handler = handler
    done = stage("infer", *INFER, *QUICK_RETRIES, "--max-samples", 6, "--workers", 1)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    raw = (stage.cwd / "infer.jsonl").read_bytes()
    raw.decode("utf-8")  # valid UTF-8, every line JSON
    rows = read_jsonl(stage.cwd / "infer.jsonl")
    assert len(rows) == 4
    assert "\ufffd 42 \ufffd" in [row["model_output"] for row in rows]  # the surrogates replaced, the rest kept
    failures = read_jsonl(stage.cwd / "infer.jsonl.failed.jsonl")
    assert len(failures) == 2 and all("MalformedReply" in f["error"] for f in failures), failures
    assert any("nested too deep" in f["error"] for f in failures) and any("chunk" in f["error"] for f in failures)
    server.handler = lambda request: Reply(content="42")
    again = stage("infer", *INFER, "--max-samples", 6, "--workers", 1)
    assert again.returncode == 0, again.stderr
    assert len(read_jsonl(stage.cwd / "infer.jsonl")) == 6


# ---- row 7: reply sizes bounded: the body (on the wire and decompressed) and the short fields


def gzip_bomb(inflated: int) -> bytes:
    """A gzip body of `inflated` spaces, made a MiB at a time (about a thousandth of that on the wire)."""
    deflate, block = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16), b" " * 2**20
    return b"".join([deflate.compress(block) for _ in range(inflated // 2**20)] + [deflate.flush()])


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_a_gzip_bomb_is_cut_off_at_the_body_bound_not_inflated(server, kind):
    bomb = gzip_bomb(4 * MAX_REPLY_BYTES)  # 128 MiB inflated, 128 KB on the wire
    server.handler = lambda request: Reply(body=bomb, headers={"Content-Encoding": "gzip"})
    tracemalloc.start()
    try:
        [failed] = calls(server, http_client=kind, max_retries=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(failed, llm.CallFailed) and "a reply body over 32 MiB" in str(failed), failed
    assert peak < 2 * MAX_REPLY_BYTES, peak  # what was read before the bound, never the whole (4x more, held twice)


def test_a_gzip_body_within_the_bound_is_read(server):
    server.handler = lambda request: Reply(
        body=zlib.compress(completion_body(request, Reply(content="42")), wbits=zlib.MAX_WBITS | 16),
        headers={"Content-Encoding": "gzip"},
    )
    [done] = calls(server)
    assert done.text == "42"
    assert server.chat_requests()[0].headers["accept-encoding"] == "gzip, deflate"


def test_an_encoding_not_asked_for_is_a_malformed_reply(server):
    server.handler = lambda request: Reply(body=b"\x0b\x02\x80{}\x03", headers={"Content-Encoding": "br"})
    [failed] = calls(server, max_retries=0)
    assert isinstance(failed, llm.CallFailed) and "Content-Encoding br, which was not asked for" in str(failed)


def test_a_body_over_the_bound_fails_the_call(server):
    server.handler = lambda request: Reply(content="x" * MAX_REPLY_BYTES)
    [failed] = calls(server, max_retries=0)
    assert isinstance(failed, llm.CallFailed) and "a reply body over 32 MiB" in str(failed), failed


@pytest.mark.e2e
def test_a_huge_model_name_is_cut_before_it_reaches_a_row(stage, server):
    server.handler = lambda request: Reply(content="42", served_model="M" * 10_000_000, system_fingerprint="f" * 300)
    done = stage("infer", *INFER, "--max-samples", 2)
    assert done.returncode == 0, done.stderr
    for row in read_jsonl(stage.cwd / "infer.jsonl"):
        assert row["response_model"] == "M" * (MAX_FIELD_CHARS - 1) + "…"
        assert len(row["system_fingerprint"]) == MAX_FIELD_CHARS
    assert (stage.cwd / "infer.jsonl").stat().st_size < 10_000


# ---- row 17: one stray 404 after good answers is a transient failure, not "no API at that URL"


@pytest.mark.e2e
def test_one_stray_404_after_good_answers_does_not_stop_a_healthy_run(stage, server):
    count = iter(range(10**9))

    def handler(request):
        if next(count) == 7:
            return Reply(status=404, body=b'{"detail": "Not Found"}')
        return Reply(content="42")

    server.handler = handler
    done = stage("infer", *INFER, *QUICK_RETRIES, "--max-samples", 10, "--workers", 1)
    assert done.returncode == 0, done.stderr
    assert len(read_jsonl(stage.cwd / "infer.jsonl")) == 10
    assert len(server.chat_requests()) == 11


@pytest.mark.e2e
def test_a_404_before_any_answer_is_still_no_api_at_that_path(stage, server):
    server.handler = lambda request: Reply(status=404, body=b'{"detail": "Not Found"}')
    done = stage("infer", *INFER, *QUICK_RETRIES, "--max-samples", 2)
    assert done.returncode == 69, done.stderr
    assert "no OpenAI-compatible API" in done.stderr


# ---- row 18: a server's error text never reaches the terminal raw

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[1;1Hinfer: all tasks passed\x9b31m \u202eevil"


@pytest.mark.e2e
@pytest.mark.parametrize("status, code", [(400, 3), (401, 4)])
def test_escape_sequences_in_error_text_are_shown_escaped(stage, server, status, code):
    server.handler = lambda request: Reply.error(status, ESCAPES)
    done = stage("infer", *INFER, *QUICK_RETRIES, "--max-samples", 2)
    assert done.returncode == code, done.stderr
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", done.stderr), repr(done.stderr)
    assert r"\x1b]0;owned\x07\x1b[2J" in done.stderr and r"\u202eevil" in done.stderr
    if status == 400:
        [failure, _] = read_jsonl(stage.cwd / "infer.jsonl.failed.jsonl")
        assert "\x1b" not in failure["error"]
