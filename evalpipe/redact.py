"""Keeps secrets out of everything we print or store."""

import re
import urllib.parse

_secrets: set[str] = set()
_BEARER = re.compile(r"(Bearer\s+)[^\s\"',;]+", re.IGNORECASE)


def register(secret: str | None) -> None:
    if secret and len(secret) >= 4:
        _secrets.add(secret)


def secrets(text: str) -> str:
    """The registered secrets replaced, and nothing else: for what a server answered, which becomes rows (a model's
    answer that explains `Bearer <token>` keeps it; our key, if a server echoes it, does not)."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "[REDACTED]")
    return text


def redact(text: str) -> str:
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, "[REDACTED]")
    return _BEARER.sub(r"\1[REDACTED]", text)


def url(text: str) -> str:
    """A URL fit for a message or a file: without user:password@ or ?query (which can carry credentials)."""
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: left out, so that the message about it can be made
        port = None
    netloc = parts.hostname + (f":{port}" if port else "") if parts.hostname else parts.netloc
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
