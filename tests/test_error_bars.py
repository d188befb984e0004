"""Item-level error bars end to end: three runs of two models on a clustered CL-bench-shaped task set,
through the real stages against the loopback server, checked against values computed here from the
judge rows with plain loops (no evalpipe statistics code)."""

import hashlib
import json
import math
import random
import statistics
import subprocess
import sys
import threading

import pytest

from evalpipe.devtools.testserver import Reply

from .conftest import ROOT, SAMPLE, is_judge, judge_json, read_jsonl, rubric_count, write_jsonl

pytestmark = pytest.mark.e2e

T_975 = {24: 2.063899, 25: 2.059539}  # Student's t quantiles (tables) for C − 1 degrees of freedom
Z_975 = 1.959964


def clustered_dataset(path, tasks=120, contexts=25):
    """Tasks spread unevenly over contexts; each context has one category and its own difficulty."""
    base = read_jsonl(SAMPLE)
    rng = random.Random(5)
    rows = []
    for i in range(tasks):
        c = min(contexts - 1, int(contexts * (i / tasks) ** 1.3))  # early contexts hold fewer tasks
        row = base[i % len(base)]
        messages = [{"role": "system", "content": f"context {c}: " + row["messages"][0]["content"][:200]}]
        messages.append({"role": "user", "content": f"task {i}: {rng.random()}"})
        category = "Rule System Application" if c % 2 else "Domain Knowledge Reasoning"
        rows.append(
            {
                **row,
                "messages": messages,
                "metadata": {"task_id": f"t{i:03d}", "context_id": f"ctx-{c}", "context_category": category},
            }
        )
    write_jsonl(path, rows)
    return rows


def difficulty_handler():
    """The answer carries the model and the context; the judge passes it with a probability set by both."""
    rng, lock = random.Random(11), threading.Lock()

    def handler(request):
        prompt = request.last_content
        if is_judge(request):
            answer = prompt.split("<<<RESPONSE\n", 1)[1].split("\nRESPONSE>>>", 1)[0]
            model, context = answer.split("|")[:2]
            ease = int(hashlib.sha256(context.encode()).hexdigest(), 16) % 100 / 100
            p = 0.15 + 0.7 * ease + (0.1 if model == "strong" else -0.1)
            with lock:
                score = int(rng.random() < p)
            return Reply(content=judge_json(score, rubric_count(prompt)))
        context = request.messages[0]["content"].split(":", 1)[0]
        return Reply(content=f"{request.body['model']}|{context}|{request.number}")

    return handler


def run_stages(env, out, data, model):
    words = ["infer", "judge", "score", f"MODEL={model}", "JUDGE_MODEL=j", "RUNS=3", f"DATA={data}", f"OUTPUTS={out}"]
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe.pipeline", *words, "WORKERS=8"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def item_means(out, model, rows):
    """task id → mean score over the three runs, from the judge rows themselves."""
    scores = {r["metadata"]["task_id"]: [] for r in rows}
    for k in (1, 2, 3):
        for r in read_jsonl(out / "clbench" / model / f"run-{k}" / "judge.jsonl"):
            scores[r["idx"]].append(r["score"])
    assert all(len(s) == 3 for s in scores.values())
    return {t: sum(s) / 3 for t, s in scores.items()}


def cr1(values, clusters):
    n, mean = len(values), sum(values) / len(values)
    sums = {}
    for v, c in zip(values, clusters):
        sums[c] = sums.get(c, 0.0) + (v - mean)
    return math.sqrt(len(sums) / (len(sums) - 1) * sum(e * e for e in sums.values())) / n, len(sums)


def test_aggregate_reports_clustered_item_level_figures_and_paired_comparisons(server, env, tmp_path):
    server.handler = difficulty_handler()
    data, out = tmp_path / "clustered.jsonl", tmp_path / "out"
    rows = clustered_dataset(data)
    for model in ("strong", "weak"):
        run_stages(env, out, data, model)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "aggregate.py"), "--outputs-dir", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "clbench" / "aggregate.json").read_text())
    models = {m["model"]: m for m in summary["models"]}
    ids = [r["metadata"]["task_id"] for r in rows]
    clusters = [r["metadata"]["context_id"] for r in rows]
    x = {m: item_means(out, m, rows) for m in models}

    for model, entry in models.items():
        values = [x[model][t] for t in ids]
        got = entry["figures"]["Overall"]["items"]
        mean = sum(values) / len(values)
        naive = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
        se, c = cr1(values, clusters)
        assert c == 25 and got["n_clusters"] == 25 and got["n_items"] == 120 and got["runs_per_item"] == [3, 3]
        assert got["mean"] == pytest.approx(mean, abs=1e-12)
        assert got["se_naive"] == pytest.approx(naive, rel=1e-9) and got["se"] == pytest.approx(se, rel=1e-9)
        assert got["se_method"] == "cr1:context_id" and got["ci_method"] == "t(df=24)"
        assert got["ci95"] == pytest.approx([mean - T_975[24] * se, mean + T_975[24] * se], abs=1e-6)
        # the mean of the three run means equals the item-level mean (every task has all runs)
        assert entry["figures"]["Overall"]["mean"] == pytest.approx(mean, abs=1e-12)
        assert got["mde"] == pytest.approx((Z_975 + 0.841621) * math.sqrt(2) * se, rel=1e-5)
        # a category: its own tasks and clusters, fewer than 100 tasks, so Wilson's interval on the
        # effective sample size (tasks / design effect)
        cat = [i for i, r in enumerate(rows) if r["metadata"]["context_category"] == "Rule System Application"]
        sub = [values[i] for i in cat]
        sub_se, sub_c = cr1(sub, [clusters[i] for i in cat])
        got_cat = entry["figures"]["Rule System Application"]["items"]
        assert got_cat["n_items"] == len(cat) < 100 and got_cat["n_clusters"] == sub_c
        assert got_cat["se"] == pytest.approx(sub_se, rel=1e-9)
        assert got_cat["small_sample"] and got_cat["ci_method"] == "wilson"
        sub_mean = sum(sub) / len(sub)
        sub_naive = math.sqrt(sum((v - sub_mean) ** 2 for v in sub) / (len(sub) - 1) / len(sub))
        n_eff = len(sub) / max(1.0, (sub_se / sub_naive) ** 2)
        centre = (sub_mean + Z_975**2 / (2 * n_eff)) / (1 + Z_975**2 / n_eff)
        half = Z_975 * math.sqrt(sub_mean * (1 - sub_mean) / n_eff + Z_975**2 / (4 * n_eff**2)) / (1 + Z_975**2 / n_eff)
        assert got_cat["ci95"] == pytest.approx([centre - half, centre + half], abs=1e-6)

    # the paired comparison: strong − weak, task by task, clustered by context
    (overall,) = [c for c in summary["comparisons"] if c["figure"] == "Overall" and c["table"] == ""]
    assert overall["model"] == "strong" and overall["baseline"] == "weak"
    d = [x["strong"][t] - x["weak"][t] for t in ids]
    se, c = cr1(d, clusters)
    diff = sum(d) / len(d)
    assert overall["diff"] == pytest.approx(diff, abs=1e-12) and overall["se"] == pytest.approx(se, rel=1e-9)
    assert overall["n_items"] == 120 and overall["n_clusters"] == 25 and overall["n_left_out"] == 0
    assert overall["ci95"] == pytest.approx([diff - T_975[24] * se, diff + T_975[24] * se], abs=1e-6)
    corr = statistics.correlation([x["strong"][t] for t in ids], [x["weak"][t] for t in ids])
    assert overall["correlation"] == pytest.approx(corr, abs=1e-9)
    assert 0 < overall["p_value"] < 1 and (overall["p_value"] < 0.05) == (abs(diff / se) > T_975[24])
    # the Markdown shows the same numbers, and says how they were made
    md = (out / "clbench" / "aggregate.md").read_text()
    assert "cr1:context_id, t(df=24)" in md and "paired comparisons" in md
    strong = models["strong"]["figures"]["Overall"]["items"]
    cell = f"{100 * strong['mean']:.1f} ({100 * strong['se']:.1f}) [{100 * strong['ci95'][0]:.1f}, "
    assert f"| strong | 3 | 120 | 25 | {cell}" in md
    assert f"| strong | weak | Overall | {100 * diff:+.1f} ({100 * se:.1f}) |" in md
    comparisons_csv = (out / "clbench" / "aggregate_comparisons.csv").read_text().splitlines()
    assert comparisons_csv[0].startswith("model,baseline,table,figure,diff %,se %")
    assert any(line.startswith("strong,weak,,Overall,") for line in comparisons_csv)
