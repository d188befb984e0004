"""The single HTML file: CSS and script inline, the data in inert blocks, a strict CSP (docs/viewer.md)."""

import base64
import gzip
import hashlib
import json
import re
from importlib import resources
from typing import Any

import orjson

CHUNK = 500  # samples per detail block
TEXT_CHUNK_CHARS = 256_000  # shared texts per block (a longer text gets a block of its own)

_SCRIPT_ESCAPES = {ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"}  # orjson escapes none of them


def dumps(obj: Any) -> bytes:
    """Compact JSON; a string orjson refuses (a lone surrogate) is written with \\u escapes instead."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False, default=str).encode()


def script_json(obj: Any) -> str:
    """JSON safe to place inside a <script> block: it cannot end the block or open a comment."""
    return dumps(obj).decode().translate(_SCRIPT_ESCAPES)


def packed(obj: Any) -> str:
    """gzip + base64 of the JSON (deterministic: no timestamp in the gzip header)."""
    return base64.b64encode(gzip.compress(dumps(obj), compresslevel=6, mtime=0)).decode("ascii")


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


_MARKER = re.compile(r"%%(CSP|STYLE|META|BLOCKS|SCRIPT)%%")


def render(meta: dict, blocks: list[tuple[str, str]]) -> str:
    assets = resources.files(__package__)
    template, style, script = (
        assets.joinpath(f"viewer.{ext}").read_text(encoding="utf-8") for ext in ("html", "css", "js")
    )
    for name, text, end in (("viewer.css", style, "</style"), ("viewer.js", script, "</script")):
        assert end not in text.lower() and "<!--" not in text, f"{name} must not contain {end} or <!--"
    body = "\n".join(f'<script type="application/octet-stream" id="{name}">{data}</script>' for name, data in blocks)
    csp = (
        f"default-src 'none'; script-src {csp_hash(script)}; style-src {csp_hash(style)}; img-src data:; "
        "connect-src 'none'; worker-src blob:; "  # the regular-expression search's worker, made from the page's script
        "base-uri 'none'; form-action 'none'; require-trusted-types-for 'script'; "
        "trusted-types viewer-worker"  # the one policy: it passes the worker's blob URL and nothing else
    )
    values = {"CSP": csp, "STYLE": style, "META": script_json(meta), "BLOCKS": body, "SCRIPT": script}
    found = _MARKER.findall(template)
    assert sorted(found) == sorted(values), f"template markers {found}"
    return _MARKER.sub(lambda m: values[m.group(1)], template)
