"""--max-cost / MAX_COST against a loopback server that bills every answer: 256 calls in flight stop short of
the cap with exit 6, every row kept; a rerun with a higher cap resumes; a model without a price never calls."""

import json
import subprocess
import sys

import pytest

from evalpipe.devtools.testserver import FakeOpenAI, Reply

from .conftest import ROOT, runner

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


def run_pipeline(env, *words) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "evalpipe.pipeline", *words]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_max_cost_spans_the_runner_s_stages_and_a_model_without_price_never_calls(billing, env, tmp_path):
    server, prices = billing
    env = {**env, "OPENAI_BASE_URL": server.base_url, "EVALPIPE_PRICES": str(prices)}
    words = ["infer", "BENCH=coin_flip", "MODEL=billed", "RUNS=2", "MAX_SAMPLES=100", f"OUTPUTS={tmp_path}"]
    done = run_pipeline(env, *words, "MAX_COST=0.3", "ARGS=--max-tokens 50")
    assert done.returncode == 6, done.stderr  # run 1 (~$0.22) fits; run 2 reaches what is left
    assert billed(server) <= 0.3
    run1 = tmp_path / "coin_flip" / "billed" / "run-1" / "infer.jsonl"
    assert len(run1.read_text().splitlines()) == 100

    # a later invocation (its own ledger) with a higher cap resumes run 2: the ledger is not what makes rows
    done = run_pipeline(env, *words, "MAX_COST=5", "ARGS=--max-tokens 50")
    assert done.returncode == 0, done.stderr
    assert len((run1.parent.parent / "run-2" / "infer.jsonl").read_text().splitlines()) == 100

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


def stage_cmd(script, *args) -> list[str]:
    return [sys.executable, str(ROOT / f"{script}.py"), *map(str, args)]


def cost_of_rows(path, price_in: float, price_out: float) -> float:
    usage = [json.loads(line)["usage"] for line in path.read_text().splitlines()]
    return sum(u["prompt_tokens"] * price_in + u["completion_tokens"] * price_out for u in usage) / 1e6


def bytes_billed(request) -> Reply:
    """What the most a tokenizer can count: a token per UTF-8 byte of the prompt, and the whole token cap."""
    prompt = sum(len(str(m.get("content", "")).encode()) for m in request.messages)
    return Reply(
        content="答案", delay=0.02, usage={"prompt_tokens": prompt, "completion_tokens": request.body["max_tokens"]}
    )


def test_cjk_and_emoji_prompts_in_four_shards_never_pass_the_cap(env, tmp_path):
    """Issue 38 row 9: prompts reserved at 2 characters a token let each of 4 shards spend 120% of its cap on
    CJK text; a token per byte is what any text can cost, so each shard stops at its cap, never past it."""
    data = tmp_path / "cjk.jsonl"
    text = "上下文学习的评测任务。请仔细阅读并回答🙂" * 15  # 300 characters, 930 bytes
    rows = [
        {
            "messages": [{"role": "user", "content": f"{i}: {text}"}],
            "rubrics": ["r"],
            "metadata": {"task_id": f"t{i}", "context_id": f"c{i}", "context_category": "a", "sub_category": "b"},
        }
        for i in range(48)
    ]
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"billed": {"input": 100.0, "output": 100.0}}}))  # a call ~ $0.1
    cap = 0.5
    with FakeOpenAI(bytes_billed) as server:
        env = {**env, "OPENAI_BASE_URL": server.base_url, "EVALPIPE_PRICES": str(prices)}
        args = ["--bench", "clbench", "--model", "billed", "--input", data, "--outputs-dir", tmp_path / "out"]
        args += ["--workers", "16", "--max-tokens", "50", "--max-cost", cap]
        shards = [
            subprocess.Popen(stage_cmd("infer", *args, "--shard", f"{k}/4"), env=env, stderr=subprocess.PIPE, text=True)
            for k in range(4)
        ]
        errors = [p.communicate(timeout=120)[1] for p in shards]
    assert [p.returncode for p in shards] == [6] * 4, errors
    run = tmp_path / "out" / "clbench" / "billed" / "run-1"
    spent = [cost_of_rows(run / f"infer.shard-{k}-of-4.jsonl", 100.0, 100.0) for k in range(4)]
    print(f"spent per shard: {', '.join(f'${s:.4f}' for s in spent)} (cap ${cap} each)")  # pytest -s shows it
    assert all(cap - 0.11 < s <= cap for s in spent), spent  # up to the cap less one call, never past it
    assert sum(len((run / f"infer.shard-{k}-of-4.jsonl").read_text().splitlines()) for k in range(4)) == len(
        server.chat_requests()
    )


def test_a_reply_billed_past_its_reservation_raises_every_later_one(env, tmp_path):
    """A server that bills four times the token cap it was sent: only the first calls (two, until a reply has
    shown what the endpoint bills) can pass their reservation; every later call reserves four times as much."""

    def overbilling(request):
        return Reply(content="ANSWER: YES", usage={"prompt_tokens": 10, "completion_tokens": 200})

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"billed": {"input": 0.0, "output": 100.0}}}))  # a call billed $0.02
    with FakeOpenAI(overbilling) as server:
        env = {**env, "OPENAI_BASE_URL": server.base_url, "EVALPIPE_PRICES": str(prices)}
        done = infer(env, tmp_path, "--max-cost", 0.5)  # 256 in flight, --max-tokens 50: reserved $0.005
        assert done.returncode == 6, done.stderr
        spent = 0.02 * len(server.chat_requests())
    assert spent <= 0.5 + 2 * (0.02 - 0.005), spent  # at most the first two calls' excess past the cap
    assert spent > 0.4


def test_bad_price_tables_and_ledgers_are_refused_before_any_call(billing, env, tmp_path):
    """Issue 38 row 13: a price that is text or negative, a discount that is a word, a ledger holding nan or a
    negative amount: exit 2 naming the file and the field (or line), no call made."""
    server, prices = billing
    env = {**env, "OPENAI_BASE_URL": server.base_url, "EVALPIPE_PRICES": str(prices)}
    good = {"input": INPUT, "output": OUTPUT}
    for table, field in (
        ({"models": {"billed": {**good, "cached_input": "0.075"}}}, "model 'billed': cached_input is '0.075'"),
        ({"models": {"billed": {**good, "cached_input": -1000}}}, "model 'billed': cached_input is -1000"),
        ({"models": {"billed": {**good, "input": -1000}}}, "model 'billed': input is -1000"),
        ({"models": {"billed": {**good, "output": True}}}, "model 'billed': output is True"),
        ({"batch_discount": "half", "models": {"billed": good}}, "batch_discount is 'half'"),
        ({"batch_discount": 2, "models": {"billed": good}}, "batch_discount is 2"),
    ):
        prices.write_text(json.dumps(table))
        done = infer(env, tmp_path, "--max-cost", 1)
        assert done.returncode == 2, done.stderr
        assert f"{prices}: {field}" in done.stderr and "Traceback" not in done.stderr
    prices.write_text(json.dumps({"models": {"billed": good}}))
    for amount in ("nan", "inf"):
        done = infer(env, tmp_path, "--max-cost", amount)
        assert done.returncode == 2 and "give a positive amount" in done.stderr, done.stderr
    ledger = tmp_path / "spent"
    for bad in ("nan", "-5", "inf", "x"):
        ledger.write_text(f"0.25\n{bad}\n")
        done = infer(env, tmp_path, "--max-cost", 1, "--spending-ledger", ledger)
        assert done.returncode == 2, done.stderr
        assert f"{ledger}:2: the spending ledger holds {bad!r}" in done.stderr
    assert server.chat_requests() == []


def test_max_cost_with_a_judge_model_without_price_is_refused_before_infer_spends(billing, env, tmp_path):
    """Issue 38 row 14: the runner checks every model its stages will call before the first one starts."""
    server, prices = billing
    env = {**env, "OPENAI_BASE_URL": server.base_url, "EVALPIPE_PRICES": str(prices)}
    base = ["infer", "judge", "BENCH=clbench", "MODEL=billed", "RUNS=1", "MAX_SAMPLES=2", f"OUTPUTS={tmp_path}"]
    for words, missing in (
        (["JUDGE_MODEL=unpriced-judge", "MAX_COST=1"], "'unpriced-judge'"),
        (["MAX_COST=1"], "'gpt-5.1'"),  # judge.py's default judge
        (["MAX_COST=1", "JUDGE_ARGS=--judge-model other"], "'other'"),
    ):
        done = runner(env, *base, *words, timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"judge: --max-cost needs a price for {missing}" in done.stderr
    done = runner(env, *base, "JUDGE_ARGS=--max-cost nan", timeout=60)  # a cap in JUDGE_ARGS is checked up front too
    assert done.returncode == 2 and "judge: --max-cost nan: give a positive amount in USD" in done.stderr
    assert server.chat_requests() == []
    assert not (tmp_path / "clbench").exists()
