"""The task cache: infer or score reads a large dataset's selected tasks once, and later runs on the same bytes
read them from the cache; a changed dataset, other code, a damaged or unwritable cache only mean reading the
dataset."""

import os
import random
import time
import zlib
from pathlib import Path

import orjson
import pytest

from evalpipe import manifest, task_cache
from evalpipe.benchmarks.coin_flip import CoinFlip
from evalpipe.stages import score

from .conftest import ROOT, score_missing_one, write_jsonl

N = 7000  # tasks: a dataset over task_cache.KEEP_ABOVE_BYTES


@pytest.fixture
def run(tmp_path):
    """A CoinFlip dataset over the size the cache keeps, its judge rows, and score.py over them."""
    src = (ROOT / "data" / "coin_flip" / "test.jsonl").read_text().splitlines(keepends=True)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(src[i % len(src)] for i in range(N)))
    assert data.stat().st_size > task_cache.KEEP_ABOVE_BYTES
    rng = random.Random(5)
    rows = [
        {"idx": task.id, "target": task.row["target"], "prediction": rng.choice(["YES", "NO", None]), "score": 0}
        for task in CoinFlip().load(data)
    ]
    del rows[3]  # a task without a row
    write_jsonl(tmp_path / "judge.jsonl", rows)
    cache = tmp_path / "cache"

    def score_py(cache_dir: Path = cache) -> dict:
        got = score_missing_one(tmp_path, data, {"EVALPIPE_CACHE_DIR": str(cache_dir)})
        got["items"] = (tmp_path / "items.json").read_bytes()
        return got

    score_py.data, score_py.rows, score_py.cache = data, rows, cache
    return score_py


def expected(data: Path, rows: list[dict]) -> dict:
    """The figures with the dataset and the rows held whole."""
    bench = CoinFlip()
    tasks = bench.load(data)
    return score.summarize(bench, tasks, {row["idx"]: row for row in rows})


FIGURES = ("f1", "accuracy", "confusion", "unparsed", "coverage")


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "tasks").glob("*"))


def test_a_second_score_reads_the_tasks_from_the_cache_and_gives_the_same_files(run):
    first = run()
    (entry,) = entries(run.cache)
    assert entry.read_bytes().endswith(b"}\n") and not list(run.cache.rglob(".*.tmp"))
    want = expected(run.data, run.rows)
    assert {key: first[key] for key in FIGURES} == {key: want[key] for key in FIGURES}
    assert run() == first  # score.json and items.json alike

    # the entry is what the second score read: a target changed in it (checksum and all) changes the figures
    lines = entry.read_bytes().split(b"\n")
    ids, codes, first_seen = orjson.loads(lines[1])
    first_seen = [{"target": "NO" if p["target"] == "YES" else "YES"} for p in first_seen]
    lines[1] = orjson.dumps([ids, codes, first_seen])
    body = b"\n".join(lines[:-2]) + b"\n"
    last = orjson.loads(lines[-2])
    entry.write_bytes(body + orjson.dumps({**last, "crc32": zlib.crc32(body)}) + b"\n")
    assert run()["confusion"] != first["confusion"]

    # without the checksum it is damaged: the dataset is read again, and the entry made anew
    entry.write_bytes(body + lines[-2] + b"\n")
    assert run() == first
    assert entry.read_bytes().split(b"\n")[1] != lines[1]


def test_a_changed_dataset_is_read_again(run):
    first = run()
    text = run.data.read_text()
    flipped = text.replace('"answer":"yes"}', '"answer":"no" }')  # the same size
    assert flipped != text and len(flipped) == len(text)
    run.data.write_text(flipped)
    again = run()
    want = expected(run.data, run.rows)
    assert {key: again[key] for key in FIGURES} == {key: want[key] for key in FIGURES}
    assert again["confusion"] != first["confusion"]


def test_a_cache_that_cannot_be_written_only_means_reading_the_dataset(run, tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    first = run(not_a_folder)
    assert run(not_a_folder) == first == run()  # and as with a cache


def recorded_entry(tmp_path, monkeypatch, chunks) -> task_cache.Entry:
    monkeypatch.setenv("EVALPIPE_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    entry = task_cache.Entry(CoinFlip(), data, None, manifest.sha256_file(data))
    assert list(entry.recorded(iter(chunks))) == chunks  # the chunks pass as they are
    return entry


CHUNKS = [(["a", "b"], [0, 1], [{"target": "YES"}, {"target": "NO"}]), (["c"], [1], [])]


def test_an_entry_is_read_back_as_written_and_only_by_the_same_code(tmp_path, monkeypatch):
    entry = recorded_entry(tmp_path, monkeypatch, CHUNKS)
    assert [tuple(chunk) for chunk in entry.read()] == CHUNKS
    monkeypatch.setattr(task_cache, "code_sha256", lambda: "other code")
    assert task_cache.Entry(CoinFlip(), tmp_path / "data.jsonl", None, entry.key["dataset_sha256"]).read() is None


@pytest.mark.parametrize("projection", [{"target": float("nan")}, {"target": ("YES",)}])
def test_projections_that_json_would_change_make_no_entry(tmp_path, monkeypatch, projection):
    entry = recorded_entry(tmp_path, monkeypatch, [(["a"], [0], [projection])])
    assert entry.read() is None and not entries(tmp_path / "cache")


def test_a_reader_that_stops_early_leaves_no_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPIPE_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    entry = task_cache.Entry(CoinFlip(), data, None, "sha")
    passing = entry.recorded(iter(CHUNKS))
    next(passing)
    passing.close()
    assert entry.read() is None and not list((tmp_path / "cache").rglob("*.*"))


def test_the_dataset_hash_is_remembered_while_the_file_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPIPE_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "q", "answer": "yes"}\n')
    real = manifest.sha256_file(data)
    monkeypatch.setattr(task_cache, "_SETTLED_NS", -(10**12))
    assert task_cache.dataset_sha256(data) == real
    assert not (tmp_path / "cache").exists()  # a small file: hashed each time
    monkeypatch.setattr(task_cache, "KEEP_ABOVE_BYTES", 0)
    monkeypatch.setattr(task_cache, "_SETTLED_NS", 2 * 10**9)
    assert task_cache.dataset_sha256(data) == real
    assert not (tmp_path / "cache").exists()  # just written: its times could not tell a change made now

    monkeypatch.setattr(task_cache, "_SETTLED_NS", -(10**12))  # as if it had been written long ago
    assert task_cache.dataset_sha256(data) == real
    (remembered,) = (tmp_path / "cache" / "sha256").glob("*.json")
    record = orjson.loads(remembered.read_bytes())
    remembered.write_bytes(orjson.dumps({**record, "sha256": "remembered"}))
    assert task_cache.dataset_sha256(data) == "remembered"  # not hashed again

    data.write_text('{"question": "q", "answer": "no!"}\n')  # the same size, a new mtime and ctime
    assert task_cache.dataset_sha256(data) == manifest.sha256_file(data) != real


def test_infer_makes_the_entry_that_its_reruns_and_score_read(run, stage, tmp_path):
    data, cache = run.data, tmp_path / "infer-cache"
    stage.env["EVALPIPE_CACHE_DIR"] = str(cache)
    ran = stage("infer", "--bench", "coin_flip", "--model", "m", "--input", data, "--max-samples", 20, check=0)
    (entry,) = entries(cache)
    made = entry.stat()
    assert sum(len(orjson.loads(line)[0]) for line in entry.read_bytes().split(b"\n")[1:-2]) == 20
    again = stage("infer", "--bench", "coin_flip", "--model", "m", "--input", data, "--max-samples", 20, check=0)
    assert "20 selected, 20 already done, 0 to run" in again.stderr, again.stderr
    stage("judge", "--bench", "coin_flip", "--model", "m", check=0)
    scored = stage("score", "--bench", "coin_flip", "--model", "m", check=0)
    assert "20/20 tasks graded" in scored.stdout, ran.stderr + scored.stdout + scored.stderr
    assert (entry.stat().st_ino, entry.stat().st_mtime_ns) == (made.st_ino, made.st_mtime_ns)  # read, not made again


def test_a_temporary_file_left_by_a_killed_writer_is_removed_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPIPE_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    entry = task_cache.Entry(CoinFlip(), data, None, "sha")
    entry.path.parent.mkdir(parents=True)
    left, writing = (entry.path.with_name(f".{entry.path.name}.{pid}.tmp") for pid in (1, 2))
    left.write_bytes(b"half an entry")
    writing.write_bytes(b"another writer, now")
    os.utime(left, (0, time.time() - 2 * 3600))
    assert list(entry.recorded(iter(CHUNKS))) == CHUNKS
    assert not left.exists() and writing.exists() and entry.read() is not None
