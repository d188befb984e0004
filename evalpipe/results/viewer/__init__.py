"""report.html: every sample of every run in one self-contained, offline HTML file (docs/viewer.md#how-it-works)."""

import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from ... import __version__
from ...errors import BadInput
from ...store import jsonl
from .. import discover
from ..shapes import Shape
from . import collect, page

DEFAULT_CONTEXT_CHARS = 20_000  # per prompt text: a CL-bench context of average length (~40K chars) is cut
SIZE_WARNING_BYTES = 100_000_000  # above this a browser struggles and mail refuses: say so


class _Index:
    """The page's sample index, a column per field (strings numbered once), and each sample's details."""

    def __init__(self):
        self.strings: dict[str, int] = {}
        self.models: dict[str, int] = {}  # each numbered once, as the strings
        self.error_types: dict[str, int] = {}
        self.columns: dict[str, list] = {k: [] for k in ("b", "m", "r", "i", "f1", "f2", "g", "p", "s", "e", "v")}
        self.details: list[dict] = []

    def sid(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings))

    def add_run(self, b: int, run: collect.Run, task_order: dict[str, int]) -> dict:
        """A run's samples, in the benchmark's task order; returns the run's row of the benchmark's run table."""
        m = self.models.setdefault(run.model, len(self.models))
        for sample in sorted(run.samples, key=lambda s: task_order[s["id"]]):
            mask = 0
            for t in sample["errors"]:
                mask |= 1 << min(self.error_types.setdefault(t, len(self.error_types)), 30)
            ids = [self.sid(sample[key]) for key in ("id", "f1", "f2", "group")]
            values = (b, m, run.k, *ids, sample["pass"], self.sid(sample["status"]), mask, sample["preview"])
            for column, value in zip(self.columns.values(), values):  # in the order of self.columns
                column.append(value)
            self.details.append(sample["detail"])
        cost = (run.score or {}).get("cost")
        return {
            "model": run.model,
            "run": run.k,
            "samples": len(run.samples),
            "infer_rows": run.infer_rows,
            "judge_rows": run.judge_rows,
            "analysis_rows": run.analysis_rows,
            "expected": run.expected,
            "passed": sum(s["pass"] == 1 for s in run.samples),
            "statuses": dict(sorted(Counter(s["status"] for s in run.samples).items())),
            "cost_usd": cost.get("cost_usd") if isinstance(cost, dict) else None,
            "scored": run.score is not None,
        }

    def blocks(self) -> list[tuple[str, str]]:
        out = [("ix", page.packed({"strings": list(self.strings), **self.columns}))]
        return out + [
            (f"s{n}", page.packed(self.details[start : start + page.CHUNK]))
            for n, start in enumerate(range(0, len(self.details), page.CHUNK))
        ]


def build(
    outputs_dir: Path, shapes: Mapping[str, Shape], context_chars: int | None = DEFAULT_CONTEXT_CHARS
) -> tuple[str, dict]:
    """The page's text, and a summary of what it holds (counts, what was cut, problems found). `shapes`:
    each benchmark's shape by name (benchmarks.sample_views()); folders of other names are not read."""
    roots = discover.find_roots(outputs_dir, shapes, collect.is_run_dir)
    if not roots:
        raise BadInput(
            f"no <bench>/<model>/run-<K>/ folder with infer.jsonl, judge.jsonl or score.json in {outputs_dir} "
            f"or up to {discover.MAX_DEPTH} folder levels below it (run make infer first)"
        )
    texts = collect.Texts(context_chars)
    index = _Index()
    benches: list[dict] = []
    for root, names in roots:
        where = root.relative_to(outputs_dir).as_posix()
        for name in names:
            summary, runs = collect.read_bench(root, name, shapes[name], texts)
            ids = dict.fromkeys(sample["id"] for run in runs for sample in run.samples)  # in the order first seen
            task_order = {task: i for i, task in enumerate(ids)}
            run_rows = [index.add_run(len(benches), run, task_order) for run in runs]
            key = name if where == "." else f"{where}/{name}"
            benches.append({"key": key, "root": where, **summary, "runs": run_rows})
    text_starts: list[int] = []  # the first long text of each block of about page.TEXT_CHUNK_CHARS
    size = 0
    for i, text in enumerate(texts.items):
        if not text_starts or size + len(text) > page.TEXT_CHUNK_CHARS:
            text_starts.append(i)
            size = 0
        size += len(text)
    ends = [*text_starts[1:], len(texts.items)]
    text_blocks = [(f"x{n}", page.packed(texts.items[a:b])) for n, (a, b) in enumerate(zip(text_starts, ends))]
    cut = texts.cut_summary()
    details = index.details
    meta = {
        "generator": f"evalpipe {__version__}",
        "source": outputs_dir.resolve().name or str(outputs_dir),
        "samples": len(details),
        "chunk": page.CHUNK,
        "sample_chunks": (len(details) + page.CHUNK - 1) // page.CHUNK,
        "text_starts": text_starts,
        "text_chars": texts.full_chars,
        "models": list(index.models),
        "error_types": list(index.error_types),
        "cut": cut,
        "benches": benches,
    }
    html = page.render(meta, index.blocks() + text_blocks)
    info = {
        "benchmarks": len(benches),
        "models": len(index.models),
        "samples": len(details),
        "cut": cut,
        "problems": [p for bench in benches for p in bench["problems"]],
        "bytes": len(html.encode()),
    }
    return html, info


def write(
    outputs_dir: Path,
    shapes: Mapping[str, Shape],
    output: Path | None = None,
    context_chars: int | None = DEFAULT_CONTEXT_CHARS,
) -> Path:
    """Write the report of `outputs_dir` atomically (default: OUTPUTS_DIR/report.html); say on stderr what it holds."""
    output = output or outputs_dir / "report.html"
    html, info = build(outputs_dir, shapes, context_chars)
    jsonl.atomic_write(output, html.encode())
    lines = [
        f"viewer: wrote {output} ({info['bytes'] / 1e6:.1f} MB): {info['benchmarks']} benchmark(s), "
        f"{info['models']} model(s), {info['samples']:,} samples"
    ]
    cut = info["cut"]
    if cut["texts_cut"]:
        lines.append(
            f"viewer: {cut['texts_cut']} of {cut['texts']} long prompt texts cut to {cut['cap']:,} characters "
            f"({cut['chars_omitted']:,} of {cut['chars_total']:,} characters not embedded; "
            "--context-chars all embeds them)"
        )
    if info["bytes"] > SIZE_WARNING_BYTES:
        lines.append(
            f"viewer: warning: the report is over {SIZE_WARNING_BYTES // 1_000_000} MB; "
            "a smaller --context-chars makes it lighter"
        )
    shown = info["problems"][:10]
    lines += [f"viewer: note: {p}" for p in shown]
    if len(info["problems"]) > len(shown):
        lines.append(f"viewer: … {len(info['problems']) - len(shown)} more notes in the report")
    for line in lines:
        print(line, file=sys.stderr)
    return output
