"""Projections: each row's projection on the fields, as a handful of shared dicts, equal to the row's own values
and of the same types (1, 1.0 and true are equal keys in Python, not the same value)."""

import random

import pytest

from evalpipe.projections import Projections

VALUES = ["YES", "NO", None, "", 1, 1.0, True, 0, False, 0.0, [1], {"a": 1}]


def own(row: dict, fields: tuple[str, ...]) -> dict:
    return {field: row[field] for field in fields if field in row}


def typed(projection: dict) -> list:
    return sorted((key, type(value).__name__, repr(value)) for key, value in projection.items())


@pytest.mark.parametrize("fields", [("prediction",), ("prediction", "judge_status"), ("a", "b", "c")])
def test_each_row_gets_its_own_values_in_a_shared_projection(fields):
    rng = random.Random(len(fields))
    projections = Projections(fields)
    seen: list[dict] = []
    for chunk in range(60):
        plain = chunk % 3 == 0  # every field there and of a plain type: the quick path
        full = chunk % 3 == 1  # every field there, of any type
        rows = []
        for _ in range(rng.randint(0, 40)):
            row = {"other": rng.random()}
            for field in fields:
                if plain:
                    row[field] = rng.choice(["YES", "NO", None])
                elif full or rng.random() < 0.8:
                    row[field] = rng.choice(VALUES)
            rows.append(row)
        codes, first_seen = projections.codes(rows)
        seen += first_seen
        assert seen == projections.table
        for row, code in zip(rows, codes):
            assert typed(projections.table[code]) == typed(own(row, fields)), row
    shared = 0
    for _ in range(20):  # rows of projections seen before take no new ones
        codes, first_seen = projections.codes([{field: "YES" for field in fields}] * 50)
        shared += len(first_seen)
    assert shared <= 1


def test_without_fields_each_row_is_its_own_projection():
    projections = Projections(None)
    rows = [{"a": 1}, {"a": 1}]
    codes, first_seen = projections.codes(rows)
    assert list(codes) == [0, 1] and first_seen == rows and projections.shared([{"b": 2}]) == [{"b": 2}]
