"""Pipelined requests against the lean server over raw sockets: however many
arrive in one write, each is answered, in order; past `MAX_PIPELINE` waiting
requests the server stops parsing and reading (the queue stays bounded)
instead of dropping any."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gateway.http.asgi import Receive, Scope, Send
from gateway.http.connection import FEED_SLICE, MAX_PIPELINE, HttpConnection
from gateway.http.server import LeanServer
from tests.http.lifespan import run_lifespan
from tests.http.test_httpserver import ResponseReader, connect, request, serve_lean


class _App:
    """`/n?i` answers `i`, the body's size and hash; `/hold?s` answers after `s` seconds."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self.loop = asyncio.get_running_loop()
            await run_lifespan(receive, send)
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        query = scope["query_string"].decode()
        if scope["path"] == "/hold":
            await asyncio.sleep(float(query))
        info = {"i": query, "size": len(body), "sha": hashlib.sha256(body).hexdigest()[:16]}
        payload = json.dumps(info).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


@contextmanager
def lean() -> Iterator[tuple[int, LeanServer, _App]]:
    app = _App()
    with serve_lean(app) as (port, server):
        yield port, server, app


def _backlogs(server: LeanServer, app: _App) -> list[int]:
    """Each open connection's backlog, read on the server's loop."""

    async def probe() -> list[int]:
        assert server.state is not None
        conns = server.state.connections
        return [c.backlog for c in conns if isinstance(c, HttpConnection)]

    assert app.loop is not None
    return asyncio.run_coroutine_threadsafe(probe(), app.loop).result(5)


def test_100_pipelined_requests_in_one_write_are_all_answered_in_order() -> None:
    with lean() as (port, _, _), connect(port) as s:
        s.sendall(b"".join(request("GET", f"/n?{i}") for i in range(100)))
        reader = ResponseReader(s)
        responses = reader.read(100, timeout=20)
        assert [r.status for r in responses] == [200] * 100
        assert [r.json()["i"] for r in responses] == [str(i) for i in range(100)]
        assert not reader.closed
        s.sendall(request("GET", "/n?after"))  # the connection is still usable
        assert reader.read(101)[-1].json()["i"] == "after"


def _post(i: int) -> tuple[bytes, bytes]:
    body = bytes([65 + i % 26]) * (i * 37 % 3000)
    if i % 5 == 0:  # some chunked, in two chunks
        half = len(body) // 2
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:half], body[half:]) if c)
        head = f"POST /n?{i} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        return head.encode() + chunks + b"0\r\n\r\n", body
    return request("POST", f"/n?{i}", body), body


def test_pipelined_bodies_cut_across_parse_slices_arrive_whole() -> None:
    posts = [_post(i) for i in range(300)]
    with lean() as (port, _, _), connect(port) as s:
        s.sendall(b"".join(raw for raw, _ in posts))
        responses = ResponseReader(s).read(300, timeout=30)
    assert [r.status for r in responses] == [200] * 300
    got = [(r.json()["i"], r.json()["size"], r.json()["sha"]) for r in responses]
    want = [(str(i), len(b), hashlib.sha256(b).hexdigest()[:16]) for i, (_, b) in enumerate(posts)]
    assert got == want


def test_a_long_pipeline_pauses_parsing_at_the_cap_and_drops_nothing() -> None:
    count = 2000
    smallest = len(request("GET", "/n?0"))
    bound = MAX_PIPELINE + FEED_SLICE // smallest + 1
    with lean() as (port, server, app), connect(port) as s:
        s.sendall(request("GET", "/hold?1.0"))
        s.sendall(b"".join(request("GET", f"/n?{i}") for i in range(count)))
        seen: list[int] = []
        end = time.monotonic() + 0.6  # while the first request is held
        while time.monotonic() < end:
            seen.extend(_backlogs(server, app))
            time.sleep(0.02)
        assert seen and MAX_PIPELINE <= max(seen) <= bound, (max(seen), bound)
        responses = ResponseReader(s).read(count + 1, timeout=60)
    assert [r.status for r in responses] == [200] * (count + 1)
    assert [r.json()["i"] for r in responses[1:]] == [str(i) for i in range(count)]


def test_a_bad_request_deep_in_a_pipeline_is_answered_after_the_good_ones() -> None:
    good: list[Any] = [request("GET", f"/n?{i}") for i in range(150)]
    with lean() as (port, _, _), connect(port) as s:
        s.sendall(b"".join(good) + b"NOT HTTP\r\n\r\n" + request("GET", "/n?never"))
        reader = ResponseReader(s)
        assert reader.wait_closed(20)
    statuses = [r.status for r in reader.responses]
    assert statuses == [200] * 150 + [400]
    assert reader.responses[-1].header("connection") == "close"
