"""judge.py's response_format ladder end to end: the manifest keeps the decision, score counts the modes."""

import json
import time

import pytest

from evalpipe.devtools.testserver import Reply, with_server_kind

from .conftest import is_judge, read_jsonl, scripted

pytestmark = pytest.mark.e2e


def judge_formats(server) -> list[str]:
    out = []
    for r in server.chat_requests():
        if is_judge(r):
            rf = (r.body or {}).get("response_format")
            out.append("none" if rf is None else rf["type"] + ("+schema" if "schema" in rf else ""))
    return out


def test_the_learned_mode_is_kept_in_the_manifest_and_used_by_the_next_run(server, stage, tmp_path):
    server.handler = with_server_kind("llama_cpp_python", scripted)
    stage.infer("--max-samples", "3", check=0)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--workers", "8", check=0)
    assert judge_formats(server) == ["json_schema"] + ["json_object+schema"] * 3
    learned = json.loads((tmp_path / "judge.jsonl.manifest.json").read_text())["learned"]["judge_format"]
    (state,) = learned.values()
    assert (state["mode"], list(state["rejected"]), state["settled"]) == ("json_object_schema", ["json_schema"], True)
    rows = read_jsonl(tmp_path / "judge.jsonl")
    assert {(r["judge_format"], r["judge_parse"], r["judge_status"]) for r in rows} == {
        ("json_object_schema", "json", "ok")
    }

    stage.infer("--max-samples", "5", check=0)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    assert judge_formats(server)[4:] == ["json_object+schema"] * 2  # no second rejection
    again = json.loads((tmp_path / "judge.jsonl.manifest.json").read_text())["learned"]["judge_format"]
    assert list(again.values())[0]["mode"] == "json_object_schema"

    proc = stage("score", "--input", "judge.jsonl", check=0)
    metrics = json.loads((tmp_path / "score.json").read_text())
    assert metrics["judge_format"] == {"json_object_schema": 5}
    assert metrics["judge_parse"] == {"json": 5}
    assert "Judge format: json_object_schema 5" in proc.stdout


def test_truncated_rows_are_judged_again_with_a_larger_budget_on_request(server, stage, tmp_path):
    stage.infer("--max-samples", "2", check=0)

    def budgeted(request):
        if is_judge(request) and request.body.get("max_tokens", 0) < 1000:
            return Reply(content='{"Grading Rationale": "Rubric 1 is', finish_reason="length")
        return scripted(request)

    server.handler = budgeted
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--judge-max-tokens", "100", check=0)
    rows = {r["idx"]: r for r in read_jsonl(tmp_path / "judge.jsonl")}
    assert {(r["judge_status"], r["score"]) for r in rows.values()} == {("judge_truncated", 0)}
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", "--judge-max-tokens", "4000", check=0)
    assert len(read_jsonl(tmp_path / "judge.jsonl")) == 2  # kept unless asked
    stage(
        "judge", "--input", "infer.jsonl", "--judge-model", "j", "--judge-max-tokens", "4000", "--rejudge-truncated"
    ).check_returncode()
    rows = {r["idx"]: r for r in read_jsonl(tmp_path / "judge.jsonl")}
    assert {r["judge_status"] for r in rows.values()} == {"ok"}


def test_the_probe_goes_alone_and_a_kill_during_it_loses_nothing(server, stage, tmp_path):
    stage.infer("--max-samples", "4", check=0)
    server.handler = lambda r: Reply(hang=True) if is_judge(r) else scripted(r)
    proc = stage.popen("judge", "--input", "infer.jsonl", "--judge-model", "j", "--workers", "4")
    try:
        deadline = time.monotonic() + 30
        while not judge_formats(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # time enough for the other three workers to send, had they not waited
        assert judge_formats(server) == ["json_schema"]
    finally:
        proc.kill()
        proc.communicate()
    server.handler = with_server_kind("llama_cpp_python", scripted)
    stage("judge", "--input", "infer.jsonl", "--judge-model", "j", check=0)
    rows = read_jsonl(tmp_path / "judge.jsonl")
    assert len(rows) == 4 and {r["judge_status"] for r in rows} == {"ok"}
