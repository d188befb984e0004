"""python -m evalpipe.devtools.bench [--tiny] [--only PART ...]: every part's figures, then the table."""

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

from .report import Figure, table

PARTS = ("throughput", "ratelimit", "faults", "peers", "scale", "viewer", "errorbars", "prefix", "shards")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evalpipe.devtools.bench", description="Measure the pipeline against its performance targets."
    )
    parser.add_argument(
        "--tiny", action="store_true", help="a seconds-long run of every part (for CI), not the targets' sizes"
    )
    parser.add_argument("--only", nargs="+", choices=PARTS, default=PARTS, metavar="PART", help=", ".join(PARTS))
    args = parser.parse_args(argv)
    rows: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="evalpipe-bench-") as tmp:
        for part in args.only:
            work = Path(tmp) / part
            work.mkdir()
            module = importlib.import_module(f"{__package__}.{part}")
            for row in module.figures(work, args.tiny):
                print(row.line(), flush=True)
                rows.append(row)
    print("\n" + table(rows))
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
