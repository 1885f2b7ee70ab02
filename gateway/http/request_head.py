"""A complete request head → an ASGI `http` scope, or a refusal (`Reject`).

The lean server's connection (`gateway.http.connection`) collects the
request line and headers from the httptools parser and hands them here once
the head is complete. What is refused here, each answered with its status
and the connection closed:

- a head (request line + headers) over `MAX_HEAD` bytes: `431`;
- an HTTP/1.1 request without a `Host` header, or any request with more
  than one: `400` (RFC 9112 §3.2);
- an `Upgrade` request (websocket, h2c) that carries a body: `400` (the
  parser would take upgraded bytes for its body); one without a body is
  served as plain HTTP/1.1 (a server may ignore `Upgrade`, RFC 9110 §7.8)
  and the connection closes after it;
- a request target that does not parse: `400`;
- a `Transfer-Encoding` with any coding but `chunked` (`gzip, chunked`):
  `501` (RFC 9112 §6.1: the server does not understand it, and must not
  pass the body on as if it were plain).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote

import httptools

from gateway.http.asgi import Scope

__all__ = ["MAX_HEAD", "Reject", "head_size", "peer_address", "request_scope", "too_large"]

MAX_HEAD: Final = 64 * 1024  # request line + headers
_METHODS: Final = {
    m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")
}
_FRAMING: Final = (b"content-length", b"transfer-encoding")


class Reject(Exception):
    """Raised in a parser callback to stop parsing and answer with an error."""

    def __init__(self, status: int, reason: str, code: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.code = code


def too_large() -> Reject:
    return Reject(431, "Request line and headers too large.", "request_headers_too_large")


def head_size(url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """The bytes of a head, at least (without the request line's method and version)."""
    return len(url) + sum(len(n) + len(v) + 4 for n, v in headers)


def peer_address(info: Any) -> tuple[str, int] | None:
    """`(host, port)` from a transport's `peername` / `sockname`."""
    if isinstance(info, tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


def _check_host(hosts: int, version: str) -> None:
    if hosts != 1 and (hosts > 1 or version != "1.0"):  # RFC 9112 §3.2
        if hosts:
            raise Reject(400, "More than one Host header.", "duplicate_host_header")
        raise Reject(400, "An HTTP/1.1 request needs a Host header.", "missing_host_header")


def _check_upgrade(method: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """Served as plain HTTP, then closed; the parser would take upgraded bytes for a body,
    so one is refused."""
    if method != b"CONNECT" and any(n in _FRAMING and v.strip() != b"0" for n, v in headers):
        raise Reject(400, "An Upgrade request with a body is not supported.", "upgrade_with_body")


def _check_transfer_codings(headers: list[tuple[bytes, bytes]]) -> None:
    for name, value in headers:
        if name != b"transfer-encoding":
            continue
        for coding in value.split(b","):
            coding = coding.strip().lower()
            if coding != b"chunked":
                shown = coding[:32].decode("latin-1")
                raise Reject(
                    501,
                    f"Transfer coding {shown!r} is not supported (only chunked).",
                    "unsupported_transfer_coding",
                )


def _split_target(url: bytes) -> tuple[bytes, bytes]:
    """`(raw_path, query)` of a request target."""
    if url[:1] == b"/" and b"#" not in url:
        raw_path, _, query = url.partition(b"?")
        return raw_path, query
    if url == b"*":
        return url, b""
    try:  # absolute-form, authority-form or a fragment: let the parser split it
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        raise Reject(400, "Invalid request target.", "invalid_request_target") from None
    return parsed.path or b"/", parsed.query or b""


def request_scope(
    parser: httptools.HttpRequestParser,
    url: bytes,
    headers: list[tuple[bytes, bytes]],
    hosts: int,
    server: tuple[str, int] | None,
    client: tuple[str, int] | None,
    app_state: dict[str, Any],
) -> tuple[Scope, bool]:
    """The scope of the request whose head `parser` just completed, and whether the
    connection may be kept alive after it; raises `Reject`."""
    version = parser.get_http_version()
    _check_host(hosts, version)
    _check_transfer_codings(headers)
    method_b = parser.get_method()
    keep_alive = parser.should_keep_alive()
    if parser.should_upgrade():
        _check_upgrade(method_b, headers)
        keep_alive = False
    raw_path, query = _split_target(url)
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path)
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": version,
        "server": server,
        "client": client,
        "scheme": "http",
        "method": _METHODS.get(method_b) or method_b.decode("ascii"),
        "root_path": "",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "headers": headers,
        "state": app_state.copy(),
    }
    return scope, keep_alive
