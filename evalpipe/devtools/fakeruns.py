"""Outputs folders written directly, at any size, for the viewer's tests and `make bench`.

The rows have the stages' shapes (rows.py) and the real score and aggregate stages summarise them, so a
report built from them is what a user's would be, only faster to make than by calling a server 100,000
times. HOSTILE holds strings that must reach a page as text and nothing else.
"""

import contextlib
import io
import random
from pathlib import Path

import orjson

from ..benchmarks import clbench
from ..benchmarks.coin_flip import CoinFlip
from ..errors import run_stage
from ..stages import aggregate, score
from ..store.paths import PROJECT

HOSTILE = (
    "</script><script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 1">',
    '<svg onload="window.__pwned = 1"></svg>',
    '[a link](javascript:window.__pwned=1) <a href="javascript:window.__pwned=1">click</a>',
    "{{7*7}} {% raw %} <!-- comment --> ]]>",
    "line\u2028separator\u2029paragraph & ampersand",
    "NUL\x00byte",
)
_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at which an have not they all "
    "rule section permit vessel context value step answer model result table record policy clause amount "
    "budget total unit rate level entry source claim basis term notice period account method sample"
).split()


def _dump(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")


def _prose(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:chars]


def _answered(model: str, output: str, prompt_tokens: int, latency_s: float) -> dict:
    """The fields infer adds to a row for a call answered in full (about four characters a token)."""
    return {
        "model": model,
        "status": "ok",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(output) // 4},
        "latency_s": latency_s,
    }


def _quiet(stage: str, main, argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return run_stage(stage, main, argv)


def summarise(root: Path, bench: str, data: Path, plots: bool = False) -> None:
    """score.json for every run (the real score stage), then aggregate.* (the real aggregate stage)."""
    for judge in sorted((root / bench).glob("*/run-*/judge.jsonl")):
        code = _quiet("score", score.main, ["--bench", bench, "--input", str(judge), "--data", str(data)])
        assert code in (0, 3), f"score exited {code} on {judge}"
    code = _quiet(
        "aggregate",
        aggregate.main,
        ["--bench", bench, "--outputs-dir", str(root), *([] if plots else ["--no-plots"])],
    )
    assert code in (0, 3), f"aggregate exited {code}"


def coin_flip(
    root: Path, models: int = 5, runs: int = 2, tasks: int = 10_000, seed: int = 0, hostile: bool = False
) -> Path:
    """models × runs × tasks CoinFlip samples under root/coin_flip/; returns the dataset written."""
    rng = random.Random(seed)
    src = (PROJECT / "data" / "coin_flip" / "test.jsonl").read_bytes().splitlines(keepends=True)
    data = root / "data" / "coin_flip.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(b"".join(src[i % len(src)] for i in range(tasks)))
    bench = CoinFlip()
    loaded = list(bench.load(data))
    for m in range(models):
        skill = 0.55 + 0.4 * m / max(1, models - 1)
        for k in range(1, runs + 1):
            infer_rows, judge_rows = [], []
            for n, task in enumerate(loaded):
                gold = task.row["target"]
                r = rng.random()
                prediction = None if r > 0.95 else gold if r < skill else ("NO" if gold == "YES" else "YES")
                text = _prose(rng, rng.randint(120, 500))
                if hostile and n < len(HOSTILE):
                    text = HOSTILE[n] + "\n" + text
                output = text + (f"\nANSWER: {prediction}" if prediction else "\nI am not sure.")
                row = {
                    "idx": task.id,
                    "messages": [{"role": "user", "content": bench.prompt(task.row["question"])}],
                    "model_output": output,
                    "target": gold,
                    "metadata": {"fewshot": 0},
                    **_answered(f"model-{m}", output, 130, round(rng.uniform(0.2, 2.0), 3)),
                }
                infer_rows.append(row)
                judge_rows.append(
                    {
                        **row,
                        "prediction": prediction,
                        "score": int(prediction == gold),
                        "judge_status": "ok" if prediction else "unparsed",
                        "parse_mode": "strict",
                    }
                )
            folder = root / "coin_flip" / f"model-{m}" / f"run-{k}"
            _dump(folder / "infer.jsonl", infer_rows)
            _dump(folder / "judge.jsonl", judge_rows)
    return data


def clbench_rows(tasks: int, contexts: int, context_chars: int, seed: int = 0) -> list[dict]:
    """A CL-bench-shaped dataset: each context (a long system message) shared by several tasks."""
    rng = random.Random(seed)
    passage = _prose(rng, max(4 * context_chars, 200_000))
    texts = []
    for c in range(contexts):
        start = rng.randrange(0, len(passage) - context_chars)
        size = rng.randint(context_chars // 2, context_chars * 3 // 2)
        body = (passage[start:] + passage)[:size]
        texts.append(f"Context {c}: the rules of system {c}.\n\n{body}")
    rows = []
    for t in range(tasks):
        c = t % contexts
        category = clbench.CATEGORIES[t % len(clbench.CATEGORIES)]
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": texts[c]},
                    {"role": "user", "content": f"Task {t}: using only the context, {_prose(rng, 120)}?"},
                ],
                "rubrics": [f"Rubric {t}.{r}: states {_prose(rng, 60)}." for r in range(rng.randint(3, 8))],
                "metadata": {
                    "task_id": f"task-{t:05d}",
                    "context_id": f"ctx-{c:04d}",
                    "context_category": category,
                    "sub_category": f"{category.split()[0]} {t % 4}",
                },
            }
        )
    return rows


def clbench_outputs(
    root: Path,
    models: int = 2,
    runs: int = 3,
    tasks: int = 1899,
    contexts: int = 500,
    context_chars: int = 40_000,
    seed: int = 0,
) -> Path:
    """models × runs CL-bench runs (judge rows and error types) under root/clbench/; returns the dataset."""
    rng = random.Random(seed)
    rows = clbench_rows(tasks, contexts, context_chars, seed)
    data = root / "data" / "clbench.jsonl"
    _dump(data, rows)
    for m in range(models):
        skill = 0.15 + 0.2 * m
        for k in range(1, runs + 1):
            infer_rows, judge_rows, analyses = [], [], []
            for row in rows:
                task_id = row["metadata"]["task_id"]
                output = _prose(rng, rng.randint(300, 2500))
                infer = {
                    "idx": task_id,
                    **row,
                    "model_output": output,
                    **_answered(f"cl-model-{m}", output, 10_000, round(rng.uniform(1, 20), 3)),
                }
                infer_rows.append(infer)
                n = len(row["rubrics"])
                if rng.random() < 0.04:
                    judge_rows.append(
                        {
                            **infer,
                            "grading_rationale": "judge reply unparseable after 3 attempts: score 0",
                            "requirement_status": [],
                            "score": 0,
                            "judge_status": "parse_error",
                            "judge_error": "not JSON (Expecting value); reply began 'I think'",
                            "judge_model": "judge",
                        }
                    )
                    continue
                passed = rng.random() < skill
                status = ["yes"] * n if passed else [rng.choice(("yes", "no")) for _ in range(n - 1)] + ["no"]
                judge_rows.append(
                    {
                        **infer,
                        "grading_rationale": " ".join(f"{i + 1}. {_prose(rng, 80)}." for i in range(n)),
                        "requirement_status": status,
                        "score": int(passed),
                        "judge_status": "ok",
                        "judge_model": "judge",
                        "judge_usage": {"prompt_tokens": 900, "completion_tokens": 200},
                        "judge_latency_s": round(rng.uniform(1, 5), 3),
                        "judge_attempts": 1,
                    }
                )
                if not passed:
                    analyses.append(
                        {
                            "idx": task_id,
                            "error_types": rng.sample(clbench.ERROR_TYPES, rng.randint(1, 2)),
                            "error_reason": _prose(rng, 150),
                            "analysis_status": "ok",
                            "analysis_model": "judge",
                        }
                    )
            folder = root / "clbench" / f"cl-model-{m}" / f"run-{k}"
            _dump(folder / "infer.jsonl", infer_rows)
            _dump(folder / "judge.jsonl", judge_rows)
            _dump(folder / "error_analysis.jsonl", analyses)
    return data
