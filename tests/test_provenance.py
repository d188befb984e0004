"""Which model answered: a served model re-pointed between runs is recorded on every row, counted by score and
flagged by aggregate, through the real stage scripts and a loopback server that changes its snapshot."""

import dataclasses
import json

import pytest

from .conftest import is_judge, scripted

pytestmark = pytest.mark.e2e


def serving(model_snapshot: str, judge_snapshot: str, fingerprint: str | None = None):
    """The scripted model and judge, saying which snapshot answered."""

    def handler(request):
        reply = scripted(request)
        served = judge_snapshot if is_judge(request) else model_snapshot
        return dataclasses.replace(reply, served_model=served, system_fingerprint=fingerprint)

    return handler


def test_a_snapshot_re_pointed_between_runs_is_recorded_counted_and_flagged(server, stage, tmp_path):
    common = ["--outputs-dir", tmp_path, "--model", "gpt-x"]
    for run, (model_snapshot, judge_snapshot) in enumerate(
        [("gpt-x-2026-01-01", "judge-2026-01"), ("gpt-x-2026-06-01", "judge-2026-06")], start=1
    ):
        server.handler = serving(model_snapshot, judge_snapshot, fingerprint=f"fp_{run}")
        stage("infer", *common, "--run", run, "--max-samples", 3, check=0)
        stage("judge", *common, "--run", run, "--judge-model", "judge-alias", check=0)
        stage("score", *common, "--run", run, check=0)
    stage("aggregate", "--outputs-dir", tmp_path, check=0)

    run1 = tmp_path / "clbench" / "gpt-x" / "run-1"
    row = json.loads((run1 / "judge.jsonl").read_text().splitlines()[0])
    assert row["response_model"] == "gpt-x-2026-01-01" and row["system_fingerprint"] == "fp_1"
    assert row["judge_response_model"] == "judge-2026-01" and row["judge_system_fingerprint"] == "fp_1"
    infer_row = json.loads((run1 / "infer.jsonl").read_text().splitlines()[0])
    assert infer_row["response_model"] == "gpt-x-2026-01-01"
    assert json.loads((run1 / "score.json").read_text())["served"] == {
        "model": {"gpt-x-2026-01-01": 3},
        "model_fingerprint": {"fp_1": 3},
        "judge": {"judge-2026-01": 3},
        "judge_fingerprint": {"fp_1": 3},
    }

    summary = json.loads((tmp_path / "clbench" / "aggregate.json").read_text())
    (model,) = summary["models"]
    assert model["mixed_served_models"] is True
    assert model["served"]["model"] == {"gpt-x-2026-01-01": 3, "gpt-x-2026-06-01": 3}
    assert model["served"]["judge"] == {"judge-2026-01": 3, "judge-2026-06": 3}
    assert model["settings"]["judge"]["model"] == "judge-alias"
    board = (tmp_path / "clbench" / "aggregate.md").read_text()
    assert "| gpt-x § |" in board
    assert "§ Runs answered or judged by more than one served model" in board
    assert "gpt-x \\S{} &" in (tmp_path / "clbench" / "aggregate.tex").read_text()  # the mark, not an escaped "\\S"
    assert (
        "gpt-x: model gpt-x-2026-01-01 (3), gpt-x-2026-06-01 (3); judge judge-2026-01 (3), judge-2026-06 (3)" in board
    )
    assert "Generation settings (from the manifests" in board and "response_format auto" in board


def test_one_snapshot_throughout_is_not_flagged(server, stage, tmp_path):
    server.handler = serving("gpt-y-1", "judge-1")
    common = ["--outputs-dir", tmp_path, "--model", "gpt-y", "--bench", "coin_flip"]
    for run in (1, 2):
        stage("infer", *common, "--run", run, "--max-samples", 4, check=0)
        stage("judge", *common, "--run", run, check=0)
        stage("score", *common, "--run", run, check=0)
    stage("aggregate", "--outputs-dir", tmp_path, "--bench", "coin_flip", check=0)
    (model,) = json.loads((tmp_path / "coin_flip" / "aggregate.json").read_text())["models"]
    assert model["mixed_served_models"] is False and model["served"] == {"model": {"gpt-y-1": 8}}
    assert "§" not in (tmp_path / "coin_flip" / "aggregate.md").read_text()
