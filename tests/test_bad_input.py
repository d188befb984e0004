"""Bad input: one clear line naming file and line, exit 2, and earlier results untouched."""

import pytest

from .conftest import SAMPLE, read_jsonl, write_jsonl

pytestmark = pytest.mark.e2e


def with_bad_row(tmp_path, mutate):
    rows = read_jsonl(SAMPLE)
    mutate(rows)
    path = tmp_path / "data.jsonl"
    write_jsonl(path, rows)
    return path


@pytest.mark.parametrize(
    "mutate, line, message",
    [
        (
            lambda rows: rows[4]["metadata"].update(task_id=rows[1]["metadata"]["task_id"]),
            5,
            "appears again (first on line 2)",
        ),
        (lambda rows: rows[3]["metadata"].pop("task_id"), 4, "no 'metadata.task_id'"),
        (lambda rows: rows[6].pop("messages"), 7, "no 'messages' key"),
        (lambda rows: rows[6].update(messages="hello"), 7, "'messages' must be a non-empty list"),
        (lambda rows: rows[2]["messages"].insert(1, {"role": "wizard", "content": "x"}), 3, "role 'wizard'"),
        (
            lambda rows: rows[2]["messages"].append({"role": "assistant", "content": "x"}),
            3,
            "must end with a user turn",
        ),
        (lambda rows: rows[8].update(rubrics="be good"), 9, "'rubrics' must be a list"),
    ],
)
def test_bad_dataset_rows(server, stage, tmp_path, mutate, line, message):
    data = with_bad_row(tmp_path, mutate)
    out = tmp_path / "infer.jsonl"
    out.write_bytes(b'{"idx": "earlier", "model_output": "paid for"}\n')
    proc = stage("infer", "--model", "m", "--input", data, "--output", out)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"infer: error: {data}:{line}: " + proc.stderr.split(f"{data}:{line}: ", 1)[1].strip()
    assert message in proc.stderr
    assert out.read_bytes() == b'{"idx": "earlier", "model_output": "paid for"}\n'
    assert server.chat_requests() == []


def test_invalid_json_line_and_missing_file(server, stage, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(SAMPLE.read_text().replace("\n", "\n{oops\n", 1))
    proc = stage("infer", "--model", "m", "--input", data)
    assert proc.returncode == 2 and f"{data}:2: invalid JSON" in proc.stderr
    proc = stage("infer", "--model", "m", "--input", tmp_path / "nope.jsonl")
    assert proc.returncode == 2 and "nope.jsonl: cannot read" in proc.stderr


def test_mixed_rubric_types_are_accepted(server, stage, tmp_path):
    data = with_bad_row(tmp_path, lambda rows: rows[0].update(rubrics=["plain", {"rubric_criteria": "dict"}]))
    stage("infer", "--model", "m", "--input", data, "--output", "o.jsonl", "--max-samples", "1", check=0)
    stage("judge", "--input", "o.jsonl", "--judge-model", "j", check=0)
    assert "1. plain\n2. dict" in server.chat_requests()[-1].last_content


def test_bad_flags_exit_2(server, stage):
    assert stage("infer", "--model", "m", "--extra-body", "{not json").returncode == 2
    assert stage("infer", "--model", "m", "--bench", "nope").returncode == 2
    assert stage("infer").returncode == 2  # --model is required


def test_a_bedrock_judge_model_is_refused(server, stage):
    # upstream routes these names to AWS Bedrock; we speak only the OpenAI-compatible protocol
    stage.infer("--bench", "clbench", "--max-samples", "1", check=0)
    judge = ("judge", "--bench", "clbench", "--model", "m", "--input", "infer.jsonl", "--output", "judge.jsonl")
    out = stage(*judge, "--judge-model", "anthropic.claude-3-5-sonnet-20240620-v1:0", check=2)
    assert "looks like an AWS Bedrock model" in out.stderr and "--base-url" in out.stderr
    assert not (stage.cwd / "judge.jsonl").exists()
    stage(*judge, "--judge-model", "gpt-4.1", check=0)  # a dotted OpenAI name is not taken for one


@pytest.mark.parametrize("script", ["judge", "score"])
def test_a_judge_label_that_is_no_plain_file_name_part_is_refused(stage, script):
    out = stage(script, "--bench", "coin_flip", "--model", "m", "--judge-label", "../x", check=2)
    assert "--judge-label '../x': use letters, digits" in out.stderr
