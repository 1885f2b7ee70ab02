"""One request/response exchange of the lean HTTP/1.1 server (`gateway.http.server`).

An `Exchange` is created when a request head is complete; its bound `receive`
and `send` are what the ASGI app is called with, in one task
(`gateway.http.app_call.run_app`).

Request body: the connection feeds body chunks in; `receive()` hands out what
is buffered (one `http.request` message per call), then blocks until the
client disconnects or the response is complete and returns `http.disconnect`
(the gateway's disconnect watcher relies on that; no polling). Reading pauses
while more than `BODY_HIGH_WATER` bytes wait unread. `Expect: 100-continue`
is answered on the first `receive()` that needs the body.

Disconnect notification: the scope carries the extension
`DISCONNECT_EXTENSION` (`gateway.http.asgi`), a function
`watch(callback) -> unwatch` calling `callback()` once when the connection
is lost while the exchange runs (at once if it already was), so an app can
react to a disconnect without a task blocked in `receive()`.

Response: the head is held until the first body chunk and written with it
(one write for a whole response). Without `content-length`, a body sent in
one message gets a computed length and a stream gets `transfer-encoding:
chunked` (close-delimited for HTTP/1.0); such a head whose body does not
follow in the same event-loop turn goes out alone at the end of the turn.
HEAD, 204 and 304 answers carry no body. `send()` awaits while the transport's
write buffer is above its high-water mark, and raises `ClientDisconnected`
(an `OSError`, ASGI 2.4) once the connection is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

from gateway.http.asgi import DISCONNECT_EXTENSION, ClientDisconnected, Message, Scope
from gateway.http.response_head import encode_head
from gateway.http.server_state import ServerState

__all__ = [
    "BODY_HIGH_WATER",
    "DISCONNECT_EXTENSION",
    "ClientDisconnected",
    "Connection",
    "Exchange",
]

log = logging.getLogger("gateway.http.server")

BODY_HIGH_WATER: Final = 256 * 1024  # unread request body before reading pauses
_COPY_LIMIT: Final = 16 * 1024  # a larger body is not copied behind its head (writelines)

_DISCONNECT: Final = {"type": "http.disconnect"}
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _UNDECIDED = range(5)  # response framing


def _noop() -> None:
    pass


class Connection(Protocol):
    """What an exchange needs of its connection (`HttpConnection`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def state(self) -> ServerState: ...
    @property
    def write_paused(self) -> bool: ...
    async def writable(self) -> None: ...
    def pause_reading(self) -> None: ...
    def body_drained(self) -> None: ...
    def touch_idle(self) -> None: ...
    def response_done(self, exchange: Exchange) -> None: ...


class Exchange:
    """One request and its response: the ASGI `receive` and `send` of one app call."""

    __slots__ = (
        "body_flush",
        "buffered",
        "chunks",
        "complete",
        "conn",
        "disconnected",
        "expect_continue",
        "final_given",
        "head",
        "head_sent",
        "http10",
        "keep_alive",
        "mode",
        "more_body",
        "remaining",
        "scope",
        "started",
        "task",
        "transport",
        "waiter",
        "watchers",
    )

    def __init__(
        self,
        conn: Connection,
        transport: asyncio.Transport,
        scope: Scope,
        keep_alive: bool,
        http10: bool,
        expect_continue: bool,
    ) -> None:
        self.conn = conn
        self.transport = transport
        self.scope = scope
        scope["extensions"] = {DISCONNECT_EXTENSION: self.watch_disconnect}
        # called once when the client goes away
        self.watchers: list[Callable[[], None]] | None = None
        self.keep_alive = keep_alive
        self.http10 = http10
        self.expect_continue = expect_continue  # `100 Continue` owed on the first receive()
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.more_body = True  # until the parser saw the end of the request
        self.final_given = False  # receive() returned the request's last body message
        self.waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.started = False  # http.response.start accepted
        self.head: bytes | None = None  # prepared, not yet written (without its blank line)
        self.head_sent = False
        self.complete = False  # the last body byte was written (or the exchange was ended)
        self.mode = _UNDECIDED
        self.remaining = 0
        self.task: asyncio.Task[None] | None = None
        self.body_flush: asyncio.Handle | None = None

    # --- request side: parser → app ------------------------------------------------------

    def feed(self, body: bytes) -> None:
        if self.complete or self.disconnected:  # answered already: the rest is discarded
            self.conn.touch_idle()
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > BODY_HIGH_WATER:
            self.conn.pause_reading()
        self.wake()

    def end_of_body(self) -> None:
        self.more_body = False
        self.wake()

    def drop_body(self) -> None:
        self.chunks = []
        self.buffered = 0

    def wake(self) -> None:
        fut = self.waiter
        if fut is not None:
            self.waiter = None
            if not fut.done():
                fut.set_result(None)

    def lost(self) -> None:
        if not self.disconnected:
            self.disconnected = True
            self.wake()
            watchers, self.watchers = self.watchers, None
            for callback in watchers or ():
                try:
                    callback()
                except Exception:  # one app callback must not break closing the connection
                    log.exception("disconnect callback failed")

    def watch_disconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """The `DISCONNECT_EXTENSION` of the scope: `callback()` once the client is gone."""
        if self.disconnected:
            callback()
            return _noop
        if self.watchers is None:
            self.watchers = []
        self.watchers.append(callback)

        def unwatch() -> None:
            if self.watchers is not None and callback in self.watchers:
                self.watchers.remove(callback)

        return unwatch

    async def receive(self) -> Message:
        if self.expect_continue:
            self.expect_continue = False
            if self.more_body and not self.chunks and not self.disconnected and not self.started:
                self.transport.write(_CONTINUE)
                self.conn.touch_idle()  # the body timeout runs from here
        while True:
            if self.disconnected:
                return dict(_DISCONNECT)
            chunks = self.chunks
            if chunks or (not self.more_body and not self.final_given):
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                more = self.more_body
                if chunks:
                    self.chunks = []
                    paused = self.buffered > BODY_HIGH_WATER
                    self.buffered = 0
                    if paused:
                        self.conn.body_drained()
                if not more:
                    self.final_given = True
                return {"type": "http.request", "body": body, "more_body": more}
            if self.complete:
                return dict(_DISCONNECT)
            fut = self.waiter
            if fut is None or fut.done():
                fut = self.waiter = self.conn.loop.create_future()
            await fut

    # --- response side: app → transport --------------------------------------------------

    async def send(self, message: Message) -> None:
        if self.conn.write_paused:
            await self.conn.writable()
        if self.disconnected:
            raise ClientDisconnected("client disconnected")
        kind = message["type"]
        if kind == "http.response.body":
            if self.started and not self.complete:
                self._write_body(message.get("body", b""), message.get("more_body", False))
                return
        elif kind == "http.response.start" and not self.started:
            self._prepare_head(message["status"], message.get("headers", ()))
            return
        state = "complete" if self.complete else "started" if self.started else "not started"
        raise RuntimeError(f"Unexpected ASGI message {kind!r} (response {state}).")

    def _prepare_head(self, status: int, headers: Any) -> None:
        head, length, has_date, app_close = encode_head(status, headers)
        conn = self.conn
        if not has_date:
            head += conn.state.date_line
        close = app_close or not self.keep_alive or conn.state.shutting_down
        # The request body is still arriving (or, after `Expect: 100-continue`, may never be
        # sent): close after this answer rather than read the rest (maybe 1 GB) to its end.
        if self.more_body:
            close = True
        if self.scope["method"] == "HEAD" or status in (204, 304) or status < 200:
            self.mode = _NO_BODY
        elif length is not None:
            self.mode = _LENGTH
            self.remaining = length
        elif self.http10:
            self.mode = _UNTIL_CLOSE
            close = True
        if close:
            self.keep_alive = False
            if not app_close:
                head += b"connection: close\r\n"
        elif self.http10:
            head += b"connection: keep-alive\r\n"
        self.head = head
        self.started = True
        self.expect_continue = False
        if length is None:
            # The body may not follow in this turn (a stream): the head then goes out alone.
            self.body_flush = conn.loop.call_soon(self._flush_head)

    def _flush_head(self) -> None:
        self.body_flush = None
        head = self.head
        if head is None or self.disconnected:
            return
        self.head = None
        self.head_sent = True
        if self.mode == _UNDECIDED:
            self.mode = _CHUNKED
            head += b"transfer-encoding: chunked\r\n"
        self.transport.write(head + b"\r\n")

    def _write_body(self, body: bytes, more: bool) -> None:
        mode = self.mode
        head = self.head
        if mode == _LENGTH:
            n = len(body)
            if n > self.remaining or (not more and n < self.remaining):
                self._broken()
                raise RuntimeError(
                    f"Response body {'longer' if n > self.remaining else 'shorter'} "
                    "than its content-length."
                )
            self.remaining -= n
            data = body
        elif mode == _CHUNKED:
            if body:
                data = b"%x\r\n%b\r\n" % (len(body), body)
                if not more:
                    data += b"0\r\n\r\n"
            else:
                data = b"" if more else b"0\r\n\r\n"
        elif mode == _UNDECIDED:
            assert head is not None
            if more:
                self.mode = _CHUNKED
                head += b"transfer-encoding: chunked\r\n"
                data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            else:
                head += b"content-length: %d\r\n" % len(body)
                data = body
        elif mode == _UNTIL_CLOSE:
            data = body
        else:  # _NO_BODY
            data = b""
        if head is not None:
            self.head = None
            self.head_sent = True
            if self.body_flush is not None:
                self.body_flush.cancel()
                self.body_flush = None
            if len(data) <= _COPY_LIMIT:
                self.transport.write(head + b"\r\n" + data)
            else:
                self.transport.writelines((head + b"\r\n", data))
        elif data:
            self.transport.write(data)
        if not more:
            self.complete = True
            self.wake()
            self.conn.response_done(self)

    def _broken(self) -> None:
        """The body does not match its declared length. If the head was still held, nothing
        went out and the app's error becomes a 500; else the connection closes."""
        self.keep_alive = False
        if self.head is not None:
            self.head = None
            self.started = False
            return
        self.complete = True
        self.conn.response_done(self)
