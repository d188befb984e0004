"""evalpipe.store.checkpoint.StepCache in process: finished calls kept beside the output, read back by a rerun."""

import json

import pytest

from evalpipe.errors import BadInput
from evalpipe.store.checkpoint import StepCache

from .conftest import read_jsonl


def test_the_file_sits_beside_the_output(tmp_path):
    out = tmp_path / "run-1" / "infer.jsonl"
    assert StepCache.path_for(out) == tmp_path / "run-1" / "infer.jsonl.steps.jsonl"
    assert StepCache(out).path == StepCache.path_for(out)


def test_put_then_get_in_the_same_run(tmp_path):
    cache = StepCache(tmp_path / "out.jsonl")
    assert cache.get("t1", "reasoning") is None
    row = cache.put("t1", "reasoning", {"text": "because", "usage": {"prompt_tokens": 3}})
    assert row == {"idx": "t1", "step": "reasoning", "text": "because", "usage": {"prompt_tokens": 3}}
    assert cache.get("t1", "reasoning") == row
    assert cache.get("t1", "extraction") is None and cache.get("t2", "reasoning") is None
    cache.close()


def test_each_put_reaches_the_file_at_once(tmp_path):
    out = tmp_path / "out.jsonl"
    cache = StepCache(out)
    cache.put("t1", "reasoning", {"text": "a"})
    # before close: a crash now must not lose the paid-for call
    assert read_jsonl(StepCache.path_for(out)) == [{"idx": "t1", "step": "reasoning", "text": "a"}]
    cache.put("t2", "reasoning", {"text": "b"})
    assert len(read_jsonl(StepCache.path_for(out))) == 2
    cache.close()


def test_a_reopened_cache_holds_what_the_last_run_put(tmp_path):
    out = tmp_path / "out.jsonl"
    first = StepCache(out)
    first.put("t1", "reasoning", {"text": "a"})
    first.put("t1", "extraction", {"answer": "42"})
    first.put(7, "reasoning", {"text": "int id"})
    first.close()

    again = StepCache(out)
    assert again.get("t1", "reasoning")["text"] == "a"
    assert again.get("t1", "extraction")["answer"] == "42"
    assert again.get(7, "reasoning")["text"] == "int id"  # the id keeps its JSON type
    assert again.get("7", "reasoning") is None
    again.put("t2", "reasoning", {"text": "b"})
    again.close()
    assert [(r["idx"], r["step"]) for r in read_jsonl(StepCache.path_for(out))] == [
        ("t1", "reasoning"),
        ("t1", "extraction"),
        (7, "reasoning"),
        ("t2", "reasoning"),
    ]  # appended, not rewritten


def test_the_latest_put_of_a_step_wins_now_and_after_reopening(tmp_path):
    out = tmp_path / "out.jsonl"
    cache = StepCache(out)
    cache.put("t1", "reasoning", {"text": "old"})
    cache.put("t1", "reasoning", {"text": "new"})
    assert cache.get("t1", "reasoning")["text"] == "new"
    cache.close()
    assert StepCache(out).get("t1", "reasoning")["text"] == "new"


def test_record_false_reads_the_file_but_writes_nothing(tmp_path):
    out = tmp_path / "out.jsonl"
    cache = StepCache(out, record=False)
    cache.put("t1", "reasoning", {"text": "dry"})
    assert cache.get("t1", "reasoning")["text"] == "dry"  # kept in memory for the rest of the run
    cache.close()
    assert not StepCache.path_for(out).exists()
    assert list(tmp_path.iterdir()) == []

    recorded = StepCache(out)
    recorded.put("t1", "reasoning", {"text": "paid"})
    recorded.close()
    before = StepCache.path_for(out).read_bytes()
    dry = StepCache(out, record=False)
    assert dry.get("t1", "reasoning")["text"] == "paid"
    dry.put("t2", "reasoning", {"text": "dry"})
    dry.put("t1", "reasoning", {"text": "dry over paid"})
    dry.close()
    assert StepCache.path_for(out).read_bytes() == before
    assert StepCache(out).get("t2", "reasoning") is None


def write_steps(out, rows, tail: bytes = b""):
    path = StepCache.path_for(out)
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + tail)
    return path


ROWS = [{"idx": "t1", "step": "reasoning", "text": "a"}, {"idx": "t2", "step": "reasoning", "text": "b"}]


def test_a_torn_last_line_is_ignored_and_cut_before_appending(tmp_path):
    out = tmp_path / "out.jsonl"
    path = write_steps(out, ROWS, b'{"idx": "t3", "step": "reas')  # killed mid-write
    cache = StepCache(out)
    assert cache.get("t1", "reasoning")["text"] == "a" and cache.get("t2", "reasoning")["text"] == "b"
    assert cache.get("t3", "reasoning") is None
    cache.put("t3", "reasoning", {"text": "c"})
    cache.close()
    assert [r["idx"] for r in read_jsonl(path)] == ["t1", "t2", "t3"]  # every line whole again
    assert StepCache(out).get("t3", "reasoning")["text"] == "c"


def test_a_complete_last_row_without_its_newline_is_kept(tmp_path):
    out = tmp_path / "out.jsonl"
    path = write_steps(out, ROWS[:1], json.dumps(ROWS[1]).encode())
    cache = StepCache(out)
    assert cache.get("t2", "reasoning")["text"] == "b"
    cache.put("t3", "reasoning", {"text": "c"})
    cache.close()
    assert [r["idx"] for r in read_jsonl(path)] == ["t1", "t2", "t3"]


def test_record_false_tolerates_a_torn_tail_without_touching_it(tmp_path):
    out = tmp_path / "out.jsonl"
    path = write_steps(out, ROWS, b'{"idx": "t3"')
    before = path.read_bytes()
    cache = StepCache(out, record=False)
    assert cache.get("t2", "reasoning")["text"] == "b" and cache.get("t3", "reasoning") is None
    assert path.read_bytes() == before


def test_a_damaged_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    out = tmp_path / "out.jsonl"
    path = StepCache.path_for(out)
    path.write_bytes(json.dumps(ROWS[0]).encode() + b"\n{not json}\n" + json.dumps(ROWS[1]).encode() + b"\n")
    with pytest.raises(BadInput, match=f"{path}:2: invalid JSON"):
        StepCache(out)
