"""A second OpenAI-compatible server, written apart from testserver.py, to check figures against.

testserver.py is the server the pipeline's behaviour was tuned against; a figure that holds only
there proves little. This one is written from the protocol alone (POST /v1/chat/completions with a
JSON body, a chat.completion or an {"error": ...} reply; GET /v1/models), on the standard
library's http.server (a thread per connection, HTTP/1.1 keep-alive), and shares no code with it.
Each behaviour is a setting:

  latency      seconds before each answer
  overloaded   share of chat replies answered 429 + Retry-After: 1 (an overloaded provider, no x-ratelimit-*)
  errors       share answered HTTP 500;  resets: share whose connection is closed without an answer
  bucket       a token bucket of `bucket` requests refilling at rpm/60 a second; every reply says
               x-ratelimit-limit-requests = rpm (the per-minute limit), -remaining- = what is left in the
               bucket, -reset- = seconds until it is full; 429 + Retry-After when empty
  window       fixed windows of `window` seconds admitting `per_window` requests each, announced likewise
  trickle      the body of every answer sent one byte a second
  hang         accept every connection and answer nothing, not even GET /v1/models
  serial       one request at a time: GET /v1/models too waits while a chat call is answered (as
               llama.cpp's Python server does while it generates)

    python -m evalpipe.devtools.plainserver [--port N] [--latency S] [--overloaded P] [--bucket N --rpm R] ...
"""

import argparse
import contextlib
import http.server
import json
import random
import threading
import time
from dataclasses import dataclass


@dataclass
class Behaviour:
    latency: float = 0.0
    overloaded: float = 0.0
    errors: float = 0.0
    resets: float = 0.0
    bucket: int = 0  # 0: no token bucket
    rpm: float = 0.0
    window: float = 0.0  # 0: no fixed window
    per_window: int = 0
    trickle: bool = False
    hang: bool = False
    serial: bool = False
    seed: int = 1


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.chat = self.ok = self.too_many = self.limited = 0


class Limits:
    """The server's request limit (a token bucket or fixed windows), if it has one: admit() says yes or no,
    with the headers that describe what is left."""

    def __init__(self, behaviour: Behaviour):
        self.b = behaviour
        self.lock = threading.Lock()
        self.tokens = float(behaviour.bucket)
        self.last = time.monotonic()
        self.window_start: float | None = None
        self.window_used = 0

    def admit(self) -> tuple[bool, dict[str, str], float]:
        """(admitted, x-ratelimit headers, seconds to wait when not admitted)."""
        b = self.b
        with self.lock:
            now = time.monotonic()
            if b.bucket:
                rate = b.rpm / 60.0
                self.tokens = min(b.bucket, self.tokens + (now - self.last) * rate)
                self.last = now
                ok = self.tokens >= 1
                if ok:
                    self.tokens -= 1
                headers = {
                    "x-ratelimit-limit-requests": str(int(b.rpm)),
                    "x-ratelimit-remaining-requests": str(int(self.tokens)),
                    "x-ratelimit-reset-requests": f"{(b.bucket - self.tokens) / rate:.3f}s",
                }
                return ok, headers, 0.0 if ok else (1 - self.tokens) / rate
            if b.window:
                if self.window_start is None or now >= self.window_start + b.window:
                    start = now if self.window_start is None else self.window_start
                    while now >= start + b.window:
                        start += b.window
                    self.window_start, self.window_used = start, 0
                ok = self.window_used < b.per_window
                self.window_used += ok
                left = self.window_start + b.window - now
                headers = {
                    "x-ratelimit-limit-requests": str(b.per_window),
                    "x-ratelimit-remaining-requests": str(b.per_window - self.window_used),
                    "x-ratelimit-reset-requests": f"{left:.3f}s",
                }
                return ok, headers, left
            return True, {}, 0.0


def make_handler(behaviour: Behaviour, counters: Counters, limits: Limits):
    draws = random.Random(behaviour.seed)
    draw_lock = threading.Lock()
    one_at_a_time: contextlib.AbstractContextManager = (
        threading.Lock() if behaviour.serial else contextlib.nullcontext()
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

        def _reply(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if behaviour.trickle:
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(1.0)
            else:
                self.wfile.write(data)

        def _hang(self) -> None:
            time.sleep(3600)
            self.close_connection = True

        def do_GET(self) -> None:
            with one_at_a_time:
                self._get()

        def do_POST(self) -> None:
            with one_at_a_time:
                self._post()

        def _get(self) -> None:
            if behaviour.hang:
                return self._hang()
            if self.path.rstrip("/") == "/v1/models":
                return self._reply(200, {"object": "list", "data": [{"id": "plain", "object": "model"}]})
            self._reply(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

        def _post(self) -> None:
            if behaviour.hang:
                return self._hang()
            size = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(size) or b"{}")
            except ValueError:
                return self._reply(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            if self.path != "/v1/chat/completions":
                return self._reply(
                    404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}}
                )
            with counters.lock:
                counters.chat += 1
            with draw_lock:
                draw = draws.random()
            if draw < behaviour.resets:
                self.close_connection = True
                self.connection.shutdown(2)
                return None
            if draw < behaviour.resets + behaviour.errors:
                return self._reply(500, {"error": {"message": "internal error", "type": "server_error"}})
            if draw < behaviour.resets + behaviour.errors + behaviour.overloaded:
                with counters.lock:
                    counters.too_many += 1
                overloaded = {"error": {"message": "Overloaded", "type": "overloaded_error"}}
                return self._reply(429, overloaded, {"Retry-After": "1"})
            admitted, headers, wait = limits.admit()
            if not admitted:
                with counters.lock:
                    counters.too_many += 1
                    counters.limited += 1
                limited = {"error": {"message": "Rate limit exceeded", "type": "rate_limit_error"}}
                return self._reply(429, limited, {**headers, "Retry-After": str(max(1, round(wait)))})
            if behaviour.latency:
                time.sleep(behaviour.latency)
            messages = body.get("messages") or [{}]
            last = str(messages[-1].get("content", ""))
            text = "plain: " + last[-40:]
            with counters.lock:
                counters.ok += 1
            self._reply(
                200,
                {
                    "id": f"plain-{counters.ok}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "plain"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": len(last) // 4 + 1, "completion_tokens": 3, "total_tokens": 0},
                },
                headers,
            )
            return None

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away (a timed-out trickle, a test's end) is not news


class PlainServer:
    """The server in a background thread: `with PlainServer(Behaviour(...)) as s: s.base_url`."""

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0):
        self.behaviour = behaviour or Behaviour()
        self.counters = Counters()
        self.limits = Limits(self.behaviour)
        self.httpd = _Server(("127.0.0.1", port), make_handler(self.behaviour, self.counters, self.limits))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "PlainServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    for name in ("latency", "overloaded", "errors", "resets", "rpm", "window"):
        parser.add_argument(f"--{name}", type=float, default=0.0)
    for name in ("bucket", "per-window"):
        parser.add_argument(f"--{name}", type=int, default=0)
    parser.add_argument("--trickle", action="store_true")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--serial", action="store_true")
    args = parser.parse_args()
    behaviour = Behaviour(**{k: v for k, v in vars(args).items() if k != "port"})
    with PlainServer(behaviour, args.port) as server:
        print(f"OPENAI_BASE_URL={server.base_url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
