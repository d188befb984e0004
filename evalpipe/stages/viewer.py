"""report.html alone: every sample of every run in one self-contained, offline HTML file (docs/viewer.md)."""

import argparse
import sys
from pathlib import Path

from .. import benchmarks
from ..errors import EXIT_OK, run_stage
from ..results import viewer
from ..results.viewer import DEFAULT_CONTEXT_CHARS


def _context_chars(value: str) -> int | None:
    if value.strip().lower() in ("all", "0", "none"):
        return None
    try:
        chars = int(value.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of characters or 'all', got {value!r}") from None
    if chars < 100:
        raise argparse.ArgumentTypeError("give at least 100 characters, or 'all'")
    return chars


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.stages.viewer", description=__doc__.split("\n\n")[0])
    parser.add_argument("outputs_dir", type=Path, help="an outputs folder (results roots up to 3 levels down)")
    parser.add_argument("--output", "-o", type=Path, help="the HTML file (default: OUTPUTS_DIR/report.html)")
    parser.add_argument(
        "--context-chars",
        type=_context_chars,
        default=DEFAULT_CONTEXT_CHARS,
        metavar="N|all",
        help=f"embed at most N characters of each long prompt text, head and tail (default {DEFAULT_CONTEXT_CHARS:,});"
        " 'all' embeds everything. The report says what was cut.",
    )
    args = parser.parse_args(argv)
    viewer.write(args.outputs_dir, benchmarks.sample_views(), args.output, args.context_chars)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_stage("viewer", main))
