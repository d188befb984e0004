"""A figure declared once: its run value written into score.json at its key, and read back for the leaderboard."""

from evalpipe.results import figures
from evalpipe.results.items import ItemFigure

COLUMNS = {
    "keys": ["p0", "p1", "p2", "p3"],
    "clusters": None,
    "groups": {"task": ["word_sorting", "dyck_languages", "word_sorting", "dyck_languages"]},
    "columns": {"a": [1, 0, None, 1], "b": [1, 1, 1, None], "n": [1, 1, 1, 0]},
}
DECLARED = (
    ItemFigure("A", "a", key="a_rate"),
    ItemFigure("A per n", "a", "n", key="nested/a_per_n"),
    ItemFigure("A − B", "a", run=lambda m: m["a_rate"] - m["b_rate"]),  # not kept: made when shown
    ItemFigure("B", "b", key="b_rate"),
    ItemFigure("{} A", "a", by="task", table="Per task", key="task_{-}_a"),
    ItemFigure("{} B", "b", by="task", table="Per task", key="task_{-}_b"),
    ItemFigure("{}", "b", by="task", table="B by task", key="by_task/{}/b"),
)


def test_run_values_are_ratios_of_column_sums_at_their_keys():
    metrics = figures.write(DECLARED, COLUMNS, {"benchmark": "x", "nested": {"count": 4}})
    assert metrics["a_rate"] == 2 / 4 and metrics["b_rate"] == 3 / 4  # None counts as 0, over all four items
    assert metrics["nested"] == {"count": 4, "a_per_n": 2 / 3}  # into the object the details made
    assert "A − B" not in str(metrics)
    assert metrics["task_word-sorting_a"] == 1 / 2 and metrics["task_dyck-languages_a"] == 1 / 2
    assert metrics["task_word-sorting_b"] == 1.0 and metrics["task_dyck-languages_b"] == 1 / 2
    assert metrics["by_task"] == {"word_sorting": {"b": 1.0}, "dyck_languages": {"b": 1 / 2}}
    empty = figures.write(
        (ItemFigure("R", "a", "n", key="r"),), {**COLUMNS, "columns": {"a": [0] * 4, "n": [0] * 4}}, {}
    )
    assert empty == {"r": 0.0}  # 0/0


def test_tables_read_the_values_back_in_declaration_order():
    shown = figures.tables(DECLARED, figures.write(DECLARED, COLUMNS, {}))
    assert list(shown) == [figures.HEADLINE, "Per task", "B by task"]
    assert shown[figures.HEADLINE] == {"A": 0.5, "A per n": 2 / 3, "A − B": 0.5 - 0.75, "B": 0.75}
    # one group value at a time, its figures together; "{-}" read back as the group value
    assert list(shown["Per task"]) == ["word_sorting A", "word_sorting B", "dyck_languages A", "dyck_languages B"]
    assert shown["Per task"]["word_sorting B"] == 1.0 and shown["B by task"] == {
        "word_sorting": 1.0,
        "dyck_languages": 0.5,
    }
    assert figures.headline(DECLARED[:2], {"a_rate": 0.25}) == {"A": 0.25, "A per n": None}  # a key it lacks: None
