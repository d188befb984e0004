"""The judge's response_format ladder over real HTTP: each server kind of ../shared/research/judge.md §2."""

import asyncio
import contextlib
import json

import pytest

from evalpipe.benchmarks.clbench import CLBench, CLBenchOptions
from evalpipe.client import judge_format
from evalpipe.client.llm import ChatClient, Endpoint
from evalpipe.devtools.testserver import FakeOpenAI, Reply, with_server_kind
from evalpipe.errors import EndpointRefused

from .conftest import is_judge, judge_json, rubric_count

RUBRICS = ["Says hello.", "Says goodbye."]


def fmt(request) -> str:
    """The mode a request asked for, as judge rows name it."""
    rf = (request.body or {}).get("response_format")
    if rf is None:
        return "none"
    if rf["type"] == "json_object":
        return "json_object_schema" if "schema" in rf else "json_object"
    return rf["type"]


def valid_judge(request) -> Reply:
    return Reply(content=judge_json(1, rubric_count(request.last_content)))


def chatty_unless_enforced(request) -> Reply:
    """A model that ignores the format: a verdict inside prose."""
    return Reply(content="Grading:\n```json\n" + judge_json(0, rubric_count(request.last_content)) + "\n```")


def grade_all(handler, *, n=40, workers=32, params=None, **options):
    """Grade n answers through CLBench.grade with `workers` concurrent tasks; (rows, server requests, formats)."""
    bench = CLBench(CLBenchOptions(**{"parse_attempts": 1, **options}))
    rows = [
        {"idx": f"t{i}", "messages": [{"role": "user", "content": "q"}], "model_output": f"a{i}", "rubrics": RUBRICS}
        for i in range(n)
    ]

    async def run(endpoint):
        gate = asyncio.Semaphore(workers)
        async with contextlib.aclosing(ChatClient(endpoint)) as client:

            async def one(row):
                async with gate:
                    return await bench.grade(row, client)

            return await asyncio.gather(*(one(r) for r in rows))

    with FakeOpenAI(handler) as srv:
        endpoint = Endpoint(
            model="judge", base_url=srv.base_url, api_key="k", max_retries=2, backoff_initial=0.01, params=params or {}
        )
        graded = asyncio.run(run(endpoint))
    return graded, [r for r in srv.chat_requests() if is_judge(r)], bench.judge_formats


@pytest.mark.parametrize(
    ("kind", "mode", "rejected"),
    [
        ("enforcing", "json_schema", []),
        ("llama_cpp_python", "json_object_schema", ["json_schema"]),
        ("llama_server_2024", "json_object_schema", ["json_schema"]),
        ("deepseek", "json_object_schema", ["json_schema"]),
        ("rejecting", "none", ["json_schema", "json_object_schema", "json_object"]),
    ],
)
def test_the_ladder_settles_on_what_the_server_takes_with_one_rejection_per_mode(kind, mode, rejected):
    rows, requests, formats = grade_all(with_server_kind(kind, valid_judge), n=40, workers=32)
    assert len(rows) == 40
    assert {(r["judge_status"], r["score"], r["judge_format"], r["judge_parse"]) for r in rows} == {
        ("ok", 1, mode, "json")
    }
    asked = [fmt(r) for r in requests]
    assert asked[: len(rejected)] == rejected  # each unsupported mode asked exactly once, first, alone
    assert asked[len(rejected) :] == [mode] * 40  # every row judged once in the mode that works: no row lost
    (state,) = formats.state().values()
    assert (state["mode"], sorted(state["rejected"]), state["settled"]) == (mode, sorted(rejected), True)


def test_a_500_that_names_the_format_is_not_retried():
    rows, requests, _ = grade_all(with_server_kind("llama_cpp_python", valid_judge), n=1)
    assert [fmt(r) for r in requests] == ["json_schema", "json_object_schema"]


def test_a_plain_500_is_a_transport_failure_not_a_rejection():
    rows, requests, formats = grade_all(lambda r: Reply.error(500, "judge down"), n=1)
    assert rows[0]["judge_status"] == "api_error"
    assert {fmt(r) for r in requests} == {"json_schema"} and len(requests) == 3  # retried, never stepped down
    (state,) = formats.state().values()
    assert (state["rejected"], state["settled"]) == ({}, False)


def test_a_server_that_ignores_the_format_is_marked_not_enforced_and_salvaged():
    rows, requests, formats = grade_all(with_server_kind("ignoring", chatty_unless_enforced), n=5, workers=1)
    assert {(r["judge_status"], r["judge_format"], r["judge_parse"], r["score"]) for r in rows} == {
        ("salvaged", "json_schema", "fenced_json", 0)
    }
    assert all(r["judge_format_enforced"] is False for r in rows)
    (state,) = formats.state().values()
    assert state["not_enforced"] == ["json_schema"]


def test_raw_newlines_inside_strings_from_a_schema_grammar_parse():
    def newline_in_rationale(request):
        verdict = json.loads(judge_json(1, rubric_count(request.last_content), rationale="line one\nline two"))
        return Reply(content=json.dumps(verdict).replace("\\n", "\n"))

    rows, _, _ = grade_all(with_server_kind("llama_cpp_python", newline_in_rationale), n=2)
    assert {(r["judge_status"], r["judge_format"]) for r in rows} == {("ok", "json_object_schema")}
    assert rows[0]["grading_rationale"] == "line one\nline two"


def test_empty_content_is_read_from_the_reasoning_field():
    def thinking(request):
        return Reply(content="", reasoning=judge_json(1, rubric_count(request.last_content)))

    rows, _, _ = grade_all(with_server_kind("enforcing", thinking), n=2)
    assert {(r["judge_status"], r["score"], r["judge_parse"]) for r in rows} == {("ok", 1, "reasoning:json")}


def test_a_reply_cut_at_the_token_limit_is_judge_truncated_and_scores_zero():
    def cut(request):
        return Reply(content='{"Grading Rationale": "Rubric 1 is met bec', finish_reason="length")

    rows, requests, _ = grade_all(with_server_kind("enforcing", cut), n=2, parse_attempts=3)
    assert {(r["judge_status"], r["score"], r["judge_attempts"]) for r in rows} == {("judge_truncated", 0, 1)}
    assert len(requests) == 2  # the same budget would cut it again: no second attempt
    bench = CLBench(CLBenchOptions())
    assert bench.is_judged(rows[0])
    assert not CLBench(CLBenchOptions(rejudge_truncated=True)).is_judged(rows[0])


def test_reasoning_models_get_max_completion_tokens_after_one_rejection():
    rows, requests, formats = grade_all(with_server_kind("reasoning", valid_judge), n=8, judge_max_tokens=4000)
    assert {r["judge_status"] for r in rows} == {"ok"}
    assert "max_tokens" in requests[0].body and sum("max_tokens" in r.body for r in requests) == 1
    assert all(r.body["max_completion_tokens"] == 4000 for r in requests[1:])
    assert next(iter(formats.state().values()))["token_field"] == "max_completion_tokens"


def test_a_user_max_tokens_is_moved_to_max_completion_tokens_too():
    rows, requests, _ = grade_all(with_server_kind("reasoning", valid_judge), n=2, params={"max_tokens": 123})
    assert [("max_tokens" in r.body, r.body.get("max_completion_tokens")) for r in requests] == [
        (True, None),
        (False, 123),
        (False, 123),
    ]


def test_none_sends_upstreams_exact_request():
    rows, requests, _ = grade_all(with_server_kind("enforcing", valid_judge), n=2, judge_format="none")
    assert [sorted(r.body) for r in requests] == [["messages", "model"]] * 2
    assert {r["judge_format"] for r in rows} == {"none"}


def test_a_forced_mode_the_server_rejects_stops_the_run():
    with pytest.raises(EndpointRefused, match="rejects response_format json_schema"):
        grade_all(with_server_kind("llama_cpp_python", valid_judge), n=3, judge_format="json_schema")


def test_forced_json_object_steps_from_schema_to_plain_then_stops():
    with pytest.raises(EndpointRefused, match="rejects response_format json_object"):
        grade_all(with_server_kind("rejecting", valid_judge), n=1, judge_format="json_object")


def test_the_error_analysis_asks_for_its_own_schema():
    def analyst(request):
        return Reply(content=json.dumps({"Error Types": ["Refusal"], "Reason": "declined"}))

    bench = CLBench(CLBenchOptions())
    row = {"idx": "t", "model_output": "no", "rubrics": RUBRICS, "requirement_status": ["no", "no"], "score": 0}

    async def run(endpoint):
        async with contextlib.aclosing(ChatClient(endpoint)) as client:
            return await bench.analyze_error(row, client)

    with FakeOpenAI(with_server_kind("llama_cpp_python", analyst)) as srv:
        out = asyncio.run(run(Endpoint(model="judge", base_url=srv.base_url, api_key="k")))
    assert (out["analysis_status"], out["analysis_format"], out["error_types"]) == (
        "ok",
        "json_object_schema",
        ["Refusal"],
    )
    sent = srv.chat_requests()[-1].body["response_format"]
    assert sent["schema"]["required"] == ["Error Types", "Reason"]


@pytest.mark.parametrize(
    ("status", "text", "unsupported"),
    [
        (400, "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.", True),
        (400, 'response_format type must be one of "text" or "json_object", but got: json_schema', True),
        (404, "No endpoints found that can handle the requested parameters.", True),
        (500, "response_format.type Input should be 'text' or 'json_object'", True),
        (500, "judge down", False),
        (500, "", False),
        (400, "This model's maximum context length is 8192 tokens (response_format ...)", False),
        (
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens'",
            False,
        ),
        (429, "response_format rate limit", False),
        (  # a proxy that echoes the request body: about response_format, though it names max_tokens
            400,
            "litellm.UnsupportedParamsError: does not support parameters: {'response_format': {'type': "
            "'json_schema'}}. Received: {'max_tokens': 512, 'response_format': {...}}",
            True,
        ),
    ],
)
def test_which_errors_mean_unsupported(status, text, unsupported):
    assert judge_format.unsupported(status, text) is unsupported


def test_token_field_defaults():
    assert judge_format.default_token_field("https://api.openai.com/v1", "gpt-5.1") == "max_completion_tokens"
    assert judge_format.default_token_field("https://api.openai.com/v1", "gpt-4.1") == "max_tokens"
    assert judge_format.default_token_field("http://127.0.0.1:8080/v1", "o3-local") == "max_tokens"


def test_a_saved_decision_seeds_only_the_same_choice():
    saved = {"h m": {"choice": "auto", "mode": "json_object", "settled": True, "rejected": {"json_schema": "x"}}}
    forced = {"h m": {"choice": "none", "mode": "none", "settled": True}}

    class Client:
        class endpoint:
            learned_key = "h m"

    auto = judge_format.Formats("auto")
    auto.seed(saved)
    assert auto.ladder(Client).mode == "json_object"  # type: ignore[arg-type]
    after_none = judge_format.Formats("auto")
    after_none.seed(forced)
    assert after_none.ladder(Client).mode == "json_schema"  # type: ignore[arg-type]


def test_a_budget_above_the_models_cap_is_lowered_to_it_once():
    def capped(request):
        if request.body.get("max_tokens", 0) > 4096:
            return Reply.error(
                400,
                "max_tokens is too large: 16384. This model supports at most 4096 completion tokens, "
                "whereas you provided 16384.",
                "invalid_value",
            )
        return valid_judge(request)

    rows, requests, formats = grade_all(capped, n=6)
    assert {r["judge_status"] for r in rows} == {"ok"}
    assert [r.body.get("max_tokens") for r in requests] == [16384] + [4096] * 6
    assert next(iter(formats.state().values()))["budget_cap"] == 4096


def test_a_budget_beyond_a_small_context_is_dropped_not_a_context_length_row():
    def vllm_8k(request):
        if "max_tokens" in request.body:
            return Reply.error(
                400,
                "'max_tokens' or 'max_completion_tokens' is too large: 16384. This model's maximum context length "
                "is 8192 tokens and your request has 300 input tokens (16384 > 8192 - 300).",
            )
        return valid_judge(request)

    rows, requests, _ = grade_all(vllm_8k, n=4)
    assert {r["judge_status"] for r in rows} == {"ok"}
    assert ["max_tokens" in r.body for r in requests] == [True] + [False] * 4


def test_a_users_own_max_tokens_beyond_the_context_stays_a_context_length_row():
    def vllm_8k(request):
        return Reply.error(400, "This model's maximum context length is 8192 tokens. max_tokens is too large")

    rows, requests, _ = grade_all(vllm_8k, n=1, params={"max_tokens": 99999})
    assert rows[0]["judge_status"] == "judge_context_length" and len(requests) == 1
