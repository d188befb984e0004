"""A benchmark's results as a Hugging Face Hub dataset, one commit (none when nothing changed): `make publish
BENCH=coin_flip REPO=owner/name`. What the repo gets, and the token: docs/results.md."""

import argparse
import os
import re
import sys
from pathlib import Path

import orjson

from ..errors import EXIT_BAD_INPUT, EXIT_ENDPOINT_REFUSED, EXIT_OK, EXIT_UNREACHABLE, BadInput, run_stage
from ..redact import redact
from ..store import jsonl, paths, rows, shards
from . import discover

REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
ROW_FIELDS = ("status", "finish_reason", "latency_s", "score", "judge_status", "judge_model", "judge_latency_s")
SERVED_FIELDS = ("response_model", "system_fingerprint", "judge_response_model", "judge_system_fingerprint")
PROMPT_FIELDS = ("messages", "model_output", "target", "prediction", "grading_rationale", "requirement_status")


def sample_row(bench: str, model: str, run: int, row: dict, with_prompts: bool) -> dict:
    out = {"benchmark": bench, "model": model, "run": run, "task_id": str(row.get("idx"))}
    out |= {key: row.get(key) for key in ROW_FIELDS}
    usage, judge = (u if isinstance(u, dict) else {} for u in (row.get("usage"), row.get("judge_usage")))
    out |= {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens")}
    if usage.get("cached_tokens") is not None:  # rows keep usage flat (llm.usage_dict)
        out["cached_tokens"] = usage["cached_tokens"]
    out |= {f"judge_{key}": judge.get(key) for key in ("prompt_tokens", "completion_tokens")}
    out |= {key: row.get(key) for key in SERVED_FIELDS}
    if with_prompts:
        out |= {key: row[key] for key in PROMPT_FIELDS if key in row}
    return out


def inside(path: Path, root: Path) -> Path:
    """`path`, when it is inside `root` once links are followed: a link may point at any file this user can read."""
    real = path.resolve()
    if not real.is_relative_to(root):
        raise BadInput(
            f"a link to {real}, outside the outputs ({root}): publish uploads only what is in them; "
            "put the file itself there, or remove the link",
            path,
        )
    return path


def files(outputs_dir: Path, bench: str, with_prompts: bool) -> dict[str, bytes]:
    """What this benchmark puts in the repo, path → bytes (README.md apart: it covers every benchmark)."""
    bench_dir = outputs_dir / bench
    root = outputs_dir.resolve()
    summary_path = bench_dir / "aggregate.json"
    if not summary_path.is_file():
        raise BadInput(f"no aggregate.json: run `make aggregate BENCH={bench}` first", bench_dir)
    run_list = discover.runs(bench_dir, lambda run: shards.exists(run / paths.judge_file_name()))
    samples, board = [], []
    for model, k, run_dir in run_list:
        judge_path = run_dir / paths.judge_file_name()
        for part in shards.parts(judge_path):
            inside(part, root)
        # the last row of a task is the one that counts, as in score
        for row in jsonl.latest_rows(judge_path, rows.row_id).values():
            samples.append(jsonl.dumps(sample_row(bench, model, k, row, with_prompts)) + b"\n")
    if not samples:
        raise BadInput("no run has a judge.jsonl", bench_dir)
    summary = inside(summary_path, root).read_bytes()
    for entry in orjson.loads(summary).get("models", []):
        for name, figure in entry.get("figures", {}).items():
            items = figure.get("items") or {}
            low, high = items.get("ci95") or [None, None]
            row = {"model": entry["model"], "figure": name, "runs": len(entry.get("runs", []))}
            row |= {"mean": figure.get("mean"), "std": figure.get("std_sample")}
            row |= {"items_mean": items.get("mean"), "items_se": items.get("se")}
            board.append(jsonl.dumps(row | {"items_ci95_low": low, "items_ci95_high": high}) + b"\n")
    out = {f"{bench}/samples.jsonl": b"".join(samples), f"{bench}/aggregate.json": summary}
    out[f"{bench}/leaderboard.jsonl"] = b"".join(board)
    for name in ("aggregate.md", "aggregate.csv"):
        if (bench_dir / name).is_file():
            out[f"{bench}/{name}"] = inside(bench_dir / name, root).read_bytes()
    for model, k, run_dir in run_list:
        for manifest in sorted(run_dir.glob("*.manifest.json")):
            out[f"{bench}/manifests/{model}/run-{k}/{manifest.name}"] = inside(manifest, root).read_bytes()
    return out


def card(benches: list[str], repo: str) -> str:
    """The dataset card: YAML configs for the Hub's viewer, one pair per benchmark, and where the rest lies."""
    configs = "".join(
        f"  - config_name: {b}\n    data_files:\n      - split: samples\n        path: {b}/samples.jsonl\n"
        f"  - config_name: {b}-leaderboard\n    data_files:\n      - split: leaderboard\n"
        f"        path: {b}/leaderboard.jsonl\n"
        for b in sorted(benches)
    )
    listing = "\n".join(
        f"- `{b}`: per-sample results (`{b}/samples.jsonl`), the leaderboard (`{b}/aggregate.md`, "
        f"`{b}/leaderboard.jsonl`) and the stages' manifests (`{b}/manifests/`)"
        for b in sorted(benches)
    )
    return (
        f"---\npretty_name: {repo.split('/')[1]}\ntags:\n  - evaluation\n  - evalpipe\nconfigs:\n{configs}---\n\n"
        f"# {repo}\n\nEvaluation results published by evalpipe, one folder per benchmark:\n\n{listing}\n\n"
        "Each sample row: benchmark, model, run, task id, score, statuses, tokens, latency, and the model the "
        "endpoint said answered (`response_model`, `system_fingerprint`). Prompts and answers are included only "
        "when published with `--with-prompts`.\n"
    )


def publish(outputs_dir: Path, bench: str, repo: str, with_prompts: bool = False, private: bool = False):
    """Upload; returns huggingface_hub's CommitInfo (the head's when nothing changed) and whether a commit was made."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    staged = files(outputs_dir, bench, with_prompts)
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)  # read now: huggingface_hub reads it at import
    api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
    head = api.repo_info(repo, repo_type="dataset", revision="main")
    present = [sibling.rfilename for sibling in head.siblings or []]
    benches = {path.split("/", 1)[0] for path in present if path.endswith("/samples.jsonl")} | {bench}
    staged["README.md"] = card(sorted(benches), repo).encode()
    operations: list = [CommitOperationAdd(path, data) for path, data in sorted(staged.items())]
    operations += [
        CommitOperationDelete(path) for path in present if path.startswith(f"{bench}/") and path not in staged
    ]
    commit = api.create_commit(repo, operations, commit_message=f"evalpipe: {bench} results", repo_type="dataset")
    return commit, commit.oid != head.sha


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.results.publish", description=__doc__)
    parser.add_argument("bench", help="the benchmark folder under --outputs-dir")
    parser.add_argument("repo", help="the Hub dataset repo, owner/name")
    parser.add_argument("--outputs-dir", type=Path, default=paths.DEFAULT_ROOT)
    parser.add_argument("--with-prompts", action="store_true", help="also publish prompts and answers")
    parser.add_argument("--private", action="store_true", help="create the repo private (an existing one stays)")
    args = parser.parse_args(argv)
    if not REPO.fullmatch(args.repo):
        parser.error(f"REPO={args.repo}: expected owner/name")
    try:
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        print("publish: huggingface_hub is not installed: `make publish` installs it", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        commit, changed = publish(args.outputs_dir, args.bench, args.repo, args.with_prompts, args.private)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        hint = ": set HF_TOKEN to a token that may write to it" if status in (401, 403) else ""
        print(f"publish: the Hub refused {args.repo} (HTTP {status}){hint}", file=sys.stderr)
        return EXIT_ENDPOINT_REFUSED if status in (401, 403, 404) else EXIT_UNREACHABLE
    except Exception as exc:  # connection refused, DNS, TLS, timeouts: OSErrors, or httpx's own
        if not isinstance(exc, OSError) and not type(exc).__module__.startswith(("httpx", "httpcore")):
            raise
        print(f"publish: cannot reach the Hub: {type(exc).__name__}: {redact(str(exc))}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if changed:
        print(f"publish: {args.bench} → {commit.commit_url}", file=sys.stderr)
    else:
        print(f"publish: {args.bench}: nothing changed since {commit.commit_url}; no new commit", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_stage("publish", main))
