"""The lean HTTP/1.1 server (`gateway.http.server`) over real loopback sockets.

Small ASGI apps are served with `BackgroundServers([Listener(..., server="lean")])`
(or a `LeanServer` with short timeouts on a private loop); the clients are raw
sockets, httpx and the openai SDK. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httptools
import httpx
import pytest

from gateway.errors import render_server_error
from gateway.http.exchange import BODY_HIGH_WATER, DISCONNECT_EXTENSION
from gateway.http.responses import ErrorRenderer, RawHeaders, json_error
from gateway.http.server import LeanServer
from gateway.http.serving import BackgroundServers, Listener, free_port

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


# --- helpers ---------------------------------------------------------------------------------


class Recorder:
    """What the apps saw, for the test thread to check."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.lock = threading.Lock()

    def add(self, item: Any) -> None:
        with self.lock:
            self.events.append(item)

    def wait_for(self, pred: Callable[[list[Any]], bool], timeout: float = 5.0) -> list[Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if pred(self.events):
                    return list(self.events)
            time.sleep(0.01)
        raise AssertionError(f"condition not met within {timeout}s; events: {self.events!r}")


async def _lifespan(
    scope: Scope, receive: Receive, send: Send, rec: Recorder | None = None
) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            scope["state"]["greeting"] = "hello"
            if rec is not None:
                rec.add("startup")
            await send({"type": "lifespan.startup.complete"})
        else:
            if rec is not None:
                rec.add("shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Receive) -> bytes:
    parts = []
    for _ in range(100_000):
        message = await receive()
        assert message["type"] == "http.request", message
        parts.append(message["body"])
        if not message["more_body"]:
            break
    return b"".join(parts)


def make_app(rec: Recorder) -> Any:
    """One app, behaviour chosen by path."""
    in_flight = [0]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send, rec)
            return
        path = scope["path"]
        in_flight[0] += 1
        try:
            await route(path, scope, receive, send)
        finally:
            in_flight[0] -= 1

    async def respond(
        send: Send, body: bytes, status: int = 200, headers: list[Any] | None = None
    ) -> None:
        hdrs = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send(
            {"type": "http.response.start", "status": status, "headers": hdrs + (headers or [])}
        )
        await send({"type": "http.response.body", "body": body})

    async def route(path: str, scope: Scope, receive: Receive, send: Send) -> None:
        if path.startswith("/echo"):
            body = await _read_body(receive)
            info = {k: scope[k] for k in ("method", "path", "http_version", "scheme", "root_path")}
            info.update(
                raw_path=scope["raw_path"].decode(),
                query=scope["query_string"].decode(),
                headers=[[n.decode(), v.decode()] for n, v in scope["headers"]],
                client=list(scope["client"]),
                server=list(scope["server"]),
                state=scope["state"],
                asgi=scope["asgi"],
                size=len(body),
                sha=hashlib.sha256(body).hexdigest(),
                concurrent=in_flight[0],
            )
            await respond(send, json.dumps(info).encode())
        elif path == "/slow":
            rec.add(("slow-start", scope["query_string"]))
            await asyncio.sleep(float(scope["query_string"] or b"0.3"))
            await respond(send, b'{"slow":true}')
            rec.add("slow-done")
        elif path == "/nolength":  # one body, no content-length: the server computes it
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]})
            await send({"type": "http.response.body", "body": b"whole body"})
        elif path == "/stream":  # no content-length, several chunks: chunked
            n = int(scope["query_string"] or b"3")
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            for i in range(n):
                await send(
                    {"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True}
                )
                await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif path == "/empty204":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/close":
            await respond(send, b"{}", headers=[(b"connection", b"close")])
        elif path == "/boom":
            raise ValueError("boom before the response")
        elif path == "/boom-after":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            raise ValueError("boom mid-response")
        elif path == "/no-response":
            return
        elif path == "/too-long":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-length", b"2")],
                }
            )
            await send({"type": "http.response.body", "body": b"three"})
        elif path == "/bad-header":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"x-a", b"1\r\nx-evil: 1")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
        else:
            await respond(send, b'{"error":"not found"}', status=404)

    return app


@contextmanager
def serve(app: Any, render_error: ErrorRenderer = json_error) -> Iterator[int]:
    port = free_port()
    with BackgroundServers(
        [Listener(app, "127.0.0.1", port, server="lean", render_error=render_error)]
    ):
        yield port


@contextmanager
def serve_lean(app: Any, **kwargs: Any) -> Iterator[tuple[int, LeanServer]]:
    """A LeanServer with custom timeouts on a private loop thread."""
    port = free_port()
    server = LeanServer(app, "127.0.0.1", port, **kwargs)
    loop = asyncio.new_event_loop()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(server.serve())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started or errors:
            break
        time.sleep(0.01)
    assert server.started, errors
    try:
        yield port, server
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive()


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


class Response:
    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        self.chunked = False
        self.done = False

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n == name), None)

    def json(self) -> Any:
        return json.loads(self.body)


class ResponseReader:
    """Parses responses from a raw socket with httptools (the test's own parser)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.responses: list[Response] = []
        self.closed = False
        self.raw = b""
        self._parser = httptools.HttpResponseParser(self)
        self._current: Response | None = None

    def on_message_begin(self) -> None:
        self._current = Response()

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._current is not None
        self._current.headers.append((name.decode().lower(), value.decode()))

    def on_headers_complete(self) -> None:
        assert self._current is not None
        self._current.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        assert self._current is not None
        self._current.body += body

    def on_message_complete(self) -> None:
        assert self._current is not None
        self._current.done = True
        self.responses.append(self._current)

    def read(self, count: int = 1, timeout: float = 5.0) -> list[Response]:
        end = time.monotonic() + timeout
        while len(self.responses) < count and not self.closed:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{count} responses not received in {timeout}s: {self.raw[:500]!r}"
                )
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                self.closed = True
                break
            self.raw += data
            self._parser.feed_data(data)
        return self.responses

    def wait_closed(self, timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while not self.closed and time.monotonic() < end:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                self.closed = True
                break
            if not data:
                self.closed = True
            self.raw += data
            self._parser.feed_data(data)
        return self.closed


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    version: str = "1.1",
) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: test"]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.fixture()
def rec() -> Recorder:
    return Recorder()


@pytest.fixture()
def port(rec: Recorder) -> Iterator[int]:
    with serve(make_app(rec)) as p:
        yield p


# --- scope, keep-alive, pipelining -------------------------------------------------------------


def test_scope_fields_and_keep_alive_reuse(port: int) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        infos = [
            client.post("/echo/a%20b/%C3%A9?x=1&y=%20", content=b"hello").json() for _ in range(3)
        ]
    first = infos[0]
    assert (
        first["method"] == "POST" and first["http_version"] == "1.1" and first["scheme"] == "http"
    )
    assert first["path"] == "/echo/a b/é" and first["raw_path"] == "/echo/a%20b/%C3%A9"
    assert first["query"] == "x=1&y=%20" and first["root_path"] == ""
    assert first["asgi"] == {"version": "3.0", "spec_version": "2.4"}
    assert first["state"] == {"greeting": "hello"}  # a copy of the lifespan state
    assert first["size"] == 5 and first["server"] == ["127.0.0.1", port]
    names = [n for n, _ in first["headers"]]
    assert names[0] == "host" and all(n == n.lower() for n in names)
    assert {tuple(i["client"]) for i in infos} == {tuple(first["client"])}  # one connection, reused


def test_response_has_date_and_no_server_header(port: int) -> None:
    r = httpx.get(f"http://127.0.0.1:{port}/echo")
    assert r.status_code == 200 and "date" in r.headers and "server" not in r.headers


def test_pipelined_requests_are_answered_in_order_one_at_a_time(port: int, rec: Recorder) -> None:
    with connect(port) as s:
        s.sendall(
            request("GET", "/slow?0.3")
            + request("POST", "/echo", b"second")
            + request("GET", "/echo")
        )
        reader = ResponseReader(s)
        responses = reader.read(3)
    assert [r.status for r in responses] == [200, 200, 200]
    assert responses[0].json() == {"slow": True}
    second, third = responses[1].json(), responses[2].json()
    assert second["size"] == 6 and third["method"] == "GET"
    assert second["concurrent"] == 1 and third["concurrent"] == 1  # never two app calls at once


def test_chunked_request_body(port: int) -> None:
    with connect(port) as s:
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        )
        time.sleep(0.05)
        s.sendall(b"6\r\n world\r\n0\r\n\r\n")
        (r,) = ResponseReader(s).read(1)
    assert r.json()["size"] == 11 and r.json()["sha"] == hashlib.sha256(b"hello world").hexdigest()


def test_expect_100_continue(port: int) -> None:
    with connect(port) as s:
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        s.settimeout(5)
        interim = s.recv(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"data")
        (r,) = ResponseReader(s).read(1)
    assert r.status == 200 and r.json()["size"] == 4


def test_expect_100_continue_refused_without_reading_closes(port: int) -> None:
    with connect(
        port
    ) as s:  # the app answers 404 without reading: no 100, and the connection closes
        s.sendall(
            b"POST /missing HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: "
            b"100-continue\r\n\r\n"
        )
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert r.status == 404 and r.header("connection") == "close"
        assert reader.wait_closed()
    assert not reader.raw.startswith(b"HTTP/1.1 100")


# --- response framing ----------------------------------------------------------------------------


def test_content_length_chunked_and_computed_length(port: int) -> None:
    with connect(port) as s:
        reader = ResponseReader(s)
        s.sendall(request("GET", "/echo"))
        (fixed,) = reader.read(1)
        s.sendall(request("GET", "/nolength"))
        _, whole = reader.read(2)
        s.sendall(request("GET", "/stream", headers={}).replace(b"/stream", b"/stream?4"))
        _, _, stream = reader.read(3)
    assert fixed.header("content-length") is not None and fixed.header("transfer-encoding") is None
    assert whole.body == b"whole body" and whole.header("content-length") == "10"
    assert (
        stream.header("transfer-encoding") == "chunked" and stream.header("content-length") is None
    )
    assert stream.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n"
    assert b"\r\n0\r\n\r\n" in reader.raw  # the last chunk


def test_stream_head_goes_out_before_the_first_chunk(rec: Recorder) -> None:
    gate = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await asyncio.wait_for(gate.wait(), 5)
        await send({"type": "http.response.body", "body": b"late", "more_body": False})

    with serve(app) as port, connect(port) as s:
        s.sendall(request("GET", "/"))
        s.settimeout(5)
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head


def test_head_and_204_have_no_body(port: int) -> None:
    with connect(port) as s:
        s.sendall(request("HEAD", "/echo") + request("HEAD", "/stream"))
        raw = b""
        for _ in range(100):
            raw += s.recv(65536)
            if raw.count(b"\r\n\r\n") == 2:
                break
        time.sleep(0.1)
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(65536)  # nothing after the two heads
        first, second, rest = raw.split(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200 OK") and b"content-length: " in first and rest == b""
        assert b"transfer-encoding" not in second
    with httpx.Client() as client:
        r = client.head(f"http://127.0.0.1:{port}/echo")
        assert r.status_code == 200 and r.content == b""
    with connect(port) as s:
        reader = ResponseReader(s)
        s.sendall(request("GET", "/empty204") + request("GET", "/echo"))
        r204, after = reader.read(2)
    assert r204.status == 204 and r204.body == b"" and r204.header("transfer-encoding") is None
    assert after.status == 200  # the connection stayed usable


def test_http10_close_delimited_and_keep_alive(port: int) -> None:
    with connect(port) as s:  # 1.0 without keep-alive: answered, then closed
        s.sendall(request("GET", "/stream?2", version="1.0"))
        reader = ResponseReader(s)
        assert reader.wait_closed()
        assert reader.raw.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding" not in reader.raw
        assert reader.raw.endswith(b"data: 0\n\ndata: 1\n\n") and b"connection: close" in reader.raw
    with connect(port) as s:  # 1.0 with keep-alive and a known length: kept open
        reader = ResponseReader(s)
        s.sendall(request("GET", "/echo", headers={"Connection": "keep-alive"}, version="1.0"))
        (r,) = reader.read(1)
        assert r.header("connection") == "keep-alive" and r.json()["http_version"] == "1.0"
        s.sendall(request("GET", "/echo", headers={"Connection": "keep-alive"}, version="1.0"))
        assert len(reader.read(2)) == 2


def test_connection_close_from_request_and_from_app(port: int) -> None:
    with connect(port) as s:
        reader = ResponseReader(s)
        s.sendall(request("GET", "/echo", headers={"Connection": "close"}))
        (r,) = reader.read(1)
        assert r.header("connection") == "close" and reader.wait_closed()
    with connect(port) as s:
        reader = ResponseReader(s)
        s.sendall(request("GET", "/close"))
        (r,) = reader.read(1)
        assert r.header("connection") == "close" and reader.wait_closed()


# --- flow control --------------------------------------------------------------------------------


def test_large_request_body_is_read_with_bounded_buffering() -> None:
    size = 20 * 1024 * 1024
    seen: dict[str, Any] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        exchange = receive.__self__  # type: ignore[attr-defined]
        digest = hashlib.sha256()
        total = peak = 0
        while True:
            peak = max(peak, exchange.buffered)
            message = await receive()
            digest.update(message["body"])
            total += len(message["body"])
            if not message["more_body"]:
                break
            if total < 4 * 1024 * 1024:
                await asyncio.sleep(0.002)  # a slow reader for the first megabytes
        seen.update(total=total, peak=peak)
        body = digest.hexdigest().encode()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"64")]}
        )
        await send({"type": "http.response.body", "body": body})

    payload = bytes(range(256)) * (size // 256)
    with serve(app) as port, connect(port, timeout=30) as s:
        s.sendall(request("POST", "/", payload))
        (r,) = ResponseReader(s).read(1, timeout=60)
    assert r.body.decode() == hashlib.sha256(payload).hexdigest() and seen["total"] == size
    # reading pauses above BODY_HIGH_WATER; one more read of the transport may land on top
    assert seen["peak"] <= BODY_HIGH_WATER + 512 * 1024, seen


def test_slow_reader_makes_send_wait() -> None:
    chunk = b"x" * 65536
    progress: dict[str, Any] = {"sent": 0, "max_buffer": 0}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        transport = send.__self__.transport  # type: ignore[attr-defined]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(1000):  # 64 MB
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            progress["sent"] += 1
            progress["max_buffer"] = max(progress["max_buffer"], transport.get_write_buffer_size())
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    with serve(app) as port, connect(port, timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(request("GET", "/"))
        time.sleep(1.0)  # the client reads nothing: the kernel buffers fill, then send() waits
        stalled = progress["sent"]
        assert stalled < 1000
        time.sleep(0.3)
        assert progress["sent"] == stalled  # still waiting, not buffering
        received = 0
        s.settimeout(30)
        while received < 1000 * 65536:
            data = s.recv(1 << 20)
            assert data
            received += len(data)
    assert progress["sent"] == 1000
    assert progress["max_buffer"] <= 64 * 1024 + len(chunk) + 1024, progress


def test_disconnect_during_a_long_response(rec: Recorder) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        await _read_body(receive)

        async def watch() -> None:
            message = await receive()  # blocks until the client goes away
            rec.add(("receive", message["type"], time.monotonic()))

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            for _ in range(2000):
                await send(
                    {"type": "http.response.body", "body": b"data: x\n\n", "more_body": True}
                )
                await asyncio.sleep(0.005)
        except OSError as exc:
            rec.add(("send", type(exc).__name__, time.monotonic()))
        await asyncio.wait_for(watcher, 5)

    with serve(app) as port:
        s = connect(port)
        s.sendall(request("GET", "/"))
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        closed_at = time.monotonic()
        s.close()
        events = rec.wait_for(lambda ev: len(ev) == 2)
    by_kind = {e[0]: e for e in events}
    assert by_kind["receive"][1] == "http.disconnect" and by_kind["receive"][2] - closed_at < 0.5
    assert by_kind["send"][1] == "ClientDisconnected" and by_kind["send"][2] - closed_at < 0.5


def test_disconnect_while_the_body_is_awaited_returns_http_disconnect(rec: Recorder) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        first = await receive()
        second = await receive()
        rec.add((first["type"], second["type"]))

    with serve(app) as port:
        s = connect(port)
        s.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        time.sleep(0.1)
        s.close()
        assert rec.wait_for(lambda ev: len(ev) == 1) == [("http.request", "http.disconnect")]


def test_disconnect_watch_extension(rec: Recorder) -> None:
    """`scope["extensions"][DISCONNECT_EXTENSION]`: the callback runs once when the client
    goes away mid-response, never after a completed response or once unwatched, and at once
    when the client is already gone."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        watch = scope["extensions"][DISCONNECT_EXTENSION]
        await _read_body(receive)
        path = scope["path"]
        unwatch = watch(lambda: rec.add((path, "gone")))
        if path == "/unwatched":
            unwatch()
        if path in ("/long", "/unwatched"):
            await asyncio.sleep(0.3)  # the client leaves meanwhile
            with contextlib.suppress(OSError):
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"late"})
            watch(lambda: rec.add((path, "already gone")))
            rec.add((path, "done"))
            return
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})
        rec.add((path, "done"))

    with serve(app) as port:
        s = connect(port)
        s.sendall(request("GET", "/quick"))
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        rec.wait_for(lambda ev: ("/quick", "done") in ev)
        s.close()  # after the answer: not a disconnect of that exchange
        for path in ("/long", "/unwatched"):
            c = connect(port)
            c.sendall(request("GET", path))
            time.sleep(0.1)
            c.close()
        events = rec.wait_for(lambda ev: ("/long", "done") in ev and ("/unwatched", "done") in ev)
    time.sleep(0.1)
    assert events.count(("/long", "gone")) == 1
    assert ("/long", "already gone") in events and ("/unwatched", "already gone") in events
    assert ("/quick", "gone") not in rec.events and ("/unwatched", "gone") not in rec.events


# --- bad input and app errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n",
    ],
)
def test_malformed_request_gets_400_and_close(port: int, raw: bytes) -> None:
    with connect(port) as s:
        s.sendall(raw)
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert r.status == 400 and r.header("connection") == "close" and "error" in r.json()
        assert reader.wait_closed()


def test_bad_request_behind_a_good_one_is_answered_after_it(port: int) -> None:
    with connect(port) as s:
        s.sendall(request("GET", "/slow?0.1") + b"NOT HTTP\r\n\r\n")
        reader = ResponseReader(s)
        first, second = reader.read(2)
        assert (first.status, second.status) == (200, 400) and reader.wait_closed()


def test_oversized_headers_get_431(port: int) -> None:
    many = "".join(f"X-Filler-{i}: {'v' * 100}\r\n" for i in range(700))  # ~75 KB in many headers
    with connect(port) as s:
        s.sendall(f"GET /echo HTTP/1.1\r\nHost: t\r\n{many}\r\n".encode())
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert r.status == 431 and reader.wait_closed()
    with connect(port) as s:  # one endless header value, sent in pieces
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: ")
        reader = ResponseReader(s)
        with contextlib.suppress(OSError):  # (the server may close before the client is done)
            for _ in range(32):  # 2 MB
                s.sendall(b"a" * 65536)
        (r,) = reader.read(1)
        assert r.status == 431 and reader.wait_closed()
    with connect(port) as s:  # just below the limit is fine
        s.sendall(f"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: {'v' * 60000}\r\n\r\n".encode())
        (r,) = ResponseReader(s).read(1)
        assert r.status == 200


def test_upgrade_requests_are_served_as_plain_http_then_closed(port: int) -> None:
    for extra in (
        {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Key": "x"},
        {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": ""},
    ):
        with connect(port) as s:
            s.sendall(request("GET", "/echo", headers=extra))
            reader = ResponseReader(s)
            (r,) = reader.read(1)
            assert r.status == 200 and r.json()["method"] == "GET" and reader.wait_closed()


def test_app_errors(port: int, caplog: pytest.LogCaptureFixture) -> None:
    with connect(port) as s:
        s.sendall(request("GET", "/boom"))
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert (
            r.status == 500 and r.json()["error"]["type"] == "server_error" and reader.wait_closed()
        )
    assert any(
        "boom before the response" in (rec.exc_text or "")
        for rec in caplog.records
        if rec.name == "gateway.http.server"
    )
    for path in ("/boom-after", "/too-long"):  # after the head went out: the connection closes
        with connect(port) as s:
            s.sendall(request("GET", path))
            reader = ResponseReader(s)
            assert reader.wait_closed()
            assert reader.responses == [] or path == "/too-long"
    with connect(port) as s:  # returned without a response, or an invalid header: a 500
        s.sendall(request("GET", "/no-response"))
        (r,) = ResponseReader(s).read(1)
        assert r.status == 500
    with connect(port) as s:
        s.sendall(request("GET", "/bad-header"))
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert r.status == 500 and b"x-evil" not in reader.raw
    assert httpx.get(f"http://127.0.0.1:{port}/echo").status_code == 200  # the server is fine


# --- the server's own error answers: the OpenAI shape, from the injected renderer -----------------

_MALFORMED = b"GARBAGE\r\n\r\n"
_HUGE_HEAD = (
    "GET /echo HTTP/1.1\r\nHost: t\r\n"
    + "".join(f"X-Filler-{i}: {'v' * 100}\r\n" for i in range(700))
    + "\r\n"
).encode()
_CRASH = request("GET", "/boom")


def _server_error(port: int, raw: bytes) -> Response:
    with connect(port) as s:
        s.sendall(raw)
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert r.header("connection") == "close" and reader.wait_closed()
        assert r.header("content-type") == "application/json"
        assert r.header("content-length") == str(len(r.body))
        assert "date" in dict(r.headers)
        return r


@pytest.mark.parametrize(
    ("raw", "status", "kind", "code"),
    [
        (_MALFORMED, 400, "invalid_request_error", "malformed_request"),
        (_HUGE_HEAD, 431, "invalid_request_error", "request_headers_too_large"),
        (_CRASH, 500, "server_error", "internal_error"),
    ],
)
def test_server_errors_have_the_full_openai_shape(
    port: int, raw: bytes, status: int, kind: str, code: str
) -> None:
    r = _server_error(port, raw)
    error = r.json()["error"]
    assert r.status == status and set(r.json()) == {"error"}
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (kind, None, code) and error["message"]


@pytest.mark.parametrize(
    ("raw", "status", "kind", "reason", "retry"),
    [
        (_MALFORMED, 400, "invalid_request_error", "bad_request", "false"),
        (_HUGE_HEAD, 431, "invalid_request_error", "headers_too_large", "false"),
        (_CRASH, 500, "server_error", "internal_error", None),
    ],
)
def test_the_gateway_renderer_adds_its_error_headers(
    rec: Recorder, raw: bytes, status: int, kind: str, reason: str, retry: str | None
) -> None:
    with serve(make_app(rec), render_error=render_server_error) as port:
        r = _server_error(port, raw)
    error = r.json()["error"]
    assert r.status == status and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind and error["param"] is None
    assert r.header("x-gateway-reject-reason") == reason and r.header("x-should-retry") == retry


def test_a_failing_renderer_falls_back_to_the_default(rec: Recorder) -> None:
    def broken(status: int, message: str, code: str | None) -> tuple[RawHeaders, bytes]:
        raise RuntimeError("renderer bug")

    with serve(make_app(rec), render_error=broken) as port:
        r = _server_error(port, _MALFORMED)
    assert r.status == 400 and r.json()["error"]["code"] == "malformed_request"


# --- timeouts, shutdown, lifespan ---------------------------------------------------------------


def test_idle_keep_alive_connection_is_closed() -> None:
    with serve_lean(make_app(Recorder()), idle_timeout=0.3) as (port, _), connect(port) as s:
        reader = ResponseReader(s)
        s.sendall(request("GET", "/echo"))
        reader.read(1)
        time.sleep(0.1)
        s.sendall(request("GET", "/echo"))  # still open within the timeout
        reader.read(2)
        start = time.monotonic()
        assert reader.wait_closed(3)
        assert 0.2 < time.monotonic() - start < 1.5
    with serve_lean(make_app(Recorder()), idle_timeout=0.3) as (port, _), connect(port) as s:
        assert ResponseReader(s).wait_closed(3)  # never sent a request


def test_graceful_shutdown_lets_in_flight_requests_finish(rec: Recorder) -> None:
    app = make_app(rec)
    with (
        serve_lean(app, graceful_timeout=2.0) as (port, server),
        connect(port) as s,
        connect(port) as idle,
    ):
        s.sendall(request("GET", "/slow?0.5"))
        rec.wait_for(lambda ev: ("slow-start", b"0.5") in ev)
        server.should_exit = True
        (r,) = ResponseReader(s).read(1)
        assert r.status == 200 and r.header("connection") == "close"
        assert ResponseReader(idle).wait_closed()
    assert rec.events[-1] == "shutdown"


def test_shutdown_cancels_requests_after_the_grace_period(rec: Recorder) -> None:
    with serve_lean(make_app(rec), graceful_timeout=0.3) as (port, server), connect(port) as s:
        s.sendall(request("GET", "/slow?30"))
        rec.wait_for(lambda ev: ("slow-start", b"30") in ev)
        start = time.monotonic()
        server.should_exit = True
        assert ResponseReader(s).wait_closed(5)
        assert time.monotonic() - start < 2.5
    assert "slow-done" not in rec.events and rec.events[-1] == "shutdown"


def test_lifespan_startup_and_shutdown_run(rec: Recorder) -> None:
    with serve(make_app(rec)):
        assert rec.events == ["startup"]
    assert rec.events == ["startup", "shutdown"]


def test_lifespan_startup_failure_fails_start() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no"})

    servers = BackgroundServers([Listener(app, "127.0.0.1", free_port(), server="lean")])
    with pytest.raises(RuntimeError):
        servers.start(timeout=5)
    assert not servers._servers[0].started
    servers.stop()


# --- real clients --------------------------------------------------------------------------------


def test_httpx_streaming_and_openai_sdk() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        body = json.loads(await _read_body(receive))
        if body.get("stream"):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            for word in ("Hel", "lo"):
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "m",
                    "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
                }
                await send(
                    {
                        "type": "http.response.body",
                        "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                        "more_body": True,
                    }
                )
            await send(
                {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
            )
            return
        answer = {
            "id": "c1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    import openai

    with serve(app) as port:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=10
        )
        for _ in range(3):
            done = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            assert done.choices[0].message.content == "Hello"
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream) == "Hello"
        client.close()
        with httpx.stream(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"stream": True},
            timeout=10,
        ) as resp:
            assert resp.headers["transfer-encoding"] == "chunked"
            assert b"".join(resp.iter_bytes()).endswith(b"data: [DONE]\n\n")


def test_finished_exchanges_leave_no_cyclic_garbage() -> None:
    """An exchange, its scope (with the disconnect extension, a bound method of the
    exchange) and its task are freed by reference counting when the response is done:
    a reference cycle per request would leave ~15 objects each for the cyclic GC, whose
    collections then cost more the more requests are in flight."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(scope, receive, send)
            return
        unwatch = scope["extensions"][DISCONNECT_EXTENSION](lambda: None)
        await _read_body(receive)
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})
        unwatch()

    n = 60
    with serve(app) as port:
        s = connect(port)
        s.sendall(request("GET", "/warm"))
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        gc.collect()
        gc.disable()
        try:
            for i in range(n):
                s.sendall(request("POST", f"/r{i}", b"{}"))
                assert s.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(0.1)  # the last task finishes after its response is written
            unreachable = gc.collect()
        finally:
            gc.enable()
        s.close()
    assert unreachable < n, f"{unreachable} objects in reference cycles after {n} requests"
