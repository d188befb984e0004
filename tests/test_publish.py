"""Publishing a benchmark's results as a Hub dataset: the real huggingface_hub upload code against the loopback
Hub (evalpipe/devtools/hubserver.py), a round trip, a re-publish that changes nothing, and one that does."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from evalpipe.devtools import fakeruns
from evalpipe.devtools.hubserver import FakeHub
from evalpipe.results import publish

from .conftest import ROOT, module

TOKEN = "hf_test_SECRET_publish_0123456789"
REPO = "team/evals"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    data = fakeruns.coin_flip(root, models=2, runs=2, tasks=40)
    fakeruns.summarise(root, "coin_flip", data)
    return root


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    with FakeHub(token=TOKEN) as server:
        for name in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield server


def head_files(hub: FakeHub) -> dict[str, bytes]:
    return hub.commits[hub.refs[REPO]["main"]].files


def test_publish_round_trip_then_nothing_then_a_change(fake_hub, outputs, tmp_path):
    commit, changed = publish.publish(outputs, "coin_flip", REPO)
    assert changed and fake_hub.refs[REPO]["main"] == commit.oid
    files = head_files(fake_hub)
    rows = [json.loads(line) for line in files["coin_flip/samples.jsonl"].splitlines()]
    assert len(rows) == 2 * 2 * 40  # model × run × task
    assert {(r["model"], r["run"]) for r in rows} == {(f"model-{m}", k) for m in range(2) for k in (1, 2)}
    assert set(rows[0]) >= {"task_id", "score", "judge_status", "prompt_tokens", "response_model"}
    assert "messages" not in rows[0] and "model_output" not in rows[0]  # no prompts unless asked
    assert files["coin_flip/aggregate.md"] == (outputs / "coin_flip" / "aggregate.md").read_bytes()
    figures = {json.loads(line)["figure"] for line in files["coin_flip/leaderboard.jsonl"].splitlines()}
    assert "F1" in figures
    card = files["README.md"].decode()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert [c["config_name"] for c in meta["configs"]] == ["coin_flip", "coin_flip-leaderboard"]
    assert meta["configs"][0]["data_files"] == [{"split": "samples", "path": "coin_flip/samples.jsonl"}]

    commits = len(fake_hub.commits)
    again, changed = publish.publish(outputs, "coin_flip", REPO)
    assert not changed and again.oid == commit.oid and len(fake_hub.commits) == commits  # no new commit

    with_prompts, changed = publish.publish(outputs, "coin_flip", REPO, with_prompts=True)
    assert changed and with_prompts.oid != commit.oid
    row = json.loads(head_files(fake_hub)["coin_flip/samples.jsonl"].splitlines()[0])
    assert row["messages"][0]["role"] == "user" and row["model_output"]

    # the token went to the Hub with every write, and nowhere into what was published
    assert set(fake_hub.authorizations) == {f"Bearer {TOKEN}"}
    assert not [p for p, data in head_files(fake_hub).items() if TOKEN.encode() in data]


def test_a_second_benchmark_joins_the_card_and_stale_files_go(fake_hub, outputs, tmp_path):
    copy = tmp_path / "outputs"
    shutil.copytree(outputs, copy)
    for run in (copy / "coin_flip").glob("model-*/run-*"):
        (run / "judge.jsonl.manifest.json").write_text('{"stage": "judge"}\n')
    publish.publish(copy, "coin_flip", REPO)
    manifests = sorted(p for p in head_files(fake_hub) if "/manifests/" in p)
    assert len(manifests) == 4 and manifests[0] == "coin_flip/manifests/model-0/run-1/judge.jsonl.manifest.json"

    shutil.rmtree(copy / "coin_flip" / "model-1")  # a model taken out of the results
    shutil.copytree(copy / "coin_flip", copy / "arithmetic")  # and a second benchmark
    publish.publish(copy, "coin_flip", REPO)
    files = head_files(fake_hub)
    assert not [p for p in files if "model-1" in p]
    assert {json.loads(line)["model"] for line in files["coin_flip/samples.jsonl"].splitlines()} == {"model-0"}

    publish.publish(copy, "arithmetic", REPO)
    files = head_files(fake_hub)
    meta = yaml.safe_load(files["README.md"].decode().split("---\n")[1])
    names = [c["config_name"] for c in meta["configs"]]
    assert names == ["arithmetic", "arithmetic-leaderboard", "coin_flip", "coin_flip-leaderboard"]
    assert len([p for p in files if p.startswith("coin_flip/manifests/")]) == 2  # coin_flip's files untouched


@pytest.mark.e2e
def test_publish_from_make_and_the_runner(fake_hub, outputs, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=fake_hub.endpoint, HF_HOME=str(tmp_path / "hf-home"), HF_TOKEN="hf_wrong_token_0000000")
    words = ["publish", "BENCH=coin_flip", f"REPO={REPO}"]
    done = runner(env, *words, f"OUTPUTS={outputs}")
    assert done.returncode == 4, done.stderr
    assert f"the Hub refused {REPO} (HTTP 401): set HF_TOKEN" in done.stderr
    assert "hf_wrong_token" not in done.stderr + done.stdout
    assert runner({**env, "HF_TOKEN": TOKEN}, *words, f"OUTPUTS={tmp_path / 'empty'}").returncode == 2
    assert runner({**env, "HF_TOKEN": TOKEN}, "publish", "BENCH=coin_flip", f"OUTPUTS={outputs}").returncode == 2
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), *words, f"OUTPUTS={outputs}"],
        env={**env, "HF_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"publish: coin_flip → {fake_hub.endpoint}/datasets/{REPO}/commit/" in done.stderr


@pytest.mark.e2e
def test_publish_uploads_nothing_a_link_points_at_outside_the_outputs(fake_hub, outputs, tmp_path):
    copy = tmp_path / "outputs"
    shutil.copytree(outputs, copy)
    run = copy / "coin_flip" / "model-0" / "run-1"
    (run / "infer.jsonl.manifest.json").write_text('{"stage": "infer"}\n')
    (copy / "coin_flip" / "model-1" / "run-1" / "infer.jsonl.manifest.json").symlink_to(
        run / "infer.jsonl.manifest.json"
    )  # a link within the outputs: what it points at is published anyway
    secret = tmp_path / "home" / "secret.json"
    secret.parent.mkdir()
    secret.write_text('{"password": "hunter2"}\n')
    (run / "judge.jsonl.manifest.json").symlink_to(secret)  # on a shared folder, anyone may leave such a link
    env = {**os.environ, "HF_TOKEN": TOKEN}
    done = module(env, "evalpipe.results.publish", "coin_flip", REPO, "--outputs-dir", copy, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"publish: error: {run / 'judge.jsonl.manifest.json'}: a link to {secret}, outside the outputs "
        f"({copy}): publish uploads only what is in them; put the file itself there, or remove the link"
    )
    assert fake_hub.log == []  # refused before anything was sent
    (run / "judge.jsonl.manifest.json").unlink()
    publish.publish(copy, "coin_flip", REPO)
    assert (
        head_files(fake_hub)["coin_flip/manifests/model-1/run-1/infer.jsonl.manifest.json"] == b'{"stage": "infer"}\n'
    )


def runner(env: dict, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "evalpipe.pipeline", *words],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_sample_row_carries_the_cached_tokens_rows_record():
    row = {"idx": "t1", "usage": {"prompt_tokens": 5, "completion_tokens": 2, "cached_tokens": 3}}
    out = publish.sample_row("coin_flip", "m", 1, row, with_prompts=False)
    assert (out["prompt_tokens"], out["completion_tokens"], out["cached_tokens"]) == (5, 2, 3)
    assert "cached_tokens" not in publish.sample_row("coin_flip", "m", 1, {"idx": "t2", "usage": {}}, False)
