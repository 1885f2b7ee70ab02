"""Response bytes the server writes itself: status lines and error answers.

The server answers some requests without the app: a malformed request
(400), a head over the size limit (431), an app that failed before its
response began (500). The body of such an answer comes from an
`ErrorRenderer`, injected into `LeanServer` so that an application can give
these answers the same shape as its own errors; `json_error` is the default:
an OpenAI-style JSON body, `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import http
import json
import logging
from collections.abc import Callable
from typing import Final

__all__ = ["STATUS_LINES", "ErrorRenderer", "RawHeaders", "error_response", "json_error"]

RawHeaders = list[tuple[bytes, bytes]]
#: `(status, message, code) -> (headers, body)`; the server adds the framing
#: headers (`content-length`, `connection`, `date`) itself.
ErrorRenderer = Callable[[int, str, str | None], tuple[RawHeaders, bytes]]

log = logging.getLogger("gateway.http.server")


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


STATUS_LINES: Final = {s: _status_line(s) for s in range(100, 600)}


def json_error(status: int, message: str, code: str | None) -> tuple[RawHeaders, bytes]:
    """The default `ErrorRenderer`: an OpenAI-style JSON error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = {"message": message, "type": kind, "param": None, "code": code}
    body = json.dumps({"error": error}).encode()
    return [(b"content-type", b"application/json")], body


def error_response(
    render: ErrorRenderer, status: int, message: str, code: str | None, date_line: bytes
) -> bytes:
    """A complete `connection: close` answer whose headers and body `render` chose."""
    try:
        headers, body = render(status, message, code)
    except Exception:  # a broken renderer must not leave the client without an answer
        log.exception("the error renderer failed; answering HTTP %d with the default body", status)
        headers, body = json_error(status, message, code)
    parts = [STATUS_LINES[status]]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (
        b"content-length: ",
        str(len(body)).encode(),
        b"\r\nconnection: close\r\n",
        date_line,
        b"\r\n",
        body,
    )
    return b"".join(parts)
