"""`make bench`'s prefix part: shared-prefix scheduling of a CL-bench-shaped set against a prefix-caching server.

1,899 tasks over 500 contexts of about 40,000 characters, the tasks of a context next to each other
(as in the real dataset), 64 in flight, against the test server's PrefixCache with a prefill cost:
each reply takes 200 ms plus 30 µs per uncached prompt token (a 10,000-token context: 0.3 s more).
infer.py runs twice, with --prefix-schedule on and off, each against a cold cache:

cached share   cached prompt tokens / prompt tokens with scheduling, against the ideal (every task
               but the first of its context reads the context from the cache); the naive order's
               share beside it
throughput     tasks/s with scheduling against tasks/s in dataset order

    python -m evalpipe.devtools.bench --only prefix [--tiny]
"""

import json
from collections.abc import Iterator
from pathlib import Path

from .. import fakeruns
from ..testserver import FakeOpenAI, PrefixCache
from .common import fixed_latency, infer_rate
from .report import Figure

BASE_LATENCY_S = 0.2
PREFILL_S_PER_TOKEN = 30e-6


def contiguous_dataset(path: Path, tasks: int, contexts: int, context_chars: int) -> list[dict]:
    """CL-bench-shaped rows, the tasks of each context next to each other; written to `path`."""
    rows = fakeruns.clbench_rows(tasks, contexts, context_chars)
    rows.sort(key=lambda row: row["metadata"]["context_id"])  # stable: the tasks keep their order in a context
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows


def ideal_share(rows: list[dict]) -> float:
    """The cached share if every task but the first of its context hit (tokens counted as PrefixCache does)."""
    seen: set[str] = set()
    prompt = cached = 0
    for row in rows:
        sizes = [len(m["content"]) for m in row["messages"]]
        prompt += max(1, sum(sizes) // 4)
        context = row["metadata"]["context_id"]
        if context in seen:
            cached += sum(sizes[:-1]) // 4
        seen.add(context)
    return cached / prompt


def cached_share(output: Path) -> float:
    """Cached prompt tokens / prompt tokens, as infer recorded them in its rows."""
    prompt = cached = 0
    with open(output) as f:
        for line in f:
            usage = json.loads(line).get("usage") or {}
            prompt += usage.get("prompt_tokens", 0)
            cached += usage.get("cached_tokens", 0)
    return cached / prompt if prompt else 0.0


def figures(work: Path, tiny: bool) -> Iterator[Figure]:
    tasks, contexts, chars = (190, 50, 8000) if tiny else (1899, 500, 40_000)
    rows = contiguous_dataset(work / "clbench.jsonl", tasks, contexts, chars)
    ideal = ideal_share(rows)
    server = FakeOpenAI().start()
    try:
        runs = {}
        for schedule in ("on", "off"):
            server.handler = PrefixCache(fixed_latency(BASE_LATENCY_S), prefill_s_per_token=PREFILL_S_PER_TOKEN)
            out = work / f"infer-{schedule}.jsonl"
            extra = ["--bench", "clbench", "--slim", "--prefix-schedule", schedule]
            runs[schedule] = infer_rate(server.base_url, work / "clbench.jsonl", out, 64, extra) | {
                "share": cached_share(out)
            }
    finally:
        server.stop()
    on, off = runs["on"], runs["off"]
    written = on["rows"] == off["rows"] == tasks and on["failed"] == off["failed"] == 0
    yield Figure(
        f"prefix: cached share of prompt tokens, {tasks:,} tasks over {contexts} contexts, 64 in flight",
        f"{on['share']:.1%} scheduled (dataset order: {off['share']:.1%})",
        ">= 0.90 of ideal, every task answered",
        on["share"] >= 0.9 * ideal and written,
        reference=f"ideal {ideal:.1%}",
        ratio=on["share"] / ideal,
    )
    yield Figure(
        "prefix: throughput with scheduling (prefill 30 µs per uncached token)",
        f"{on['rate']:.1f} tasks/s ({on['seconds']:.1f} s)",
        ">= 1.0",
        on["rate"] >= off["rate"],
        reference=f"dataset order {off['rate']:.1f} tasks/s ({off['seconds']:.1f} s)",
        ratio=on["rate"] / off["rate"] if off["rate"] else None,
    )
