"""Real datasets from the Hub: the real huggingface_hub download code against a loopback server that
answers like the Hub (HF_ENDPOINT), with 404s, a connection broken mid-file, corrupted bytes, a
branch that moved and no network at all; files and lock files on disk."""

import json
import os
import subprocess
import sys

import pytest

from evalpipe.datasets import hub
from evalpipe.devtools.hubserver import FakeHub, Fault
from evalpipe.errors import BadInput

from .conftest import ROOT, read_jsonl

pytest.importorskip("huggingface_hub")  # `make test` installs it (requirements-data.txt)

TOKEN = "hf_test_SECRET_0123456789abcdef"
TEST_ROWS = b"".join(
    b'{"question": "Q: A coin is heads up. ana flips the coin.  Is the coin still heads up?", "answer": "no"}\n'
    for _ in range(3)
)
VALIDATION_ROWS = TEST_ROWS.replace(b"ana", b"bo")


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A Hub on loopback; huggingface_hub's cache and our data/hf/ in tmp_path."""
    with FakeHub() as server:
        for name in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        # read by huggingface_hub at its import, as in a stage's process where the environment is set before
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setenv("EVALPIPE_HUB_DIR", str(tmp_path / "data" / "hf"))
        yield server


def data_files(tmp_path) -> list[str]:
    """Everything under data/hf/, as relative paths (temp files included)."""
    base = tmp_path / "data" / "hf"
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) if base.exists() else []


def lock_of(tmp_path, repo) -> dict:
    return json.loads((tmp_path / "data" / "hf" / repo / hub.LOCK_NAME).read_text())


def test_a_file_lands_with_its_lock_and_a_pinned_commit_needs_no_network(fake_hub, tmp_path):
    commit = fake_hub.commit("org/ds", {"rows.jsonl": TEST_ROWS, "README.md": b"# card"}, lfs={"rows.jsonl"})
    path = hub.fetch(hub.parse_ref(f"hf://org/ds@{commit}/rows.jsonl"))
    assert path == tmp_path / "data" / "hf" / "org" / "ds" / "rows.jsonl" and path.read_bytes() == TEST_ROWS
    entry = lock_of(tmp_path, "org/ds")["files"]["rows.jsonl"]
    assert entry["revision"] == entry["commit"] == commit and entry["size"] == len(TEST_ROWS)
    assert entry["sha256"] == __import__("hashlib").sha256(TEST_ROWS).hexdigest()
    assert data_files(tmp_path) == ["org/ds/hf-lock.json", "org/ds/rows.jsonl"]  # no temp file left
    assert TOKEN not in (tmp_path / "data" / "hf" / "org" / "ds" / hub.LOCK_NAME).read_text()
    assert hub.source_of(path) == f"hf://org/ds@{commit}/rows.jsonl"
    fake_hub.stop()  # a commit never moves: the locked file is used without asking
    assert hub.fetch(hub.parse_ref(f"hf://org/ds@{commit}/rows.jsonl")) == path
    path.write_bytes(b"edited\n")  # bytes that no longer match the lock are not used
    assert hub.source_of(path) is None
    with pytest.raises(hub.HubUnreachable, match="cannot reach the Hugging Face Hub.*no longer matches hf-lock.json"):
        hub.fetch(hub.parse_ref(f"hf://org/ds@{commit}/rows.jsonl"))


def test_a_branch_that_moved_stops_the_run_until_a_commit_is_chosen(fake_hub, tmp_path):
    old = fake_hub.commit("org/ds", {"rows.jsonl": TEST_ROWS})
    path = hub.fetch(hub.parse_ref("hf://org/ds/rows.jsonl"))  # no @: main
    assert hub.fetch(hub.parse_ref("hf://org/ds@main/rows.jsonl")) == path  # main has not moved
    new = fake_hub.commit("org/ds", {"rows.jsonl": VALIDATION_ROWS})  # main moves
    with pytest.raises(BadInput, match=f"org/ds@main moved: .* fetched at commit {old}, the Hub now has {new}"):
        hub.fetch(hub.parse_ref("hf://org/ds@main/rows.jsonl"))
    assert path.read_bytes() == TEST_ROWS and lock_of(tmp_path, "org/ds")["files"]["rows.jsonl"]["commit"] == old
    assert hub.fetch(hub.parse_ref(f"hf://org/ds@{new}/rows.jsonl")).read_bytes() == VALIDATION_ROWS
    assert lock_of(tmp_path, "org/ds")["files"]["rows.jsonl"]["revision"] == new
    assert hub.fetch(hub.parse_ref(f"hf://org/ds@{old}/rows.jsonl")).read_bytes() == TEST_ROWS  # and back


def test_splits_by_file_name_and_by_the_cards_configs(fake_hub, tmp_path):
    fake_hub.commit(
        "org/coin",
        {
            "data/test-00000-of-00001.jsonl": TEST_ROWS,
            "data/validation-00000-of-00001.jsonl": VALIDATION_ROWS,
            "README.md": b"# card",
        },
    )
    test = hub.fetch(hub.parse_ref("hf://org/coin/test"))
    assert test.name == "test-00000-of-00001.jsonl" and test.read_bytes() == TEST_ROWS
    assert lock_of(tmp_path, "org/coin")["files"]["data/test-00000-of-00001.jsonl"]["split"] == "test"
    assert hub.fetch(hub.parse_ref("hf://org/coin/validation")).read_bytes() == VALIDATION_ROWS
    card = {"configs": [{"config_name": "default", "data_files": [{"split": "test", "path": "q/held_out*.jsonl"}]}]}
    fake_hub.commit("org/card", {"q/held_out.jsonl": TEST_ROWS, "q/test_old.jsonl": b"{}\n"}, card=card)
    assert hub.fetch(hub.parse_ref("hf://org/card/test")).name == "held_out.jsonl"  # the card decides
    fake_hub.commit(
        "org/shards", {"data/test-00000-of-00002.jsonl": b"{}\n", "data/test-00001-of-00002.jsonl": b"{}\n"}
    )
    with pytest.raises(BadInput, match="the test split of org/shards@main is 2 files .*: name one"):
        hub.fetch(hub.parse_ref("hf://org/shards/test"))


@pytest.mark.parametrize(
    "ref, message",
    [
        ("hf://org/nope/rows.jsonl", "no dataset org/nope on the Hub"),
        ("hf://org/ds@v9/rows.jsonl", "org/ds has no revision 'v9'"),
        (
            "hf://org/ds/other.jsonl",
            r"org/ds@main has no file or split 'other.jsonl' \(its files: gone.jsonl, rows.jsonl\)",
        ),
        ("hf://org/ds/gone.jsonl", r"lists gone.jsonl but the Hub has no such file \(HTTP 404\)"),
        ("hf://org/ds", "expected hf://<owner>/<name>"),
        ("hf://org/../../rows.jsonl", "not a dataset repo and file of the Hub"),
        ("hf://org/ds/../../rows.jsonl", "not a dataset repo and file of the Hub"),
    ],
)
def test_404s_are_one_line_and_leave_nothing(fake_hub, tmp_path, ref, message):
    fake_hub.commit("org/ds", {"rows.jsonl": TEST_ROWS, "gone.jsonl": TEST_ROWS})
    fake_hub.gone.add("gone.jsonl")
    with pytest.raises(BadInput, match=message) as caught:
        hub.fetch(hub.parse_ref(ref))
    assert "\n" not in str(caught.value) and data_files(tmp_path) == []


def test_a_connection_broken_mid_file_is_retried_to_the_end(fake_hub, tmp_path):
    data = b"".join(b'{"n": %d}\n' % i for i in range(20_000))
    fake_hub.commit("org/ds", {"big.jsonl": data}, lfs={"big.jsonl"})
    fake_hub.breaks["big.jsonl"] = Fault(after=50_000, times=1)
    assert hub.fetch(hub.parse_ref("hf://org/ds/big.jsonl")).read_bytes() == data
    gets = [path for method, path, _ in fake_hub.log if method == "GET" and path.endswith("big.jsonl")]
    assert len(gets) == 2 and fake_hub.breaks["big.jsonl"].times == 0  # broken once, then whole


def test_a_download_that_keeps_breaking_or_arrives_corrupted_leaves_nothing_in_data(fake_hub, tmp_path):
    fake_hub.commit("org/ds", {"big.jsonl": TEST_ROWS * 100, "bad.jsonl": TEST_ROWS}, lfs={"big.jsonl"})
    fake_hub.corrupt.add("bad.jsonl")
    with pytest.raises(hub.HubUnreachable, match="arrived corrupted"):
        hub.fetch(hub.parse_ref("hf://org/ds/bad.jsonl"))
    fake_hub.breaks["big.jsonl"] = Fault(after=10, times=100)  # huggingface_hub retries 5 times, 1 s apart
    with pytest.raises(hub.HubUnreachable, match="broke off"):
        hub.fetch(hub.parse_ref("hf://org/ds/big.jsonl"))
    assert data_files(tmp_path) == []
    fake_hub.corrupt.clear()  # the corrupt blob was not kept in huggingface_hub's cache either
    assert hub.fetch(hub.parse_ref("hf://org/ds/bad.jsonl")).read_bytes() == TEST_ROWS


def test_without_network_one_line_says_what_to_download_and_where(fake_hub, tmp_path, monkeypatch):
    fake_hub.commit("org/ds", {"rows.jsonl": TEST_ROWS})
    locked = hub.fetch(hub.parse_ref("hf://org/ds/rows.jsonl"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert hub.fetch(hub.parse_ref("hf://org/ds/rows.jsonl")) == locked  # locked and unchanged: used, with a warning
    target = tmp_path / "data" / "hf" / "org" / "new" / "rows.jsonl"
    with pytest.raises(hub.HubUnreachable) as caught:
        hub.fetch(hub.parse_ref("hf://org/new/rows.jsonl"))
    assert str(caught.value) == (
        "cannot reach the Hugging Face Hub to fetch hf://org/new@main/rows.jsonl (ConnectError: [Errno 111] "
        f"Connection refused): download http://127.0.0.1:9/datasets/org/new/resolve/main/rows.jsonl and put it at "
        f"{target}, then run again"
    )
    with pytest.raises(hub.HubUnreachable, match=r"download the test split's file from .* and put it under"):
        hub.fetch(hub.parse_ref("hf://org/new/test"))
    target.parent.mkdir(parents=True)
    target.write_bytes(TEST_ROWS)  # as the message says
    assert hub.fetch(hub.parse_ref("hf://org/new/rows.jsonl")) == target
    (target.parent / "test.jsonl").write_bytes(TEST_ROWS)
    assert hub.fetch(hub.parse_ref("hf://org/new/test")) == target.parent / "test.jsonl"


def test_stage_words_are_resolved_to_local_files(fake_hub, tmp_path):
    fake_hub.commit("org/ds", {"rows.jsonl": TEST_ROWS})
    local = str(tmp_path / "data" / "hf" / "org" / "ds" / "rows.jsonl")
    argv = ["--input", "hf://org/ds/rows.jsonl", "--data=hf://org/ds@main/rows.jsonl", "--model", "hf-model"]
    assert hub.resolve_argv(argv) == ["--input", local, f"--data={local}", "--model", "hf-model"]


def test_the_command_fetches_a_benchmark_and_points_elsewhere_for_big_bench_mistake(fake_hub, tmp_path, capsys):
    fake_hub.commit("tencent/CL-bench", {"CL-bench.jsonl": TEST_ROWS}, sha=hub.CLBENCH_REVISION)
    fake_hub.commit("tencent/CL-bench", {"CL-bench.jsonl": b"newer\n"})  # main moved on: the pin holds
    assert hub.main(["clbench"]) == 0
    assert (tmp_path / "data" / "hf" / "tencent" / "CL-bench" / "CL-bench.jsonl").read_bytes() == TEST_ROWS
    assert "hf://tencent/CL-bench@6f5df61d" in capsys.readouterr().out
    assert hub.main(["error_recovery"]) == 2
    assert "WHGTyen/BIG-Bench-Mistake" in capsys.readouterr().err
    with pytest.raises(BadInput, match="one repo"):
        hub.main(["--revision", "main"])


# ---- through the stages and make


@pytest.mark.e2e
def test_make_data_then_a_run_on_the_hubs_coin_flip_splits(fake_hub, server, env, tmp_path):
    fake_hub.commit(
        "extraordinarylab/coin-flip",
        {"data/test-00000-of-00001.jsonl": TEST_ROWS, "data/validation-00000-of-00001.jsonl": VALIDATION_ROWS},
    )
    env = {**env, **{k: os.environ[k] for k in ("HF_ENDPOINT", "HF_HOME", "HF_TOKEN", "EVALPIPE_HUB_DIR")}}
    make = subprocess.run(["make", "-s", "-C", str(ROOT), "data", "BENCH=coin_flip"], env=env, capture_output=True)
    assert make.returncode == 0, make.stderr.decode()
    assert TOKEN not in (make.stdout + make.stderr).decode()
    lock = lock_of(tmp_path, "extraordinarylab/coin-flip")["files"]
    assert {e["split"] for e in lock.values()} == {"test", "validation"}

    def stage(script, *args):
        cmd = [sys.executable, str(ROOT / f"{script}.py"), "--bench", "coin_flip", "--outputs-dir", str(tmp_path)]
        return subprocess.run([*cmd, *args], env=env, cwd=tmp_path, capture_output=True, text=True)

    ref = "hf://extraordinarylab/coin-flip"
    infer = stage(
        "infer", "--model", "m", "--input", f"{ref}/test", "--fewshot", "2", f"--fewshot-data={ref}/validation"
    )
    assert infer.returncode == 0, infer.stderr
    run = tmp_path / "coin_flip" / "m" / "run-1"
    recorded = json.loads((run / "infer.jsonl.manifest.json").read_text())
    commit = lock[next(iter(lock))]["commit"]
    assert recorded["dataset_source"] == f"{ref}@{commit}/data/test-00000-of-00001.jsonl"
    assert "bo flips the coin" in server.chat_requests()[0].last_content  # demos from the validation split
    assert stage("judge", "--model", "m").returncode == 0 and stage("score", "--model", "m").returncode == 0
    assert json.loads((run / "score.json").read_text())["coverage"]["expected"] == 3
    assert len(read_jsonl(run / "judge.jsonl")) == 3


@pytest.mark.e2e
def test_the_command_without_network_exits_69_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"), EVALPIPE_HUB_DIR=str(tmp_path / "d"))
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe.datasets.hub", "clbench"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 69 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("hub: error: cannot reach the Hugging Face Hub")
    assert f"and put it at {tmp_path / 'd' / 'tencent' / 'CL-bench' / 'CL-bench.jsonl'}" in proc.stderr
    assert not (tmp_path / "d").exists()
