"""What the four stage scripts share: flags, endpoint settings, and turning errors into exit codes."""

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Callable

from . import benchmarks, redact
from .errors import EXIT_INTERRUPTED, BadInput, StageError
from .paths import DEFAULT_ROOT


def run_stage(name: str, main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Run a stage's main and map every way it can end to one exit code and one line."""
    os.umask(os.umask(0) | 0o002)  # the user's umask, but never a world-writable output
    try:
        return main(sys.argv[1:] if argv is None else argv)
    except StageError as exc:
        print(f"{name}: error: {redact.redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        print(redact.redact(traceback.format_exc()), file=sys.stderr, end="")
        return 1


def sigterm_as_interrupt() -> None:
    """Make SIGTERM end a process as Ctrl-C does (cleanup in `finally`, exit 130)."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def parser_for(
    stage: str,
    description: str,
    add_args: Callable[[argparse.ArgumentParser, benchmarks.Benchmark], None],
    argv: list[str],
    *,
    per_run: bool = True,
):
    """Parse argv in two passes: --bench first, then the full flag set including the benchmark's own."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--bench", default="clbench")
    known, _ = pre.parse_known_args(argv)
    if known.bench not in benchmarks.REGISTRY:
        raise BadInput(f"unknown benchmark {known.bench!r}; choose from {', '.join(benchmarks.REGISTRY)}")
    bench = benchmarks.get(known.bench)
    parser = argparse.ArgumentParser(prog=f"{stage}.py", description=description)
    parser.add_argument(
        "--bench", default="clbench", choices=list(benchmarks.REGISTRY), help="benchmark (default: clbench)"
    )
    if per_run:
        parser.add_argument("--run", type=int, default=1, help="run number K, for outputs/<bench>/<model>/run-K (default 1)")
    parser.add_argument("--outputs-dir", type=Path, default=DEFAULT_ROOT, help="root of the output layout (default outputs)")
    add_args(parser, bench)
    args = parser.parse_args(argv)
    if per_run and args.run < 1:
        parser.error("--run must be 1 or more")
    bench.configure(args)
    return bench, args


def add_endpoint_args(parser: argparse.ArgumentParser, *, upstream_max_retries: int | None = None) -> None:
    g = parser.add_argument_group("endpoint and generation")
    g.add_argument("--base-url", help="OpenAI-compatible endpoint URL (default: $OPENAI_BASE_URL; for judge.py $JUDGE_BASE_URL first; else OpenAI)")
    g.add_argument("--api-key", help="API key (default: from the environment; never written anywhere)")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    g.add_argument(
        "--max-retries",
        type=int,
        default=6 if upstream_max_retries is None else upstream_max_retries,
        help="retries of a transient failure (429, 5xx, timeout, connection) per call (default %(default)s)",
    )
    g.add_argument("--max-retry-seconds", type=float, default=900.0, help="cap on the time one call spends retrying (default 900)")
    g.add_argument("--backoff", type=float, default=1.0, help="first backoff wait in seconds, doubled per retry (default 1)")
    g.add_argument("--backoff-max", type=float, default=60.0, help="longest backoff wait in seconds (default 60)")
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--max-tokens", type=int, help="cap on generated tokens")
    g.add_argument(
        "--max-tokens-param",
        choices=("max_tokens", "max_completion_tokens"),
        default="max_tokens",
        help="body field that carries --max-tokens (OpenAI reasoning models want max_completion_tokens)",
    )
    g.add_argument("--reasoning-effort", help="e.g. low, medium, high (sent as reasoning_effort)")
    g.add_argument(
        "--extra-body",
        help="JSON object merged into the request body for provider-specific fields, "
        "e.g. '{\"top_k\": 20}' (or @file.json)",
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="print how many calls the pending tasks need and an estimate of their tokens and cost; send nothing",
    )
    g.add_argument("--prices", type=Path, help="price table JSON for --dry-run (default $EVALPIPE_PRICES, else the bundled dated table)")
    b = parser.add_argument_group("batch engines (see README: online, export/import, Batch API)")
    b.add_argument("--export-batch", type=Path, metavar="FILE",
                   help="write the next call of every pending task as OpenAI batch request lines and exit")
    b.add_argument("--import-batch", type=Path, nargs="+", metavar="FILE",
                   help="write the rows that batch output/error files complete (any order, any subset; idempotent)")
    b.add_argument("--backend", choices=("online", "batch"), default="online",
                   help="online (default) or batch: submit to the Batch API and advance a state file per invocation "
                   "(exit 75 while waiting)")
    b.add_argument("--batch-wait", type=float, default=0.0, help="with --backend batch, keep polling up to S seconds (default 0)")
    b.add_argument("--batch-poll", type=float, default=30.0, help="first wait between polls in seconds, doubled up to 300 (default 30)")
    b.add_argument("--batch-max-requests", type=int, default=50_000, help="requests per batch file (default 50,000)")
    b.add_argument("--batch-max-bytes", type=int, default=200 * 1024 * 1024, help="bytes per batch file (default 200 MB)")
    g.add_argument("--workers", type=int, default=8, help="calls in flight at once (default 8)")
    g.add_argument("--grace", type=float, default=10.0, help="seconds to let calls in flight finish after SIGINT/SIGTERM (default 10)")
    g.add_argument("--log-every", type=float, default=30.0, help="seconds between progress lines when not on a terminal (default 30)")
    g.add_argument("--progress", choices=("auto", "bar", "log"), default="auto",
                   help="a tqdm bar, plain log lines, or auto: the bar on a terminal, lines otherwise (default)")


def _extra_body(text: str | None) -> dict:
    if not text:
        return {}
    source = "--extra-body"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot read --extra-body file: {exc.strerror}", source) from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"--extra-body is not valid JSON: {exc}", None if source == "--extra-body" else source) from None
    if not isinstance(value, dict):
        raise BadInput("--extra-body must be a JSON object")
    return value


def endpoint_from_args(args: argparse.Namespace, model: str, env_prefix: str = "OPENAI"):
    """An llm.Endpoint: flags first, then <PREFIX>_API_KEY / <PREFIX>_BASE_URL, then OPENAI_*."""
    from .llm import Endpoint  # here, so that score and aggregate never load the openai SDK


    def env(name: str) -> str | None:
        return os.environ.get(f"{env_prefix}_{name}") or os.environ.get(f"OPENAI_{name}") or None

    params = {}
    for flag, field in (("temperature", "temperature"), ("top_p", "top_p"), ("reasoning_effort", "reasoning_effort")):
        if getattr(args, flag) is not None:
            params[field] = getattr(args, flag)
    if args.max_tokens is not None:
        params[args.max_tokens_param] = args.max_tokens
    if args.workers < 1:
        raise BadInput("--workers must be 1 or more")
    return Endpoint(
        model=model,
        base_url=args.base_url or env("BASE_URL"),
        api_key=args.api_key or env("API_KEY"),
        timeout=args.timeout,
        max_retries=max(0, args.max_retries),
        max_retry_seconds=args.max_retry_seconds,
        backoff_initial=args.backoff,
        backoff_max=args.backoff_max,
        params=params,
        extra_body=_extra_body(args.extra_body),
    )
