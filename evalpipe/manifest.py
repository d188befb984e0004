"""What made an output: written beside it as `<output>.manifest.json`."""

import hashlib
import os
import time
from pathlib import Path

import orjson

from . import __version__, jsonl


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
