"""judge: grade every inference row that has no final judge row yet."""

import argparse
import asyncio
import gc
import sys
from pathlib import Path

from .. import cli, jsonl, lock, manifest, paths, runner
from ..benchmarks import Benchmark, Task, row_id
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput

# Model names upstream routes to AWS Bedrock; we speak only the OpenAI-compatible protocol.
_BEDROCK_PREFIXES = ("anthropic.", "amazon.", "meta.", "mistral.", "cohere.")


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--model", help="the model whose answers are judged (for the default paths)")
    parser.add_argument("--input", type=Path, help="inference JSONL (default outputs/<bench>/<model>/run-<K>/infer.jsonl)")
    parser.add_argument(
        "--output",
        type=Path,
        help="judge JSONL (default: judge.jsonl beside an infer.jsonl input, else outputs/<input-name>_graded.jsonl as upstream)",
    )
    parser.add_argument("--judge-model", default="gpt-5.1", help="judge model (default gpt-5.1, as upstream)")
    parser.add_argument("--aws-region", help=argparse.SUPPRESS)  # accepted for upstream command lines
    cli.add_endpoint_args(parser, upstream_max_retries=3)
    bench.add_judge_arguments(parser)


def _paths(bench: Benchmark, args) -> tuple[Path, Path]:
    if args.input is None:
        if not args.model:
            raise BadInput("give --input, or --model (and --run) to use the default output layout")
        infer_path = paths.run_dir(args.outputs_dir, bench.name, args.model, args.run) / "infer.jsonl"
    else:
        infer_path = args.input
    if args.output is not None:
        return infer_path, args.output
    if infer_path.name == "infer.jsonl":
        return infer_path, infer_path.with_name("judge.jsonl")
    return infer_path, Path("outputs") / f"{infer_path.stem}_graded.jsonl"


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("judge", "Grade every inference row not yet judged (resumable).", _add_args, argv)
    infer_path, output = _paths(bench, args)
    if not infer_path.exists():
        raise BadInput("no such inference file (run infer first)", infer_path)
    if bench.judge_uses_llm and "." in args.judge_model and (
        ":" in args.judge_model or args.judge_model.startswith(_BEDROCK_PREFIXES)
    ):
        raise BadInput(
            f"{args.judge_model!r} looks like an AWS Bedrock model; this pipeline speaks the OpenAI-compatible "
            "protocol only: put the judge behind an OpenAI-compatible gateway and pass --base-url"
        )
    rows = jsonl.latest_rows(infer_path, row_id)
    gc.freeze()  # the loaded rows live to the end: keep the collector from rescanning them
    endpoint = cli.endpoint_from_args(args, args.judge_model, env_prefix="JUDGE")

    with lock.exclusive(output):
        judged = jsonl.latest_rows(output, row_id)
        pending = [
            Task(id=task_id, row=row, line=0)
            for task_id, row in rows.items()
            if task_id not in judged or not bench.is_judged(judged[task_id])
        ]
        manifest.write(
            output,
            {
                "stage": "judge",
                "benchmark": bench.name,
                "input": str(infer_path),
                "judge_model": args.judge_model if bench.judge_uses_llm else None,
                "endpoint": endpoint.host if bench.judge_uses_llm else None,
                "params": {**endpoint.params, **endpoint.extra_body} if bench.judge_uses_llm else {},
            },
        )
        print(
            f"judge: {bench.name} · {len(rows)} inference rows, {len(rows) - len(pending)} already judged, "
            f"{len(pending)} to judge → {output}",
            file=sys.stderr,
        )
        if not pending:
            return EXIT_OK
        retry_later = set()  # rows this run wrote as stand-ins (every earlier one was pending again)

        async def grade(task, client):
            row = await bench.grade(task.row, client)
            if bench.is_provisional(row):
                retry_later.add(task.id)
            return row

        judge_endpoint = endpoint if bench.judge_uses_llm else None
        summary = asyncio.run(runner.run_with_client("judge", judge_endpoint, pending, output, args, grade))

    code = runner.finish("judge", summary, output)
    if retry_later:
        print(f"judge: {len(retry_later)} rows will be judged again on the next run (judge API failed)", file=sys.stderr)
    if code == EXIT_OK and retry_later:
        return EXIT_INCOMPLETE
    return code
