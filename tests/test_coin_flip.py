"""CoinFlip: generator, templates, parse rules, metric semantics, and the full pipeline."""

import asyncio
import binascii
import importlib.util
import json
import re

import pytest

from evalpipe.benchmarks.base import Task
from evalpipe.benchmarks.coin_flip import (
    FEW_SHOT_HEADER,
    ZERO_SHOT,
    CoinFlip,
    CoinFlipOptions,
    worked_example,
)
from evalpipe.datasets import coin_flip as gen
from evalpipe.devtools.testserver import Reply
from evalpipe.errors import BadInput
from evalpipe.stages import score

from .conftest import ROOT, make, read_jsonl, write_jsonl

DATA = ROOT / "data" / "coin_flip"


# ---- parse rules: the table of reply shapes is tests/test_coin_flip_parse.py


def test_lenient_is_evalscope_under_one_name():
    assert CoinFlip(CoinFlipOptions(parse="lenient")).options.parse == "evalscope"
    assert CoinFlip().options.parse == "evalscope"  # the default


# ---- metrics


def bench(parse="strict"):
    return CoinFlip(CoinFlipOptions(parse=parse))


def scored(golds, outputs):
    b = bench()
    tasks = [Task(id=str(i), row={"question": "q", "target": g}, line=i) for i, g in enumerate(golds)]
    judged = {}
    for t, out in zip(tasks, outputs):
        if out is not None:
            judged[t.id] = asyncio.run(b.grade({"idx": t.id, "model_output": out, "target": t.row["target"]}, None))
    return score.summarize(b, tasks, judged)


def test_metrics_by_hand():
    # TP, unparsed gold-YES (not a false negative), FP, TN, FN, unparsed gold-NO
    m = scored(
        ["YES", "YES", "NO", "NO", "YES", "NO"],
        ["ANSWER: YES", "no idea", "ANSWER: YES", "ANSWER: NO", "ANSWER: NO", "ANSWER: perhaps"],
    )
    assert m["confusion"] == {"tp": 1, "fp": 1, "fn": 1, "tn": 1} and m["unparsed"] == 2
    assert m["accuracy"] == 2 / 6  # unparsed count as wrong
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 0.5, 0.5)
    assert m["yes_ratio"] == 2 / 6


def test_missing_rows_count_as_wrong_and_are_reported():
    m = scored(["YES", "NO", "YES", "NO"], ["ANSWER: YES", "ANSWER: NO", None, None])
    assert m["coverage"]["missing"] == 2 and m["accuracy"] == 0.5
    assert (m["precision"], m["recall"], m["f1"]) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    "golds, outputs",
    [
        (["YES", "NO"], ["gibberish", "more gibberish"]),  # nothing parsed: every ratio is 0/0
        (["NO", "NO"], ["ANSWER: NO", "ANSWER: NO"]),  # no YES predicted, no YES gold
        (["YES", "YES"], ["ANSWER: NO", "ANSWER: NO"]),  # precision 0/0, recall 0
    ],
)
def test_zero_divisions_are_zero(golds, outputs):
    m = scored(golds, outputs)
    assert m["precision"] == 0.0 and m["f1"] == 0.0 and m["yes_ratio"] == 0.0
    assert m["recall"] == 0.0


def test_empty_selection_is_all_zero():
    m = score.summarize(bench(), [], {})
    assert (m["accuracy"], m["f1"], m["yes_ratio"]) == (0.0, 0.0, 0.0)


# ---- templates and few-shot


def test_zero_shot_template_is_evalscopes():
    assert len(ZERO_SHOT.replace("{question}", "")) == 360
    assert ZERO_SHOT.startswith("\nSolve the following coin flip problem step by step.")
    assert ZERO_SHOT.endswith("the answer YES or NO to the problem.\n\nReasoning:\n")


def test_worked_examples_track_every_person():
    q = (
        "Q: A coin is heads up. ana flips the coin. bo does not flip the coin. cy flips the coin.  "
        "Is the coin still heads up?"
    )
    demo = worked_example(q, "YES")
    assert demo.startswith(q + "\n\nReasoning:\nThe coin starts heads up. ana flips the coin, so it is now tails up.")
    assert (
        "bo does not flip the coin, so it stays tails up." in demo
        and "cy flips the coin, so it is now heads up." in demo
    )
    assert demo.endswith("\nANSWER: YES")
    with pytest.raises(ValueError):
        worked_example(q, "NO")


def test_fewshot_prompt_structure_and_seeded_choice():
    b = CoinFlip(CoinFlipOptions(fewshot=3, fewshot_seed=7, fewshot_data=DATA / "validation.jsonl", parse="strict"))
    q = read_jsonl(DATA / "test.jsonl")[0]["question"]
    prompt = b.prompt(q)
    head, rest = prompt.split("\n\n", 1)
    assert head == FEW_SHOT_HEADER
    demos, zero = rest.split("\n\n\nSolve the following", 1)
    assert "\nSolve the following" + zero == ZERO_SHOT.format(question=q)
    assert len(re.findall(r"^ANSWER: (YES|NO)$", demos, re.M)) == 3
    again = CoinFlip(CoinFlipOptions(fewshot=3, fewshot_seed=7, fewshot_data=DATA / "validation.jsonl", parse="strict"))
    assert again.prompt(q) == prompt
    val_questions = {r["question"] for r in read_jsonl(DATA / "validation.jsonl")}
    assert all(d.split("\n\n")[0] in val_questions for d in demos.split("\n\nQ: ") if d.startswith("Q: "))


# ---- generator


def test_generator_is_deterministic_and_matches_the_committed_files(tmp_path):
    gen.write_splits(tmp_path)
    for split in ("test", "validation"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (DATA / f"{split}.jsonl").read_bytes()


def test_generator_statistics_match_the_recorded_ones():
    rows = read_jsonl(DATA / "test.jsonl")
    assert len(rows) == 3333 and len(read_jsonl(DATA / "validation.jsonl")) == 1333
    s = gen.prompt_statistics(rows)
    assert abs(s["mean"] - 500.15) <= 1.5 and abs(s["std"] - 28.32) <= 1.5
    assert abs(s["min"] - 453) <= 6 and abs(s["max"] - 551) <= 6
    assert abs(s["yes_share"] - 0.51) <= 0.015
    assert len(gen.load_names()) >= 1000


def test_generated_questions_are_well_formed_and_answers_follow_parity():
    pattern = re.compile(
        r"^Q: A coin is heads up\.((?: [a-z]+ (?:flips|does not flip) the coin\.){2,4})  Is the coin still heads up\?$"
    )
    for row in read_jsonl(DATA / "test.jsonl") + read_jsonl(DATA / "validation.jsonl"):
        m = pattern.match(row["question"])
        assert m, row
        names = re.findall(r" ([a-z]+) (?:flips|does not flip)", m.group(1))
        assert len(set(names)) == len(names)
        flips = m.group(1).count(" flips the coin.")
        assert row["answer"] == ("yes" if flips % 2 == 0 else "no")


# ---- loader


def test_loader_reads_json_exports_with_stable_ids(tmp_path):
    rows = read_jsonl(DATA / "test.jsonl")[:5]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.json").write_text(json.dumps({"rows": [{"row_idx": i, "row": r} for i, r in enumerate(rows)]}))
    write_jsonl(tmp_path / "c.jsonl", [{**r, "answer": r["answer"].upper()} for r in rows])
    ids = [[t.id for t in CoinFlip().load(tmp_path / name)] for name in ("a.json", "b.json", "c.jsonl")]
    assert ids[0] == ids[1] == ids[2] == [t.id for t in list(CoinFlip().load(DATA / "test.jsonl"))[:5]]


def test_loader_errors_name_the_line(tmp_path):
    write_jsonl(
        tmp_path / "bad.jsonl", [{"question": "Q: x", "answer": "yes"}, {"question": "Q: y", "answer": "maybe"}]
    )
    with pytest.raises(BadInput, match=r"bad.jsonl:2: 'answer' must be yes or no"):
        list(CoinFlip().load(tmp_path / "bad.jsonl"))


def test_ids_are_the_position_and_the_crc32_of_the_question(tmp_path):
    """Whichever way a chunk of lines is read (at once, or a row at a time where an answer is spelled otherwise),
    a task's id is its position and its question's CRC-32, so that old runs' rows keep matching."""
    rows = read_jsonl(DATA / "test.jsonl")[:2000]
    rows[1500]["answer"] = f" {rows[1500]['answer'].title()} "
    write_jsonl(tmp_path / "d.jsonl", rows)
    tasks = list(CoinFlip().load(tmp_path / "d.jsonl"))
    assert [t.id for t in tasks] == [
        f"{i:05d}-{binascii.crc32(r['question'].encode()):08x}" for i, r in enumerate(rows)
    ]
    assert [(t.row["target"], t.line) for t in tasks] == [
        (r["answer"].strip().upper(), i + 1) for i, r in enumerate(rows)
    ]
    rows[1800]["answer"] = "maybe"
    write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(BadInput, match=r"d.jsonl:1801: 'answer' must be yes or no"):
        list(CoinFlip().load(tmp_path / "d.jsonl"))


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow is installed")
def test_parquet_without_pyarrow_is_a_clear_error(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(BadInput, match="needs pyarrow"):
        list(CoinFlip().load(tmp_path / "x.parquet"))


# ---- the pipeline


def answer_by_parity(request):
    """Right on questions with an even number of people, wrong (but well-formed) otherwise."""
    prompt = request.last_content
    question = prompt.split("\n\n")[-3] if "Reasoning:\n" in prompt else prompt
    flips = question.count(" flips the coin.")
    people = flips + question.count(" does not flip the coin.")
    truth = "YES" if flips % 2 == 0 else "NO"
    lie = {"YES": "NO", "NO": "YES"}[truth]
    if people == 3:
        return Reply(content="I am not sure.")
    return Reply(content=f"Counting flips.\nANSWER: {truth if people == 2 else lie}")


@pytest.mark.e2e
def test_make_pipeline_for_coin_flip(server, env, tmp_path):
    server.handler = answer_by_parity
    settings = ["BENCH=coin_flip", f"OUTPUTS={tmp_path}", "MODEL=m", "RUNS=2", "MAX_SAMPLES=60", "WORKERS=8"]
    proc = make(env, "infer", "judge", "score", "aggregate", *settings)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tasks = read_jsonl(DATA / "test.jsonl")[:60]
    score = json.loads((tmp_path / "coin_flip" / "m" / "run-1" / "score.json").read_text())

    def people(q):
        return q.count(" flips the coin.") + q.count(" does not flip the coin.")

    gold = ["YES" if r["answer"] == "yes" else "NO" for r in tasks]
    pred = []
    for r, g in zip(tasks, gold):
        n = people(r["question"])
        pred.append(None if n == 3 else g if n == 2 else {"YES": "NO", "NO": "YES"}[g])
    tp = sum(p == g == "YES" for p, g in zip(pred, gold))
    fp = sum(p == "YES" and g == "NO" for p, g in zip(pred, gold))
    fn = sum(p == "NO" and g == "YES" for p, g in zip(pred, gold))
    tn = sum(p == g == "NO" for p, g in zip(pred, gold))
    assert score["confusion"] == {"tp": tp, "fp": fp, "fn": fn, "tn": tn}
    assert score["unparsed"] == pred.count(None)
    assert score["accuracy"] == (tp + tn) / 60
    assert score["yes_ratio"] == pred.count("YES") / 60
    p, r = tp / (tp + fp), tp / (tp + fn)
    assert abs(score["f1"] - 2 * p * r / (p + r)) < 1e-12
    judged = read_jsonl(tmp_path / "coin_flip" / "m" / "run-1" / "judge.jsonl")
    assert all(row["parse_mode"] == "evalscope" for row in judged)  # EvalScope's rule is the default
    assert all(r.body["temperature"] == 0 for r in server.chat_requests())  # as EvalScope sends it
    sent = sorted(r.last_content for r in server.chat_requests())
    assert all(len(r.messages) == 1 and r.messages[0]["role"] == "user" for r in server.chat_requests())
    assert sent == sorted(ZERO_SHOT.format(question=t["question"]) for t in tasks for _ in range(2))  # 2 runs
    agg = json.loads((tmp_path / "coin_flip" / "aggregate.json").read_text())
    assert list(agg["models"][0]["figures"])[0] == "F1"
    assert "F1" in proc.stdout and "YES ratio" in proc.stdout


@pytest.mark.e2e
def test_another_parse_mode_regrades_without_calls_and_is_in_the_gradings_fingerprint(server, stage, tmp_path):
    server.handler = lambda r: Reply(content="**ANSWER: YES**")
    stage("infer", "--bench", "coin_flip", "--model", "m", "--output", "infer.jsonl", "--max-samples", "10", check=0)
    answers = json.loads((tmp_path / "infer.jsonl.manifest.json").read_text())["fingerprint"]
    calls = len(server.chat_requests())

    def grade(*flags):
        stage("judge", "--bench", "coin_flip", "--input", "infer.jsonl", *flags, check=0)
        stage("score", "--bench", "coin_flip", "--input", "judge.jsonl", check=0)
        judged = read_jsonl(tmp_path / "judge.jsonl")[-10:]
        grading = json.loads((tmp_path / "judge.jsonl.manifest.json").read_text())["fingerprint"]
        return json.loads((tmp_path / "score.json").read_text()), {r["parse_mode"] for r in judged}, grading

    default, modes, grading = grade()  # evalscope: bold markers around the line are stripped
    assert default["unparsed"] == 0 and default["yes_ratio"] == 1.0
    assert modes == {"evalscope"} and grading == {"grader": "rule", "parse": "evalscope"}
    strict, modes, grading = grade("--parse", "strict")  # the same answers graded again: none is parsed
    assert strict["unparsed"] == 10 and modes == {"strict"} and grading["parse"] == "strict"
    alias, modes, grading = grade("--parse", "lenient")  # an alias: recorded under its one name
    assert alias["unparsed"] == 0 and modes == {"evalscope"} and grading["parse"] == "evalscope"
    assert len(server.chat_requests()) == calls  # grading is free
    infer_manifest = json.loads((tmp_path / "infer.jsonl.manifest.json").read_text())
    assert infer_manifest["fingerprint"] == answers and "parse" not in answers  # the answers did not change
    assert answers["temperature"] == 0.0


@pytest.mark.e2e
def test_temperature_flag_overrides_or_drops_the_default(server, stage, tmp_path):
    def infer(output, *flags):
        stage("infer", "--model", "m", "--output", output, "--max-samples", "2", *flags, check=0)

    infer("a.jsonl", "--bench", "coin_flip")  # EvalScope's temperature 0
    infer("b.jsonl", "--bench", "coin_flip", "--temperature", "0.7")
    infer("c.jsonl", "--bench", "coin_flip", "--temperature", "none")  # for models that refuse the field
    infer("d.jsonl")  # clbench: nothing sent, as upstream
    sent = [r.body.get("temperature", "unset") for r in server.chat_requests()]
    assert sent == [0, 0, 0.7, 0.7, "unset", "unset", "unset", "unset"]
    params = [json.loads((tmp_path / f"{n}.jsonl.manifest.json").read_text())["params"] for n in "abcd"]
    assert params == [{"temperature": 0.0}, {"temperature": 0.7}, {}, {}]


def test_a_judge_row_without_its_target_is_graded_wrong_not_a_crash():
    # score without a dataset reads the judge rows as the tasks; a row written by another tool may lack `target`
    columns = bench().item_columns([Task(id=1, row={}, line=1)], {1: {"prediction": "YES"}})["columns"]
    assert (columns["correct"], columns["parsed"], columns["tp"]) == ([0], [1], [0])
