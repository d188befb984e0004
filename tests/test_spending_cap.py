"""--max-cost / MAX_COST against a loopback server that bills every answer: 256 calls in flight stop short of
the cap with exit 6, every row kept; a rerun with a higher cap resumes; a model without a price never calls."""

import json
import subprocess
import sys

import pytest

from evalpipe.devtools.testserver import FakeOpenAI, Reply

from .conftest import ROOT

pytestmark = pytest.mark.e2e

INPUT, OUTPUT = 2.0, 40.0  # USD per million tokens: a call of ~100 prompt tokens and 50 completion ~ $0.0022


@pytest.fixture
def billing(tmp_path):
    """A server whose usage is what a tokenizer of 4 characters per token would count, and its price table."""

    def answer(request):
        prompt = sum(len(str(m.get("content", ""))) for m in request.messages) // 4
        return Reply(content="ANSWER: YES", delay=0.05, usage={"prompt_tokens": prompt, "completion_tokens": 50})

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"billed": {"input": INPUT, "output": OUTPUT}}}))
    with FakeOpenAI(answer) as server:
        yield server, prices


def billed(server) -> float:
    """What the server answered, at the table's prices: what was really spent, rows written or not."""
    total = 0.0
    for request in server.chat_requests():
        prompt = sum(len(str(m.get("content", ""))) for m in request.messages) // 4
        total += (prompt * INPUT + 50 * OUTPUT) / 1e6
    return total


def infer(env, out, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "infer.py"), "--bench", "coin_flip", "--model", "billed", "--outputs-dir", out]
        + ["--max-samples", "600", "--workers", "256", "--max-tokens", "50", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cap_holds_with_256_in_flight_and_a_higher_cap_resumes(billing, env, tmp_path):
    server, prices = billing
    env = {**env, "OPENAI_BASE_URL": server.base_url, "EVALPIPE_PRICES": str(prices)}
    cap = 0.5
    done = infer(env, tmp_path, "--max-cost", cap)
    assert done.returncode == 6, done.stderr
    assert "spending cap reached" in done.stderr and "raise the cap or run again later" in done.stderr
    spent = billed(server)
    assert 0.8 * cap < spent <= cap  # it stopped near the cap, never past it
    rows = (tmp_path / "coin_flip" / "billed" / "run-1" / "infer.jsonl").read_text().splitlines()
    assert len(rows) == len(server.chat_requests())  # every answer paid for is kept
    assert len(rows) < 600

    done = infer(env, tmp_path, "--max-cost", 5)
    assert done.returncode == 0, done.stderr
    ids = [json.loads(r)["idx"] for r in (tmp_path / "coin_flip" / "billed" / "run-1" / "infer.jsonl").open()]
    assert len(ids) == len(set(ids)) == 600 == len(server.chat_requests())  # each task answered once


def test_max_cost_spans_the_runner_s_stages_and_a_model_without_price_never_calls(billing, env, tmp_path):
    server, prices = billing
    env = {**env, "OPENAI_BASE_URL": server.base_url, "EVALPIPE_PRICES": str(prices)}
    words = ["infer", "BENCH=coin_flip", "MODEL=billed", "RUNS=2", "MAX_SAMPLES=100", f"OUTPUTS={tmp_path}"]
    done = subprocess.run(
        [sys.executable, "-m", "evalpipe.pipeline", *words, "MAX_COST=0.3", "ARGS=--max-tokens 50"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 6, done.stderr  # run 1 (~$0.22) fits; run 2 reaches what is left
    assert billed(server) <= 0.3
    run1 = tmp_path / "coin_flip" / "billed" / "run-1" / "infer.jsonl"
    assert len(run1.read_text().splitlines()) == 100

    asked = len(server.chat_requests())
    done = infer({**env, "EVALPIPE_PRICES": str(tmp_path / "none.json")}, tmp_path, "--max-cost", 1)
    assert done.returncode == 2 and "cannot read the price table" in done.stderr
    prices.write_text(json.dumps({"models": {"other": {"input": 1, "output": 1}}}))
    done = infer(env, tmp_path, "--max-cost", 1)
    assert done.returncode == 2 and "--max-cost needs a price for 'billed'" in done.stderr
    assert len(server.chat_requests()) == asked  # no call was made

    prices.write_text(json.dumps({"models": {"billed": {"input": INPUT, "output": OUTPUT}}}))
    done = infer(env, tmp_path / "dry", "--max-cost", 5, "--dry-run")  # 600 calls ≈ $1.35
    assert done.returncode == 0 and "; --max-cost $5: within it" in done.stderr, done.stderr
    done = infer(env, tmp_path / "dry", "--max-cost", 1, "--dry-run")
    assert "--max-cost $1: the run would stop at the cap, exit 6" in done.stderr
    assert len(server.chat_requests()) == asked
