"""Conservative zero scores, each with its reason, and which of them are judged again."""

import pytest

from evalpipe.devtools.testserver import Reply

from .conftest import SAMPLE, is_judge, judge_json, read_jsonl, rubric_count, scripted

pytestmark = pytest.mark.e2e

IDS = [r["metadata"]["task_id"] for r in read_jsonl(SAMPLE)]


def judged(tmp_path):
    return {r["idx"]: r for r in read_jsonl(tmp_path / "judge.jsonl")}


def judge_calls(server):
    return sum(is_judge(r) for r in server.chat_requests())


def test_empty_output_scores_zero_without_a_judge_call(server, stage, tmp_path):
    empty_for = read_jsonl(SAMPLE)[1]["messages"][-1]["content"]
    server.handler = lambda r: Reply(content="   ") if r.last_content == empty_for else scripted(r)
    stage.infer("--max-samples", "3", check=0)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    row = judged(tmp_path)[IDS[1]]
    assert (row["score"], row["judge_status"], row["requirement_status"]) == (0, "empty_output", [])
    assert judge_calls(server) == 2


def test_judge_api_failure_is_a_provisional_zero_judged_again_next_run(server, stage, tmp_path):
    stage.infer("--max-samples", "4", check=0)
    server.handler = lambda r: Reply.error(500, "judge down") if is_judge(r) else scripted(r)
    proc = stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--max-retries", "1", "--backoff", "0.01")
    assert proc.returncode == 3, proc.stderr
    rows = judged(tmp_path)
    assert {r["judge_status"] for r in rows.values()} == {"api_error"}
    assert {r["score"] for r in rows.values()} == {0}
    assert all("HTTP 500" in r["judge_error"] for r in rows.values())
    score = stage("score", "--input", "judge.jsonl")
    assert score.returncode == 3 and "provisional zeros" in score.stderr
    server.handler = scripted
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    assert {r["judge_status"] for r in judged(tmp_path).values()} == {"ok"}
    assert stage("score", "--input", "judge.jsonl").returncode == 0


def test_unparseable_judge_replies_are_retried_then_recorded(server, stage, tmp_path):
    stage.infer("--max-samples", "2", check=0)
    server.handler = lambda r: Reply(content="I think it is fine overall.") if is_judge(r) else scripted(r)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--parse-attempts", "3", check=0)
    rows = judged(tmp_path)
    assert {(r["judge_status"], r["score"], r["judge_attempts"]) for r in rows.values()} == {("parse_error", 0, 3)}
    assert "I think it is fine" in rows[IDS[0]]["judge_error"]
    assert judge_calls(server) == 6
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    assert judge_calls(server) == 6  # parse errors stay unless asked
    server.handler = scripted
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--rejudge-parse-errors", check=0)
    assert judge_calls(server) == 8
    assert {r["judge_status"] for r in judged(tmp_path).values()} == {"ok"}
    assert len(read_jsonl(tmp_path / "judge.jsonl")) == 4  # history kept; the last row per task wins


def test_salvaged_replies_count_and_say_how(server, stage, tmp_path):
    stage.infer("--max-samples", "2", check=0)

    def chatty_judge(request):
        if not is_judge(request):
            return scripted(request)
        verdict = judge_json(1, rubric_count(request.last_content))
        return Reply(content=f"Sure! Here is the grading.\n```json\n{verdict}\n```\nHope this helps.")

    server.handler = chatty_judge
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    rows = judged(tmp_path)
    assert {(r["judge_status"], r["judge_salvage"], r["score"]) for r in rows.values()} == {
        ("salvaged", "fenced_json", 1)
    }
    assert judge_calls(server) == 2


def test_a_retry_after_parse_failure_keeps_the_usage_of_every_call(server, stage, tmp_path):
    stage.infer("--max-samples", "1", check=0)
    replies = ["garbage", None]

    def second_time_lucky(request):
        if not is_judge(request):
            return scripted(request)
        text = replies.pop(0) or judge_json(0, rubric_count(request.last_content))
        return Reply(content=text, usage={"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110})

    server.handler = second_time_lucky
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    row = judged(tmp_path)[IDS[0]]
    assert (row["judge_status"], row["judge_attempts"], row["judge_usage"]) == (
        "ok",
        2,
        {"prompt_tokens": 200, "completion_tokens": 20},
    )


def test_replies_that_are_no_verdict_score_zero_and_the_stage_goes_on(server, stage, tmp_path):
    """Issue 38 rows 5 and 6: fractions, prose, exponents and deep nesting are parse failures (score 0), never a
    pass and never a RecursionError; every task gets its row and judge exits as usual."""
    stage.infer("--max-samples", "8", check=0)
    body = '{"Grading Rationale": "x", "List of Requirement Satisfaction Status": [], "Overall Score": '
    bad = [body + v + "}" for v in ("1/2", "1 of 3 requirements met", "1e-9", "1e400")]
    bad += [body + '"1 of 3 requirements met"}', "[" * 3000, '{"a": ' * 3000, body + "1, " + '"x": ' + "[" * 9000]
    answers = [r["model_output"] for r in read_jsonl(tmp_path / "infer.jsonl")]
    reply_for = dict(zip(answers, bad, strict=True))  # one kind of non-verdict per task

    def no_verdicts(request):
        if not is_judge(request):
            return scripted(request)
        return Reply(content=next(text for answer, text in reply_for.items() if answer in request.last_content))

    server.handler = no_verdicts
    proc = stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--parse-attempts", "1", check=0)
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    rows = judged(tmp_path)
    assert len(rows) == 8
    assert {(r["judge_status"], r["score"]) for r in rows.values()} == {("parse_error", 0)}
