"""What the four stage scripts share: flags, the benchmarks' own flags and endpoint settings."""

import argparse
import dataclasses
import json
import os
import re
import typing
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from . import benchmarks, redact
from .client import spending, thinking
from .datasets import hub
from .errors import BadInput
from .store.paths import DEFAULT_ROOT

DEFAULT_JUDGE_MODEL = "gpt-5.1"  # judge.py's, as upstream's CL-bench


def parser_for(
    stage: str,
    description: str,
    add_args: Callable[[argparse.ArgumentParser, benchmarks.Benchmark], None],
    argv: list[str],
    *,
    per_run: bool = True,
):
    """Parse argv in two passes: --bench first, then every flag including the benchmark's own (without --bench,
    --help also lists the other benchmarks' own). A word `hf://...` stands for that Hub file, fetched first."""
    argv = hub.resolve_argv(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--bench")
    known, _ = pre.parse_known_args(argv)
    name = benchmarks.DEFAULT if known.bench is None else known.bench
    if name not in benchmarks.REGISTRY:
        raise BadInput(f"unknown benchmark {name!r}; choose from {', '.join(benchmarks.REGISTRY)}")
    bench = benchmarks.get(name)

    def build(for_bench: benchmarks.Benchmark) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"{stage}.py", description=description)
        parser.add_argument(
            "--bench",
            default=benchmarks.DEFAULT,
            choices=list(benchmarks.REGISTRY),
            help=f"benchmark (default: {benchmarks.DEFAULT})",
        )
        if per_run:
            parser.add_argument(
                "--run", type=whole_number, default=1, help="run number K: outputs/<bench>/<model>/run-K (default 1)"
            )
            parser.add_argument(
                "--label",
                help="name a variant of the model's configuration (e.g. 3shot): its runs go to "
                "outputs/<bench>/<model>@<label>/ and form their own leaderboard row",
            )
        parser.add_argument("--outputs-dir", type=Path, default=DEFAULT_ROOT, help="output root (default outputs)")
        add_args(parser, for_bench)
        for option in dataclasses.fields(for_bench.Options):  # the benchmark's own flags for this stage
            if option.metadata.get("stage") != stage:
                continue
            name, meta = "--" + option.name.replace("_", "-"), option.metadata
            if isinstance(option.default, bool):
                parser.add_argument(name, action="store_true", help=meta["help"])
                continue
            kind = next((t for t in typing.get_args(option.type) if t is not type(None)), option.type)  # X | None → X
            kind = whole_number if kind is int else kind
            parser.add_argument(name, type=kind, default=option.default, choices=meta["choices"], help=meta["help"])
        return parser

    parser = build(bench)
    if known.bench is None:
        # what -h prints; parsing is unchanged. A deliberate override on this one instance (not a stubs problem)
        parser.format_help = lambda: _help_with_other_benchmarks(build, bench)  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    if per_run and args.run < 1:
        parser.error("--run must be 1 or more")
    # the benchmark's Options from the parsed flags (a flag another stage offers keeps its default)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(bench.Options) if hasattr(args, f.name)}
    chosen = type(bench)(bench.Options(**given))
    chosen.thinking = getattr(args, "thinking", chosen.thinking)
    return chosen, args


def whole_number(text: str) -> int:
    """argparse's type for a whole number, in digits 0-9 only: int() also takes other scripts' digits ('٣')."""
    if not re.fullmatch(r"-?[0-9]+", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number (digits 0-9)")
    return int(text)


def _help_with_other_benchmarks(build: Callable[[benchmarks.Benchmark], argparse.ArgumentParser], bench) -> str:
    """The --help text of `bench`'s parser plus, in a group each, the flags only another benchmark adds."""
    shown = build(bench)
    common = set(build(benchmarks.Benchmark())._option_string_actions)  # the flags every benchmark has
    for name, other in benchmarks.REGISTRY.items():
        if name == bench.name:
            continue
        own = [a for a in build(other())._actions if a.option_strings and common.isdisjoint(a.option_strings)]
        if own:
            group = shown.add_argument_group(f"{name} options (with --bench {name})")
            # listed only (this parser never parses): add_argument would clash on a flag two benchmarks share
            group._group_actions.extend(own)
    return shown.format_help()


def add_endpoint_args(parser: argparse.ArgumentParser, stage: str) -> None:
    """The flags of infer and judge, the stages that call an endpoint (long form: docs/usage.md)."""
    g = parser.add_argument_group("endpoint and generation")
    g.add_argument(
        "--base-url", help="endpoint URL (default $OPENAI_BASE_URL, for judge.py $JUDGE_BASE_URL first; else OpenAI)"
    )
    g.add_argument("--api-key", help="API key (default: from the environment; never written anywhere)")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds for each attempt as a whole (default 600)")
    g.add_argument(
        "--max-retries",
        type=whole_number,
        default=3 if stage == "judge" else 6,  # judge: upstream's
        help="retries of a transient failure (429, 5xx, timeout, connection) per call (default %(default)s)",
    )
    g.add_argument("--max-retry-seconds", type=float, default=900.0, help="most seconds one call retries (default 900)")
    g.add_argument("--backoff", type=float, default=1.0, help="first backoff in seconds, doubled per retry (default 1)")
    g.add_argument("--backoff-max", type=float, default=60.0, help="longest backoff wait in seconds (default 60)")
    g.add_argument(
        "--http-client", choices=("aiohttp", "httpx"), default="aiohttp", help="the SDK's transport (default aiohttp)"
    )
    g.add_argument(
        "--temperature",
        type=number_or_none,
        help="sent as temperature (default: not sent, or the benchmark's own for infer); `none` sends none",
    )
    g.add_argument("--top-p", type=float)
    g.add_argument("--max-tokens", type=whole_number, help="cap on generated tokens")
    g.add_argument(
        "--max-tokens-param",
        choices=("max_tokens", "max_completion_tokens"),
        default="max_tokens",
        help="body field that carries --max-tokens (OpenAI reasoning models want max_completion_tokens)",
    )
    g.add_argument("--reasoning-effort", help="e.g. low, medium, high (sent as reasoning_effort)")
    g.add_argument(
        "--thinking",
        choices=thinking.MODES,
        default="separate",
        help="separate (default): a reasoning model's thinking goes to the row's `thinking` field and only its answer "
        "is graded; as-is: content is graded as the server sent it",
    )
    g.add_argument("--extra-body", help="JSON object (or @file) merged into the request body, e.g. '{\"top_k\": 20}'")
    g.add_argument("--dry-run", action="store_true", help="print the calls, tokens and cost it would take; send none")
    g.add_argument("--prices", type=Path, help="for --dry-run, --max-cost (default $EVALPIPE_PRICES, else bundled)")
    g.add_argument(
        "--max-cost", type=_usd, metavar="USD", help="spend at most this much in this run (exit 6 when reached)"
    )
    g.add_argument(
        "--spending-ledger", type=Path, metavar="FILE", help="with --max-cost: count from, and add to, this file"
    )
    g.add_argument("--workers", type=whole_number, default=8, help="calls in flight at once (default 8)")
    g.add_argument("--grace", type=float, default=10.0, help="seconds to finish calls on SIGINT/SIGTERM (default 10)")
    g.add_argument("--log-every", type=float, default=30.0, help="seconds between progress log lines (default 30)")
    g.add_argument(
        "--progress", choices=("auto", "bar", "log"), default="auto", help="auto (default): a bar on a tty, else lines"
    )
    b = parser.add_argument_group("batch engines (see docs/batch.md: online, export/import, Batch API)")
    b.add_argument(
        "--export-batch", type=Path, metavar="FILE", help="write the pending tasks' next calls as batch lines and exit"
    )
    b.add_argument(
        "--import-batch", type=Path, nargs="+", metavar="FILE", help="write the rows batch output/error files complete"
    )
    b.add_argument(
        "--backend",
        choices=("online", "batch"),
        default="online",
        help="online (default) or batch: submit to the Batch API, one step per invocation (exit 75 while waiting)",
    )
    b.add_argument("--batch-wait", type=float, default=0.0, help="seconds --backend batch keeps polling (default 0)")
    b.add_argument("--batch-poll", type=float, default=30.0, help="first seconds between polls, doubled up to 300")
    b.add_argument("--batch-max-requests", type=whole_number, default=50_000, help="requests per batch file")
    b.add_argument("--batch-max-bytes", type=whole_number, default=200 * 1024 * 1024, help="bytes per batch file")
    if stage == "infer":
        parser.add_argument(
            "--prefix-schedule",
            choices=("on", "off"),
            default="on",
            help="on (default): a shared context's first task alone, the rest once it is answered; off: dataset order",
        )
    s = parser.add_argument_group("shards (docs/scale.md)")
    s.add_argument(
        "--shard",
        metavar="K/N",
        help="only shard K of N (K from 0); without it, from Slurm's or a Kubernetes Indexed Job's environment; "
        "`all`: the whole run",
    )
    s.add_argument("--shards", type=whole_number, metavar="N", help="the number of shards (K: JOB_COMPLETION_INDEX)")


def _usd(text: str) -> float:
    try:
        return spending.amount(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def number_or_none(text: str) -> float | None:
    return None if text.strip().lower() == "none" else float(text)


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
    """An llm.Endpoint: flags first, then <PREFIX>_API_KEY / <PREFIX>_BASE_URL, then OPENAI_* (each on its own).
    A key from <P>_API_KEY is sent only to <P>_BASE_URL's origin (OpenAI's when unset): another is refused."""
    from .client.llm import Endpoint  # here: score and aggregate, which call no endpoint, never import llm

    sent = ("temperature", "top_p", "reasoning_effort")
    params = {name: getattr(args, name) for name in sent if getattr(args, name) is not None}
    if args.max_tokens is not None:
        params[args.max_tokens_param] = args.max_tokens
    if args.workers < 1:
        raise BadInput("--workers must be 1 or more")
    prefixes = list(dict.fromkeys((env_prefix, "OPENAI")))
    homes = {p: _env(f"{p}_BASE_URL") or Endpoint.OPENAI_URL for p in prefixes}  # where each <P>_API_KEY belongs
    given = [
        ("--base-url", args.base_url, prefixes[0]),
        *((f"{p}_BASE_URL", _env(f"{p}_BASE_URL"), p) for p in prefixes),
    ]
    source, base_url, prefix = next((g for g in given if g[1]), ("the default (OpenAI)", None, ""))
    if base_url is not None:
        _refuse_credentials(base_url, source, prefix)
    url = base_url or Endpoint.OPENAI_URL
    return Endpoint(
        model=model,
        base_url=base_url,
        api_key=args.api_key or _env_key(prefixes, homes, url, source),
        timeout=args.timeout,
        max_retries=max(0, args.max_retries),
        max_retry_seconds=args.max_retry_seconds,
        backoff_initial=args.backoff,
        backoff_max=args.backoff_max,
        params=params,
        extra_body=_extra_body(args.extra_body),
        base_url_source=source,
        headers=_sdk_environment_headers(_origin(url, source) == _origin(homes["OPENAI"], "OPENAI_BASE_URL")),
        http_client=args.http_client,
        thinking=args.thinking,
    )


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _refuse_credentials(url: str, source: str, prefix: str) -> None:
    """BadInput (before any request) when `url` carries user:password@: the SDK would send them nowhere (every call
    would fail), and the key goes in the Authorization header. The message never shows them."""
    try:
        parts = urllib.parse.urlsplit(url)
        credentials = parts.username is not None or parts.password is not None
    except ValueError:
        raise BadInput(f"{source} is not a valid URL") from None
    if credentials:
        raise BadInput(
            f"{source} has credentials in it ({redact.url(url).replace('//', '//USER:KEY@', 1)}): "
            f"give the URL without them and the key in {prefix}_API_KEY or --api-key (sent in the Authorization header)"
        )


def _env_key(prefixes: list[str], homes: dict[str, str], url: str, url_source: str) -> str | None:
    """The first <P>_API_KEY set, if `url` is on its origin; else a refusal naming settings and hosts, never the key."""
    key_prefix = next((p for p in prefixes if _env(f"{p}_API_KEY")), None)
    if key_prefix is None:
        return None  # no key anywhere: Endpoint.sdk_options() decides (any key for a local server)
    key_var, home = f"{key_prefix}_API_KEY", homes[key_prefix]
    if _origin(url, url_source) == _origin(home, f"{key_prefix}_BASE_URL"):
        return os.environ[key_var]
    if url_source == "--base-url":
        missing, fix = "", "pass its key with --api-key (any value for a server that needs no key)"
    elif prefixes.index(url_source.removesuffix("_BASE_URL")) < prefixes.index(key_prefix):
        wanted = url_source.replace("_BASE_URL", "_API_KEY")  # e.g. JUDGE_BASE_URL set, JUDGE_API_KEY not
        missing, fix = (
            f" but {wanted} is not set",
            f"set {wanted} (any value for a server that needs no key) or pass --api-key",
        )
    else:
        # e.g. JUDGE_API_KEY set without JUDGE_BASE_URL: the URL fell back to OPENAI_BASE_URL
        wanted = f"{key_prefix}_BASE_URL"
        missing, fix = f" but {wanted} is not set", f"set {wanted} to the endpoint {key_var} is for, or pass --api-key"
    raise BadInput(
        f"{url_source} points to {redact.url(url)}{missing}; the key in {key_var} belongs to {redact.url(home)} "
        f"and is not sent to another host: {fix}"
    )


def _origin(url: str, source: str) -> tuple[str, str, int | None]:
    """Scheme, host and port: what a key is bound to (another path on the same server is the same place)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise BadInput(f"{source} is not a valid URL (bad port)") from None
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def _sdk_environment_headers(at_home: bool) -> dict[str, str | None]:
    """The headers the openai SDK adds from OPENAI_ORG_ID, _PROJECT_ID and _CUSTOM_HEADERS: kept where OPENAI_API_KEY
    belongs (`at_home`), else removed (None). An Authorization header there is never sent: the key is chosen above."""
    found = {"OpenAI-Organization": _env("OPENAI_ORG_ID"), "OpenAI-Project": _env("OPENAI_PROJECT_ID")}
    for line in os.environ.get("OPENAI_CUSTOM_HEADERS", "").split("\n"):
        name, colon, value = line.partition(":")
        if colon:
            found[name.strip()] = value.strip()
    return {
        name: value if at_home and value and name.lower() != "authorization" else None for name, value in found.items()
    }
