"""score's projected rows: each row's values on the fields, as a handful of shared dicts, equal to the row's own
values and of the same types (1, 1.0 and true are equal keys in Python, not the same value)."""

import random

import pytest

from evalpipe.client import cost
from evalpipe.stages.score_input import Shared, add_calls

VALUES = ["YES", "NO", None, "", 1, 1.0, True, 0, False, 0.0, [1], {"a": 1}]


def own(row: dict, fields: tuple[str, ...]) -> dict:
    return {field: row[field] for field in fields if field in row}


def typed(projection: dict) -> list:
    return sorted((key, type(value).__name__, repr(value)) for key, value in projection.items())


@pytest.mark.parametrize("fields", [("prediction",), ("prediction", "judge_status"), ("a", "b", "c")])
def test_each_row_gets_its_own_values_in_a_shared_projection(fields):
    rng = random.Random(len(fields))
    shared = Shared(fields)
    for block in range(80):
        plain = block % 4 in (0, 3)  # each field a string or None: the quick path
        full = block % 4 == 1  # every field there, of any type
        # the later fields (or all) in no row of the block, as the served-model fields in most runs
        had = fields[: block % len(fields)] if block % 4 == 3 else fields
        rows = []
        for _ in range(rng.randint(0, 40)):
            row = {"other": rng.random()}
            for field in had:
                if plain:
                    row[field] = rng.choice(["YES", "NO", None])
                elif full or rng.random() < 0.8:
                    row[field] = rng.choice(VALUES)
            rows.append(row)
        for row, projected in zip(rows, shared(rows), strict=True):
            assert typed(projected) == typed(own(row, fields)), row
    distinct = {id(projected) for _ in range(20) for projected in shared([{field: "YES" for field in fields}] * 50)}
    assert len(distinct) == 1  # rows of one projection share one dict


def test_without_fields_each_row_is_its_own_projection():
    rows = [{"a": 1}, {"a": 1}]
    assert Shared(None)(rows) is rows


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 10, "completion_tokens": 2},
        {"invalid": {"prompt_tokens": "x"}},
        {"prompt_tokens": 1.5, "completion_tokens": 2},
        {"prompt_tokens": 0.0},
        {"prompt_tokens": -1},
        {"prompt_tokens": True},
        {"prompt_tokens": cost.MAX_TOKEN_COUNT + 1},
        {},
    ],
)
def test_a_block_of_calls_counts_as_its_calls_do_one_by_one(usage):
    """score adds a block of one-call rows at once: a usage that is not token counts is left out as the ledger
    leaves it out call by call (the good calls' tokens kept), never summed in or taking the block with it."""
    rows = [{"model": "m", "usage": {"prompt_tokens": 10, "completion_tokens": 2}, "latency_s": 0.1}] * 3
    rows = [*rows, {"model": "m", "usage": usage, "latency_s": 0.2}]
    at_once, one_by_one = cost.Ledger(), cost.Ledger()
    add_calls(at_once, rows)
    for row in rows:
        for call in cost.api_calls(row):
            one_by_one.add(*call)
    got, want = at_once.stages["infer"], one_by_one.stages["infer"]
    assert (got.calls, got.invalid_usage, got.usages, list(got.latencies)) == (
        want.calls,
        want.invalid_usage,
        want.usages,
        list(want.latencies),
    )
