"""`make bench`'s error-bar part: item-level figures of a synthetic CL-bench-shaped run set.

python -m evalpipe.devtools.bench --only errorbars
"""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from ...store.paths import PROJECT
from .common import SAMPLE
from .report import Figure


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    clustered = clbench_error_bars(work / "error-bars")
    yield Figure(
        "CL-bench-shaped run set (1,899 tasks / 500 contexts, 3 runs × 2 models): clustered SE of Overall",
        f"{clustered['se']:.4f} (design effect {clustered['design_effect']:.2f})",
        "reported",
        True,
        reference=f"naive SE {clustered['se_naive']:.4f}",
        ratio=clustered["se"] / clustered["se_naive"],
    )
    yield Figure(
        "  minimum detectable difference (80% power, α 0.05)",
        f"{100 * clustered['mde']:.1f} points unpaired, {100 * clustered['pair_mde']:.1f} paired "
        f"(correlation {clustered['correlation']:.2f}); with 1 / 10 runs per task: "
        f"{100 * clustered['mde_runs']['1']:.1f} / {100 * clustered['mde_runs']['10']:.1f}",
        "reported",
        True,
    )


def clbench_error_bars(work: Path, tasks: int = 1899, contexts: int = 500) -> dict:
    """Item-level figures of a synthetic CL-bench-shaped run set made by the real score and aggregate
    stages: tasks share contexts whose difficulty they share, two models 3 points apart, 3 runs each."""
    import random

    rng = random.Random(2026)
    base = json.loads(SAMPLE.read_text().splitlines()[0])
    sizes = [1] * contexts
    for _ in range(tasks - contexts):
        sizes[rng.randrange(contexts)] += 1
    rows: list[dict] = []
    ease: list[float] = []
    for c, size in enumerate(sizes):
        context_ease = rng.betavariate(0.7, 2.0)
        for _ in range(size):
            i = len(rows)
            meta = {
                "task_id": f"t{i:04d}",
                "context_id": f"c{c:03d}",
                "context_category": base["metadata"]["context_category"],
            }
            rows.append({**base, "metadata": meta})
            ease.append(min(1.0, max(0.0, context_ease + rng.gauss(0, 0.1))))
    work.mkdir(parents=True)
    data = work / "clbench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for model, shift in (("a", 0.0), ("b", -0.03)):
        for k in (1, 2, 3):
            run = work / "out" / "clbench" / model / f"run-{k}"
            run.mkdir(parents=True)
            with open(run / "judge.jsonl", "w") as f:
                for r, x in zip(rows, ease):
                    score = int(rng.random() < max(0.0, x + shift))
                    f.write(json.dumps({"idx": r["metadata"]["task_id"], "score": score, "judge_status": "ok"}) + "\n")
            subprocess.run(
                [sys.executable, str(PROJECT / "score.py"), "--input", str(run / "judge.jsonl"), "--data", str(data)],
                check=True,
                capture_output=True,
            )
    subprocess.run(
        [sys.executable, str(PROJECT / "aggregate.py"), "--outputs-dir", str(work / "out"), "--no-plots"],
        check=True,
        capture_output=True,
    )
    summary = json.loads((work / "out" / "clbench" / "aggregate.json").read_text())
    first = summary["models"][0]["figures"]["Overall"]["items"]
    (pair,) = [c for c in summary["comparisons"] if c["figure"] == "Overall" and not c["table"]]
    return {**first, "pair_mde": pair["mde"], "correlation": pair["correlation"]}
