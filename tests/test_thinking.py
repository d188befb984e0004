"""Reasoning models as they really answer (issue 40): every shape a server hands the thinking back in, through real
HTTP, for the three benchmarks and the judge. The thinking of every reply holds a decoy: an answer that differs
from the final one."""

import dataclasses
import json

import pytest

from evalpipe.benchmarks.error_recovery import FINAL_ANSWER_PROMPT
from evalpipe.client import thinking
from evalpipe.devtools.testserver import FakeOpenAI, Reply, with_server_kind

from .conftest import ROOT, SAMPLE, is_judge, judge_json, read_jsonl, rubric_count

# how a server hands the thinking back (the table), one task each
SHAPES = ("plain", "hidden", "reasoning_content", "reasoning", "inline", "template_opened", "unclosed")
NO_ANSWER = ("hidden", "unclosed")  # the budget ran out while thinking
N = len(SHAPES)
COIN_FLIP = [json.loads(line) for line in (ROOT / "data/coin_flip/test.jsonl").read_text().splitlines()[:N]]
CLBENCH = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:N]]
ERROR_RECOVERY = [json.loads(line) for line in (ROOT / "data/error_recovery/sample.jsonl").read_text().splitlines()[:N]]


def secret(i: int) -> str:
    return f"SECRET-THINKING-{i}"


def shaped(shape: str, final: str, decoy: str, i: int) -> Reply:
    """A reply in `shape` whose final answer is `final` and whose thinking holds `decoy` (and a marker)."""
    thought = f"{secret(i)} Let me work it out step by step. {decoy}"
    if shape == "plain":
        return Reply(content=final)
    if shape == "hidden":  # OpenAI o-series: the budget spent on hidden reasoning, nothing left for the answer
        return Reply(content="", finish_reason="length", reasoning_tokens=48)
    if shape in ("reasoning_content", "reasoning"):
        return Reply(content=final, reasoning=thought, reasoning_field=shape, reasoning_tokens=20)
    if shape == "inline":
        return Reply(content=f"<think>\n{thought}\n</think>\n\n{final}")
    if shape == "template_opened":  # the chat template wrote `<think>` itself
        return Reply(content=f"{thought}\n</think>\n\n{final}")
    assert shape == "unclosed"
    return Reply(content=f"<think>\n{thought}", finish_reason="length")


def answer(request) -> Reply:
    """The model of every benchmark, and the judge (a reasoning model too, with a decoy verdict in its thinking)."""
    prompt = request.last_content
    if is_judge(request):
        response = prompt.split("<<<RESPONSE\n", 1)[1].split("\nRESPONSE>>>", 1)[0]
        i = next((i for i in range(N) if response == f"FINAL-{i}"), None)
        n, score = rubric_count(prompt), int(i is not None)
        shape = "plain" if i is None or SHAPES[i] in NO_ANSWER else SHAPES[i]
        return shaped(shape, judge_json(score, n), judge_json(1 - score, n), i or 0)
    for i, row in enumerate(COIN_FLIP):
        if row["question"] in prompt:
            other = "NO" if row["answer"].upper() == "YES" else "YES"
            return shaped(SHAPES[i], row["answer"].upper(), f"ANSWER: {other}", i)
    for i, row in enumerate(CLBENCH):
        if row["messages"][-1]["content"] == prompt:
            return shaped(SHAPES[i], f"FINAL-{i}", f"DECOY-{i}", i)
    for i, row in enumerate(ERROR_RECOVERY):
        if any(row["question"] == m.get("content") for m in request.messages):
            if FINAL_ANSWER_PROMPT in prompt:
                return shaped(SHAPES[i], str(row["target"]), "WRONG", i)
            return shaped(SHAPES[i], f"REASONING-FINAL-{i}", "reasoning decoy", i)
    raise AssertionError(f"unexpected request: {prompt[:200]!r}")


@pytest.fixture(scope="module")
def thinker():
    with FakeOpenAI(answer) as srv:
        yield srv


@pytest.fixture
def server(thinker):
    """conftest's `env` points the stages at this server; each test sees only its own requests."""
    thinker.requests.clear()
    return thinker


# ---- the separation itself


@pytest.mark.parametrize(
    ("content", "reasoning", "finish", "expected"),
    [
        ("YES", "", "stop", ("YES", "", False)),
        ("", "", "length", ("", "", True)),  # hidden reasoning, budget spent
        ("YES", "I think NO", "stop", ("YES", "I think NO", False)),
        ("<think>\nANSWER: NO\n</think>\n\nYES", "", "stop", ("YES", "ANSWER: NO", False)),
        ("ANSWER: NO\n</think>\nYES", "", "stop", ("YES", "ANSWER: NO", False)),
        ("<think>\nANSWER: NO", "", "length", ("", "ANSWER: NO", True)),
        ("<think>a</think>", "", "length", ("", "a", True)),  # thinking closed, no room left for the answer
        ("  <think>a</think>b</think>c", "", "stop", ("b</think>c", "a", False)),  # the first closing tag ends it
        ("the tag <think> inside an answer", "", "stop", ("the tag <think> inside an answer", "", False)),
    ],
)
def test_each_shape_separates_into_the_final_answer_and_the_thinking(content, reasoning, finish, expected):
    assert thinking.separate(content, reasoning, finish) == expected


def test_as_is_keeps_content_whole_as_the_references_do():
    reply = thinking.separate("<think>\nANSWER: NO", "field", "length", "as-is")
    assert reply == ("<think>\nANSWER: NO", "field", False)


# ---- through real HTTP, each benchmark


def judged(stage, bench: str, *args: str) -> tuple[list[dict], list[dict], dict, str, str]:
    """infer, judge and score of `bench` on the first N tasks: the inference rows, the judge rows, score.json, and
    infer's and score's stderr."""
    infer = stage("infer", "--bench", bench, "--model", "m", "--output", "infer.jsonl", "--max-samples", N, *args)
    assert infer.returncode == 0, infer.stderr
    stage(
        "judge",
        "--bench",
        bench,
        "--input",
        "infer.jsonl",
        "--output",
        "judge.jsonl",
        "--judge-model",
        "j",
        *args,
        check=0,
    )
    score = stage("score", "--bench", bench, "--input", "judge.jsonl", check=0)
    cwd = stage.cwd
    return (
        sorted(read_jsonl(cwd / "infer.jsonl"), key=lambda row: str(row["idx"])),
        sorted(read_jsonl(cwd / "judge.jsonl"), key=lambda row: str(row["idx"])),
        json.loads((cwd / "score.json").read_text()),
        infer.stderr,
        score.stderr,
    )


@pytest.mark.e2e
def test_coin_flip_grades_the_final_answer_whatever_the_shape(server, stage):
    infer_rows, judge_rows, score, infer_err, score_err = judged(stage, "coin_flip")
    for i, (shape, row) in enumerate(zip(SHAPES, judge_rows)):
        gold = COIN_FLIP[i]["answer"].upper()
        if shape in NO_ANSWER:
            assert (row["status"], row["model_output"], row["prediction"], row["score"]) == (
                "thinking_truncated",
                "",
                None,
                0,
            ), shape
        else:  # the decoy inside the thinking is never read
            assert (row["status"], row["model_output"], row["prediction"], row["score"]) == ("ok", gold, gold, 1), shape
        if shape not in ("plain", "hidden"):
            assert secret(i) in row["thinking"] and secret(i) not in row["model_output"], shape
        assert list(row)[:3] == ["idx", "messages", "model_output"]
    assert infer_rows[SHAPES.index("hidden")]["usage"]["reasoning_tokens"] == 48
    assert score["coverage"]["thinking_truncated"] == 2
    assert score["cost"]["stages"]["infer"]["tokens"]["reasoning_tokens"] == 48 + 20 + 20
    last = infer_err.strip().splitlines()[-1]
    assert "2 of 7 answers ran out of tokens while thinking" in last and "raise --max-tokens" in last, infer_err
    assert "ran out of tokens while thinking" in score_err.strip().splitlines()[-1], score_err


@pytest.mark.e2e
def test_coin_flip_as_is_reproduces_the_reference_which_reads_the_decoy(server, stage):
    _, judge_rows, score, _, _ = judged(stage, "coin_flip", "--thinking", "as-is")
    predictions = {shape: row["prediction"] for shape, row in zip(SHAPES, judge_rows)}
    gold = {shape: COIN_FLIP[i]["answer"].upper() for i, shape in enumerate(SHAPES)}
    for shape in ("inline", "template_opened", "unclosed"):  # EvalScope's rule finds the ANSWER line in the thinking
        assert predictions[shape] not in (None, gold[shape]), shape
        assert "<think>" in judge_rows[SHAPES.index(shape)]["model_output"] or shape == "template_opened"
    for shape in ("plain", "reasoning_content", "reasoning"):
        assert predictions[shape] == gold[shape], shape
    assert score["coverage"]["thinking_truncated"] == 1  # hidden only: an unclosed block is an answer there


@pytest.mark.e2e
def test_the_clbench_judge_is_shown_the_final_answer_only(server, stage):
    infer_rows, judge_rows, score, _, _ = judged(stage, "clbench")
    shown = [r.last_content for r in server.chat_requests() if is_judge(r)]
    assert len(shown) == N - len(NO_ANSWER)
    assert not [prompt for prompt in shown if "SECRET-THINKING" in prompt or "DECOY-" in prompt]
    position = {row["metadata"]["task_id"]: i for i, row in enumerate(CLBENCH)}
    for row in judge_rows:
        i = position[row["idx"]]
        shape = SHAPES[i]
        if shape in NO_ANSWER:
            assert (row["status"], row["judge_status"], row["score"]) == ("thinking_truncated", "empty_output", 0)
            assert "ran out while the model was thinking" in row["grading_rationale"]
        else:
            assert f"<<<RESPONSE\nFINAL-{i}\nRESPONSE>>>" in "".join(shown), shape
            # the judge thinks too: its verdict is read from its final answer, as plain JSON, never its decoy
            assert (row["model_output"], row["score"], row["judge_parse"]) == (f"FINAL-{i}", 1, "json"), shape
    assert {tuple(row)[:5] for row in infer_rows} == {("idx", "messages", "model_output", "rubrics", "metadata")}
    assert {tuple(row)[-1] for row in infer_rows} == {"thinking"}
    assert score["coverage"]["thinking_truncated"] == 2
    assert score["overall"]["score_1"] == N - len(NO_ANSWER)


@pytest.mark.e2e
def test_clbench_as_is_at_infer_alone_shows_the_judge_content_as_sent_as_upstream(server, stage):
    """One flag reaches the reference: the judge, at its defaults, shows the rows as infer wrote them."""
    stage("infer", "--bench", "clbench", "--model", "m", "--output", "infer.jsonl", "--max-samples", N,
          "--thinking", "as-is", check=0)  # fmt: skip
    stage("judge", "--bench", "clbench", "--input", "infer.jsonl", "--output", "judge.jsonl", "--judge-model", "j",
          check=0)  # fmt: skip
    shown = [r.last_content for r in server.chat_requests() if is_judge(r)]
    # the inline shapes' thinking reaches the judge, and the unclosed block is judged as an answer, as upstream
    assert len(shown) == N - 1 and len([prompt for prompt in shown if "SECRET-THINKING" in prompt]) == 3
    statuses = {row["status"] for row in read_jsonl(stage.cwd / "judge.jsonl")}
    assert statuses == {"ok", "thinking_truncated"}  # hidden reasoning: empty content at the limit, either way


@pytest.mark.e2e
def test_upstream_rows_with_inline_thinking_never_show_it_to_the_judge(server, stage, tmp_path):
    """Rows written by upstream's infer.py (no `thinking` field): the judge is shown their final answer."""
    rows = []
    for i, row in enumerate(CLBENCH[:3]):
        output = f"<think>{secret(i)} DECOY-{i}</think>FINAL-{i}" if i < 2 else f"{secret(i)}</think>FINAL-{i}"
        upstream = {"idx": row["metadata"]["task_id"], "messages": row["messages"], "model_output": output}
        rows.append(upstream | {"rubrics": row["rubrics"], "metadata": row["metadata"]})
    (tmp_path / "upstream.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stage(
        "judge",
        "--bench",
        "clbench",
        "--input",
        "upstream.jsonl",
        "--output",
        "judge.jsonl",
        "--judge-model",
        "j",
        check=0,
    )
    shown = [r.last_content for r in server.chat_requests()]
    assert len(shown) == 3 and not [p for p in shown if "SECRET-THINKING" in p]
    assert [row["score"] for row in read_jsonl(tmp_path / "judge.jsonl")] == [1, 1, 1]
    assert [row["model_output"] for row in read_jsonl(tmp_path / "judge.jsonl")] == [r["model_output"] for r in rows]


@pytest.mark.e2e
def test_error_recovery_extracts_and_grades_the_final_answer(server, stage):
    infer_rows, judge_rows, score, _, _ = judged(stage, "error_recovery")
    sent = [r for r in server.chat_requests() if FINAL_ANSWER_PROMPT in r.last_content]
    # the reasoning turn is handed back without its thinking
    assert sent and not [r for r in sent if "SECRET-THINKING" in json.dumps(r.messages)]
    for row in judge_rows:
        i = row["metadata"]["problem"]
        shape = SHAPES[i]
        if shape in NO_ANSWER:
            assert (row["status"], row["answer"], row["correct"]) == ("thinking_truncated", "", False), shape
            assert row["calls"]["extraction"]["thinking_truncated"] is True
        else:
            target = str(ERROR_RECOVERY[i]["target"])
            assert (row["status"], row["answer"], row["correct"]) == ("ok", target, True), shape
            assert row["model_output"] == f"REASONING-FINAL-{i}"
            if shape != "plain":
                assert row["thinking"].startswith(f"[reasoning]\n{secret(i)}") and "[extraction]" in row["thinking"]
    assert score["coverage"]["thinking_truncated"] == 2 * 3  # two problems, three variations each
    assert len(infer_rows) == 3 * N


@pytest.mark.e2e
def test_slim_rows_leave_the_thinking_out(server, stage):
    stage.infer("--bench", "coin_flip", "--max-samples", N, "--slim", check=0)
    rows = read_jsonl(stage.cwd / "infer.jsonl")
    assert {row["thinking"] for row in rows} == {None} and "messages" not in rows[0]
    stage("judge", "--bench", "coin_flip", "--input", "infer.jsonl", "--output", "judge.jsonl", check=0)
    scores = [row["score"] for row in sorted(read_jsonl(stage.cwd / "judge.jsonl"), key=lambda row: row["idx"])]
    assert scores == [0 if shape in NO_ANSWER else 1 for shape in SHAPES]


# ---- the token-limit field, learned per endpoint


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("kind", "given", "learned"),
    [("reasoning", "max_tokens", "max_completion_tokens"), ("legacy", "max_completion_tokens", "max_tokens")],
)
def test_the_token_field_the_endpoint_refuses_is_replaced_once_and_recorded(server, stage, kind, given, learned):
    server.handler = with_server_kind(kind, answer)
    try:
        args = ("--bench", "coin_flip", "--max-samples", 3, "--max-tokens", 256, "--max-tokens-param", given)
        stage.infer(*args, "--workers", 1, check=0)
        bodies = [r.body for r in server.chat_requests()]
        assert [given in b for b in bodies] == [True, False, False, False]  # refused once, then the other field
        assert all(b[learned] == 256 for b in bodies[1:])
        recorded = json.loads((stage.cwd / "infer.jsonl.manifest.json").read_text())
        assert recorded["learned"]["token_field"] == {f"{server.base_url} m": learned}
        # the next run starts from it: no refusal at all
        server.requests.clear()
        stage.infer(*args, "--max-samples", 5, check=0)
        assert [learned in r.body for r in server.chat_requests()] == [True, True]
        # an endpoint that changed its mind is learned again
        server.handler = with_server_kind("legacy" if kind == "reasoning" else "reasoning", answer)
        server.requests.clear()
        stage.infer(*args, "--max-samples", 6, check=0)
        assert [given in r.body for r in server.chat_requests()] == [False, True]
        recorded = json.loads((stage.cwd / "infer.jsonl.manifest.json").read_text())
        assert recorded["learned"]["token_field"] == {f"{server.base_url} m": given}
    finally:
        server.handler = answer


# ---- what the thinking cost, on the leaderboard


@pytest.mark.e2e
def test_the_leaderboard_counts_reasoning_tokens_their_cost_and_the_budget_outcome(server, stage):
    server.handler = lambda request: dataclasses.replace(answer(request), effort_applied="medium")
    try:
        run = ("--bench", "coin_flip", "--model", "gpt-5-mini")
        stage("infer", *run, "--max-samples", N, "--reasoning-effort", "high", "--max-tokens", 48, check=0)
        stage("judge", *run, check=0)
        stage("score", *run, check=0)
        done = stage("aggregate", "--bench", "coin_flip", "--no-plots", check=0)
    finally:
        server.handler = answer
    model = json.loads((stage.cwd / "outputs/coin_flip/aggregate.json").read_text())["models"][0]
    cost = json.loads((stage.cwd / "outputs/coin_flip/gpt-5-mini/run-1/score.json").read_text())["cost"]
    infer = cost["stages"]["infer"]
    assert model["thinking"]["reasoning_tokens_per_task"] == pytest.approx(88 / N)
    assert model["thinking"]["reasoning_share"] == pytest.approx(infer["reasoning_cost_usd"] / cost["cost_usd"])
    assert 0 < model["thinking"]["reasoning_share"] < 1 and model["thinking"]["thinking_truncated"] == 2
    assert model["thinking"]["effort_applied"] == {"medium": N}
    share = f"{100 * model['thinking']['reasoning_share']:.1f}% of the bill"
    note = f"gpt-5-mini: 13 reasoning tokens per task, {share}; 2 answers ran out of tokens while thinking"
    assert note in done.stdout, done.stdout
    assert "reasoning effort applied, as the endpoint said: medium (7)" in done.stdout
    assert "reasoning_effort high" in done.stdout  # asked (the generation settings' note)
