"""docs/adding-a-benchmark.md's worked example: the guide shows capitals.py whole, and the module runs through the
stage scripts; and the shared pieces it is made of (benchmarks/grading.py) on tables of replies and bad files."""

import asyncio
import json
import re
import subprocess
import sys

import pytest

from evalpipe.benchmarks import grading
from evalpipe.benchmarks.capitals import Capitals
from evalpipe.errors import BadInput

from .conftest import ROOT, read_jsonl

GUIDE = ROOT / "docs" / "adding-a-benchmark.md"
MODULE = ROOT / "evalpipe" / "benchmarks" / "capitals.py"


def test_the_guide_shows_the_module_whole():
    blocks = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), re.S | re.M)
    assert len(blocks) == 1, "the guide has one python block: the worked example"
    assert blocks[0] == MODULE.read_text()
    assert len(blocks[0].splitlines()) <= 30


# the guide's step 3 (the registry line), done in the stage's own process; then the stage script as it is
REGISTERED = (
    "import runpy, sys\n"
    "from evalpipe import benchmarks\n"
    "from evalpipe.benchmarks.capitals import Capitals\n"
    "benchmarks.REGISTRY[Capitals.name] = Capitals\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
REPLIES = {  # the first six questions (by country): four right, one wrong, one without a letter
    "Australia": "Canberra has been the capital since 1913.\nAnswer: B",
    "Canada": "**Answer:** A",
    "Brazil": "Answer: A",
    "Turkey": "C",
    "Switzerland": "It is one of them, I think.",
    "Morocco": "Rabat.\nANSWER: (D)",
}


def capitals_model(request):
    from evalpipe.devtools.testserver import Reply

    country = re.search(r"What is the capital of (.+?)\?", request.last_content).group(1)
    return Reply(content=REPLIES[country])


def registered_stage(script, *args, env, cwd):
    """A stage script run with capitals.py in the registry (REGISTERED)."""
    return subprocess.run(
        [sys.executable, "-c", REGISTERED, str(ROOT / f"{script}.py"), *map(str, args)],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.e2e
def test_the_example_through_the_stages(server, env, tmp_path):
    server.handler = capitals_model
    common = ["--bench", "capitals", "--outputs-dir", tmp_path, "--model", "m"]
    for script, flags in (("infer", ["--max-samples", "6"]), ("judge", []), ("score", [])):
        done = registered_stage(script, *common, *flags, env=env, cwd=tmp_path)
        assert done.returncode == 0, f"{script}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    run = tmp_path / "capitals" / "m" / "run-1"
    prompts = [row["messages"][0]["content"] for row in read_jsonl(run / "infer.jsonl")]  # in order of answers
    [prompt] = [text for text in prompts if "Australia" in text]
    assert prompt.endswith("What is the capital of Australia?\n\nA) Sydney\nB) Canberra\nC) Melbourne\nD) Perth")
    assert "one of ABCD" in prompt
    metrics = json.loads((run / "score.json").read_text())
    assert metrics["score"] == pytest.approx(4 / 6)
    assert metrics["coverage"]["graded"] == 6 and metrics["coverage"]["expected"] == 6
    assert metrics["judge_status"] == {"ok": 5, "unparsed": 1}
    assert len(server.chat_requests()) == 6

    bad = tmp_path / "bad.jsonl"  # a row without its answer's letter among the choices: one line, exit 2
    bad.write_text(Capitals.default_data.read_text().replace('"answer": "A"', '"answer": "E"', 1))
    done = registered_stage("infer", *common, "--input", bad, "--output", tmp_path / "x.jsonl", env=env, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr == f"infer: error: {bad}:2: 'answer' must be one of ABCD, got 'E'\n"
    assert len(server.chat_requests()) == 6


@pytest.mark.parametrize(
    "reply, letter",
    [
        ("Answer: B", "B"),
        ("answer: c", "C"),
        ("Reasoning...\nAnswer: A\nOn reflection:\nAnswer: D", "D"),  # the last one counts
        ("**Answer:** B", "B"),
        ("Answer: $C$", "C"),
        ("Answer: (A)", "A"),
        ("B", "B"),
        (" (C) ", "C"),
        ("D.", "D"),
        ("Answer: Because the city is inland", None),
        ("Brasília", None),
        ("", None),
    ],
)
def test_choice_letter(reply, letter):
    assert grading.choice_letter(reply) == letter


def test_exact_match_scores_the_letter_and_says_when_none_was_read():
    row = {"idx": "t", "model_output": "x", "target": "B"}
    assert asyncio.run(Capitals().grade({**row, "model_output": "Answer: B"}, None))["score"] == 1
    assert grading.exact_match(row, "C") == {**row, "score": 0, "judge_status": "ok"}
    assert grading.exact_match(row, None) == {**row, "score": 0, "judge_status": "unparsed"}
    assert grading.exact_match(row, "", unread="empty_output")["judge_status"] == "empty_output"


def test_the_bundled_sample_is_well_formed():
    tasks = Capitals().load(Capitals.default_data)
    assert 8 <= len(tasks) <= 20 and len({t.id for t in tasks}) == len(tasks)
    assert [t.line for t in tasks] == list(range(1, len(tasks) + 1))


def test_a_json_array_reads_with_the_line_each_row_starts_on(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"question": "q1",\n   "answer": "a"},\n  {"question": "q2", "answer": "b"}\n]\n')
    assert [line for line, _ in grading.read_rows(path)] == [2, 4]
    tasks = grading.read_tasks(path, question=str, answer=str)
    assert [t.row["question"] for t in tasks] == ["q1", "q2"] and len({t.id for t in tasks}) == 2
    path.write_text("[]")
    assert list(grading.read_rows(path)) == []


@pytest.mark.parametrize(
    "name, text, line, words",
    [
        ("a.jsonl", '{"question": "q", "choices": ["x", "y"], "answer": "A"}\n{"question": 3}\n', 2, "'question'"),
        ("b.jsonl", '{"question": "q", "choices": ["x"], "answer": "A"}\n', 1, "'choices' must be 2 to 10"),
        ("c.jsonl", '{"question": "q", "choices": ["x", "y"], "answer": "C"}\n', 1, "'answer' must be one of AB"),
        ("d.jsonl", '{"id": "a", "question": "q", "choices": ["x", "y"], "answer": "A"}\n' * 2, 2, "seen once"),
        ("e.jsonl", '{"question": "q", "choices": ["x", "y"], "answer": "A"}\nnot json\n', 2, "invalid JSON"),
        ("f.json", '[{"question": "q", "choices": ["x", "y"], "answer": "A"},\n 7]', 2, "expected a JSON object"),
        ("g.json", '[{"question": "q", "choices": ["x", "y"], "answer": "A"}\n\n {}]', 3, "expected ',' or ']'"),
        ("h.json", '[\n{"question": "q",\n "choices": ["x", "y"], "answer": }]', 3, "invalid JSON"),
        ("i.json", '{"rows": []}', 1, "expected a JSON array"),
    ],
)
def test_a_bad_row_is_an_error_naming_file_and_line(tmp_path, name, text, line, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(BadInput) as caught:
        grading.read_multiple_choice(path)
    assert str(caught.value).startswith(f"{path}:{line}: ") and words in str(caught.value), str(caught.value)


def test_an_empty_file_has_no_tasks(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(BadInput, match="no tasks in the file"):
        grading.read_tasks(path)
