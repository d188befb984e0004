"""The retry policy against real HTTP: each failure class on the wire and what the client does."""

import asyncio
import subprocess
import sys
import time
import types

import pytest

from evalpipe import redact
from evalpipe.client import llm
from evalpipe.client.llm import CallFailed, ChatClient, ContextTooLong, Endpoint
from evalpipe.devtools.testserver import Reply
from evalpipe.errors import EndpointRefused

from .conftest import API_KEY, ROOT

MSGS = [{"role": "user", "content": "hi"}]


def call(server, **kw):
    settings = dict(
        model="m",
        base_url=server.base_url,
        api_key=API_KEY,
        timeout=2,
        max_retries=3,
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    settings.update(kw)

    async def go():
        client = ChatClient(Endpoint(**settings))
        try:
            return await client.complete(MSGS)
        finally:
            await client.aclose()

    return asyncio.run(go())


def sequence(*replies):
    """A handler that plays replies in order, then repeats the last one."""
    replies = list(replies)

    def handler(request):
        return replies.pop(0) if len(replies) > 1 else replies[0]

    return handler


def test_success_records_usage_and_sends_parameters(server):
    server.handler = sequence(
        Reply(
            content="hello",
            usage={
                "prompt_tokens": 7,
                "completion_tokens": 3,
                "total_tokens": 10,
                "completion_tokens_details": {"reasoning_tokens": 2},
            },
        )
    )
    done = call(
        server, params={"temperature": 0.2, "max_tokens": 50, "reasoning_effort": "low"}, extra_body={"top_k": 5}
    )
    assert (done.text, done.finish_reason, done.attempts) == ("hello", "stop", 1)
    assert done.usage == {"prompt_tokens": 7, "completion_tokens": 3, "reasoning_tokens": 2}
    body = server.chat_requests()[0].body
    assert (body["temperature"], body["max_tokens"], body["reasoning_effort"], body["top_k"]) == (0.2, 50, "low", 5)
    assert server.chat_requests()[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_429_waits_as_retry_after_says(server):
    server.handler = sequence(Reply.error(429, "slow down", headers={"Retry-After": "1"}), Reply(content="ok"))
    started = time.monotonic()
    done = call(server)
    assert done.text == "ok" and done.attempts == 2
    assert time.monotonic() - started >= 1.0  # the 0.05 s backoff alone would be far shorter


def test_5xx_and_malformed_bodies_are_retried_then_succeed(server):
    server.handler = sequence(
        Reply.error(500, "boom"),
        Reply.error(503, "busy"),
        Reply(body=b"<html>gateway says hi</html>", content_type="text/html"),
        Reply(body=b'{"choices": [', content_type="application/json"),
        Reply(content="finally"),
    )
    done = call(server, max_retries=5)
    assert (done.text, done.attempts) == ("finally", 5)


def test_retries_are_capped_then_the_call_fails(server):
    server.handler = sequence(Reply.error(502, "bad gateway"))
    with pytest.raises(CallFailed, match="HTTP 502.*after 4 attempts"):
        call(server, max_retries=3)
    assert len(server.chat_requests()) == 4


def test_a_hung_request_times_out_and_is_retried(server):
    server.handler = sequence(Reply(hang=True), Reply(content="ok"))
    done = call(server, timeout=0.5)
    assert done.text == "ok" and done.attempts == 2


def test_connection_reset_is_retried(server):
    server.handler = sequence(Reply(reset=True), Reply(content="ok"))
    assert call(server).attempts == 2


def test_context_length_is_final_without_retry(server):
    server.handler = sequence(
        Reply.error(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded")
    )
    with pytest.raises(ContextTooLong):
        call(server)
    assert len(server.chat_requests()) == 1


def test_other_400_fails_at_once(server):
    server.handler = sequence(Reply.error(400, "unknown parameter foo"))
    with pytest.raises(CallFailed, match="HTTP 400"):
        call(server)
    assert len(server.chat_requests()) == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply.error(401, "bad key"),
        Reply.error(403, "forbidden"),
        Reply.error(404, "model not found"),
        Reply.error(429, "You exceeded your current quota", code="insufficient_quota"),
    ],
)
def test_refusals_stop_without_retry(server, reply):
    server.handler = sequence(reply)
    with pytest.raises(EndpointRefused):
        call(server)
    assert len(server.chat_requests()) == 1


def test_an_echoed_key_is_redacted_from_errors(server):
    server.handler = sequence(Reply.error(401, f"Invalid header Authorization: Bearer {API_KEY}"))
    with pytest.raises(EndpointRefused) as err:
        call(server)
    assert API_KEY not in str(err.value) and "[REDACTED]" in str(err.value)


def test_429s_do_not_use_up_the_retry_count(server):
    server.handler = sequence(*[Reply.error(429, "slow", headers={"retry-after-ms": "10"})] * 5, Reply(content="ok"))
    done = call(server, max_retries=1)
    assert done.text == "ok" and done.attempts == 6


def test_the_retry_time_cap_ends_a_429_storm(server):
    server.handler = sequence(Reply.error(429, "slow", headers={"retry-after-ms": "100"}))
    started = time.monotonic()
    with pytest.raises(CallFailed, match="HTTP 429"):
        call(server, max_retries=1, max_retry_seconds=0.5)
    assert time.monotonic() - started < 2


# judge.py run as a script, saying at exit whether the SDK was loaded
SDK_LOADED = (
    "import atexit, runpy, sys; sys.path[0] = sys.argv[1]; "
    "atexit.register(lambda: print('SDK loaded:', 'openai._client' in sys.modules)); "
    "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.e2e
def test_a_stage_that_makes_no_call_never_imports_the_sdk(tmp_path):
    (tmp_path / "infer.jsonl").write_text(
        "".join(f'{{"idx": "{i}", "model_output": "ANSWER: YES", "target": "YES"}}\n' for i in range(3))
    )
    judge = [sys.executable, "-c", SDK_LOADED, str(ROOT), str(ROOT / "judge.py"), "--bench", "coin_flip"]
    for _ in range(2):  # grading by rule, then nothing left to do
        done = subprocess.run(
            [*judge, "--input", "infer.jsonl", "--output", "judge.jsonl"], cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith("SDK loaded: False")
    # the check can see it: making a client loads the SDK
    make_client = "from evalpipe.client.llm import ChatClient, Endpoint; ChatClient(Endpoint(model='m', api_key='k'))"
    check = "import sys; print('SDK loaded:', 'openai._client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", f"{make_client}; {check}"], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.strip() == "SDK loaded: True", done.stderr


def test_an_echoed_key_is_taken_out_before_a_long_field_is_cut():
    key = "sk-echoed-key-0123456789"
    redact.register(key)
    reply = types.SimpleNamespace(model="m" * 250 + key, system_fingerprint=None, choices=[])
    served = llm.served(reply)["response_model"]
    assert key[:5] not in served and served.startswith("m" * 250 + "[REDA")
