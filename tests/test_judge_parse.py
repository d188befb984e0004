import json

from evalpipe.benchmarks.clbench import Verdict, parse_judge_reply, rubrics_text

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
