"""`python -m evalpipe.expand --data CL-bench.jsonl --input infer.jsonl --output infer-full.jsonl`: the `messages`
of slim rows (infer.py --slim) joined back from the dataset, for upstream tools, in their second place. For
benchmarks whose messages are the dataset's own (CL-bench)."""

import argparse
import sys
from pathlib import Path

from . import benchmarks
from .datasets import hub
from .errors import BadInput, run_stage
from .store import jsonl


def expand(bench: benchmarks.Benchmark, data: Path, source: Path, target: Path) -> int:
    messages = {t.id: t.row.get("messages") for t in bench.load(data)}
    written = 0
    with jsonl.Appender(target) as out:
        for line, row in jsonl.iter_rows(source, torn_tail_ok=True):
            task_id = benchmarks.row_id(row)
            if "messages" not in row:
                if messages.get(task_id) is None:
                    raise BadInput(f"task {task_id!r} has no messages in {data}", source, line)
                row = {"idx": row["idx"], "messages": messages[task_id], **{k: v for k, v in row.items() if k != "idx"}}
            out.append(row)
            written += 1
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Join the messages of slim rows back from the dataset.")
    parser.add_argument("--bench", default=benchmarks.DEFAULT, choices=list(benchmarks.REGISTRY), help="benchmark")
    parser.add_argument("--data", type=Path, required=True, help="the dataset the rows were made from")
    parser.add_argument("--input", type=Path, required=True, help="slim rows (infer.py --slim)")
    parser.add_argument("--output", type=Path, required=True, help="the rows with messages (a new file)")
    args = parser.parse_args(hub.resolve_argv(argv))  # --data/--input may be hf://...
    if args.output.exists():
        raise BadInput(f"{args.output} exists; choose a new file")
    n = expand(benchmarks.get(args.bench), args.data, args.input, args.output)
    print(f"expand: wrote {n} rows to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("expand", main))
