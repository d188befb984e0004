"""infer: ask the model for every selected task that has no row yet."""

import argparse
import asyncio
import gc
import sys
from pathlib import Path

from .. import batch, batch_backend, cli, cost, dryrun, jsonl, lock, manifest, paths, runner
from ..benchmarks import Benchmark, row_id
from ..checkpoint import StepCache
from ..errors import EXIT_OK


def _add_args(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--model", required=True, help="model name sent to the endpoint")
    default = bench.default_data.relative_to(paths.PROJECT) if bench.default_data else None
    parser.add_argument("--input", type=Path, help=f"dataset JSONL (default: the bundled sample, {default})")
    parser.add_argument("--output", type=Path, help="output JSONL (default outputs/<bench>/<model>/run-<K>/infer.jsonl)")
    parser.add_argument("--max-samples", type=int, help="only the first N tasks of the dataset (a prefix, as upstream)")
    parser.add_argument(
        "--slim",
        action="store_true",
        help="leave the copied `messages` out of the rows (much smaller files; `python -m evalpipe.expand` "
        "joins them back from the dataset for upstream tools)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="add rows to an output made under another configuration (model, parameters, dataset, options); "
        "without it such a rerun is refused",
    )
    cli.add_endpoint_args(parser)
    bench.add_infer_arguments(parser)


def main(argv: list[str]) -> int:
    bench, args = cli.parser_for("infer", "Run the model on every pending task (resumable).", _add_args, argv)
    data = args.input or bench.default_data
    tasks = bench.load(data)
    tasks = bench.select(tasks, args.max_samples)  # prefix first, then resume, as upstream
    gc.freeze()  # the loaded dataset lives to the end: keep the collector from rescanning it
    output = args.output or paths.run_dir(args.outputs_dir, bench.name, args.model, args.run, args.label) / "infer.jsonl"
    endpoint = cli.endpoint_from_args(args, args.model)

    data_sha = manifest.sha256_file(Path(data))
    fingerprint = manifest.fingerprint(
        args,
        {"dataset_sha256": data_sha, "prompt_sha256": manifest.sha256_texts(bench.infer_prompts()),
         "request_extra_body": endpoint.extra_body},
    )

    def pending_given(written: set) -> list:
        return [t for t in tasks if t.id not in written]

    def solver(steps: StepCache):
        async def solve(task, client):
            row = await bench.solve(task, client, steps)
            if args.slim:
                row.pop("messages", None)
            return row

        return solve

    def announce(pending: list) -> None:
        print(
            f"infer: {bench.name} · {args.model} · {len(tasks)} selected, {len(tasks) - len(pending)} already done, "
            f"{len(pending)} to run → {output}",
            file=sys.stderr,
        )

    if args.dry_run:  # reads only: no folder, no lock file, no manifest
        pending = pending_given(jsonl.ids_in(output, row_id))
        announce(pending)
        dryrun.estimate(
            "infer", pending, solver(StepCache(output, record=False)), endpoint, args.max_tokens, cost.load_prices(args.prices)
        )
        return EXIT_OK

    with lock.exclusive(output):
        done = jsonl.ids_in(output, row_id)
        in_batches = batch_backend.open_batches(output)
        steps_path = StepCache.path_for(output)
        paid_for = done or in_batches or (steps_path.exists() and steps_path.stat().st_size > 0)
        if paid_for and not args.allow_config_change:
            manifest.refuse_if_changed(output, fingerprint)
        batch_backend.refuse_other_engines(output, in_batches, args)
        pending = pending_given(done)
        announce(pending)
        if args.export_batch:
            return batch.export("infer", pending, solver(StepCache(output, record=False)), endpoint, args.export_batch, args)
        record = manifest.Record(
            output,
            {
                "stage": "infer",
                "benchmark": bench.name,
                "dataset": str(Path(data).resolve()),
                "dataset_sha256": data_sha,
                "max_samples": args.max_samples,
                "model": args.model,
                "endpoint": endpoint.host,
                "params": {**endpoint.params, **endpoint.extra_body},
                "slim": args.slim,
                "fingerprint": fingerprint,
            },
        )
        counts = {"selected": len(tasks), "done_before": len(tasks) - len(pending), "pending": len(pending)}
        if not pending and not in_batches:
            record.finish(**counts, written=0, failed=0)
            return EXIT_OK
        steps = StepCache(output)

        def still_pending() -> list:
            return pending_given(jsonl.ids_in(output, row_id))

        try:
            if args.backend == "batch":
                code = batch_backend.advance("infer", still_pending, solver(steps), endpoint, output, args)
                record.finish(**counts, backend="batch", exit_code=code, still_pending=len(still_pending()))
                return code
            if args.import_batch:
                summary = batch.import_files("infer", pending, solver(steps), endpoint, args.import_batch, output, args)
            else:
                summary = asyncio.run(runner.run_with_client("infer", endpoint, pending, output, args, solver(steps)))
        finally:
            steps.close()
        record.finish(**counts, written=summary.written, failed=summary.failed, interrupted=summary.interrupted)

    return runner.finish("infer", summary, output)
