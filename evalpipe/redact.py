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
        text = text.replace(secret, "[REDACTED]")
    return text


def redact(text: str) -> str:
    """The registered secrets and any bearer token replaced: for what we print or log."""
    return _BEARER.sub(r"\1[REDACTED]", secrets(text))


# What a terminal would act on rather than show: C0 and C1 controls (ESC starts a sequence that can retitle the
# window, clear the screen or move the cursor), DEL, the bidirectional overrides (text shown in another order
# than it is), and lone UTF-16 surrogates (not Unicode: they cannot even be encoded to print)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` on one line, safe to print to a terminal: whitespace runs become one space and every other
    control character is shown escaped (ESC as \\x1b), never sent raw."""
    return _UNPRINTABLE.sub(_escaped, " ".join(text.split()))


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def url(text: str) -> str:
    """A URL fit for a message or a file: without user:password@ or ?query (which can carry credentials)."""
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: left out, so that the message about it can be made
        port = None
    netloc = parts.hostname + (f":{port}" if port else "") if parts.hostname else parts.netloc
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
