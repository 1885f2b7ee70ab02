"""One client connection of the lean HTTP/1.1 server (`gateway.http.server`).

`HttpConnection` is an asyncio Protocol feeding `httptools.HttpRequestParser`.
Each complete request head becomes an `Exchange` (`gateway.http.exchange`)
served by one task, the app call. Requests are answered in order: a pipelined
request waits in a queue, with reading paused, until the response before it
is complete; the next app call starts then.

Limits and errors: a request line + headers over `MAX_HEAD` bytes is answered
`431`, a malformed request `400`, both with `connection: close`. Upgrade
requests (websocket, h2c, CONNECT) are served as plain HTTP/1.1 (a server may
ignore `Upgrade`, RFC 9110 §7.8) and the connection closes after the response;
one that also carries a body is refused with `400`. The body of these answers
comes from the server's `ErrorRenderer` (`gateway.http.responses`). A half-close from the
client counts as a disconnect.

An HTTP/1.1 request without a `Host` header, or any request with more than
one, is answered `400` and the connection closes (RFC 9112 §3.2).

Keep-alive: HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with
`Connection: keep-alive` and a response of known length. A response that
starts before its request's body is complete (a 413 for a declared length over
the limit, a 404 without reading) closes the connection after it: the rest of
the body is not read to its end (only discarded for `LINGER_S` while closing).

Timeouts, one timer per connection re-armed lazily (never a task or a timer
per request): a connection with no byte of a next request for `idle_timeout`
seconds (since the last response, or since it was opened) is closed; a request
head must be complete within `head_timeout` of its first byte (else the
connection closes); a request body must not pause for more than
`body_timeout` between two bytes nor take more than `body_total_timeout` in
all (a stalled `Content-Length` body, a chunked body without its final
chunk, `Expect: 100-continue` and no body): the request is answered `408` if
its response has not started, and the connection closes (the app's `receive()`
returns `http.disconnect`). Time during which the server itself does not read
(a pipelined request waiting its turn, an app not reading its body, a
`100 Continue` not yet sent) does not count against the client.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Final, cast
from urllib.parse import unquote

import httptools

from gateway.http.asgi import Scope
from gateway.http.exchange import BODY_HIGH_WATER, Exchange
from gateway.http.responses import error_response
from gateway.http.server_state import ServerState

log = logging.getLogger("gateway.http.server")

MAX_HEAD: Final = 64 * 1024  # request line + headers
MAX_PIPELINE: Final = 32  # queued requests per connection; beyond, the connection closes after them
LINGER_S: Final = 2.0  # input is discarded this long after an answer that leaves input unread
_METHODS: Final = {
    m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")
}
_TOO_LARGE: Final = "Request line and headers too large."
_TOO_LARGE_CODE: Final = "request_headers_too_large"
# What the connection's timer watches (`_phase`).
_IDLE: Final = 0  # no byte of a next request yet: `idle_timeout`
_HEAD: Final = 1  # a request head is arriving: `head_timeout`
_BODY: Final = 2  # the body of a request is arriving: `body_timeout`, `body_total_timeout`
_BUSY: Final = 3  # a request is being answered: no timeout


class _Reject(Exception):
    """Raised in a parser callback to stop parsing and answer with an error
    (status 0: close without an answer)."""

    def __init__(self, status: int, reason: str, code: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.code = code


def _head_size(url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    return len(url) + sum(len(n) + len(v) + 4 for n, v in headers)


def _addr(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


class HttpConnection(asyncio.Protocol):
    __slots__ = (
        "_client",
        "_closed",
        "_current",
        "_deferred_error",
        "_drain",
        "_expect",
        "_fresh",
        "_head_lower",
        "_head_upper",
        "_headers",
        "_hosts",
        "_last",
        "_parser",
        "_parsing",
        "_phase",
        "_queue",
        "_read_paused",
        "_server",
        "_since",
        "_stopped",
        "_timer",
        "_timer_at",
        "_transport",
        "_url",
        "loop",
        "state",
        "write_paused",
    )

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = state.loop
        self._parser = httptools.HttpRequestParser(self)
        # Answer a request even when bytes follow a `Connection: close` one (as uvicorn does).
        self._parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._transport: asyncio.Transport = cast(asyncio.Transport, None)  # set in connection_made
        self._client: tuple[str, int] | None = None
        self._server: tuple[str, int] | None = None
        self._url = b""  # non-empty while a request head is being parsed
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect = False
        self._hosts = 0  # Host header lines of the head being parsed
        self._head_upper = 0  # head bytes in earlier reads, at most (with the read it began in)
        self._head_lower = 0  # head bytes in earlier reads, at least (without that read)
        self._fresh = False  # a head was completed during the current read
        self._parsing: Exchange | None = None  # the request whose body is being received
        self._current: Exchange | None = None  # the request being answered
        self._queue: deque[Exchange] | None = None  # pipelined requests waiting for their turn
        self._deferred_error: bytes | None = None  # answer to a bad request behind the current one
        self._closed = False
        self._stopped = False  # no more requests are parsed on this connection
        self._read_paused = False
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._phase = _IDLE
        self._since = 0.0  # when the current phase began
        self._last = 0.0  # when the last body byte arrived (phase `_BODY`)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when `_timer` fires

    # --- transport callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        self._client = _addr(transport.get_extra_info("peername"))
        self._server = _addr(transport.get_extra_info("sockname"))
        self.state.connections.add(self)
        self._become_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self._mark_closed()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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
        phase = self._phase
        if phase == _IDLE:  # the first bytes of a request head
            self._phase = _HEAD
            self._since = now = self.loop.time()
            self._arm(now + self.state.head_timeout)
        elif phase == _BODY:
            self._last = self.loop.time()
        was_in_head = self._url != b""
        self._fresh = False
        self._head_upper += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._stop_parsing()  # the request was served as plain HTTP; nothing more is read
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Reject) and cause.status == 0:
                log.debug("%s from %s", cause.reason, self._client)
                self._stop_parsing()
            elif isinstance(cause, _Reject):
                self._bad_request(cause.status, cause.reason, cause.code)
            else:
                reason = f"Malformed HTTP request: {cause or exc}"
                self._bad_request(400, reason, "malformed_request")
            return
        if self._url:  # a head is still incomplete at the end of this read
            if self._fresh or not was_in_head:
                self._head_upper = len(data)
                self._head_lower = 0
            else:
                self._head_lower += len(data)
                if self._head_lower > MAX_HEAD:
                    self._bad_request(431, _TOO_LARGE, _TOO_LARGE_CODE)
                    return
        else:
            self._head_upper = 0
        if self._parsing is not None and self._phase != _BODY:
            self._body_begins()

    # --- parser callbacks --------------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"host":
            self._hosts += 1
        elif name == b"expect" and value.lower() == b"100-continue":
            self._expect = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        url, headers, hosts = self._url, self._headers, self._hosts
        self._url = b""
        self._headers = []
        self._hosts = 0
        self._fresh = True
        if self._head_upper > MAX_HEAD and _head_size(url, headers) > MAX_HEAD:
            raise _Reject(431, _TOO_LARGE, _TOO_LARGE_CODE)
        self._head_upper = self._head_lower = 0
        parser = self._parser
        version = parser.get_http_version()
        if hosts != 1 and (hosts > 1 or version != "1.0"):  # RFC 9112 §3.2
            if hosts:
                raise _Reject(400, "More than one Host header.", "duplicate_host_header")
            raise _Reject(400, "An HTTP/1.1 request needs a Host header.", "missing_host_header")
        method_b = parser.get_method()
        method = _METHODS.get(method_b) or method_b.decode("ascii")
        keep_alive = parser.should_keep_alive()
        if parser.should_upgrade():
            # The parser would take a body for upgraded bytes: refuse one; serve the rest,
            # then close.
            if method_b != b"CONNECT" and any(
                n in (b"content-length", b"transfer-encoding") and v.strip() != b"0"
                for n, v in headers
            ):
                raise _Reject(
                    400, "An Upgrade request with a body is not supported.", "upgrade_with_body"
                )
            keep_alive = False
        if url[:1] == b"/" and b"#" not in url:
            raw_path, _, query = url.partition(b"?")
        elif url == b"*":
            raw_path, query = url, b""
        else:  # absolute-form, authority-form or a fragment: let the parser split it
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                raise _Reject(400, "Invalid request target.", "invalid_request_target") from None
            raw_path, query = parsed.path or b"/", parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        state = self.state
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": version,
            "server": self._server,
            "client": self._client,
            "scheme": "http",
            "method": method,
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": headers,
            "state": state.app_state.copy(),
        }
        queue = self._queue
        if self._current is not None and queue is not None and len(queue) >= MAX_PIPELINE:
            raise _Reject(0, "too many pipelined requests")  # (answered up to here, then closed)
        exchange = Exchange(
            self,
            self._transport,
            scope,
            keep_alive,
            version == "1.0",
            self._expect and version != "1.0",
        )
        self._expect = False
        self._parsing = exchange
        if self._current is None:
            self._start(exchange)
        else:
            if self._queue is None:
                self._queue = deque()
            self._queue.append(exchange)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        exchange = self._parsing
        if exchange is not None:
            exchange.feed(body)

    def on_message_complete(self) -> None:
        exchange = self._parsing
        if exchange is not None:
            self._parsing = None
            if self._phase == _BODY:
                self._phase = _BUSY
            exchange.end_of_body()

    # --- sequencing ----------------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self._current = exchange
        self._phase = _BUSY
        task = exchange.task = self.loop.create_task(exchange.run(self.state.app))
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
            nxt = queue.popleft()
            if not queue:
                self._resume_reading()
            self._start(nxt)
            if self._parsing is nxt:
                self._body_begins()
            return
        if self._deferred_error is not None:
            self._transport.write(self._deferred_error)
            self._close(linger=True)
            return
        self._resume_reading()
        self._become_idle()

    def pause_reading(self) -> None:
        if not self._read_paused and not self._closed:
            self._read_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused and not self._closed and not self._stopped:
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

    # --- timeouts: one timer per connection, re-armed lazily ---------------------------------

    def _arm(self, due: float) -> None:
        """Make sure the timer fires at `due` at the latest (one firing earlier re-arms)."""
        timer = self._timer
        if timer is not None:
            if self._timer_at <= due:
                return
            timer.cancel()
        self._timer_at = due
        self._timer = self.loop.call_at(due, self._check)

    def _become_idle(self) -> None:
        if self.state.shutting_down:
            self._close()
            return
        now = self._since = self.loop.time()
        if self._url:  # the next request's head has begun already
            self._phase = _HEAD
            self._arm(now + self.state.head_timeout)
        else:
            self._phase = _IDLE
            self._arm(now + self.state.idle_timeout)

    def _body_begins(self) -> None:
        """A request's body is incomplete at the end of a read: time it."""
        now = self._since = self._last = self.loop.time()
        self._phase = _BODY
        state = self.state
        self._arm(now + min(state.body_timeout, state.body_total_timeout))

    def touch_idle(self) -> None:
        """The client's request moved on (its bytes arrived, or a `100 Continue` went out)."""
        now = self._last = self.loop.time()
        if self._phase == _IDLE:
            self._since = now

    def _check(self) -> None:
        self._timer = None
        phase = self._phase
        if self._closed or phase == _BUSY:
            return  # the next phase that needs one arms a new timer
        state = self.state
        now = self.loop.time()
        if phase == _IDLE:
            due = self._since + state.idle_timeout
        elif phase == _HEAD:
            due = self._since + state.head_timeout
        else:
            parsing = self._parsing
            if self._read_paused or (parsing is not None and parsing.expect_continue):
                # The server is not reading (or not asking for the body): not the client's stall.
                self._last = now
                self._since = max(self._since, now + state.body_timeout - state.body_total_timeout)
            due = min(self._last + state.body_timeout, self._since + state.body_total_timeout)
        if now < due - 0.001:
            self._arm(due)
            return
        if phase == _IDLE:
            log.debug("closing idle connection from %s", self._client)
            self._close()
        elif phase == _HEAD:
            log.debug("request head from %s not complete in time: closing", self._client)
            self._close()
        else:
            total = now - self._since >= state.body_total_timeout - 0.001
            limit = state.body_total_timeout if total else state.body_timeout
            what = "not complete within" if total else "stalled for"
            self._bad_request(
                408, f"Request body {what} {limit:g} s: closing.", "request_body_timeout"
            )

    # --- closing -------------------------------------------------------------------------------

    def _close(self, linger: bool = False) -> None:
        """Close; with `linger` (or while a request is still arriving) first half-close and
        discard input for up to `LINGER_S`: closing with unread input resets the connection,
        and a reset can destroy the answer before the client reads it."""
        if self._closed:
            return
        linger = linger or self._parsing is not None or self._url != b""
        self._mark_closed()
        transport = self._transport
        if not (linger and transport.can_write_eof()):
            transport.close()
            return
        transport.write_eof()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(LINGER_S, transport.close)

    def _mark_closed(self) -> None:
        self._closed = True
        self._stopped = True
        for exchange in (self._current, self._parsing, *(self._queue or ())):
            if exchange is not None:
                exchange.lost()
        self._queue = None
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
