"""Item-level error bars: the worked example of research/stats.md §7 to 6 decimals, and the edge cases of §8.3.

The example: 12 items in 4 clusters of sizes 2, 3, 3, 4, two models, three runs each, 0/1 scores.
Expected values were computed by hand from the formulas (Miller 2024, eq. 1, 4 and Appendix A;
inspect_ai's CR1); they are not read back from our code.
"""

import math

import orjson
import pytest

from evalpipe.results import items, render, stats
from evalpipe.results.items import ItemFigure, ModelItems

A = [(1, 1, 1), (1, 1, 0), (1, 1, 1), (1, 0, 1), (1, 1, 1), (0, 0, 1)]
A += [(0, 0, 0), (0, 1, 0), (1, 1, 0), (0, 1, 1), (1, 0, 0), (0, 0, 0)]
B = [(1, 1, 1), (1, 0, 1), (1, 0, 1), (0, 0, 1), (1, 1, 0), (0, 1, 1)]
B += [(0, 0, 1), (0, 1, 0), (0, 1, 0), (0, 0, 1), (0, 0, 0), (0, 0, 0)]
CLUSTERS = ["c1", "c1", "c2", "c2", "c2", "c3", "c3", "c3", "c4", "c4", "c4", "c4"]
OVERALL = ItemFigure("Overall", "score")


def runs(scores, clusters=CLUSTERS, keys=None):
    keys = keys or list(range(len(scores)))
    return [
        {"keys": list(keys), "clusters": clusters, "groups": {}, "columns": {"score": [s[k] for s in scores]}}
        for k in range(3)
    ]


def close(value, expected, places=6):
    return round(value, places) == round(expected, places)


def test_single_model_naive_and_clustered_standard_errors():
    a = items.estimate(ModelItems(runs(A), "context_id"), OVERALL, None, None)
    b = items.estimate(ModelItems(runs(B), "context_id"), OVERALL, None, None)
    assert close(a["mean"], 20 / 36) and close(b["mean"], 16 / 36)
    assert close(a["se_naive"], 0.103258) and close(b["se_naive"], 0.085412)
    assert close(a["se"], 0.155673) and close(b["se"], 0.134392)  # CR1
    assert a["n_items"] == 12 and a["n_clusters"] == 4 and a["runs_per_item"] == [3, 3]
    assert a["se_method"] == "cr1:context_id"
    # 12 items: a small sample, so the shown interval is Wilson's; the t(C − 1) one is kept beside it
    assert a["small_sample"] and a["ci_method"] == "wilson"
    low, high = a["ci95_from_se"]
    assert close(low, 0.0601, 4) and close(high, 1.0510, 4)
    assert close(b["ci95_from_se"][0], 0.0167, 4) and close(b["ci95_from_se"][1], 0.8721, 4)
    # the run-to-run std the within-item spread predicts (F12)
    assert close(a["run_std_predicted"], 0.127294) and close(b["run_std_predicted"], 0.144338)


def test_cr0_and_the_naive_interval_from_the_building_blocks():
    ratio = stats.RatioEstimate([sum(s) / 3 for s in A], None, CLUSTERS, [1] * len(A))
    cr1, c, _ = ratio.se_df()
    cr0 = cr1 * math.sqrt((c - 1) / c)  # CR1 is CR0 times sqrt(C / (C − 1))
    assert close(cr0, 0.134817)  # CR0, Miller Appendix A
    naive = ratio.se_naive()
    assert close(math.sqrt(cr0**2 + naive**2 / 12), 0.138073)  # Miller eq. 4
    t11 = stats.t_quantile(0.975, 11)
    assert close(ratio.value - t11 * naive, 0.3283, 4) and close(ratio.value + t11 * naive, 0.7828, 4)


def test_paired_comparison_clustered():
    mine, theirs = ModelItems(runs(A), "context_id"), ModelItems(runs(B), "context_id")
    c = items.compare(mine, theirs, OVERALL, "Overall", None)
    assert close(c["diff"], 4 / 36)
    assert close(c["se"], 0.129188)
    assert close(c["ci95"][0], -0.3000, 4) and close(c["ci95"][1], 0.5222, 4)
    assert close(c["correlation"], 0.699913)
    assert c["n_items"] == 12 and c["n_clusters"] == 4 and c["n_left_out"] == 0 and c["ci_method"] == "t(df=3)"
    assert close(c["p_value"], stats.t_two_sided_p(c["diff"] / c["se"], 3))
    # unclustered: the naive paired SE, which the single-model SEs and their correlation also give
    naive = items.compare(ModelItems(runs(A, None), None), ModelItems(runs(B, None), None), OVERALL, "Overall", None)
    assert close(naive["se"], 0.074911)
    assert close(math.sqrt(0.103258**2 + 0.085412**2 - 2 * 0.103258 * 0.085412 * 0.699913), 0.074911)


def coin_flip_runs():
    gold = ["YES"] * 6 + ["NO"] * 6
    predictions = ["YYYNYY" + "NYNNNN", "YYNNYY" + "NYYNN-", "YYYNYN" + "NNNNYN"]
    out = []
    for run in predictions:
        cols = {k: [] for k in ("tp", "yes", "positive", "correct", "f1_num", "f1_den")}
        for g, p in zip(gold, run):
            pred = {"Y": "YES", "N": "NO", "-": None}[p]
            tp, yes, pos = int(pred == "YES" and g == "YES"), int(pred == "YES"), int(pred is not None and g == "YES")
            for k, v in zip(cols, (tp, yes, pos, int(pred == g), 2 * tp, yes + pos)):
                cols[k].append(v)
        out.append({"keys": list(range(12)), "clusters": None, "groups": {}, "columns": cols})
    return out


def test_coin_flip_ratios_by_the_delta_method():
    model = ModelItems(coin_flip_runs(), None)
    f1 = items.estimate(model, ItemFigure("F1", "f1_num", "f1_den", proportion=False), None, None)
    assert close(f1["mean"], 26 / 35) and close(f1["se"], 0.117798)
    assert f1["ci_method"] == "z" and f1["se_method"] == "delta"
    assert close(f1["ci95"][0], 0.5120, 4) and close(f1["ci95"][1], 0.9737, 4)
    precision = items.estimate(model, ItemFigure("Precision", "tp", "yes"), None, None)
    recall = items.estimate(model, ItemFigure("Recall", "tp", "positive"), None, None)
    assert close(precision["mean"], 0.764706) and close(precision["se"], 0.143383)
    assert close(recall["mean"], 0.722222) and close(recall["se"], 0.151683)
    accuracy = items.estimate(model, ItemFigure("Accuracy", "correct"), None, None)
    yes = items.estimate(model, ItemFigure("YES ratio", "yes"), None, None)
    assert close(accuracy["mean"], 0.722222) and close(accuracy["se"], 0.090205)
    assert close(yes["mean"], 0.472222) and close(yes["se"], 0.119330)


def test_intervals_are_shown_within_the_values_a_figure_can_take():
    """F1 is no proportion (no Wilson interval) but lies in [0, 1]: its interval is shown clipped there, as the
    footnote says; a loss (CR − IR)/CR can go below 0 but not above 1; aggregate.json keeps the raw interval."""
    f1 = {"mean": 0.9, "ci95": [0.2, 1.03], "proportion": False, "bounds": [0.0, 1.0]}
    assert items.display_interval(f1) == (0.2, 1.0)
    assert render.items_cell({**f1, "se": 0.066}) == "90.0 (6.6) [20.0, 100.0]"
    loss = {"mean": 0.2, "ci95": [-0.3, 1.2], "proportion": False, "bounds": [None, 1.0]}
    assert items.display_interval(loss) == (-0.3, 1.0)
    old = {"mean": 0.9, "ci95": [-0.1, 1.1], "proportion": True}  # estimates written before bounds were
    assert items.display_interval(old) == (0.0, 1.0)
    figure = items.estimate(ModelItems(coin_flip_runs(), None), ItemFigure("F1", "f1_num", "f1_den", False), None, None)
    assert figure["bounds"] == [0.0, 1.0]


def test_performance_loss_uses_the_paired_delta_method():
    loss = ItemFigure("loss", "cr_minus_ir", "cr", proportion=False)

    def columns(clusters):
        return [
            {
                "keys": list(range(12)),
                "clusters": clusters,
                "groups": {},
                "columns": {"cr": [a[k] for a in A], "cr_minus_ir": [a[k] - b[k] for a, b in zip(A, B)]},
            }
            for k in range(3)
        ]

    naive = items.estimate(ModelItems(columns(None), None), loss, None, None)
    assert close(naive["mean"], 0.2) and close(naive["se"], 0.117241)
    assert close(naive["ci95"][0], -0.0298, 4) and close(naive["ci95"][1], 0.4298, 4)
    clustered = items.estimate(ModelItems(columns(CLUSTERS), "c"), loss, None, None)
    assert close(clustered["se"], 0.205913)
    assert close(clustered["ci95"][0], -0.4553, 4) and close(clustered["ci95"][1], 0.8553, 4)
    # the reference eval's error bar treats CR and IR as independent: about 1.8 times too wide here
    cr, ir, se_cr, se_ir = 20 / 36, 16 / 36, 0.103258, 0.085412
    independent = (ir / cr) * math.sqrt((se_cr / cr) ** 2 + (se_ir / ir) ** 2)
    assert close(independent, 0.213882, 5) and 1.8 < independent / naive["se"] < 1.9


def test_wilson_interval():
    assert [round(x, 4) for x in stats.wilson(7, 12)] == [0.3195, 0.8067]
    assert [round(x, 4) for x in stats.wilson(4, 12)] == [0.1381, 0.6094]
    assert stats.wilson(0, 0) is None


def test_singleton_clusters_give_the_naive_standard_error():
    scores = [tuple(int((i * 7 + k) % 5 < 2) for k in range(3)) for i in range(30)]
    keyed = items.estimate(ModelItems(runs(scores, [f"t{i}" for i in range(30)]), "id"), OVERALL, None, None)
    plain = items.estimate(ModelItems(runs(scores, None), None), OVERALL, None, None)
    # CR1 with singleton clusters: sqrt(n/(n−1)) · sqrt(Σe²)/n = the naive SE exactly
    assert keyed["se"] == pytest.approx(plain["se"], rel=1e-12) and plain["se"] > 0


def test_one_cluster_has_no_standard_error_and_no_nan():
    est = items.estimate(ModelItems(runs(A, ["same"] * 12), "c"), OVERALL, None, None)
    assert est["se"] is None and est["n_clusters"] == 1
    assert est["ci_method"] == "wilson" and all(0 <= x <= 1 for x in est["ci95"])
    assert not any(isinstance(v, float) and math.isnan(v) for v in est.values())


def test_all_equal_scores_give_a_zero_standard_error_and_the_wilson_fallback():
    est = items.estimate(ModelItems(runs([(1, 1, 1)] * 150, None), None), OVERALL, None, None)
    assert est["mean"] == 1.0 and est["se"] == 0.0 and est["se_naive"] == 0.0
    assert est["small_sample"] and est["ci_method"] == "wilson"
    low, high = est["ci95"]
    assert high == 1.0 and 0.97 < low < 1.0
    assert "mde" not in est and "mde_runs" not in est  # no spread: nothing to say about detectable gaps


def test_a_task_missing_from_some_runs_uses_the_runs_that_graded_it():
    scored = runs(A, None)
    scored[1]["columns"]["score"][0] = None  # item 0 not graded in run 2
    del scored[2]["keys"][5], scored[2]["columns"]["score"][5]  # item 5 absent from run 3's file
    model = ModelItems(scored, None)
    values = model.values("score", None)
    a, _, graded = zip(*(values[code] for code in model.codes))
    assert graded[0] == 2 and graded[5] == 2 and graded.count(3) == 10
    assert a[0] == 1.0 and a[5] == 0.0  # item 5: runs 1 and 2 scored 0, 0 (run 3's 1 is gone)
    est = items.estimate(model, OVERALL, None, None)
    assert est["runs_per_item"] == [2, 3]
    expected = [sum(s) / 3 for s in A]
    expected[0], expected[5] = 1.0, 0.0
    assert close(est["mean"], sum(expected) / 12)


def test_equal_runs_per_task_make_the_item_mean_the_mean_of_run_means():
    est = items.estimate(ModelItems(runs(B), "c"), OVERALL, None, None)
    run_means = [sum(s[k] for s in B) / 12 for k in range(3)]
    assert close(est["mean"], stats.mean(run_means))
    assert [round(r, 6) for r in run_means] == [0.333333, 0.416667, 0.583333]


def test_a_comparison_leaves_out_tasks_one_model_lacks_and_counts_them():
    mine = runs(A, None)
    theirs = runs(B, None, keys=list(range(2, 14)))  # baseline graded tasks 2..13: 0 and 1 missing, 12, 13 extra
    c = items.compare(ModelItems(mine, None), ModelItems(theirs, None), OVERALL, "Overall", None)
    assert c["n_items"] == 10 and c["n_left_out"] == 4
    # task 2 of the model is paired with the baseline's first row, and so on
    diffs = [sum(A[i]) / 3 - sum(B[i - 2]) / 3 for i in range(2, 12)]
    assert close(c["diff"], sum(diffs) / 10)


def test_groups_give_one_figure_per_value():
    scored = runs(A)
    for r in scored:
        r["groups"] = {"category": ["x"] * 5 + ["y"] * 7}
    model = ModelItems(scored, "c")
    assert list(model.subsets(ItemFigure("{} rate", "score", by="category"))) == [("x rate", "x"), ("y rate", "y")]
    x = items.estimate(model, ItemFigure("{}", "score", by="category"), "x", None)
    assert x["n_items"] == 5 and x["n_clusters"] == 2 and close(x["mean"], sum(sum(s) for s in A[:5]) / 15)


def test_the_bootstrap_is_recorded_and_repeatable():
    model = ModelItems(runs(A), "context_id")
    first = items.estimate(model, OVERALL, None, items.Bootstrap(500, 7))["bootstrap"]
    again = items.estimate(ModelItems(runs(A), "context_id"), OVERALL, None, items.Bootstrap(500, 7))["bootstrap"]
    assert first == again
    assert first["replicates"] == 500 and first["seed"] == 7 and first["method"] == "percentile"
    assert first["resampled"] == "clusters"
    low, high = first["ci95"]
    assert 0 <= low < 20 / 36 < high <= 1
    other = items.estimate(model, OVERALL, None, items.Bootstrap(500, 8))["bootstrap"]
    assert other["se"] != first["se"]


def test_minimum_detectable_difference():
    # Miller §5: ω² = 1/9, σ² = 0, n = 969 → δ ≈ 0.03 (80% power, two-sided α 0.05)
    assert close(stats.minimum_detectable(math.sqrt((1 / 9) / 969)), 0.03, 4)
    # and n = 198 with K = 1, σ² = 1/6 each: 13.27 points (his text rounds to 13.2)
    assert close(stats.minimum_detectable(math.sqrt((1 / 9 + 2 / 6) / 198)), 0.1327, 4)


def test_t_distribution():
    for df, t in ((1, 12.706205), (2, 4.302653), (3, 3.182446), (4, 2.776445), (11, 2.200985), (29, 2.045230)):
        assert close(stats.t_quantile(0.975, df), t)
    assert close(stats.t_quantile(0.975, 499), 1.964729)
    assert close(stats.t_two_sided_p(stats.t_quantile(0.975, 7), 7), 0.05, 9)
    assert close(stats.t_two_sided_p(0.0, 5), 1.0)


def test_counting_identical_items_gives_what_listing_them_gives():
    """Items are counted by profile; the figures must equal those over the items one by one."""
    import random

    rng = random.Random(3)
    scores = [tuple(int(rng.random() < 0.3 + 0.4 * (i % 3) / 2) for _ in range(3)) for i in range(500)]
    clusters = [f"c{i // 7}" for i in range(500)]
    for keys in (clusters, None):
        est = items.estimate(ModelItems(runs(scores, keys), "c" if keys else None), OVERALL, None, None)
        direct = stats.RatioEstimate([sum(s) / 3 for s in scores], None, keys, [1] * len(scores))
        assert est["mean"] == pytest.approx(direct.value, abs=1e-12)
        expected = direct.se_df()[0]
        assert est["se"] == pytest.approx(expected, rel=1e-9)
    model = ModelItems(runs(scores, None), None)
    assert len(model.profiles) <= 8  # three 0/1 runs: at most 2³ distinct items


@pytest.mark.parametrize(
    "columns",
    [
        {"keys": [], "clusters": None, "groups": {}, "columns": {}},
        {"keys": ["a", 2], "clusters": None, "groups": {}, "columns": {"score": [1, None]}},
        {
            "keys": ["t1", "t2", "t3"],
            "clusters": ["c1", "c1", "c2"],
            "groups": {"category": ["x", "y", "x"], 'é "q"': [None, 1.5, "z"]},
            "columns": {"num": [1, 0, None], "den": [1, 1, 0], "ünï": [0.25, None, 1]},
        },
    ],
)
def test_items_json_written_in_pieces_is_the_plain_dump(columns, tmp_path):
    from evalpipe.store import jsonl

    path = tmp_path / "items.json"
    jsonl.atomic_write(path, items.encoded("bench", "ctx", columns))
    assert path.read_bytes() == orjson.dumps(
        {"format": items.FORMAT, "benchmark": "bench", "cluster": "ctx", **columns}
    )
    assert items.read(path) == ("ctx", columns)
