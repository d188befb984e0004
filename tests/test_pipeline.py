"""The four stage scripts end to end, as subprocesses, against the loopback server."""

import json

import pytest

from evalpipe.devtools.testserver import Reply

from .conftest import API_KEY, SAMPLE, is_judge, make, read_jsonl, write_jsonl

pytestmark = pytest.mark.e2e

UPSTREAM_INFER = ["idx", "messages", "model_output", "rubrics", "metadata"]
UPSTREAM_JUDGE = UPSTREAM_INFER + ["grading_rationale", "requirement_status", "score"]


def sample_rows():
    return read_jsonl(SAMPLE)


def test_make_runs_the_whole_pipeline_over_runs(server, env, tmp_path):
    settings = [f"OUTPUTS={tmp_path / 'out'}", "MODEL=org/model:v1", "JUDGE_MODEL=judge-1", "RUNS=2", "WORKERS=4"]
    proc = make(env, "infer", "judge", "score", "aggregate", *settings)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run1 = tmp_path / "out" / "clbench" / "org_model_v1" / "run-1"
    infer_rows, judge_rows = read_jsonl(run1 / "infer.jsonl"), read_jsonl(run1 / "judge.jsonl")
    assert len(infer_rows) == len(judge_rows) == 12
    assert all(list(r)[:5] == UPSTREAM_INFER for r in infer_rows)
    assert all(list(r)[:8] == UPSTREAM_JUDGE for r in judge_rows)
    solved = sum(r["score"] for r in judge_rows)
    score = json.loads((run1 / "score.json").read_text())
    assert score["overall"]["score_1"] == solved
    assert score["overall"]["solving_rate"] == solved / 12
    assert score["coverage"] == {
        "expected": 12,
        "graded": 12,
        "missing": 0,
        "missing_ids": [],
        "extra_rows_ignored": 0,
        "to_rejudge": 0,
    }
    by_cat = score["by_category"]
    assert sum(c["total"] for c in by_cat.values()) == 12
    aggregate = json.loads((tmp_path / "out" / "clbench" / "aggregate.json").read_text())
    (model,) = aggregate["models"]
    assert model["model"] == "org_model_v1" and model["runs"] == [1, 2]
    # deterministic server: both runs agree, so the std is 0
    assert model["figures"]["Overall"] == {**model["figures"]["Overall"], "mean": solved / 12, "std_sample": 0.0}
    assert f"{100 * solved / 12:.1f} ± 0.0" in proc.stdout
    # the key went nowhere
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert API_KEY not in path.read_text(errors="replace")
    assert API_KEY not in proc.stdout + proc.stderr


def test_upstream_command_lines_and_row_formats(server, stage, tmp_path):
    # upstream: python infer.py --model M --input X --output Y --workers N ; eval.py --input Y --output Z
    stage(
        "infer",
        "--model",
        "m",
        "--input",
        SAMPLE,
        "--output",
        "out.jsonl",
        "--workers",
        "3",
        "--max-samples",
        "4",
        check=0,
    )
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 4
    # an infer row written by upstream (no extra keys, plus a ref_answer) is judged by ours
    upstream_rows = []
    for row in sample_rows()[:2]:
        upstream_rows.append(
            {
                "idx": row["metadata"]["task_id"],
                "messages": row["messages"],
                "model_output": "A answer",
                "rubrics": row["rubrics"],
                "metadata": row["metadata"],
                "ref_answer": "x",
            }
        )
    write_jsonl(tmp_path / "upstream_infer.jsonl", upstream_rows)
    stage(
        "judge",
        "--input",
        "upstream_infer.jsonl",
        "--judge-model",
        "gpt-5.1",
        "--reasoning-effort",
        "low",
        "--workers",
        "5",
        "--max-retries",
        "3",
        "--aws-region",
        "us-east-1",
        check=0,
    )
    graded = read_jsonl(tmp_path / "outputs" / "upstream_infer_graded.jsonl")
    assert [list(r)[:8] for r in graded] == [UPSTREAM_JUDGE] * 2
    assert all(r["ref_answer"] == "x" and r["judge_status"] == "ok" for r in graded)
    judge_requests = [r for r in server.chat_requests() if is_judge(r)]
    assert {r.body["reasoning_effort"] for r in judge_requests} == {"low"}
    assert {r.body["model"] for r in judge_requests} == {"gpt-5.1"}


def test_judge_prompt_numbers_rubrics_and_a_prompt_file_is_used_verbatim(server, stage, tmp_path):
    stage.infer("--max-samples", "1", check=0)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    prompt = [r for r in server.chat_requests() if is_judge(r)][0].last_content
    rubrics = sample_rows()[0]["rubrics"]
    assert "\n".join(f"{i}. {r}" for i, r in enumerate(rubrics, 1)) in prompt
    (tmp_path / "prompt.txt").write_text("GRADE {response} AGAINST {rubrics} Response to grade: JSON please")
    server.handler = lambda r: Reply(
        content='{"Overall Score": 1, "Grading Rationale": "", '
        '"List of Requirement Satisfaction Status": ["yes","yes","yes","yes"]}'
    )
    stage(
        "judge",
        "--input",
        "infer.jsonl",
        "--judge-model",
        "j",
        "--output",
        "j2.jsonl",
        "--judge-prompt",
        "prompt.txt",
        check=0,
    )
    custom = server.chat_requests()[-1].last_content
    answer = read_jsonl(tmp_path / "infer.jsonl")[0]["model_output"]
    assert (
        custom
        == f"GRADE {answer} AGAINST "
        + "\n".join(f"{i}. {r}" for i, r in enumerate(rubrics, 1))
        + " Response to grade: JSON please"
    )


def test_generation_flags_reach_the_request_body(server, stage):
    stage(
        "infer",
        "--model",
        "m",
        "--output",
        "o.jsonl",
        "--max-samples",
        "1",
        "--temperature",
        "0.3",
        "--top-p",
        "0.9",
        "--max-tokens",
        "77",
        "--max-tokens-param",
        "max_completion_tokens",
        "--reasoning-effort",
        "high",
        "--extra-body",
        '{"top_k": 20, "chat_template_kwargs": {"enable_thinking": false}}',
        check=0,
    )
    body = server.chat_requests()[0].body
    assert {k: body[k] for k in ("temperature", "top_p", "max_completion_tokens", "reasoning_effort", "top_k")} == {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_completion_tokens": 77,
        "reasoning_effort": "high",
        "top_k": 20,
    }
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "max_tokens" not in body
