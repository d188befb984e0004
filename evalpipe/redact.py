"""Keeps secrets out of everything we print or store."""

import re

_secrets: set[str] = set()
_BEARER = re.compile(r"(Bearer\s+)[^\s\"',;]+", re.IGNORECASE)


def register(secret: str | None) -> None:
    if secret and len(secret) >= 4:
        _secrets.add(secret)


def redact(text: str) -> str:
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, "[REDACTED]")
    return _BEARER.sub(r"\1[REDACTED]", text)
