"""The SDK's two HTTP transports (--http-client aiohttp, the default, and httpx) over real loopback
HTTP: the same answers, the same failure classes, no key sent to another host, no connection cap
below the concurrency asked for, nothing left unclosed."""

import asyncio
import socket
import time

import pytest

from evalpipe.client.limiter import AdaptiveLimit
from evalpipe.client.llm import ChatClient, Endpoint
from evalpipe.devtools.testserver import FakeOpenAI, Reply
from evalpipe.errors import CallFailed, EndpointUnreachable

from .conftest import API_KEY, closed_port, plain_http_port, read_jsonl

MSGS = [{"role": "user", "content": "hi"}]
HTTP_CLIENTS = ("aiohttp", "httpx")  # --http-client


def endpoint(base_url: str, kind: str, **kw) -> Endpoint:
    settings = dict(timeout=5, max_retries=1, backoff_initial=0.05, backoff_max=0.1)
    return Endpoint(model="m", base_url=base_url, api_key=API_KEY, http_client=kind, **{**settings, **kw})


def call(base_url: str, kind: str, **kw):
    async def go():
        client = ChatClient(endpoint(base_url, kind, **kw))
        try:
            return await client.complete(MSGS)
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_a_call_goes_through_each_transport(server, kind):
    server.handler = lambda request: Reply(content="hello", usage={"prompt_tokens": 3, "completion_tokens": 1})
    done = call(server.base_url, kind)
    assert (done.text, done.usage, done.attempts) == ("hello", {"prompt_tokens": 3, "completion_tokens": 1}, 1)
    [request] = server.chat_requests()
    assert request.headers["authorization"] == f"Bearer {API_KEY}"


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_a_dead_endpoint_is_unreachable_over_each_transport(kind):
    with pytest.raises(EndpointUnreachable, match="connection refused"):
        call(f"http://127.0.0.1:{closed_port()}/v1", kind)

    with plain_http_port() as port, pytest.raises(EndpointUnreachable, match="TLS failed"):
        call(f"https://127.0.0.1:{port}/v1", kind)


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_a_connect_timeout_is_unreachable_over_each_transport(kind):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    queued = []  # never accepted: they fill the backlog, and Linux then ignores new connection requests
    for _ in range(4):
        waiting = socket.socket()
        waiting.setblocking(False)
        waiting.connect_ex(listener.getsockname())
        queued.append(waiting)
    try:
        with pytest.raises(EndpointUnreachable, match="no connection within"):
            call(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", kind, timeout=0.3)
    finally:
        for sock in (*queued, listener):
            sock.close()


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
@pytest.mark.parametrize(
    "reply, said",
    [(Reply(reset=True), "APIConnectionError: Connection error."), (Reply(hang=True), "APITimeoutError")],
    ids=["reset", "hang"],
)
def test_a_server_that_breaks_the_connection_is_not_a_dead_endpoint(server, kind, reply, said):
    """A reset or a read timeout means a server took the connection: retried, then the task fails
    (over aiohttp the SDK names every broken connection a ConnectTimeout; the cause decides)."""
    server.handler = lambda request: reply
    with pytest.raises(CallFailed) as failed:
        call(server.base_url, kind, timeout=0.5)
    assert not isinstance(failed.value, EndpointUnreachable)
    assert str(failed.value).startswith(said) and "after 2 attempts" in str(failed.value)


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_never_takes_the_key_to_another_host(kind, status):
    with FakeOpenAI() as elsewhere, FakeOpenAI() as redirecting:
        target = f"http://localhost:{elsewhere.port}/v1/chat/completions"  # another origin: another host
        redirecting.handler = lambda request: Reply(status=status, headers={"Location": target}, body=b"")
        try:
            call(redirecting.base_url, kind, max_retries=0)
        except CallFailed:
            pass  # a 301/302 turns the POST into a GET, which the other server answers with an error
        assert redirecting.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
        assert elsewhere.requests, "the redirect was not followed: nothing left to check"
        for request in elsewhere.requests:
            assert API_KEY not in str(request.headers) and "authorization" not in request.headers


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_the_connections_keep_up_with_the_concurrency(server, kind):
    """150 calls at once all reach the server while the first is still being answered: no pool
    caps them (aiohttp's connector alone would allow 100)."""
    arrived: list[float] = []

    def slow(request):
        arrived.append(time.monotonic())
        return Reply(delay=1.5)

    server.handler = slow
    calls = 150

    async def go():
        client = ChatClient(endpoint(server.base_url, kind, timeout=30), AdaptiveLimit(calls))
        try:
            return await asyncio.gather(*(client.complete(MSGS) for _ in range(calls)))
        finally:
            await client.aclose()

    assert len(asyncio.run(go())) == calls
    assert len(arrived) == calls and max(arrived) - min(arrived) < 1.5


@pytest.mark.e2e
def test_infer_switches_transport_without_a_config_change_and_leaves_nothing_unclosed(stage, tmp_path):
    stage.env["PYTHONWARNINGS"] = "always"  # ResourceWarnings (unclosed sessions and sockets) would show
    first = stage.infer("--max-samples", "2", check=0)
    second = stage.infer("--max-samples", "4", "--http-client", "httpx", check=0)
    assert len(read_jsonl(tmp_path / "infer.jsonl")) == 4  # the httpx run added its rows: same fingerprint
    for proc in (first, second):
        assert "Unclosed" not in proc.stderr and "ResourceWarning" not in proc.stderr, proc.stderr
