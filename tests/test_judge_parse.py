import json

from evalpipe.benchmarks.clbench import Verdict, parse_error_types, parse_judge_reply, rubrics_text

GOOD = {"Grading Rationale": "all met", "List of Requirement Satisfaction Status": ["yes", "yes"], "Overall Score": 1}


def test_plain_and_outer_fenced_json_are_ok():
    for text in (json.dumps(GOOD), "```json\n" + json.dumps(GOOD) + "\n```", "```\n" + json.dumps(GOOD) + "```"):
        v = parse_judge_reply(text, 2)
        assert isinstance(v, Verdict) and v.how == "json" and v.score == 1 and v.notes == []


def test_fenced_json_inside_prose_is_salvaged():
    text = "Here is my grading:\n```json\n" + json.dumps({**GOOD, "Overall Score": 0}) + "\n```\nThanks."
    v = parse_judge_reply(text, 2)
    assert (v.how, v.score) == ("fenced_json", 0)


def test_json_inside_prose_is_salvaged_and_the_last_verdict_wins():
    first, second = json.dumps({**GOOD, "Overall Score": 1}), json.dumps({**GOOD, "Overall Score": 0})
    text = f"First thought: {first} but on reflection {second}"
    v = parse_judge_reply(text, 2)
    assert (v.how, v.score) == ("json_in_prose", 0)


def test_truncated_reply_with_a_stated_score_is_salvaged():
    text = '{"Overall Score": 0, "Grading Rationale": "Rubric 1 is met but rubric 2 is not because the ans'
    v = parse_judge_reply(text, 2)
    assert (v.how, v.score) == ("score_only", 0)
    assert v.rationale.startswith("Rubric 1 is met")


def test_truncated_reply_without_score_is_a_failure():
    text = '{"Grading Rationale": "Rubric 1 is met, rubric 2 is'
    assert isinstance(parse_judge_reply(text, 2), str)


def test_scores_other_than_0_or_1_are_rejected():
    for bad in (2, 0.5, "yes", True, None):
        reason = parse_judge_reply(json.dumps({**GOOD, "Overall Score": bad}), 2)
        assert isinstance(reason, str) and "0 or 1" in reason
    assert parse_judge_reply(json.dumps({**GOOD, "Overall Score": "1"}), 2).score == 1


def test_status_count_mismatch_and_inconsistency_are_recorded():
    v = parse_judge_reply(json.dumps({**GOOD, "List of Requirement Satisfaction Status": ["yes", "no", "YES"]}), 2)
    assert v.score == 1
    assert "3 statuses for 2 rubrics" in v.notes
    assert "score 1 although a rubric is marked no" in v.notes
    assert v.statuses == ["yes", "no", "yes"]


def test_empty_and_prose_only_replies_fail():
    assert parse_judge_reply("", 1) == "empty judge reply"
    assert isinstance(parse_judge_reply("The answer looks good to me. Score: 1", 1), str)


def test_rubrics_become_a_numbered_checklist():
    assert rubrics_text(["a", {"rubric_criteria": " b "}, "", {"other": 1}, "c"]) == "1. a\n2. b\n3. c"
    assert rubrics_text([]) == "No specific rubrics provided."


# Verdicts that are not 0 or 1, in every place a score can be read from (issue 38, row 6)
NOT_A_VERDICT = ("1/2", "1 of 3 requirements met", "1e-9", "1e400", "1e-400", "0.5", "1.00000000000000001", "true")


def test_a_score_that_is_not_exactly_0_or_1_is_never_read_as_one():
    for stated in NOT_A_VERDICT:
        body = '"Grading Rationale": "x", "List of Requirement Satisfaction Status": ["yes", "yes"], "Overall Score": '
        for text in (
            "{" + body + stated + "}",  # the whole reply
            "{" + body + stated,  # a reply that breaks off after it
            f"Here it is:\n```json\n{{{body}{stated}}}\n```",  # fenced, in prose
            "{" + body + json.dumps(stated) + "}",  # as a string
        ):
            reason = parse_judge_reply(text, 2)
            assert isinstance(reason, str) and "0 or 1" in reason, (text, reason)
    # what the contract allows stays read, salvaged or not
    for text, score in (('{"Overall Score": 1.0}', 1), ('{"Grading Rationale": "cut', None)):
        v = parse_judge_reply(text, 0)
        assert (v.score if isinstance(v, Verdict) else None) == score
    assert parse_judge_reply('{"Grading Rationale": "ok", "Overall Score": 1\n', 0).how == "score_only"
    assert parse_judge_reply('{"Grading Rationale": "ok", "Overall Score": "0" }', 0).score == 0


def test_deep_or_unclosed_nesting_is_a_parse_failure_not_a_recursion_error():
    deep = "[" * 5000 + "]" * 5000
    for text in (
        "[" * 3000,
        '{"a": ' * 3000,
        '{"Overall Score": 1, "x": ' + deep + "}",
        'Sure: {"Overall Score": 1, "x": ' + deep + "}",
        '{"Overall Score": 1, "x": ' + "[" * 40 + "]" * 40 + "}",  # deeper than a verdict can be: not salvaged
    ):
        reason = parse_judge_reply(text, 1)
        assert isinstance(reason, str) and "nested deeper than" in reason
        assert "nested deeper than" in parse_error_types(text)


def test_a_stated_score_reads_the_same_in_a_whole_reply_and_in_one_cut_short():
    for stated, score in (("1.00", 1), ('"1.0"', 1), ("0", 0), ('"0"', 0), ("1e0", 1)):
        body = '{"Grading Rationale": "x", "Overall Score": ' + stated
        assert parse_judge_reply(body + "}", 0).score == score
        cut = parse_judge_reply(body + "\n", 0)
        assert (cut.how, cut.score) == ("score_only", score), stated


def test_an_integer_past_python_s_digit_limit_is_a_parse_failure_not_a_crash():
    huge = "1" * 5000
    assert "not JSON" in parse_judge_reply('{"n": ' + huge + "}", 2)
    verdict = parse_judge_reply('{"Overall Score": 0, "n": ' + huge + "}", 2)
    assert isinstance(verdict, Verdict) and (verdict.how, verdict.score) == ("score_only", 0)  # as if cut short
    assert isinstance(parse_error_types('{"Error Types": ["Refusal"], "Reason": "x", "n": ' + huge + "}"), str)


def test_an_analysis_in_prose_is_read_last_stated_first_even_after_a_fenced_one():
    first = json.dumps({"Error Types": ["Refusal"], "Reason": "first"})
    second = json.dumps({"Error Types": ["Format Error"], "Reason": "second"})
    assert parse_error_types(f"```json\n{first}\n```\nActually: {second}") == (
        ["Format Error"],
        "second",
        "json_in_prose",
    )
