"""judge: grade every inference row that has no final judge row yet.

With --error-analysis (CL-bench), classify instead why each failed solution failed: the judge
rows are the input and `error_analysis.jsonl` beside them the output.
"""

import argparse
import asyncio
import gc
import sys
from pathlib import Path

from .. import batch, batch_backend, cli, cost, dryrun, jsonl, lock, manifest, paths, runner
from ..benchmarks import Benchmark, Task, row_id
from ..errors import EXIT_INCOMPLETE, EXIT_OK, BadInput

# Model names upstream routes to AWS Bedrock; we speak only the OpenAI-compatible protocol.
_BEDROCK_PREFIXES = ("anthropic.", "amazon.", "meta.", "mistral.", "cohere.")
# Judge flags that change which rows are (re)judged, not what a judge row says.
_NOT_IN_FINGERPRINT = ("model", "aws_region", "judge_prompt", "parse_attempts", "rejudge_parse_errors", "parse", "error_analysis")


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--model", help="the model whose answers are judged (for the default paths)")
    parser.add_argument(
        "--input",
        type=Path,
        help="inference JSONL (default outputs/<bench>/<model>/run-<K>/infer.jsonl; with --error-analysis the judge JSONL)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="judge JSONL (default: judge.jsonl beside an infer.jsonl input, else outputs/<input-name>_graded.jsonl "
        "as upstream; with --error-analysis, error_analysis.jsonl beside the judge file)",
    )
    parser.add_argument("--judge-model", default="gpt-5.1", help="judge model (default gpt-5.1, as upstream)")
    parser.add_argument("--aws-region", help=argparse.SUPPRESS)  # accepted for upstream command lines
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="add rows to an output judged under another configuration (judge model, parameters, prompt); "
        "without it such a rerun is refused",
    )
    if bench.error_analysis_name:
        parser.add_argument(
            "--error-analysis",
            action="store_true",
            help="classify each failed solution's error types with the judge model (reads the judge rows)",
        )
    cli.add_endpoint_args(parser, upstream_max_retries=3)
    bench.add_judge_arguments(parser)


def _paths(bench: Benchmark, args, analysis: bool) -> tuple[Path, Path]:
    first_file = "judge.jsonl" if analysis else "infer.jsonl"
    if args.input is None:
        if not args.model:
            raise BadInput("give --input, or --model (and --run) to use the default output layout")
        in_path = paths.run_dir(args.outputs_dir, bench.name, args.model, args.run, args.label) / first_file
    else:
        in_path = args.input
    if args.output is not None:
        return in_path, args.output
    if analysis:
        return in_path, paths.error_analysis_path(in_path, bench.error_analysis_name)
    if in_path.name == "infer.jsonl":
        return in_path, in_path.with_name("judge.jsonl")
    return in_path, Path("outputs") / f"{in_path.stem}_graded.jsonl"


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("judge", "Grade every inference row not yet judged (resumable).", _add_args, argv)
    analysis = getattr(args, "error_analysis", False)
    in_path, output = _paths(bench, args, analysis)
    if not in_path.exists():
        raise BadInput(f"no such {'judge' if analysis else 'inference'} file (run {'judge' if analysis else 'infer'} first)", in_path)
    uses_llm = bench.judge_uses_llm or analysis
    if not uses_llm and args.backend == "batch":
        print(f"judge: {bench.name} is graded by a rule (no API calls): --backend batch has nothing to do", file=sys.stderr)
        args.backend = "online"
    if uses_llm and "." in args.judge_model and (":" in args.judge_model or args.judge_model.startswith(_BEDROCK_PREFIXES)):
        raise BadInput(
            f"{args.judge_model!r} looks like an AWS Bedrock model; this pipeline speaks the OpenAI-compatible "
            "protocol only: put the judge behind an OpenAI-compatible gateway and pass --base-url"
        )
    rows = jsonl.latest_rows(in_path, row_id)
    gc.freeze()  # the loaded rows live to the end: keep the collector from rescanning them
    endpoint = cli.endpoint_from_args(args, args.judge_model, env_prefix="JUDGE") if uses_llm else None
    if analysis:
        label, prompts = "error analysis", bench.error_analysis_prompts()
        rows = {k: row for k, row in rows.items() if bench.needs_error_analysis(row)}
        is_done, work = bench.is_analyzed, bench.analyze_error
    else:
        label, prompts = "judge", bench.judge_prompts()
        is_done, work = bench.is_judged, bench.grade
    fingerprint = None  # a rule judge: nothing about the judge to keep apart
    if uses_llm:
        fingerprint = manifest.fingerprint(
            args, {"prompt_sha256": manifest.sha256_texts(prompts), "request_extra_body": endpoint.extra_body}, _NOT_IN_FINGERPRINT
        )

    def pending_given(written: dict) -> list:
        return [Task(id=k, row=row, line=0) for k, row in rows.items() if k not in written or not is_done(written[k])]

    def announce(pending: list) -> None:
        print(
            f"{label}: {bench.name} · {len(rows)} rows to cover, {len(rows) - len(pending)} already done, "
            f"{len(pending)} to do → {output}",
            file=sys.stderr,
        )

    if uses_llm and (args.export_batch or args.import_batch or args.backend == "batch") and hasattr(args, "parse_attempts"):
        args.parse_attempts = 1  # one judge call per task and batch; --rejudge-parse-errors sends them again
    if args.dry_run:  # reads only: no folder, no lock file, no manifest
        pending = pending_given(jsonl.latest_rows(output, row_id))
        announce(pending)
        dryrun.estimate(
            label, pending, lambda task, client: work(task.row, client), endpoint,
            args.max_tokens, cost.load_prices(args.prices), first_call_only=True,
        )
        return EXIT_OK

    with lock.exclusive(output):
        done = jsonl.latest_rows(output, row_id)
        in_batches = batch_backend.open_batches(output)
        if uses_llm and (done or in_batches) and not args.allow_config_change:
            manifest.refuse_if_changed(output, fingerprint)
        batch_backend.refuse_other_engines(output, in_batches, args)
        pending = pending_given(done)
        announce(pending)
        if args.export_batch:
            return batch.export(label, pending, lambda task, client: work(task.row, client), endpoint, args.export_batch, args)
        record = manifest.Record(
            output,
            {
                "stage": "error_analysis" if analysis else "judge",
                "benchmark": bench.name,
                "input": str(in_path.resolve()),
                "judge_model": args.judge_model if uses_llm else None,
                "endpoint": endpoint.host if uses_llm else None,
                "params": {**endpoint.params, **endpoint.extra_body} if uses_llm else {},
                "fingerprint": fingerprint,
            },
        )
        counts = {"rows": len(rows), "done_before": len(rows) - len(pending), "pending": len(pending)}
        if not pending and not in_batches:
            record.finish(**counts, written=0, failed=0)
            return EXIT_OK
        retry_later = set()  # rows this run wrote as stand-ins (every earlier one was pending again)

        async def grade(task, client):
            row = await work(task.row, client)
            if bench.is_provisional(row):
                retry_later.add(task.id)
            return row

        if args.backend == "batch":

            def still_pending() -> list:
                return pending_given(jsonl.latest_rows(output, row_id))

            code = batch_backend.advance(
                label, still_pending, grade, endpoint, output, args, current=lambda: jsonl.latest_rows(output, row_id)
            )
            record.finish(**counts, backend="batch", exit_code=code, still_pending=len(still_pending()))
            return code
        if args.import_batch:
            summary = batch.import_files(label, pending, grade, endpoint, args.import_batch, output, args, current=done)
        else:
            summary = asyncio.run(runner.run_with_client(label, endpoint, pending, output, args, grade))
        record.finish(**counts, written=summary.written, failed=summary.failed, retry_later=len(retry_later))

    code = runner.finish(label, summary, output)
    if retry_later:
        print(f"{label}: {len(retry_later)} rows will be done again on the next run (judge API failed)", file=sys.stderr)
    if code == EXIT_OK and retry_later:
        return EXIT_INCOMPLETE
    return code
