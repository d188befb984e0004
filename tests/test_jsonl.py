import os

import pytest

from evalpipe.errors import BadInput
from evalpipe.store import jsonl


def test_torn_tail_is_cut_and_rows_before_it_survive(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"idx": "a", "v": 1}\n{"idx": "b", "v": 2}\n{"idx": "c", "v"')
    assert [r["idx"] for _, r in jsonl.iter_rows(path, torn_tail_ok=True)] == ["a", "b"]
    note = jsonl.repair_tail(path)
    assert "torn" in note
    assert path.read_bytes() == b'{"idx": "a", "v": 1}\n{"idx": "b", "v": 2}\n'
    with jsonl.Appender(path) as out:
        out.append({"idx": "c", "v": 3})
    assert [r["v"] for _, r in jsonl.iter_rows(path)] == [1, 2, 3]


def test_complete_last_row_without_newline_is_kept(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"idx": "a"}\n{"idx": "b"}')
    assert jsonl.repair_tail(path) == "added the missing newline after the last row"
    assert path.read_bytes() == b'{"idx": "a"}\n{"idx": "b"}\n'
    assert jsonl.repair_tail(path) is None


def test_torn_line_longer_than_the_scan_block(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"idx": "a"}\n{"idx": "b", "text": "' + b"x" * 200_000)
    jsonl.repair_tail(path)
    assert path.read_bytes() == b'{"idx": "a"}\n'


def test_a_single_torn_line_empties_the_file(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"idx": "a", "te')
    jsonl.repair_tail(path)
    assert path.read_bytes() == b""


def test_last_row_per_id_wins(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"idx": "a", "v": 1}\n{"idx": "b", "v": 1}\n{"idx": "a", "v": 2}\n')
    rows = jsonl.latest_rows(path, lambda r: r["idx"])
    assert rows == {"b": {"idx": "b", "v": 1}, "a": {"idx": "a", "v": 2}}
    assert jsonl.latest_rows(tmp_path / "missing.jsonl", lambda r: r["idx"]) == {}


@pytest.mark.parametrize(
    "content, line, message",
    [
        (b'{"a": 1}\n{"a": 2\n{"a": 3}\n', 2, "invalid JSON"),
        (b'{"a": 1}\n{"a": "\xff"}\n', 2, "not valid UTF-8"),
        (b'[{"a": 1}, {"a": 2}]\n', 1, "JSON array"),
        (b'{"a": 1}\n"just a string"\n', 2, "expected a JSON object"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    with pytest.raises(BadInput) as err:
        list(jsonl.iter_rows(path))
    assert f"{path}:{line}:" in str(err.value)
    assert message in str(err.value)


def test_a_torn_last_line_of_an_input_is_an_error(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": ')
    with pytest.raises(BadInput, match=":2:"):
        list(jsonl.iter_rows(path))


def test_bom_crlf_and_blank_lines_are_accepted(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\r\n{"a": 2}\r\n')
    assert [(n, r["a"]) for n, r in jsonl.iter_rows(path)] == [(1, 1), (3, 2)]


def test_atomic_write_replaces_whole_file_with_umask_permissions(tmp_path):
    path = tmp_path / "sub" / "score.json"
    jsonl.atomic_write(path, b"old")
    jsonl.atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in path.parent.iterdir()] == ["score.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_ids_in_slices_our_ids_and_parses_the_rest(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(
        b'{"idx":"a","v":1}\n'
        b'{"idx": "b", "v": 2}\n'  # upstream spacing: parsed
        b'{"idx":"c\\"q","v":3}\n'  # an escaped quote in the id: parsed
        b'{"messages": [], "metadata": {"task_id": "d"}}\n'  # no idx: upstream fallback
        b'{"idx":"e","v":5}'  # complete, but no newline yet: parsed, counts
    )
    key = lambda r: r.get("idx", r.get("metadata", {}).get("task_id"))  # noqa: E731
    assert jsonl.ids_in(path, key) == {"a", "b", 'c"q', "d", "e"}
    path.write_bytes(b'{"idx":"a","v":1}\n{"idx":"b","v":')  # torn: b is not done
    assert jsonl.ids_in(path, key) == {"a"}
    path.write_bytes(b'{"idx":"a","v":1}\nnot json\n{"idx":"b","v":2}\n')
    with pytest.raises(BadInput, match=":2:"):
        jsonl.ids_in(path, key)
