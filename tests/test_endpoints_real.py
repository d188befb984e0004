"""Endpoints as they really behave (issue 30), checked through real HTTP against both servers: our
test server (testserver.FakeOpenAI) and a second one written apart from it (plainserver.PlainServer).

A trickling body, an endpoint that answers nothing, hostile usage numbers, credentials in the base
URL, names too long for a folder, strings that would run in a report, sporadic 429s."""

import asyncio
import csv
import json
import subprocess
import sys
import time

import pytest

from evalpipe.client import cost, llm
from evalpipe.client.limiter import AdaptiveLimit
from evalpipe.client.llm import ChatClient, Endpoint
from evalpipe.devtools.plainserver import Behaviour, PlainServer
from evalpipe.devtools.testserver import FakeOpenAI, Faults, RateLimit, Reply, deterministic
from evalpipe.errors import CallFailed, EndpointUnreachable
from evalpipe.results import tables

from .conftest import API_KEY, ROOT, read_jsonl, runner, write_jsonl

MSGS = [{"role": "user", "content": "hi"}]


def complete(base_url, limit=None, calls=1, **kw):
    settings = dict(model="m", base_url=base_url, api_key=API_KEY, timeout=2, max_retries=0, backoff_initial=0.05)
    settings.update(kw)

    async def go():
        client = ChatClient(Endpoint(**settings), limit)
        try:
            return await asyncio.gather(*(client.complete(MSGS) for _ in range(calls)), return_exceptions=True)
        finally:
            await client.aclose()

    return asyncio.run(go())


def trickling(request):
    reply = deterministic(request)
    reply.trickle, reply.trickle_bytes = 1.0, 1
    return reply


@pytest.fixture(params=["testserver", "plainserver"])
def trickle_url(request):
    if request.param == "testserver":
        with FakeOpenAI(trickling) as server:
            yield server.base_url
    else:
        with PlainServer(Behaviour(trickle=True)) as server:
            yield server.base_url


def test_a_trickling_body_ends_as_a_timed_out_attempt(trickle_url):
    assert llm.openai.AsyncOpenAI  # the SDK loaded (on first use) before the clock starts
    started = time.monotonic()
    # a byte a second never trips a read timeout of 2 s: only the deadline of the whole call can end it
    [failed] = complete(trickle_url, timeout=2.0)
    assert time.monotonic() - started < 3.0  # the timeout plus a second
    assert isinstance(failed, CallFailed) and str(failed).startswith("CallTimedOut"), failed


@pytest.fixture(params=["testserver", "plainserver"])
def silent_url(request):
    if request.param == "testserver":
        with FakeOpenAI(silent=True) as server:
            yield server.base_url
    else:
        with PlainServer(Behaviour(hang=True)) as server:
            yield server.base_url


def test_an_endpoint_that_answers_nothing_is_unreachable_once_its_timeout_has_passed(silent_url):
    started = time.monotonic()
    results = complete(silent_url, calls=3, timeout=1.0)
    waited = time.monotonic() - started
    # the whole --timeout first (slow is not dead), then GET /models for as long again at most
    assert 1.0 <= waited < 1.0 + 1.0 + 2.0
    assert all(isinstance(r, EndpointUnreachable) for r in results), results
    assert "accepted connections but never answered" in str(results[0])
    assert "--timeout 1s" in str(results[0]) and "raise --timeout" in str(results[0])


def test_a_serial_server_slow_to_answer_is_waited_for_up_to_the_timeout():
    """llama.cpp's server answers one request at a time, GET /models included: a first answer that takes
    longer than any fixed allowance but less than --timeout is waited for, however long that is."""
    with PlainServer(Behaviour(latency=1.5, serial=True)) as server:
        results = complete(server.base_url, calls=2, timeout=4.0)
    assert all(isinstance(r, llm.Completion) and r.text.startswith("plain:") for r in results), results


def test_a_live_server_slower_than_the_timeout_is_timed_out_not_called_dead():
    """Past --timeout a serial server still answers GET /models once it is free: the call timed out, and the
    run goes on (retries, then exit 3), never exit 69."""
    with PlainServer(Behaviour(latency=1.5, serial=True)) as server:
        [failed] = complete(server.base_url, timeout=1.0)
    assert isinstance(failed, CallFailed) and not isinstance(failed, EndpointUnreachable), failed
    assert "timed out" in str(failed).lower(), failed


@pytest.mark.e2e
def test_infer_stops_with_69_after_its_timeout_on_an_endpoint_that_answers_nothing(stage):
    with FakeOpenAI(silent=True) as silent:
        stage.env["OPENAI_BASE_URL"] = silent.base_url
        started = time.monotonic()
        done = stage(
            "infer", "--bench", "coin_flip", "--model", "m", "--max-samples", "3", "--timeout", "2", timeout=60
        )
    assert done.returncode == 69, done.stderr
    assert time.monotonic() - started < 20
    assert "accepted connections but never answered" in done.stderr


HOSTILE = [
    {"prompt_tokens": -2430, "completion_tokens": 5},
    {"prompt_tokens": 2**63, "completion_tokens": 5},
    {"prompt_tokens": 10**30, "completion_tokens": 5},
    {"prompt_tokens": 1.5, "completion_tokens": 5},
    {"prompt_tokens": "12", "completion_tokens": 5},
]


def test_usage_numbers_that_are_not_counts_are_marked_invalid(server, capsys):
    for usage in HOSTILE:
        server.handler = lambda request, usage=usage: Reply(content="x", usage=usage)
        [done] = complete(server.base_url)
        assert set(done.usage) == {"invalid"} and "prompt_tokens" in done.usage["invalid"], done.usage
    assert capsys.readouterr().err.count("not token counts") <= 1  # one warning per run


def test_the_ledger_leaves_out_usage_rows_that_are_not_counts():
    ledger = cost.Ledger()
    ledger.add("infer", "gpt-4o-mini", {"prompt_tokens": 10, "completion_tokens": 2}, 0.1)
    for usage in [*HOSTILE, {"invalid": {"prompt_tokens": "-1"}}]:
        ledger.add("infer", "gpt-4o-mini", usage, 0.1)
    summary = ledger.summary(cost.load_prices())
    stage = summary["stages"]["infer"]
    assert stage["tokens"] == {"prompt_tokens": 10, "completion_tokens": 2}
    assert stage["invalid_usage_calls"] == len(HOSTILE) + 1 and stage["cost_usd"] >= 0
    assert "not token counts" in cost.format_summary(summary)


@pytest.mark.e2e
def test_score_and_aggregate_over_rows_with_hostile_usage_exit_0(stage, server, tmp_path):
    """infer against a server sending hostile numbers, then score and aggregate over rows that an older
    version wrote with such numbers as they came."""
    counter = iter(range(10**6))

    def hostile(request):
        usage = HOSTILE[next(counter) % len(HOSTILE)]
        return Reply(content="Answer: yes", usage=usage)

    server.handler = hostile
    common = ["--bench", "coin_flip", "--model", "gpt-4o-mini"]
    done = stage("infer", *common, "--max-samples", "10", check=0)
    assert done.stderr.count("not token counts") == 1
    folder = tmp_path / "outputs" / "coin_flip" / "gpt-4o-mini" / "run-1"
    rows = read_jsonl(folder / "infer.jsonl")
    assert all("invalid" in row["usage"] for row in rows)
    for i, row in enumerate(rows):  # as written before the check
        row["usage"] = {"prompt_tokens": [-2430, 2**63, 2**63][i % 3], "completion_tokens": 5}
    write_jsonl(folder / "infer.jsonl", rows)
    stage("judge", *common, check=0)
    stage("score", *common, "--max-samples", "10", check=0)
    tokens = json.loads((folder / "score.json").read_text())["cost"]["stages"]["infer"]["tokens"]
    assert all(0 <= value < 2**63 for value in tokens.values()), tokens
    stage("aggregate", "--bench", "coin_flip", check=0)


@pytest.mark.e2e
def test_credentials_in_the_base_url_are_refused_at_once_without_showing_the_key(stage, server):
    host = server.base_url.split("://", 1)[1]
    stage.env["OPENAI_BASE_URL"] = f"http://user:KEY-0123456789@{host}"
    started = time.monotonic()
    done = stage("infer", "--bench", "coin_flip", "--model", "m", "--max-samples", "2", check=2)
    assert time.monotonic() - started < 10 and not server.chat_requests()
    assert "has credentials in it" in done.stderr and "KEY-0123456789" not in done.stdout + done.stderr


@pytest.mark.e2e
def test_the_pipeline_ends_with_the_code_of_the_stage_that_did_not_finish(server, env, tmp_path):
    server.handler = lambda request: Reply.error(500, "down")
    words = ["infer", "judge", "score", "BENCH=coin_flip", "MODEL=m", "RUNS=1", "MAX_SAMPLES=2", f"OUTPUTS={tmp_path}"]
    done = runner(env, *words, "ARGS=--max-retries 0", "JUDGE_ARGS=--max-retries 0", timeout=120)
    assert done.returncode == 3, done.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("flag", ["--model", "--label"])
def test_a_name_too_long_for_a_folder_is_bad_input(stage, flag):
    names = {"--model": "m", "--label": "l", flag: "x" * 5000}
    done = stage(
        "infer", "--bench", "coin_flip", "--max-samples", "1", *[w for kv in names.items() for w in kv], check=2
    )
    assert "too long for a file name" in done.stderr and "Traceback" not in done.stderr


HOSTILE_NAMES = ["<img src=x onerror=alert(1)>", '=HYPERLINK("http://x","y")', "+1+cmd", "@SUM(A1)", "-2+3"]


def test_strings_from_data_are_escaped_in_markdown_and_csv():
    md = tables.markdown_table(HOSTILE_NAMES, [HOSTILE_NAMES])
    assert "<img" not in md and "&lt;img" in md
    rows = list(csv.reader(tables.csv_text(HOSTILE_NAMES, [[*HOSTILE_NAMES, -1.5, "-1.5"]]).splitlines()))
    for row in rows:
        assert not any(cell.startswith(("=", "+", "@")) for cell in row), row
        assert all(cell.startswith("'") for cell in row[1:5])
    assert rows[1][5:] == ["-1.5", "-1.5"]  # numbers stay numbers


@pytest.mark.e2e
def test_aggregate_and_report_escape_category_names_from_the_dataset(stage, server, tmp_path):
    """CL-bench categories from the dataset end up as table headers in aggregate.md/.csv and report.md."""
    rows = [json.loads(line) for line in (ROOT / "data" / "clbench" / "sample.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        row["metadata"]["context_category"] = HOSTILE_NAMES[i % 2]
        row["metadata"]["sub_category"] = HOSTILE_NAMES[i % 2]
    data = tmp_path / "hostile.jsonl"
    write_jsonl(data, rows)
    stage("infer", "--model", "m", "--max-samples", "4", "--input", data, check=0)
    stage("judge", "--model", "m", check=0)
    stage("score", "--model", "m", "--max-samples", "4", "--data", data, check=0)
    stage("aggregate", check=0)
    out = tmp_path / "outputs" / "clbench"
    md = (out / "aggregate.md").read_text()
    assert "<img" not in md and "&lt;img" in md, md
    for row in csv.reader((out / "aggregate.csv").read_text().splitlines()):
        assert not any(cell.startswith(("=", "+", "@")) for cell in row), row
    subprocess.run(
        [sys.executable, "-m", "evalpipe.stages.report", "--outputs-dir", tmp_path / "outputs"],
        cwd=ROOT,
        env=stage.env,
        check=True,
        capture_output=True,
    )
    assert "<img" not in (tmp_path / "outputs" / "report.md").read_text()


def test_sporadic_overload_429s_neither_shrink_nor_pause_the_others():
    """1 in 50 replies is an overloaded provider's 429 with Retry-After: only that request waits, on both servers."""
    for make in (
        lambda: FakeOpenAI(Faults(deterministic, overloaded=0.02, retry_after=1.0)),
        lambda: PlainServer(Behaviour(overloaded=0.02)),
    ):
        limit = AdaptiveLimit(64)
        with make() as server:
            results = complete(server.base_url, limit, calls=600, max_retries=6)
        assert all(isinstance(r, llm.Completion) for r in results), [r for r in results if isinstance(r, Exception)]
        assert sum(r.attempts > 1 for r in results) >= 3  # the faults were there
        assert limit.cuts == 0 and limit.limit == 64


def test_a_token_bucket_announced_per_minute_is_paced_with_few_429s_on_both_servers():
    """A bucket of 40 refilling at 100/s whose limit-requests says 6000 (the per-minute limit): past the first 64
    sent before any reply (24 of them 429), at most 15 of 300 answered 429."""
    test_limit = RateLimit(deterministic, rpm=6000, burst_s=0.4, per_minute_limit=True)
    with FakeOpenAI(test_limit) as server:
        results = complete(server.base_url, AdaptiveLimit(64), calls=300, max_retries=6)
    assert all(isinstance(r, llm.Completion) for r in results)
    assert test_limit.rejected <= 24 + 15, test_limit.rejected
    with PlainServer(Behaviour(bucket=40, rpm=6000)) as plain:
        results = complete(plain.base_url, AdaptiveLimit(64), calls=300, max_retries=6)
    assert all(isinstance(r, llm.Completion) for r in results)
    assert plain.counters.limited <= 24 + 15, plain.counters.limited
