"""One upstream HTTP/1.1 connection: an asyncio Protocol feeding httptools.

A connection carries one exchange at a time. Its state is plain attributes
and at most one future (`waiter`) that the task reading it awaits; the
transport's callbacks fill the buffer and wake it. Reading is paused while
more than `HIGH_WATER` bytes wait unread, and resumed when the reader drains
them. See `gateway.http.client` for the pool and the error classes' meaning.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol, cast

import httptools

Key = tuple[str, str, int]  # (scheme, host, port)
HIGH_WATER: Final = 256 * 1024


class HTTPClientError(Exception):
    """Base of the upstream client's errors."""


class ConnectFailed(HTTPClientError):
    """The request provably never reached the server."""


class StaleConnection(ConnectFailed):
    """A reused keep-alive connection was already closed by the peer."""


class ConnectionBroken(HTTPClientError):
    """The connection failed once the request may have reached the server."""


class _ExtraMessage(Exception):
    """Bytes after a complete response that nothing asked for."""


class Owner(Protocol):
    """What a connection needs of the pool it belongs to (`gateway.http.client.Pool`)."""

    def release(self, conn: Conn, reuse: bool) -> None: ...
    def drop(self, conn: Conn, wake: bool = True) -> None: ...


class Conn(asyncio.Protocol):
    __slots__ = (
        "active",
        "body_done",
        "buf",
        "buffered",
        "dead",
        "drain_tracked",
        "error",
        "framed",
        "got_bytes",
        "head_done",
        "headers",
        "idle_since",
        "keep_alive",
        "key",
        "loop",
        "parser",
        "paused",
        "pool",
        "reused",
        "slot",
        "status",
        "transport",
        "unwritten",
        "uses",
        "waiter",
    )

    transport: asyncio.Transport | None
    status: int
    headers: list[tuple[bytes, bytes]]
    head_done: bool
    body_done: bool
    keep_alive: bool
    framed: bool
    buf: list[bytes]
    buffered: int
    paused: bool
    waiter: asyncio.Future[None] | None
    error: HTTPClientError | None
    unwritten: bool  # part of the request may still sit in a write buffer
    got_bytes: bool  # any byte of the response arrived

    def __init__(self, pool: Owner, key: Key) -> None:
        self.pool = pool
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        # Plain TCP reports a full drain through resume_writing (high-water 0);
        # TLS buffers above the transport, so there only a failed write counts.
        self.drain_tracked = key[0] == "http"
        self.uses = 0
        self.reused = False
        self.idle_since = 0.0
        self.slot = True  # holds one of the pool's slots
        self.dead = False  # closed by either side
        self.active = True  # handed out (not idle in the pool)
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.headers = []
        self.head_done = self.body_done = self.keep_alive = self.framed = False
        self.buf = []
        self.buffered = 0
        self.paused = False
        self.waiter = None
        self.error = None
        self.unwritten = self.got_bytes = False

    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def abort(self) -> None:
        """Close at once, dropping unsent bytes (the engines abort on this)."""
        self.dead = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        return (
            self.body_done
            and self.keep_alive
            and self.error is None
            and not self.unwritten
            and not self.dead
            and not self.buf
            and not self.paused
        )

    # -- the exchange, driven by the reading task --------------------------------

    async def exchange(self, data: bytes) -> None:
        """Write the request; return once the response head has arrived."""
        transport = self.transport
        if self.dead or transport is None or transport.is_closing():
            what = "the connection was closed before the request was sent"
            raise StaleConnection(what) if self.uses else ConnectFailed(what)
        self.reused = self.uses > 0
        self.uses += 1
        self.unwritten = True
        waiter = self.waiter = self.loop.create_future()
        transport.write(data)
        buffered = self.drain_tracked and transport.get_write_buffer_size()
        if not transport.is_closing() and not buffered:
            self.unwritten = False
        if not self.head_done and self.error is None:
            try:
                await waiter
            finally:
                self.waiter = None
        if not self.head_done:
            raise self.error or ConnectionBroken("no response head")

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: HTTPClientError) -> None:
        self.error = error
        self.abort()
        self.wake()

    # -- transport callbacks ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.drain_tracked:
            self.transport.set_write_buffer_limits(high=0, low=0)

    def resume_writing(self) -> None:
        self.unwritten = False

    def data_received(self, data: bytes) -> None:
        if not self.active:  # nothing was asked on an idle connection
            self.abort()
            self.pool.drop(self)
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.body_done:
                self.keep_alive = False  # trailing bytes: never reuse
            elif self.error is None:
                self._fail(ConnectionBroken(f"malformed response: {exc!r}"))
            return
        if self.buffered > HIGH_WATER and not self.paused and not self.body_done and not self.dead:
            self.paused = True
            cast(asyncio.Transport, self.transport).pause_reading()

    def eof_received(self) -> bool:
        self._lost(None, eof=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc, eof=False)
        # The last callback: break the conn ↔ parser (and conn → transport) cycles,
        # so a closed connection is freed by reference counting, not the cyclic GC.
        self.transport = None
        del self.parser

    def _lost(self, exc: Exception | None, eof: bool) -> None:
        self.dead = True
        if not self.active:
            self.abort()
            self.pool.drop(self)
            return
        if self.body_done or self.error is not None:
            return
        why = repr(exc) if exc is not None else "closed by the peer"
        if self.head_done:
            if eof and not self.framed:  # a body delimited by the connection's end
                self.body_done = True
                self.wake()
                return
            self._fail(ConnectionBroken(f"connection broke mid-response: {why}"))
        elif self.unwritten and not self.got_bytes:
            what = f"connection closed before the request was written: {why}"
            self._fail(StaleConnection(what) if self.reused else ConnectFailed(what))
        else:
            self._fail(ConnectionBroken(f"connection closed before a response head: {why}"))

    # -- parser callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.body_done:
            raise _ExtraMessage

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # interim (100 Continue): the real head follows
            self.headers = []
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.framed = self.keep_alive or any(
            k.lower() in (b"content-length", b"transfer-encoding") for k, _ in self.headers
        )
        self.head_done = True
        self.wake()

    def on_body(self, body: bytes) -> None:
        self.buf.append(body)
        self.buffered += len(body)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.body_done = True
            self.wake()
