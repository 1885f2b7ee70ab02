"""Request framing for the lean server: bytes in, request events out.

`RequestParser` feeds `httptools.HttpRequestParser` and tells its sink (the
connection, `gateway.http.connection`) about each request: its head as an
ASGI scope (`gateway.http.request_head`), its body chunks, its end. Bad
input raises `Reject` from `feed()`: a malformed request is a `400`, a head
over `MAX_HEAD` bytes a `431` (counted across reads, so an endless header
sent in pieces is refused without being buffered), and whatever
`request_scope` refuses. An `Upgrade` request ends parsing: `feed()`
returns False and nothing after it is parsed.

A request that follows a `Connection: close` one is still parsed (as
uvicorn does): the connection answers it, then closes.
"""

from __future__ import annotations

from typing import Any, Protocol

import httptools

from gateway.http.asgi import Scope
from gateway.http.request_head import MAX_HEAD, Reject, head_size, request_scope, too_large

__all__ = ["RequestParser", "RequestSink"]


class RequestSink(Protocol):
    """What the parser reports to (the connection)."""

    def request_begins(self, scope: Scope, keep_alive: bool, expect_continue: bool) -> None: ...
    def request_body(self, body: bytes) -> None: ...
    def request_complete(self) -> None: ...


class RequestParser:
    """One connection's request framing (see the module doc)."""

    __slots__ = (
        "_expect",
        "_fresh",
        "_head_lower",
        "_head_upper",
        "_headers",
        "_hosts",
        "_length",
        "_parser",
        "_sink",
        "_url",
        "app_state",
        "body_left",
        "client",
        "server",
    )

    def __init__(self, sink: RequestSink, app_state: dict[str, Any]) -> None:
        self._sink = sink
        self.app_state = app_state  # each request's scope gets a copy
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._url = b""  # non-empty while a request head is being parsed
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect = False
        self._hosts = 0  # Host header lines of the head being parsed
        self._length = b""  # its Content-Length
        self.body_left = 0  # declared body bytes not parsed yet (0 for a chunked body)
        self._head_upper = 0  # head bytes in earlier reads, at most (with the read it began in)
        self._head_lower = 0  # head bytes in earlier reads, at least (without that read)
        self._fresh = False  # a head was completed during the current read

    @property
    def in_head(self) -> bool:
        """A request head has begun and is not complete."""
        return self._url != b""

    def feed(self, data: bytes | memoryview) -> bool:
        """Parse `data`; False once an upgrade request ended parsing. Raises `Reject`."""
        was_in_head = self._url != b""
        self._fresh = False
        self._head_upper += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return False
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, Reject):
                raise cause from None
            raise Reject(
                400, f"Malformed HTTP request: {cause or exc}", "malformed_request"
            ) from None
        if not self._url:
            self._head_upper = 0
        elif self._fresh or not was_in_head:  # a head is still incomplete at the end of this read
            self._head_upper = len(data)
            self._head_lower = 0
        else:
            self._head_lower += len(data)
            if self._head_lower > MAX_HEAD:
                raise too_large()
        return True

    # --- httptools callbacks -------------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"host":
            self._hosts += 1
        elif name == b"content-length":
            self._length = value
        elif name == b"expect" and value.lower() == b"100-continue":
            self._expect = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        url, headers, hosts, length = self._url, self._headers, self._hosts, self._length
        expect = self._expect
        self._url = self._length = b""
        self._headers = []
        self._hosts = 0
        self._expect = False
        self.body_left = int(length) if length.strip().isdigit() else 0  # (the parser checked it)
        self._fresh = True
        if self._head_upper > MAX_HEAD and head_size(url, headers) > MAX_HEAD:
            raise too_large()
        self._head_upper = self._head_lower = 0
        scope, keep_alive = request_scope(
            self._parser, url, headers, hosts, self.server, self.client, self.app_state
        )
        self._sink.request_begins(scope, keep_alive, expect and scope["http_version"] != "1.0")

    def on_body(self, body: bytes) -> None:
        if self.body_left:
            self.body_left -= len(body)
        self._sink.request_body(body)

    def on_message_complete(self) -> None:
        self._sink.request_complete()
