"""report.html: every sample of every run in one self-contained, offline HTML file.

    python -m evalpipe.stages.viewer OUTPUTS_DIR [--output FILE] [--context-chars N|all]

`make report` writes outputs/report.html next to report.md. The file needs no server and makes
no network request: open it from disk, mail it, attach it. It shows, per benchmark, the
leaderboard with its error bars, coverage, judge statuses, cost and plots; a sample browser with
filters, full-text search and a detail view shaped per benchmark; a comparison of two models or
runs on the same tasks; and permalinks in the URL fragment. Generated from the stage files alone
(collect.py reads them, streaming; page.py packs the file). docs/viewer.md has the details.
"""

import sys
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
        self.models: list[str] = []
        self.error_types: list[str] = []
        self.columns: dict[str, list] = {k: [] for k in ("b", "m", "r", "i", "f1", "f2", "g", "p", "s", "e", "v")}
        self.details: list[dict] = []

    def sid(self, value: str) -> int:
        found = self.strings.get(value)
        if found is None:
            found = self.strings[value] = len(self.strings)
        return found

    def add_run(self, b: int, run, task_order: dict[str, int]) -> dict:
        """A run's samples, in the benchmark's task order; returns the run's row of the benchmark's run table."""
        if run.model not in self.models:
            self.models.append(run.model)
        m = self.models.index(run.model)
        statuses: dict[str, int] = {}
        passed = 0
        for sample in sorted(run.samples, key=lambda s: task_order[s["id"]]):
            mask = 0
            for t in sample["errors"]:
                if t not in self.error_types:
                    self.error_types.append(t)
                mask |= 1 << min(self.error_types.index(t), 30)
            statuses[sample["status"]] = statuses.get(sample["status"], 0) + 1
            passed += sample["pass"] == 1
            sid = self.sid
            for col, value in (
                ("b", b),
                ("m", m),
                ("r", run.k),
                ("i", sid(sample["id"])),
                ("f1", sid(sample["f1"])),
                ("f2", sid(sample["f2"])),
                ("g", sid(sample["group"])),
                ("p", sample["pass"]),
                ("s", sid(sample["status"])),
                ("e", mask),
                ("v", sample["preview"]),
            ):
                self.columns[col].append(value)
            self.details.append(sample["detail"])
        cost = (run.score or {}).get("cost")
        cost = cost if isinstance(cost, dict) else {}
        return {
            "model": run.model,
            "run": run.k,
            "samples": len(run.samples),
            "infer_rows": run.infer_rows,
            "judge_rows": run.judge_rows,
            "analysis_rows": run.analysis_rows,
            "expected": run.expected,
            "passed": passed,
            "statuses": dict(sorted(statuses.items())),
            "cost_usd": cost.get("cost_usd"),
            "scored": run.score is not None,
        }

    def blocks(self) -> list[tuple[str, str]]:
        """The index, then the details a chunk at a time."""
        out = [("ix", page.packed({"strings": list(self.strings), **self.columns}))]
        return out + [
            (f"s{n}", page.packed(self.details[start : start + page.CHUNK]))
            for n, start in enumerate(range(0, len(self.details), page.CHUNK))
        ]


def _text_blocks(texts: collect.Texts) -> tuple[list[tuple[str, str]], list[int]]:
    """The long texts, packed in chunks of about page.TEXT_CHUNK_CHARS, and the first text of each chunk."""
    blocks: list[tuple[str, str]] = []
    starts: list[int] = []
    chunk: list[str] = []
    size = 0
    for i, text in enumerate(texts.items):
        if chunk and size + len(text) > page.TEXT_CHUNK_CHARS:
            blocks.append((f"x{len(starts) - 1}", page.packed(chunk)))
            chunk, size = [], 0
        if not chunk:
            starts.append(i)
        chunk.append(text)
        size += len(text)
    if chunk:
        blocks.append((f"x{len(starts) - 1}", page.packed(chunk)))
    return blocks, starts


def build(
    outputs_dir: Path, shapes: Mapping[str, Shape], context_chars: int | None = DEFAULT_CONTEXT_CHARS
) -> tuple[str, dict]:
    """The page's text, and a summary of what it holds (counts, what was cut, problems found). `shapes`:
    each benchmark's shape by name (benchmarks.sample_views()); folders of other names are not read."""
    outputs_dir = Path(outputs_dir)
    roots = collect.find_roots(outputs_dir, shapes)
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
            task_order: dict[str, int] = {}
            for run in runs:
                for sample in run.samples:
                    task_order.setdefault(sample["id"], len(task_order))
            run_rows = [index.add_run(len(benches), run, task_order) for run in runs]
            key = name if where == "." else f"{where}/{name}"
            benches.append({"key": key, "root": where, **summary, "runs": run_rows})
    text_blocks, text_starts = _text_blocks(texts)
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
        "models": index.models,
        "error_types": index.error_types,
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


def describe(output: Path, info: dict) -> list[str]:
    """What the report holds, what was cut and what is missing, as lines for the terminal (and cron mail)."""
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
    return lines


def write(
    outputs_dir: Path,
    shapes: Mapping[str, Shape],
    output: Path | None = None,
    context_chars: int | None = DEFAULT_CONTEXT_CHARS,
) -> Path:
    """Build the report of `outputs_dir` and write it atomically (default: OUTPUTS_DIR/report.html)."""
    output = output or Path(outputs_dir) / "report.html"
    html, info = build(outputs_dir, shapes, context_chars)
    jsonl.atomic_write(output, html.encode())
    for line in describe(output, info):
        print(line, file=sys.stderr)
    return output
