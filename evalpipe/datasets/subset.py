"""A fixed stratified subset of a dataset: the watch's SAMPLE=N (docs/watch.md#choosing-sample). An item (what the
figures count) is taken whole; the strata are the values of the first group the benchmark's figures split on."""

import random
from collections.abc import Hashable
from pathlib import Path

from ..benchmarks import Benchmark
from ..errors import BadInput
from ..store import jsonl

BOM = b"\xef\xbb\xbf"


def choose(bench: Benchmark, source: Path, n: int, seed: str) -> dict:
    """Which of `source`'s items make the subset: a record of the choice, the chosen tasks' ids and lines."""
    if source.suffix.lower() in (".json", ".parquet"):
        raise BadInput("SAMPLE needs a JSONL dataset (one row a line); convert it first", source)
    by = next((f.by for f in bench.figures if f.by), None)
    units: dict[Hashable, dict] = {}  # the items in file order: each with its stratum, its tasks' ids and lines
    for task in bench.load(source):
        columns = bench.item_columns([task], {})  # one task's item key and group labels, no grades
        stratum = columns["groups"][by][0] if by and by in columns["groups"] else None
        unit = units.setdefault(columns["keys"][0], {"stratum": stratum, "ids": [], "lines": []})
        unit["ids"].append(task.id)
        unit["lines"].append(task.line)
    strata: dict[Hashable, list[Hashable]] = {}
    for key, unit in units.items():
        strata.setdefault(unit["stratum"], []).append(key)
    n = min(n, len(units))
    # n shared out in proportion to the strata's sizes, the remainder to the largest fractions (first seen on ties)
    exact = {s: n * len(keys) / len(units) for s, keys in strata.items()}
    quotas = {s: int(v) for s, v in exact.items()}
    for s in sorted(exact, key=lambda s: -(exact[s] - quotas[s]))[: n - sum(quotas.values())]:
        quotas[s] += 1
    rng = random.Random(seed)
    chosen = [key for s, keys in strata.items() for key in rng.sample(keys, quotas[s])]
    return {
        "items": n,
        "of_items": len(units),
        "stratified_by": by,
        "strata": {str(s): {"chosen": quotas[s], "of": len(keys)} for s, keys in strata.items()},
        "seed": seed,
        "ids": sorted(str(task_id) for key in chosen for task_id in units[key]["ids"]),
        "lines": sorted({line for key in chosen for line in units[key]["lines"]}),
    }


def lines_of(bench: Benchmark, source: Path, ids: list[str]) -> list[int]:
    """The lines of `source` holding the tasks with these ids (a changed dataset: the same tasks, where still there)."""
    wanted = set(ids)
    return sorted({task.line for task in bench.load(source) if str(task.id) in wanted})


def write(source: Path, lines: list[int], output: Path) -> None:
    """Copy these lines of `source` (1-based), as they are, into `output` (atomically)."""
    wanted = set(lines)
    pieces = []
    with open(source, "rb") as f:
        for number, raw in enumerate(f, 1):
            if number in wanted:
                raw = raw[len(BOM) :] if number == 1 and raw.startswith(BOM) else raw
                pieces.append(raw if raw.endswith(b"\n") else raw + b"\n")
    jsonl.atomic_write(output, pieces)
