"""What a careless user or a shared folder puts where the stages read and write (issue 38): a dataset edited
between the stages, links, pipes, devices and folders where files go, absurd shard counts, digits of other
scripts, a file system without locks, a foreign manifest. Each ends in one line naming the file and an exit
code from the README's table, with no hang and nothing already written lost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalpipe.benchmarks.coin_flip import CoinFlip
from evalpipe.devtools import fakeruns
from evalpipe.stages.selected import shard_key
from evalpipe.store import shards

from .conftest import ROOT, runner

pytestmark = pytest.mark.e2e

COIN_FLIP = ROOT / "data" / "coin_flip" / "test.jsonl"
EARLIER = b'{"idx": "earlier", "model_output": "paid for"}\n'


def one_line(proc: subprocess.CompletedProcess, code: int, *says: str) -> str:
    """The stage's stderr, when it is one line ending the stage with `code` and saying each of `says`."""
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for text in says:
        assert text in lines[0]
    return lines[0]


def coin_flip_data(path: Path, tasks: int = 8) -> Path:
    path.write_bytes(b"".join(COIN_FLIP.read_bytes().splitlines(keepends=True)[:tasks]))
    return path


@pytest.fixture
def answered(stage, tmp_path):
    """A CoinFlip run of 8 tasks, answered (the loopback server) and judged (a rule): infer.jsonl and judge.jsonl
    in tmp_path, with their manifests; returns the dataset."""
    data = coin_flip_data(tmp_path / "data.jsonl")
    stage.infer("--bench", "coin_flip", "--input", data, check=0)
    stage("judge", "--bench", "coin_flip", "--input", "infer.jsonl", check=0)
    return data


def test_score_refuses_a_dataset_that_is_not_the_one_infer_read(stage, answered, tmp_path):
    score = tmp_path / "score.json"
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(answered.read_bytes())
    stage("score", "--bench", "coin_flip", "--input", "judge.jsonl", "--data", copy, check=0)  # same bytes: fine
    stage("score", "--bench", "coin_flip", "--input", "judge.jsonl", check=0)
    before = score.read_bytes()
    # a gold answer edited in place, between judge and score
    lines = answered.read_text().splitlines(keepends=True)
    row = json.loads(lines[0])
    row["answer"] = {"yes": "no", "no": "yes"}[row["answer"]]
    answered.write_text(json.dumps(row) + "\n" + "".join(lines[1:]))
    for given in ([], ["--data", answered]):  # as infer recorded it, and as DATA= gives it
        refused = stage("score", "--bench", "coin_flip", "--input", "judge.jsonl", *given)
        line = one_line(refused, 2, f"{answered}: changed since infer read it", "infer.jsonl.manifest.json")
        assert line.startswith("score: error: ")
    assert score.read_bytes() == before  # nothing graded against the edited answers
    copy.write_bytes(answered.read_bytes())
    refused = stage("score", "--bench", "coin_flip", "--input", "judge.jsonl", "--data", copy)
    one_line(refused, 2, f"{copy}: not the dataset infer read ({answered.resolve()}")
    # a manifest of something else: what it lacks, in one line
    manifest = tmp_path / "infer.jsonl.manifest.json"
    manifest.write_text('{"stage": "something else"}')
    one_line(stage("score", "--bench", "coin_flip", "--input", "judge.jsonl"), 2, f"{manifest.name}: names no dataset")
    manifest.write_text("[1, 2]")
    one_line(stage("score", "--bench", "coin_flip", "--input", "judge.jsonl"), 2, f"{manifest.name}: not a manifest")


def test_no_stage_writes_through_a_link(stage, answered, tmp_path):
    target = tmp_path / "elsewhere" / "someone-elses.jsonl"
    target.parent.mkdir()
    torn = EARLIER + b'{"idx": "torn'  # an appender would cut the torn line, then append
    infer = ["infer", "--model", "m", "--bench", "coin_flip", "--input", answered]
    for folder, link, command in (
        ("a", "infer.jsonl", [*infer, "--output", "a/infer.jsonl"]),
        ("b", "infer.jsonl.lock", [*infer, "--output", "b/infer.jsonl"]),  # the pid would go into the target
        ("c", "judge.jsonl", ["judge", "--bench", "coin_flip", "--input", "infer.jsonl", "--output", "c/judge.jsonl"]),
    ):
        target.write_bytes(torn)
        (tmp_path / folder).mkdir()
        (tmp_path / folder / link).symlink_to(target)
        says = f"{folder}/{link}: a symbolic link (to {target}) where an output file goes"
        one_line(stage(*command), 2, says, "never writes through a link")
        assert target.read_bytes() == torn


def test_folders_pipes_and_devices_where_files_go_are_refused_at_once(stage, answered, tmp_path):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer holds it open: a reader would wait for the end for ever
    try:
        os.write(writer, COIN_FLIP.read_bytes().splitlines(keepends=True)[0])
        for data in (fifo, Path("/dev/zero")):
            for command in (
                ["infer", "--model", "m", "--bench", "coin_flip", "--output", "other.jsonl", "--input", data],
                ["score", "--bench", "coin_flip", "--input", "judge.jsonl", "--output", "s.json", "--data", data],
            ):
                proc = stage(*command, timeout=60)
                one_line(proc, 2, f"{data}: a ", "not a regular file")
        run = tmp_path / "piped"
        run.mkdir()
        os.mkfifo(run / "infer.jsonl")
        infer = stage.infer("--bench", "coin_flip", "--input", answered, "--output", run / "infer.jsonl", timeout=60)
        one_line(infer, 2, f"{run / 'infer.jsonl'}: a named pipe (FIFO) where an output file goes")
        judge = stage(
            "judge", "--bench", "coin_flip", "--input", run / "infer.jsonl", "--output", "j.jsonl", timeout=60
        )
        one_line(judge, 2, f"{run / 'infer.jsonl'}: a named pipe (FIFO), not a regular file")
    finally:
        os.close(writer)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "infer.jsonl").mkdir()
    infer = stage.infer("--bench", "coin_flip", "--input", answered, "--output", "folder/infer.jsonl")
    one_line(infer, 2, "folder/infer.jsonl: a folder where an output file goes")
    (tmp_path / "score.json").mkdir()
    one_line(stage("score", "--bench", "coin_flip", "--input", "judge.jsonl"), 2, "score.json: a folder where")
    (tmp_path / "other" / "infer.jsonl.manifest.json").mkdir(parents=True)
    infer = stage.infer("--bench", "coin_flip", "--input", answered, "--output", "other/infer.jsonl")
    assert infer.returncode == 2 and "Traceback" not in infer.stderr  # after the line saying what it would do
    assert (
        infer.stderr.splitlines()[-1] == "infer: error: other/infer.jsonl.manifest.json: a folder, not a regular file"
    )
    (tmp_path / "outs" / "coin_flip").mkdir(parents=True)
    (tmp_path / "outs" / "coin_flip" / "m").write_text("")  # a file where the model's folder goes
    infer = stage("infer", "--model", "m", "--bench", "coin_flip", "--input", answered, "--outputs-dir", "outs")
    one_line(infer, 2, "outs/coin_flip/m: a file where a folder goes")


NO_LOCKS = """
import errno, fcntl, os, runpy, sys
def flock(fd, operation):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))  # what NFS without lockd answers
fcntl.flock = flock
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_file_system_without_locks_is_said_and_nothing_is_written(env, tmp_path):
    data = coin_flip_data(tmp_path / "data.jsonl")
    (tmp_path / "infer.jsonl").write_bytes(EARLIER)
    proc = subprocess.run(
        [sys.executable, "-c", NO_LOCKS, str(ROOT / "infer.py"), "--bench", "coin_flip", "--model", "m"]
        + ["--input", str(data), "--output", "infer.jsonl"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    one_line(proc, 74, "cannot lock infer.jsonl.lock: No locks available", "file system with locks")
    assert (tmp_path / "infer.jsonl").read_bytes() == EARLIER


@pytest.mark.parametrize("digits", ["²", "٣"])  # '²'.isdigit() and int('٣') == 3: neither is taken
def test_whole_numbers_are_ascii_digits(env, stage, tmp_path, digits):
    for name in ("RUNS", "WORKERS", "SHARDS", "MAX_SAMPLES"):
        done = runner(env, "score", "BENCH=coin_flip", f"OUTPUTS={tmp_path}", f"{name}={digits}")
        one_line(done, 2, f"{name}={digits}: expected a whole number", "digits 0-9")
    data = coin_flip_data(tmp_path / "data.jsonl")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "infer.py"), "--bench", "coin_flip", "--model", "m", "--input", str(data)]
        + ["--shards", "4"],
        cwd=tmp_path,
        env={**env, "JOB_COMPLETION_INDEX": digits},
        capture_output=True,
        text=True,
        timeout=60,
    )
    one_line(proc, 2, f"JOB_COMPLETION_INDEX: shard {digits} of 4", "digits 0-9")
    refused = stage.infer("--bench", "coin_flip", "--input", data, "--workers", digits)
    assert refused.returncode == 2 and f"--workers: '{digits}': expected a whole number" in refused.stderr
    assert not (tmp_path / "infer.jsonl").exists()


def test_absurd_shard_counts_are_refused_and_the_largest_is_reported_briefly(env, stage, tmp_path):
    data = coin_flip_data(tmp_path / "data.jsonl")
    for flags in (["--shard", "0/1000000000"], ["--shards", "1000000000"]):
        refused = stage.infer("--bench", "coin_flip", "--input", data, *flags)
        one_line(refused, 2, "1,000,000,000 shards; at most 10,000")
    done = runner(env, "infer", "BENCH=coin_flip", f"DATA={data}", f"OUTPUTS={tmp_path}", "SHARD=0/1000000000")
    assert done.returncode == 2 and "at most 10,000" in done.stderr
    # the largest count allowed, one shard of it written: score lists the others briefly, at once
    bench = CoinFlip()
    first = next(iter(bench.load(data)))
    k = shards.index(shard_key(bench, first.id, first.row), shards.MAX_SHARDS)
    stage.infer("--bench", "coin_flip", "--input", data, "--shard", f"{k}/10000", check=0)
    stage("judge", "--bench", "coin_flip", "--input", "infer.jsonl", "--shard", f"{k}/10000", check=0)
    score = stage("score", "--bench", "coin_flip", "--input", "judge.jsonl", timeout=60)
    assert score.returncode == 3, score.stderr
    told = [line for line in score.stderr.splitlines() if "are missing or unfinished" in line]
    assert len(told) == 1 and len(told[0]) < 1000 and "in all)" in told[0]
    cut = json.loads((tmp_path / "score.json").read_text())["coverage"]["shards"]
    assert cut["count"] == 10_000 and len(cut["without_file"]["judge"]) == 9_999
    # a shard file of a count no run can have (left by hand, or by an older version): named, not listed
    stray = tmp_path / "judge.shard-0-of-1000000000.jsonl"
    stray.write_bytes(b"")
    one_line(
        stage("score", "--bench", "coin_flip", "--input", "judge.jsonl"), 2, f"{stray.name}: a shard file of no run"
    )


def test_aggregate_replaces_its_plots_whole(tmp_path):
    data = fakeruns.coin_flip(tmp_path, models=2, runs=2, tasks=40)
    fakeruns.summarise(tmp_path, "coin_flip", data, plots=True)
    png = tmp_path / "coin_flip" / "aggregate.png"
    old = png.read_bytes()
    os.link(png, tmp_path / "old.png")  # the file as it was: written in place, it would change under this name too
    (tmp_path / "coin_flip" / "model-0" / "run-2" / "score.json").unlink()  # a different chart next time
    aggregate = subprocess.run(
        [sys.executable, str(ROOT / "aggregate.py"), "--bench", "coin_flip", "--outputs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert aggregate.returncode in (0, 3), aggregate.stderr
    assert (tmp_path / "old.png").read_bytes() == old
    assert png.read_bytes().startswith(b"\x89PNG") and png.read_bytes() != old
    assert not list(png.parent.glob(".aggregate*.tmp"))
