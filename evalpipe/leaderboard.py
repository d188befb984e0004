"""`make report`: aggregate every benchmark found under outputs/ and index them in outputs/report.md."""

import argparse
import sys
from pathlib import Path

from . import benchmarks, cli, jsonl
from .errors import EXIT_INCOMPLETE, EXIT_OK, BadInput
from .paths import DEFAULT_ROOT
from .stages import aggregate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.leaderboard", description=__doc__)
    parser.add_argument("--outputs-dir", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--std", choices=("sample", "population"), default="sample")
    args = parser.parse_args(argv)
    present = [name for name in benchmarks.REGISTRY if any((args.outputs_dir / name).glob("*/run-*/score.json"))]
    if not present:
        raise BadInput(f"no score.json under {args.outputs_dir}/<bench>/*/run-*/ (run make infer judge score first)")
    sections, code = [], EXIT_OK
    for name in present:
        print(f"report: {name}", file=sys.stderr)
        rc = cli.run_stage("aggregate", aggregate.main, ["--bench", name, "--outputs-dir", str(args.outputs_dir), "--std", args.std])
        if rc not in (EXIT_OK, EXIT_INCOMPLETE):
            return rc
        code = max(code, rc)
        bench_dir = args.outputs_dir / name
        section = (bench_dir / "aggregate.md").read_text(encoding="utf-8")
        images = sorted(p.name for p in bench_dir.glob("aggregate*.png"))
        section += "".join(f"\n![{name} {image}]({name}/{image})\n" for image in images)
        section += f"\nAlso: [CSV]({name}/aggregate.csv) · [JSON]({name}/aggregate.json) · [LaTeX]({name}/aggregate.tex)\n"
        sections.append(section)
    out = args.outputs_dir / "report.md"
    jsonl.atomic_write(out, ("# Results\n\n" + "\n".join(sections)).encode())
    print(f"report: wrote {out}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(cli.run_stage("report", main))
