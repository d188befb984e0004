"""`make report`: aggregate every benchmark found under outputs/ in place and index them in outputs/report.md
(docs/results.md#leaderboards-and-plots)."""

import argparse
import re
import sys
from pathlib import Path

from .. import benchmarks
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput, run_stage
from ..results import discover, nights, viewer
from ..store import jsonl
from ..store.paths import DEFAULT_ROOT
from . import aggregate


def find_results(outputs_dir: Path) -> list[tuple[Path, list[str]]]:
    return discover.find_roots(outputs_dir, benchmarks.REGISTRY, lambda run: (run / "score.json").exists())


def section(outputs_dir: Path, root: Path, bench: str) -> str:
    """report.md's section for one benchmark of one root: its aggregate.md (headings one level down) and links."""
    where = root.relative_to(outputs_dir)
    title = " / ".join((*where.parts, bench))
    link = (where / bench).as_posix()  # relative to report.md, which sits in outputs_dir
    bench_dir = root / bench
    table = (bench_dir / "aggregate.md").read_text(encoding="utf-8")
    table = re.sub(r"^## ", "### ", table, flags=re.MULTILINE)
    images = sorted(p.name for p in bench_dir.glob("aggregate*.png"))
    text = f"## {title}\n\n{table}"
    text += "".join(f"\n![{title} {image}]({link}/{image})\n" for image in images)
    text += f"\nAlso: [CSV]({link}/aggregate.csv) · [JSON]({link}/aggregate.json) · [LaTeX]({link}/aggregate.tex)\n"
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.stages.report", description=__doc__)
    parser.add_argument("--outputs-dir", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--std", choices=("sample", "population"), default="sample")
    args = parser.parse_args(argv)
    results = find_results(args.outputs_dir)
    if not results:
        raise BadInput(
            f"no <bench>/<model>/run-<K>/score.json in {args.outputs_dir} or up to {discover.MAX_DEPTH} folder levels "
            "below it (run make infer judge score first)"
        )
    sections, code = [], EXIT_OK
    for root, present in results:
        for name in present:
            print(f"report: {root / name}", file=sys.stderr)
            rc = run_stage(
                "aggregate", aggregate.main, ["--bench", name, "--outputs-dir", str(root), "--std", args.std]
            )
            if rc not in (EXIT_OK, EXIT_INCOMPLETE):
                return rc
            code = max(code, rc)
            sections.append(section(args.outputs_dir, root, name))
    sections += nights.history_sections(results, args.outputs_dir)  # the watched models' nights (docs/watch.md)
    out = args.outputs_dir / "report.md"
    jsonl.atomic_write(out, ("# Results\n\n" + "\n".join(sections)).encode())
    print(f"report: wrote {out}", file=sys.stderr)
    viewer.write(args.outputs_dir, benchmarks.sample_views())  # report.html beside report.md: every sample
    return code


if __name__ == "__main__":
    sys.exit(run_stage("report", main))
