"""A scriptable OpenAI-compatible chat server on loopback, for tests and benchmarks.

It speaks enough HTTP/1.1 (keep-alive, Content-Length bodies) for the `openai` SDK and answers
POST /v1/chat/completions with whatever its handler returns for each request: an answer, a
delay, an HTTP error with headers (Retry-After), a hang, a connection reset, a malformed or
trickled body. Run it in-process (FakeOpenAI, in a background thread) or as
`python -m evalpipe.testserver` (deterministic answers).
"""

import argparse
import asyncio
import hashlib
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: dict | None
    number: int  # 1-based arrival order

    @property
    def messages(self) -> list[dict]:
        return (self.body or {}).get("messages", [])

    @property
    def last_content(self) -> str:
        msgs = self.messages
        return str(msgs[-1].get("content", "")) if msgs else ""


@dataclass
class Reply:
    content: str = "ok"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering
    body: bytes | None = None  # raw body instead of a chat completion
    content_type: str = "application/json"
    hang: bool = False  # accept the request and never answer
    reset: bool = False  # drop the connection without answering
    trickle: float = 0.0  # seconds between body chunks of 16 bytes
    finish_reason: str = "stop"
    usage: dict | None = None

    @classmethod
    def error(cls, status: int, message: str, code: str | None = None, **kw) -> "Reply":
        err = {"message": message, "type": "error", "code": code}
        return cls(status=status, body=json.dumps({"error": err}).encode(), **kw)


def deterministic(request: Request) -> Reply:
    """The default handler: an answer derived from the prompt, the same every time."""
    digest = hashlib.sha256(json.dumps(request.messages, sort_keys=True).encode()).hexdigest()[:12]
    return Reply(content=f"answer-{digest}")


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            408: "Request Timeout", 413: "Payload Too Large", 422: "Unprocessable Entity",
            429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
            503: "Service Unavailable", 504: "Gateway Timeout"}


def completion_body(request: Request, reply: Reply) -> bytes:
    prompt_chars = sum(len(str(m.get("content", ""))) for m in request.messages)
    usage = reply.usage or {
        "prompt_tokens": max(1, prompt_chars // 4),
        "completion_tokens": max(1, len(reply.content) // 4),
        "total_tokens": max(1, prompt_chars // 4) + max(1, len(reply.content) // 4),
    }
    return json.dumps(
        {
            "id": f"chatcmpl-{request.number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": (request.body or {}).get("model", "test"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": usage,
        }
    ).encode()


class FakeOpenAI:
    """An OpenAI-compatible server in a background thread; `handler` may be swapped any time."""

    def __init__(self, handler: Callable[[Request], Reply] = deterministic, host: str = "127.0.0.1", port: int = 0):
        self.handler = handler
        self.host, self.port = host, port
        self.requests: list[Request] = []
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def chat_requests(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # ---- lifecycle

    def start(self) -> "FakeOpenAI":
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._on_connection, self.host, self.port, backlog=2048)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fake-openai", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- HTTP

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    break
                keep_open = await self._respond(request, writer)
                if not keep_open:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | None:
        head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
        if not head:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = Request(method, path, headers, body, next(self._counter))
        with self._lock:
            self.requests.append(request)
        return request

    async def _respond(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.method == "GET" and request.path.rstrip("/").endswith("/models"):
            body = json.dumps({"object": "list", "data": [{"id": "test", "object": "model"}]}).encode()
            await self._send(writer, 200, {}, body, "application/json", 0.0)
            return True
        if not request.path.endswith("/chat/completions"):
            await self._send(writer, 404, {}, b'{"error": {"message": "not found"}}', "application/json", 0.0)
            return True
        reply = self.handler(request)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.hang:
            await asyncio.sleep(3600)
            return False
        if reply.reset:
            writer.transport.abort()
            return False
        body = reply.body if reply.body is not None else completion_body(request, reply)
        await self._send(writer, reply.status, reply.headers, body, reply.content_type, reply.trickle)
        return True

    async def _send(self, writer, status: int, headers: dict, body: bytes, content_type: str, trickle: float) -> None:
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if trickle:
            for i in range(0, len(body), 16):
                writer.write(body[i:i + 16])
                await writer.drain()
                await asyncio.sleep(trickle)
        else:
            writer.write(body)
        await writer.drain()


def main() -> None:
    parser = argparse.ArgumentParser(description="A deterministic OpenAI-compatible test server on loopback.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()

    def handler(request: Request) -> Reply:
        reply = deterministic(request)
        reply.delay = args.delay
        return reply

    server = FakeOpenAI(handler, port=args.port).start()
    print(f"OPENAI_BASE_URL={server.base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
