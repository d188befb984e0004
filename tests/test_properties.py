"""Property-based tests of the JSONL reader/repair and the judge-reply parser."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from evalpipe.benchmarks.clbench import Verdict, parse_judge_reply
from evalpipe.store import jsonl

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
rows = st.lists(st.fixed_dictionaries({"idx": st.text(max_size=8), "v": json_values}), max_size=8)


@settings(max_examples=150, deadline=None)
@given(rows=rows, cut=st.integers(min_value=0), more=rows)
def test_a_file_cut_anywhere_reads_as_a_prefix_and_repairs(tmp_path_factory, rows, cut, more):
    path = tmp_path_factory.mktemp("j") / "out.jsonl"
    data = b"".join(jsonl.dumps(r) + b"\n" for r in rows)
    cut = cut % (len(data) + 1)
    path.write_bytes(data[:cut])
    read = [r for _, r in jsonl.iter_rows(path, torn_tail_ok=True)]
    assert read == rows[: len(read)]
    assert len(read) >= data[:cut].count(b"\n") - 0  # every complete line is read
    with jsonl.Appender(path) as out:
        for r in more:
            out.append(r)
    after = [r for _, r in jsonl.iter_rows(path)]  # strict: no torn line is left
    assert after[: len(read)] == read and after[len(after) - len(more) :] == more
    assert len(after) in (len(read) + len(more), len(read) + 1 + len(more))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.integers(0, 20))
def test_the_parser_never_raises(text, n):
    result = parse_judge_reply(text, n)
    assert isinstance(result, (Verdict, str))
    if isinstance(result, Verdict):
        assert result.score in (0, 1)


prose = st.text(alphabet=st.characters(blacklist_characters='{}"`'), max_size=80)


@settings(max_examples=200, deadline=None)
@given(
    before=prose,
    after=prose,
    score=st.sampled_from([0, 1]),
    statuses=st.lists(st.sampled_from(["yes", "no"]), max_size=6),
    fenced=st.booleans(),
)
def test_a_verdict_inside_any_prose_is_found(before, after, score, statuses, fenced):
    obj = json.dumps(
        {"Grading Rationale": "r", "List of Requirement Satisfaction Status": statuses, "Overall Score": score}
    )
    body = f"```json\n{obj}\n```" if fenced else obj
    v = parse_judge_reply(f"{before}\n{body}\n{after}", len(statuses))
    assert isinstance(v, Verdict) and v.score == score and v.statuses == statuses
