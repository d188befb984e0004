"""What made an output: written beside it as `<output>.manifest.json`."""

import hashlib
import os
import time
from pathlib import Path

import orjson

from . import __version__, jsonl
from .errors import BadInput


def path_for(output: Path) -> Path:
    return output.with_name(output.name + ".manifest.json")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(output: Path, info: dict) -> None:
    info = {"evalpipe_version": __version__, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info}
    jsonl.atomic_write(path_for(output), orjson.dumps(info, option=orjson.OPT_INDENT_2) + b"\n")


def read(output: Path) -> dict | None:
    path = path_for(output)
    if not os.path.exists(path):
        return None
    return orjson.loads(Path(path).read_bytes())


# Flags that change how a run goes, not what its rows are: left out of the fingerprint.
OPERATIONAL = {
    "api_key", "base_url", "workers", "timeout", "max_retries", "max_retry_seconds", "backoff", "backoff_max",
    "grace", "log_every", "progress", "output", "outputs_dir", "input", "run", "max_samples", "allow_config_change",
}


def fingerprint(args, dataset_sha256: str) -> dict:
    """What makes the rows what they are: the dataset's content and every flag that shapes a request
    (model, generation parameters, benchmark options). Endpoint, concurrency and retry settings,
    and the --max-samples prefix (resuming a longer prefix is the same run), are left out."""
    flags = {k: (str(v) if isinstance(v, Path) else v) for k, v in sorted(vars(args).items()) if k not in OPERATIONAL}
    return {"dataset_sha256": dataset_sha256, **flags}


def refuse_if_changed(output: Path, new: dict) -> None:
    """Refuse to add rows made under another configuration to an output that has rows."""
    old = (read(output) or {}).get("fingerprint")
    if old is None or old == new:
        return
    changed = [f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    raise BadInput(
        f"{output} holds rows made under another configuration ({'; '.join(changed)}); "
        "start a new run with --run N (or another --output), or pass --allow-config-change to add rows anyway"
    )
