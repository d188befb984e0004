"""What made an output: `<output>.manifest.json`, written when a stage starts (what it runs with) and again when it
ends (when, how many rows); `history` keeps each invocation on the output, so a run resumed five times says so."""

import functools
import hashlib
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from .. import __version__
from ..errors import BadInput
from . import jsonl, shards
from .paths import PROJECT


def path_for(output: Path) -> Path:
    return output.with_name(output.name + ".manifest.json")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with jsonl.open_input(path, buffering=0) as f:  # no pipe or device: it would block or never end
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_texts(texts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()


@functools.cache
def git_commit() -> str | None:
    """The project's commit, with `-dirty` when tracked files differ from it; None outside git."""
    describe = ["git", "-C", str(PROJECT), "describe", "--always", "--dirty", "--abbrev=40", "--exclude=*"]
    try:
        done = subprocess.run(describe, capture_output=True, text=True, timeout=5)  # --exclude: no tag names
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def learned(output: Path, key: str) -> dict:
    """What earlier runs on this output learned under `key` (see Record.finish); {} when nothing."""
    value = ((read(output) or {}).get("learned") or {}).get(key)
    return value if isinstance(value, dict) else {}


def read_run(output: Path) -> dict | None:
    """The manifest of a run's file however it was cut: its own, else its first shard's (None: neither)."""
    return (find_run(output) or (None, None))[1]


def find_run(output: Path) -> tuple[Path, dict] | None:
    for part in [output, *shards.shard_files(output).values()]:
        recorded = read(part)
        if recorded is not None:
            return path_for(part), recorded
    return None


def read(output: Path) -> dict | None:
    path = path_for(output)
    if not os.path.exists(path):
        return None
    with jsonl.open_input(path) as f:  # a folder or a pipe there: refused, never waited on
        raw = f.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON ({exc}); delete it to start the record afresh", path) from None
    if not isinstance(body, dict):
        raise BadInput("not a manifest (expected a JSON object); delete it to start the record afresh", path)
    return body


class Record:
    """The manifest of one stage invocation: `Record(output, info)` at the start, `.finish(counts)` at the end.

    A changed fingerprint (let through by --allow-config-change) is recorded only once rows were added under it:
    a run that added none changed nothing, and the next run with the old configuration must not be refused.
    """

    def __init__(self, output: Path, info: dict):
        self.output = output
        previous = read(output) or {}
        self.history = previous.get("history", [])[-49:]  # 50 invocations kept, with this one
        self.info = {
            "evalpipe_version": __version__,
            "git_commit": git_commit(),
            **info,
            "started_at": _now(),
            "ended_at": None,
            "counts": None,
        }
        if isinstance(previous.get("learned"), dict):  # what earlier runs learned of the endpoint stays
            self.info["learned"] = previous["learned"]
        old, new = previous.get("fingerprint"), info.get("fingerprint")
        self.new_fingerprint = None
        if old is not None and new is not None and differences(old, new):
            self.new_fingerprint, self.info["fingerprint"] = new, old
        self._write()

    def finish(self, **counts) -> None:
        """Record the end; a `learned` count ({what: {endpoint: value}}) is merged per endpoint into the top level's,
        for the next run to start from."""
        for what, value in (counts.pop("learned", None) or {}).items():
            earlier = self.info.setdefault("learned", {}).get(what)
            self.info["learned"][what] = {**(earlier if isinstance(earlier, dict) else {}), **value}
        pending = counts.get("pending", 0)
        added = counts.get("written", 0) or pending - counts.get("still_pending", pending)
        if self.new_fingerprint is not None and added:
            self.info["fingerprint"] = self.new_fingerprint
        self.info.update(ended_at=_now(), counts=counts)
        self.history.append({k: self.info[k] for k in ("started_at", "ended_at", "git_commit", "counts")})
        self._write()

    def _write(self) -> None:
        body = {**self.info, "history": self.history}
        jsonl.write_json(path_for(self.output), body)


# Flags that change how a run goes, not what its rows are: left out of the fingerprint. extra_body is
# fingerprinted as request_extra_body (the parsed object sent, not the flag's text), fewshot_data by the demos
# picked from it (in prompt_sha256); shard(s) say which part of the run a process writes.
OPERATIONAL = set(
    "api_key base_url workers timeout max_retries max_retry_seconds backoff backoff_max http_client "
    "grace log_every progress output outputs_dir input run label max_samples allow_config_change dry_run "
    "prices max_cost spending_ledger export_batch import_batch backend batch_wait batch_poll "
    "batch_max_requests batch_max_bytes extra_body fewshot_data shard shards".split()
)


def fingerprint(args, inputs: dict, ignore: Iterable[str] = ()) -> dict:
    """What makes the rows what they are: `inputs` (content hashes of dataset and prompts) and every flag but the
    OPERATIONAL and `ignore`d ones."""
    skip = OPERATIONAL | set(ignore)
    flags = {k: (str(v) if isinstance(v, Path) else v) for k, v in sorted(vars(args).items()) if k not in skip}
    if flags.get("max_tokens") is None:
        flags.pop("max_tokens_param", None)  # which field would carry a cap that is not set
    return {**inputs, **flags}


def differences(old: dict, new: dict) -> list[str]:
    """What two fingerprints set differently; a key only one has comes from another version's format, not a change."""
    return [f"{k}: {old[k]!r} → {new[k]!r}" for k in sorted(set(old) & set(new)) if old[k] != new[k]]


def refuse_if_changed(output: Path, new: dict) -> None:
    """Refuse rows of another configuration than the output's, or than its run's other parts (shards.py)."""
    for part in dict.fromkeys([output, shards.whole(output), *shards.shard_files(output).values()]):
        changed = differences((read(part) or {}).get("fingerprint") or {}, new)
        if changed:
            raise BadInput(
                f"{part} holds rows made under another configuration ({'; '.join(changed)}); "
                "start a new run with --run N (or another --output), or pass --allow-config-change to add rows anyway"
            )
