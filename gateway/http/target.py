"""`Target`, a parsed request URL, and `encode_request`: the bytes of one request."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from gateway.http.client_conn import ConnectFailed, Key


class Target:
    """A parsed request URL (cached per URL string)."""

    __slots__ = ("host", "host_header", "key", "literal", "path", "port", "tls")

    def __init__(self, url: str) -> None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConnectFailed(f"invalid URL {url!r}: {exc}") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectFailed(f"unsupported URL {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.tls else 80)
        self.key: Key = (parts.scheme, self.host, self.port)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.host_header = parts.netloc.rpartition("@")[2]
        try:
            ipaddress.ip_address(self.host)
            self.literal = True
        except ValueError:
            self.literal = False


def encode_request(
    method: str, target: Target, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """Request line, `Host`, `Content-Length` (when there is a body), the
    caller's headers verbatim, and the body: one buffer, one write."""
    block = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
    if block.count("\n") != len(headers) or block.count("\r") != len(headers):
        raise ValueError("newline or carriage return in an HTTP header")
    length = "" if body is None else f"Content-Length: {len(body)}\r\n"
    head = f"{method} {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n{length}{block}\r\n"
    try:
        raw = head.encode("latin-1")
    except UnicodeEncodeError:
        raw = head.encode()
    return raw + body if body else raw
