"""What score reads of a judge file: each id's last row on the fields the figures read, of the row's own values
and types (1, 1.0 and true are equal keys in Python, not the same value), rows of the same values sharing one
dict; and the calls of the rows as cost.api_calls counts them, whatever their shapes."""

import random

import pytest

from evalpipe.client import cost
from evalpipe.stages.score import read_judged

from .conftest import write_jsonl

VALUES = ["YES", "NO", None, "", 1, 1.0, True, 0, False, 0.0, [1], {"a": 1}]
SHAPES = [
    lambda rng: {"model": "m", "usage": {"prompt_tokens": rng.randint(0, 9)}, "latency_s": rng.random()},
    lambda rng: {"model": "m", "usage": {"prompt_tokens": 3, "cached_tokens": 1}, "latency_s": None},
    lambda rng: {"model": "m", "usage": None, "latency_s": 0.5},
    lambda rng: {"model": "n", "usage": {"completion_tokens": 2}, "latency_s": 1},
    lambda rng: {"model": "m", "latency_s": 0.25},
    lambda rng: {"model": "m", "usage": {"prompt_tokens": 1}, "latency_s": 0.1, "batch": True},
    lambda rng: {"usage": {"prompt_tokens": 4}, "latency_s": 0.2},
    lambda rng: {"model": "m", "calls": {"a": {"usage": {"prompt_tokens": 5}, "latency_s": 0.3}}},
    lambda rng: {"model": "m", "usage": {}, "judge_model": "j", "judge_usage": {"prompt_tokens": 7}},
    lambda rng: {"model": "m", "usage": {"prompt_tokens": 1}, "latency_s": 0.1, "analysis_model": "a"},
    lambda rng: {"model": "m", "usage": {"invalid": {"prompt_tokens": "x"}}, "latency_s": 0.2},
    lambda rng: {"model": "m", "usage": {"prompt_tokens": 1.5, "completion_tokens": 2}, "latency_s": 0.2},
    lambda rng: {"model": "m", "usage": {"prompt_tokens": cost.MAX_TOKEN_COUNT + 1}, "latency_s": 0.2},
    lambda rng: {},
]


def own(row: dict, fields: tuple[str, ...]) -> dict:
    return {field: row[field] for field in fields if field in row}


def typed(projection: dict) -> list:
    return sorted((key, type(value).__name__, repr(value)) for key, value in projection.items())


@pytest.mark.parametrize("fields", [("prediction",), ("prediction", "judge_status"), ("a", "b", "c")])
def test_each_id_gets_its_last_rows_own_values_and_the_calls_of_every_row(tmp_path, fields):
    rng = random.Random(len(fields))
    rows = []
    for n in range(600):
        row = {"idx": f"t{rng.randrange(400)}", **rng.choice(SHAPES)(rng)}
        for field in fields[: n % (len(fields) + 1)]:
            row[field] = rng.choice(VALUES)
        rows.append(row)
    rows += [{"idx": f"same{n}", **{field: "YES" for field in fields}} for n in range(50)]
    write_jsonl(tmp_path / "judge.jsonl", rows)

    latest, ledger, read = read_judged([tmp_path / "judge.jsonl"], fields)

    last = {row["idx"]: row for row in rows}
    assert read == len(rows) and list(latest) == list(last)
    for key, row in last.items():
        assert typed(latest[key]) == typed(own(row, fields)), row
    assert len({id(latest[f"same{n}"]) for n in range(50)}) == 1  # rows of the same values share one dict
    by_row = cost.Ledger()
    for row in rows:
        for call in cost.api_calls(row):
            by_row.add(*call)
    prices = cost.load_prices()
    assert ledger.summary(prices) == by_row.summary(prices)
