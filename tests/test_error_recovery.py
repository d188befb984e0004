"""Error Recovery: the converter, each variation's messages on the wire, two-call resume, metrics."""

import hashlib
import json
import signal
import subprocess
import time

import pytest

from evalpipe.benchmarks.base import select
from evalpipe.benchmarks.error_recovery import (
    FINAL_ANSWER_PROMPT,
    FORMAT_HINTS,
    MISTAKE_NOTICE,
    TASK_DESCRIPTION,
    ErrorRecovery,
    compat,
    normalize,
)
from evalpipe.datasets import error_recovery as conv
from evalpipe.devtools.testserver import Reply
from evalpipe.stages import score

from .conftest import ROOT, SHARED, make, read_jsonl

SAMPLE = ROOT / "data" / "error_recovery" / "sample.jsonl"
BBM_SAMPLE = ROOT / "data" / "error_recovery" / "bbm_sample"
BBM = SHARED / "data" / "big-bench-mistake"
PROBLEMS = read_jsonl(SAMPLE)
BY_QUESTION = {p["question"]: p for p in PROBLEMS}


# ---- converter


@pytest.mark.skipif(not BBM.exists(), reason="../shared/data/big-bench-mistake is not here")
def test_converter_on_the_real_files_matches_the_reference_data_files():
    variants = conv.convert(BBM)
    counts = {t: sum(r["task"] == t for r in variants["main"]) for t in conv.TASKS}
    assert counts == {
        "multistep_arithmetic": 201,
        "tracking_shuffled_objects": 246,
        "word_sorting": 239,
        "logical_deduction": 250,
        "dyck_languages": 500,
    }
    assert [r["task"] for r in variants["medium"]] == [t for t in conv.TASKS for _ in range(50)]
    assert variants["small"] == [r for t in conv.TASKS for r in [x for x in variants["main"] if x["task"] == t][:2]]
    # sha256 of the reference eval's data files (their git-lfs pointers): our bytes are theirs
    reference = {
        "main": "8fda8fddd6a63d6b84ee4b6a8934bcedcada67e3fcd5df64041f14c04d774be3",
        "medium": "d5c591504d282ca7763d7abe407958da1ea06d6dc62be4808ba4fa97ff5f3cb2",
        "small": "3e55b1af640b26eff5661c83c7ff6bf52040ea062c9a71ba16069e2305fdb362",
    }
    for name, rows in variants.items():
        assert hashlib.sha256(conv.encode(rows)).hexdigest() == reference[name], name


def test_converter_on_our_sample_selects_orders_and_types_as_the_reference():
    rows = conv.convert(BBM_SAMPLE, ("main", "small"))["main"]
    assert conv.encode(rows) == SAMPLE.read_bytes()
    assert [r["task"] for r in rows] == [t for t in conv.TASKS for _ in range(2)]
    first = rows[0]
    assert list(first) == [
        "question",
        "correct_steps",
        "incorrect_step",
        "mistake_index",
        "num_ground_truth_steps",
        "target",
        "task",
    ]
    assert first["mistake_index"] == 2.0 and isinstance(first["mistake_index"], float)
    assert first["target"] == -7 and isinstance(first["target"], int)
    assert all(isinstance(r["target"], str) for r in rows if r["task"] != "multistep_arithmetic")
    dyck = [r for r in rows if r["task"] == "dyck_languages"][0]
    assert dyck["question"].startswith(
        "Given the following sequence of opening and closing brackets, provide the "
        "minimal sequence of additional brackets that would balance the original sequence:\n"
    )
    ws = [r for r in rows if r["task"] == "word_sorting"]
    assert ws[0]["question"] == "Sort the following list of words alphabetically:\nthistle marrow tundra gazebo"
    assert b"falcon\\/kite" in SAMPLE.read_bytes()  # the reference's encoding escapes "/"
    with pytest.raises(Exception, match="needs 50 rows per task"):
        conv.convert(BBM_SAMPLE, ("medium",))


@pytest.mark.e2e
def test_make_error_recovery_data(tmp_path):
    out = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "error-recovery-data", f"BBM_DIR={BBM_SAMPLE}"], capture_output=True, text=True
    )
    # the sample has too few rows for the medium variant: a clear error, nothing half-written
    assert out.returncode != 0 and "medium variant needs 50 rows per task" in out.stdout + out.stderr


# ---- messages on the wire


def er_handler(server_calls=None):
    """Reasoning: a fixed text. Extraction: right for NR and CR, wrong for IR."""

    def handler(request):
        msgs = request.messages
        if FINAL_ANSWER_PROMPT in msgs[-1]["content"]:
            problem = BY_QUESTION[msgs[1]["content"]]
            given = msgs[2]["content"] if msgs[2]["role"] != "assistant" or len(msgs) > 4 else None
            ir = "\n".join(problem["correct_steps"]) + "\n" + problem["incorrect_step"]
            return Reply(content="WRONG" if given is not None and ir in given else str(problem["target"]))
        return Reply(content=f"reasoning after {len(msgs)} messages")

    return handler


def run_infer(stage, *flags, output="infer.jsonl", check=0):
    return stage("infer", "--bench", "error_recovery", "--model", "m", "--output", output, *flags, check=check)


def calls_for(server, problem, variation_content=None):
    return [
        r.messages
        for r in server.chat_requests()
        if r.messages[1]["content"] == problem["question"]
        and (variation_content is None or (len(r.messages) > 2 and r.messages[2]["content"] == variation_content))
    ]


@pytest.mark.e2e
def test_each_variation_byte_for_byte(server, stage):
    server.handler = er_handler()
    run_infer(stage, "--max-samples", "1")
    p = PROBLEMS[0]
    system = {"role": "system", "content": TASK_DESCRIPTION}
    user = {"role": "user", "content": p["question"]}
    correct = "\n".join(p["correct_steps"])
    final = {"role": "system", "content": FINAL_ANSWER_PROMPT + FORMAT_HINTS["multistep_arithmetic"]}
    assert FORMAT_HINTS["multistep_arithmetic"] == "\n\nAnswer with a single number."
    requests = [r.messages for r in server.chat_requests()]
    assert len(requests) == 6  # 3 variations x (reasoning + extraction)
    nr_reasoning = [system, user]
    cr_reasoning = [system, user, {"role": "assistant", "content": correct}]
    ir_reasoning = [system, user, {"role": "assistant", "content": correct + "\n" + p["incorrect_step"]}]
    for start in (nr_reasoning, cr_reasoning, ir_reasoning):
        assert start in requests
        reply = {"role": "assistant", "content": f"reasoning after {len(start)} messages"}
        assert start + [reply, final] in requests


@pytest.mark.e2e
def test_a_mistake_in_the_first_step_is_given_after_a_newline_as_the_reference(server, stage, tmp_path):
    # the reference joins the correct steps, then adds "\n" + the mistake: with no correct step, "\n" comes first
    problem = {**PROBLEMS[0], "correct_steps": [], "incorrect_step": "Step one, wrong.", "mistake_index": 0.0}
    data = tmp_path / "first-step.jsonl"
    data.write_text(json.dumps(problem) + "\n")
    server.handler = lambda request: Reply(content=str(problem["target"]))
    run_infer(stage, "--input", str(data))
    given = [r.messages[2]["content"] for r in server.chat_requests() if len(r.messages) == 3]
    assert sorted(given) == ["", "\nStep one, wrong."]  # CR, IR (NR gives no reasoning)


@pytest.mark.e2e
def test_reference_options_change_roles_and_notices(server, stage):
    server.handler = er_handler()
    p = PROBLEMS[0]
    correct = "\n".join(p["correct_steps"])
    run_infer(
        stage,
        "--max-samples",
        "1",
        "--reasoning-role",
        "user",
        "--final-answer-role",
        "user",
        "--mistake-notice",
        "immediate",
        output="a.jsonl",
    )
    requests = [r.messages for r in server.chat_requests()]
    notice = {"role": "user", "content": MISTAKE_NOTICE}
    cr = [m for m in requests if len(m) > 2 and m[2] == {"role": "user", "content": correct}]
    assert cr[0][3] == notice and cr[1][-1]["role"] == "user"  # notice right after the given reasoning
    nr = [m for m in requests if len(m) == 2 or m[2]["role"] == "assistant" and m[2]["content"].startswith("reasoning")]
    assert all(notice not in m for m in nr)  # no notice without given reasoning
    before = len(server.chat_requests())
    run_infer(stage, "--max-samples", "1", "--mistake-notice", "end", "--mistake-notice-ir-only", output="b.jsonl")
    new = [r.messages for r in server.chat_requests()[before:]]
    assert len(new) == 7  # IR gets one more reasoning call after the notice
    ir_notice = [m for m in new if m[-1] == notice]
    assert len(ir_notice) == 1 and ir_notice[0][2]["content"].endswith(p["incorrect_step"])


@pytest.mark.e2e
def test_chat_compat_merge_never_sends_two_turns_of_a_role_or_a_late_system(server, stage):
    server.handler = er_handler()
    run_infer(stage, "--max-samples", "2", "--chat-compat", "merge", "--mistake-notice", "end")
    for request in server.chat_requests():
        roles = [m["role"] for m in request.messages]
        assert all(a != b for a, b in zip(roles, roles[1:])), roles
        assert "system" not in roles[1:]
    assert compat(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "system", "content": "f"},
        ],
        "merge",
    ) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a\n\nb"},
        {"role": "user", "content": "f"},
    ]


# ---- resume between the two calls


@pytest.mark.e2e
def test_kill_between_the_two_calls_repeats_only_the_extraction(server, stage, tmp_path):
    def slow_extraction(request):
        if FINAL_ANSWER_PROMPT in request.messages[-1]["content"]:
            return Reply(hang=True)
        return Reply(content=f"paid reasoning {len(request.messages)}")

    server.handler = slow_extraction
    proc = stage.popen(
        "infer", "--bench", "error_recovery", "--model", "m", "--output", "infer.jsonl", "--workers", "4"
    )
    steps_file = tmp_path / "infer.jsonl.steps.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (steps_file.exists() and steps_file.read_bytes().count(b"\n") >= 4):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    paid = {r["idx"] for r in read_jsonl(steps_file) if r["step"] == "reasoning"}
    assert len(paid) >= 4 and not (tmp_path / "infer.jsonl").read_bytes().strip()
    server.handler = er_handler()
    before = len(server.chat_requests())
    run_infer(stage)
    new = server.chat_requests()[before:]
    reasoning_calls = [r for r in new if FINAL_ANSWER_PROMPT not in r.messages[-1]["content"]]
    assert len(reasoning_calls) == 30 - len(paid) and len(new) - len(reasoning_calls) == 30
    rows = {r["idx"]: r for r in read_jsonl(tmp_path / "infer.jsonl")}
    assert len(rows) == 30
    for idx in paid:  # the reasoning paid for before the kill is the one used
        assert rows[idx]["model_output"].startswith("paid reasoning")


@pytest.mark.e2e
def test_failed_extraction_is_retried_next_run_without_new_reasoning(server, stage, tmp_path):
    def failing_extraction(request):
        if FINAL_ANSWER_PROMPT in request.messages[-1]["content"]:
            return Reply.error(500, "extraction broke")
        return Reply(content="reasoning")

    server.handler = failing_extraction
    proc = run_infer(stage, "--max-samples", "2", "--max-retries", "0", check=None)
    assert proc.returncode == 3
    assert len(read_jsonl(tmp_path / "infer.jsonl.failed.jsonl")) == 6
    server.handler = er_handler()
    before = len(server.chat_requests())
    run_infer(stage, "--max-samples", "2")
    new = server.chat_requests()[before:]
    assert len(new) == 6 and all(FINAL_ANSWER_PROMPT in r.messages[-1]["content"] for r in new)


# ---- grading and metrics


@pytest.mark.parametrize(
    "task, answer, target, exact, normalized",
    [
        ("multistep_arithmetic", "-7", "-7", True, True),
        ("multistep_arithmetic", " -7.0\n", "-7", False, True),
        ("logical_deduction", "B", "(B)", False, True),
        ("logical_deduction", "(B) The green book", "(B)", False, True),
        ("tracking_shuffled_objects", "(C)", "(B)", False, False),
        ("word_sorting", "Apple banana.", "apple banana", False, True),
        ("dyck_languages", "} ) )", "} ) )", True, True),
        ("dyck_languages", "}))", "} ) )", False, True),
    ],
)
def test_exact_and_normalised_match(task, answer, target, exact, normalized):
    assert (answer == target) is exact
    assert (normalize(task, answer) == normalize(task, target)) is normalized


@pytest.mark.e2e
def test_make_pipeline_metrics_by_hand(server, env, tmp_path):
    server.handler = er_handler()
    proc = make(
        env, "infer", "judge", "score", "aggregate", "BENCH=error_recovery", f"OUTPUTS={tmp_path}", "MODEL=m", "RUNS=2"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    score = json.loads((tmp_path / "error_recovery" / "m" / "run-1" / "score.json").read_text())
    assert (score["NR_correct_rate"], score["CR_correct_rate"], score["IR_correct_rate"]) == (1.0, 1.0, 0.0)
    assert score["performance_loss"] == 1.0
    task_keys = [k for k in score if k.startswith("task_")]
    assert len(task_keys) == 15 and "task_multistep-arithmetic_IR_correct_rate" in task_keys
    assert score["counts"]["IR"] == {"correct": 0, "normalized_correct": 0, "total": 10, "missing": 0}
    assert score["stderr"] == {"NR": 0.0, "CR": 0.0, "IR": 0.0}
    after = {}
    for p in PROBLEMS:
        k = str(p["num_ground_truth_steps"] - int(p["mistake_index"]))
        after[k] = after.get(k, 0) + 1
    assert {k: v["problems"] for k, v in score["by_steps_after_mistake"].items()} == after
    infer_calls = score["cost"]["stages"]["infer"]
    assert infer_calls["calls"] == 60  # 10 problems × 3 variations × (reasoning + extraction)
    assert infer_calls["tokens"]["prompt_tokens"] > 0 and infer_calls["tokens"]["completion_tokens"] > 0
    assert "judge" not in score["cost"]["stages"]  # exact match: no API calls
    agg = json.loads((tmp_path / "error_recovery" / "aggregate.json").read_text())
    figures = agg["models"][0]["figures"]
    assert list(figures) == ["NR", "CR", "IR", "Performance loss (1 − IR/CR)", "CR − IR"]
    assert figures["CR"]["mean"] == 1.0 and figures["IR"]["std_sample"] == 0.0
    # item-level: one item per problem (its three variations), per task in a table of its own
    assert figures["CR"]["items"]["n_items"] == 10 and figures["CR"]["items"]["runs_per_item"] == [2, 2]
    assert figures["Performance loss (1 − IR/CR)"]["items"]["mean"] == 1.0
    assert figures["CR − IR"]["items"]["mean"] == 1.0 and figures["CR − IR"]["items"]["se"] == 0.0
    per_task = agg["models"][0]["extra_tables"]["Per task"]
    assert per_task["word_sorting IR"]["mean"] == 0.0 and per_task["word_sorting IR"]["items"]["n_items"] == 2


def test_stderr_and_missing_rows(tmp_path):
    b = ErrorRecovery()
    tasks = list(select(b, b.load(SAMPLE), 4))
    assert len(tasks) == 12
    judged = {}
    for t in tasks:
        ok = t.row["variation"] == "CR" or (t.row["variation"] == "IR" and t.row["problem"] == 0)
        if t.row["variation"] == "NR" and t.row["problem"] == 3:
            continue  # missing: counts as wrong
        judged[t.id] = {"correct": ok, "normalized_correct": ok, "calls": {}}
    m = score.summarize(b, tasks, judged)
    assert (m["NR_correct_rate"], m["CR_correct_rate"], m["IR_correct_rate"]) == (0.0, 1.0, 0.25)
    assert m["stderr"]["IR"] == pytest.approx((0.25 * 0.75 / 4) ** 0.5)
    assert m["performance_loss"] == 0.75
    assert m["coverage"]["missing"] == 1 and m["counts"]["NR"]["missing"] == 1
