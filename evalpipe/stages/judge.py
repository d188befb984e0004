"""judge: grade every inference row that has no final judge row yet. --error-analysis (CL-bench): classify why
each failed solution failed, by the judge model, into `<error_analysis_name>.jsonl` beside the judge rows."""

import argparse
import sys
from pathlib import Path

from .. import cli
from ..benchmarks import Benchmark
from ..benchmarks.base import ErrorAnalysis, uses_judge_model
from ..datasets import hub
from ..errors import BadInput
from ..store import paths, shards
from . import graded
from .graded import input_path


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--model", help="the model whose answers are judged (for the default paths)")
    parser.add_argument(
        "--input",
        type=Path,
        help="inference JSONL, or hf://<repo>[@<revision>]/<file> "
        "(default outputs/<bench>/<model>/run-<K>/infer.jsonl; with --error-analysis the judge JSONL)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="judge JSONL (default: judge.jsonl beside an infer.jsonl input, else outputs/<input-name>_graded.jsonl "
        "as upstream; with --error-analysis, error_analysis.jsonl beside the judge file)",
    )
    parser.add_argument(
        "--judge-model",
        default=cli.DEFAULT_JUDGE_MODEL,
        help=f"judge model (default {cli.DEFAULT_JUDGE_MODEL}, as upstream)",
    )
    parser.add_argument(
        "--judge-label",
        metavar="NAME",
        help="a second opinion: write judge-NAME.jsonl beside judge.jsonl instead (another judge model, or the "
        "same one again); with --error-analysis, read it",
    )
    parser.add_argument("--aws-region", help=argparse.SUPPRESS)  # accepted for upstream command lines
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="add rows to an output judged under another configuration (judge model, parameters, prompt); "
        "without it such a rerun is refused",
    )
    if isinstance(bench, ErrorAnalysis):
        parser.add_argument(
            "--error-analysis",
            action="store_true",
            help="classify each failed solution's error types with the judge model (reads the judge rows)",
        )
    cli.add_endpoint_args(parser, "judge")


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("judge", "Grade every inference row not yet judged (resumable).", _add_args, argv)
    paths.check_judge_label(args.judge_label)
    if args.judge_label is not None and args.output is not None:
        raise BadInput("give --judge-label or --output, not both")
    if getattr(args, "error_analysis", False):
        return _error_analysis(bench, args)
    in_path = input_path(bench, args, "infer.jsonl")
    if args.output is not None:
        output = args.output
    elif in_path.name == "infer.jsonl" and hub.source_of(in_path) is None:  # judge[-<label>].jsonl beside it
        output = in_path.with_name(paths.judge_file_name(args.judge_label))
    else:  # as upstream: outputs/<input-name>_graded[-<label>].jsonl
        output = Path("outputs") / f"{in_path.stem}_graded{'-' + args.judge_label if args.judge_label else ''}.jsonl"
    if not shards.exists(in_path):
        raise BadInput("no such inference file (run infer first)", in_path)
    shards.chosen(args.shard, args.shards)  # a bad --shard is said before any notice or other refusal
    if not uses_judge_model(bench) and args.backend == "batch":
        print(
            f"judge: {bench.name} is graded by a rule (no API calls): --backend batch has nothing to do",
            file=sys.stderr,
        )
        args.backend = "online"
    return graded.run(
        bench,
        args,
        in_path,
        output,
        label="judge",
        stage="judge",
        prompts=bench.prompts().get("judge", []),
        is_done=bench.is_judged,
        work=bench.grade,
        by_model=uses_judge_model(bench),
    )


def _error_analysis(bench: Benchmark, args) -> int:
    assert isinstance(bench, ErrorAnalysis)  # --error-analysis is offered only then
    in_path = input_path(bench, args, paths.judge_file_name(args.judge_label))
    output = args.output or paths.error_analysis_path(in_path, bench.error_analysis_name)
    if not shards.exists(in_path):
        raise BadInput("no such judge file (run judge first)", in_path)
    return graded.run(
        bench,
        args,
        in_path,
        output,
        label="error analysis",
        stage="error_analysis",
        prompts=bench.error_analysis_prompts(),
        is_done=bench.is_analyzed,
        work=bench.analyze_error,
        keep=bench.needs_error_analysis,
    )
