"""The head of a response as bytes: the status line and the app's headers,
validated (a header name must be a token, no CR or LF anywhere, a numeric
`content-length`); the framing headers are the server's (`transfer-encoding`
from the app is dropped), what it must know of the rest is returned."""

from __future__ import annotations

from typing import Any, Final

from gateway.http.responses import STATUS_LINES

__all__ = ["encode_head"]

_SPECIAL: Final = frozenset((b"content-length", b"transfer-encoding", b"connection", b"date"))

# Response header names seen before → their lower-case form (validated once).
_NAMES: dict[bytes, bytes] = {}
_TOKEN: Final = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _new_name(name: bytes) -> bytes:
    if not isinstance(name, bytes) or not name or name.translate(None, _TOKEN):
        raise RuntimeError(f"Invalid HTTP response header name: {name!r}")
    lower = name.lower()
    if len(_NAMES) < 4096:
        _NAMES[name] = lower
    return lower


def encode_head(status: int, headers: Any) -> tuple[bytes, int | None, bool, bool]:
    """`(head without its blank line, content-length or None, has a date header,
    the app asked to close)`; RuntimeError for a bad status or header."""
    line = STATUS_LINES.get(status)
    if line is None:
        raise RuntimeError(f"Invalid HTTP status code: {status!r}")
    parts = [line]
    length: int | None = None
    has_date = app_close = False
    names = _NAMES
    for name, value in headers:
        lname = names.get(name) or _new_name(name)
        if lname in _SPECIAL:
            if lname == b"content-length":
                if not value.isdigit():
                    raise RuntimeError(f"Invalid content-length: {value!r}")
                length = int(value)
            elif lname == b"transfer-encoding":
                continue  # the framing is the server's
            elif lname == b"connection":
                app_close = app_close or b"close" in value.lower()
            else:
                has_date = True
        parts += (name, b": ", value, b"\r\n")
    head = b"".join(parts)
    lines = len(parts) // 4 + 1
    if head.count(b"\n") != lines or head.count(b"\r") != lines:
        raise RuntimeError("Invalid HTTP response header: CR or LF in a name or value.")
    return head, length, has_date, app_close
