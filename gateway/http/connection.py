"""One client connection of the lean HTTP/1.1 server (`gateway.http.server`).

`HttpConnection` is an asyncio Protocol feeding `httptools.HttpRequestParser`.
Each complete request head becomes an `Exchange` (`gateway.http.exchange`)
served by one task, the app call. Requests are answered in order: a pipelined
request waits in a queue, with reading paused, until the response before it
is complete; the next app call starts then. Input is parsed in slices of
`FEED_SLICE` bytes (plus what remains of a declared body, which completes no
request); once `MAX_PIPELINE` requests wait, parsing pauses too and the rest
of the input waits, unparsed, until the queue shrinks: no request is dropped,
and the queue holds at most `MAX_PIPELINE` plus the requests one slice holds.

Refusals: what `gateway.http.request_head` refuses in a head (`431` over
`MAX_HEAD`, `400` for a missing or doubled `Host`, an `Upgrade` with a body,
a bad target) and a malformed request (`400`) are answered with
`connection: close`, the body from the server's `ErrorRenderer`
(`gateway.http.responses`). A request behind one still being answered is
refused after that answer. A half-close from the client counts as a
disconnect.

Keep-alive: HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with
`Connection: keep-alive` and a response of known length. A response that
starts before its request's body is complete (a 413 for a declared length over
the limit, a 404 without reading) closes the connection after it: the rest of
the body is not read to its end (only discarded for `LINGER_S` while closing).
An upgraded request is served as plain HTTP/1.1 and the connection closes.

Timeouts: `gateway.http.conn_timer` (idle keep-alive, head, body; a stalled
body is answered `408` if its response has not started, then the connection
closes and the app's `receive()` returns `http.disconnect`). An idle
connection whose next request has arrived by the deadline, unread yet, is
not closed (closing would reset that request unanswered): it is served.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from typing import Final, cast

from gateway.http.app_call import run_app
from gateway.http.asgi import Scope
from gateway.http.conn_timer import BODY, IDLE, ConnectionTimer
from gateway.http.exchange import BODY_HIGH_WATER, Exchange
from gateway.http.request_head import Reject, peer_address
from gateway.http.request_parser import RequestParser
from gateway.http.responses import error_response
from gateway.http.server_state import ServerState

__all__ = ["FEED_SLICE", "LINGER_S", "MAX_PIPELINE", "HttpConnection"]

log = logging.getLogger("gateway.http.server")

MAX_PIPELINE: Final = 32  # queued requests per connection before parsing pauses
FEED_SLICE: Final = 4096  # input parsed at once (bounds what one parse can queue past the cap)
LINGER_S: Final = 2.0  # input is discarded this long after an answer that leaves input unread


def input_waiting(transport: asyncio.BaseTransport) -> bool:
    """Whether bytes (or the client's FIN) wait unread in the socket."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with socket.fromfd(sock.fileno(), sock.family, sock.type) as peer:  # a dup: no close
            peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:  # closed meanwhile, or no socket to peek (not a stream)
        return False
    return True


class HttpConnection(asyncio.Protocol):
    __slots__ = (
        "_client",
        "_closed",
        "_current",
        "_deferred_error",
        "_drain",
        "_parsing",
        "_queue",
        "_read_paused",
        "_reader",
        "_stash",
        "_stopped",
        "_timer",
        "_transport",
        "loop",
        "state",
        "write_paused",
    )

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = state.loop
        self._reader = RequestParser(self, state.app_state)
        self._transport: asyncio.Transport = cast(asyncio.Transport, None)  # set in connection_made
        self._client: tuple[str, int] | None = None
        self._parsing: Exchange | None = None  # the request whose body is being received
        self._current: Exchange | None = None  # the request being answered
        self._queue: deque[Exchange] | None = None  # pipelined requests waiting for their turn
        self._stash: bytes | None = None  # input not parsed yet: the queue is full
        self._deferred_error: bytes | None = None  # answer to a bad request behind the current one
        self._closed = False
        self._stopped = False  # no more requests are parsed on this connection
        self._read_paused = False
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._timer = ConnectionTimer(self, state)

    @property
    def backlog(self) -> int:
        """Requests parsed and waiting for their turn."""
        return len(self._queue or ())

    # --- transport callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        self._client = self._reader.client = peer_address(transport.get_extra_info("peername"))
        self._reader.server = peer_address(transport.get_extra_info("sockname"))
        self.state.connections.add(self)
        self._become_idle(fresh=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self._mark_closed()

    def eof_received(self) -> bool | None:
        return None  # a half-close is a disconnect: the transport closes itself

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writers()

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return
        if self._stash is not None:  # (reading is paused: not expected)
            self._stash += data
            return
        timer = self._timer
        if timer.phase == IDLE:  # the first bytes of a request head
            timer.head_begins()
        elif timer.phase == BODY:
            timer.last = self.loop.time()
        self._feed(data)

    # --- parsing ---------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        """Parse `data` slice by slice; once the queue is full, keep the rest in `_stash`."""
        size = len(data)
        view = memoryview(data) if size > FEED_SLICE else data
        start = 0
        while start < size:
            queue = self._queue
            if queue is not None and len(queue) >= MAX_PIPELINE:
                self._stash = bytes(view[start:])
                self.pause_reading()
                break
            end = start + FEED_SLICE + self._reader.body_left  # (body bytes complete no request)
            if not self._parse(view[start:end] if start or end < size else data):
                return
            start = end
        if self._parsing is not None and self._timer.phase != BODY:
            self._timer.body_begins()

    def _parse(self, data: bytes | memoryview) -> bool:
        """Feed the parser; False once this connection parses no more."""
        try:
            if self._reader.feed(data):
                return True
            self._stop_parsing()  # an upgrade request, served as plain HTTP: nothing more is read
        except Reject as reject:
            self._bad_request(reject.status, reject.reason, reject.code)
        return False

    # --- parser events (`RequestSink`) ---------------------------------------------------------

    def request_begins(self, scope: Scope, keep_alive: bool, expect_continue: bool) -> None:
        http10 = scope["http_version"] == "1.0"
        exchange = Exchange(self, self._transport, scope, keep_alive, http10, expect_continue)
        self._parsing = exchange
        if self._current is None:
            self._start(exchange)
        else:
            if self._queue is None:
                self._queue = deque()
            self._queue.append(exchange)
            self.pause_reading()

    def request_body(self, body: bytes) -> None:
        exchange = self._parsing
        if exchange is not None:
            exchange.feed(body)

    def request_complete(self) -> None:
        exchange = self._parsing
        if exchange is not None:
            self._parsing = None
            self._timer.body_done()
            exchange.end_of_body()

    # --- sequencing ----------------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self._current = exchange
        self._timer.busy()
        task = exchange.task = self.loop.create_task(run_app(exchange, self.state.app))
        self.state.tasks.add(task)

    def response_done(self, exchange: Exchange) -> None:
        """`exchange` ended (its last byte written, or abandoned): start the next request,
        or go idle."""
        if self._current is exchange:
            self._current = None
        if self._closed:
            return
        if not exchange.keep_alive:
            self._close()
            return
        if self._parsing is exchange:  # the app did not read the whole body: the rest is discarded
            exchange.drop_body()
        queue = self._queue
        if queue:
            self._start_next(queue)
            return
        if self._deferred_error is not None:
            self._transport.write(self._deferred_error)
            self._close(linger=True)
            return
        self._resume_reading()
        self._become_idle()

    def _start_next(self, queue: deque[Exchange]) -> None:
        nxt = queue.popleft()
        self._start(nxt)
        stash = self._stash
        if stash is not None and not self._stopped:  # room in the queue again: parse on
            self._stash = None
            self._feed(stash)
            if self._closed:
                return
        if not queue:
            self._resume_reading()
        if self._parsing is nxt:
            self._timer.body_begins()

    def pause_reading(self) -> None:
        if not self._read_paused and not self._closed:
            self._read_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused and not self._closed and not self._stopped and self._stash is None:
            parsing = self._parsing
            if parsing is not None and parsing.buffered > BODY_HIGH_WATER:
                return
            self._read_paused = False
            self._transport.resume_reading()

    def body_drained(self) -> None:
        if not self._queue:
            self._resume_reading()

    def _stop_parsing(self) -> None:
        """No more requests on this connection: it closes once the responses due are out."""
        self._stopped = True
        last = self._queue[-1] if self._queue else self._current
        if last is None:
            self._close()
        else:
            last.keep_alive = False

    def _bad_request(self, status: int, reason: str, code: str | None) -> None:
        log.debug("HTTP %d to %s: %s", status, self._client, reason)
        self._stopped = True
        self.pause_reading()
        state = self.state
        data = error_response(state.render_error, status, reason, code, state.date_line)
        current = self._current
        if current is None:
            self._transport.write(data)
            self._close(linger=True)
        elif self._parsing is current:  # the request being answered is itself malformed (its body)
            if not current.head_sent:
                current.complete = True
                self._transport.write(data)
            self._close(linger=True)
        else:  # a request behind the current one: answered when those before it are
            queue = self._queue
            if queue and queue[-1] is self._parsing:
                queue.pop()  # its body is malformed: never served
            self._parsing = None
            self._deferred_error = data

    # --- timeouts (`gateway.http.conn_timer`) ----------------------------------------------------

    def _become_idle(self, fresh: bool = False) -> None:
        if self.state.shutting_down:
            self._close()
            return
        self._timer.idle(head_begun=self._reader.in_head, fresh=fresh)

    def touch_idle(self) -> None:
        """The client's request moved on (its bytes arrived, or a `100 Continue` went out)."""
        self._timer.touch()

    def holding_body(self) -> bool:
        parsing = self._parsing
        return self._read_paused or (parsing is not None and parsing.expect_continue)

    def timed_out(self, phase: int, message: str) -> None:
        if phase == BODY:
            self._bad_request(408, message, "request_body_timeout")
        elif phase == IDLE and input_waiting(self._transport):
            # A next request arrived by the deadline, unread yet (a busy loop runs
            # due timers before it reads: uvloop always does): closing now would
            # reset it unanswered. It is read next; its head gets `head_timeout`.
            self._timer.head_begins()
        else:
            log.debug("%s from %s: closing", message, self._client)
            self._close()

    # --- closing -------------------------------------------------------------------------------

    def _close(self, linger: bool = False) -> None:
        """Close; with `linger` (or while a request is still arriving) first half-close and
        discard input for up to `LINGER_S`: closing with unread input resets the connection,
        and a reset can destroy the answer before the client reads it."""
        if self._closed:
            return
        linger = linger or self._parsing is not None or self._reader.in_head
        linger = linger or self._stash is not None
        self._mark_closed()
        transport = self._transport
        if not (linger and transport.can_write_eof()):
            transport.close()
            return
        transport.write_eof()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        self._timer.call_later(LINGER_S, transport.close)

    def _mark_closed(self) -> None:
        self._closed = True
        self._stopped = True
        self._timer.cancel()
        for exchange in (self._current, self._parsing, *(self._queue or ())):
            if exchange is not None:
                exchange.lost()
        self._queue = None
        self._stash = None
        self._wake_writers()

    def shutdown(self) -> None:
        """Server shutdown: close now if idle, else once the response in progress is out."""
        if self._current is None and not self._queue:
            self._close()
        else:
            self._stop_parsing()

    def abort(self) -> None:
        self._mark_closed()
        self._transport.abort()

    # --- write flow control ---------------------------------------------------------------------

    async def writable(self) -> None:
        while self.write_paused and not self._closed:
            fut = self._drain
            if fut is None or fut.done():
                fut = self._drain = self.loop.create_future()
            await fut

    def _wake_writers(self) -> None:
        fut, self._drain = self._drain, None
        if fut is not None and not fut.done():
            fut.set_result(None)
