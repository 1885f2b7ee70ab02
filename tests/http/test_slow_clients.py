"""Slow and non-conforming clients against the lean server: request-body
timeouts (a stalled body, a chunked body without its final chunk,
`Expect: 100-continue` and no body), the head and keep-alive timeouts, the
`Host` header rules (RFC 9112 §3.2), closing after an early answer instead of
reading a huge body, and many stalled clients not holding up the others."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from gateway.config.decode import ConfigError, decode
from gateway.config.schema import GatewayConfig, ListenConfig
from gateway.http.connection import LINGER_S
from gateway.http.serving import BackgroundServers, Listener, free_port
from tests.gwharness import running_gateway
from tests.http.test_httpserver import ResponseReader, connect, request

SHORT = 0.3


class Seen:
    """What the app saw: the last message `receive()` returned per path."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: list[tuple[str, str]] = []

    def add(self, path: str, kind: str) -> None:
        with self.lock:
            self.last.append((path, kind))

    def wait_for(self, item: tuple[str, str], timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if item in self.last:
                    return True
            time.sleep(0.01)
        return False


def make_app(seen: Seen) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        size = 0
        if path == "/early":  # answers before reading the body (as a 413 does)
            body = b'{"error":"too large"}'
        else:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    seen.add(path, "disconnect")
                    return
                size += len(msg.get("body", b""))
                if not msg.get("more_body", False):
                    break
            seen.add(path, "body")
            body = json.dumps({"size": size}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413 if path == "/early" else 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


@contextmanager
def lean(seen: Seen | None = None, **timeouts: float) -> Iterator[int]:
    timeouts.setdefault("head_timeout", SHORT)
    timeouts.setdefault("body_timeout", SHORT)
    timeouts.setdefault("keepalive_timeout", SHORT)
    port = free_port()
    listener = Listener(make_app(seen or Seen()), "127.0.0.1", port, server="lean", **timeouts)
    with BackgroundServers([listener]):
        yield port


def closed_within(reader: ResponseReader, low: float, high: float) -> None:
    start = time.monotonic()
    assert reader.wait_closed(high + 2)
    assert low <= time.monotonic() - start <= high, time.monotonic() - start


# --- body timeouts ----------------------------------------------------------------------------


def test_stalled_body_gets_408_and_close_and_the_app_sees_a_disconnect() -> None:
    seen = Seen()
    with lean(seen) as port, connect(port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\na")
        reader = ResponseReader(s)
        start = time.monotonic()
        (r,) = reader.read(1, timeout=3)
        assert SHORT * 0.8 < time.monotonic() - start < SHORT + 1.0
        assert r.status == 408 and r.header("connection") == "close"
        error = r.json()["error"]
        assert error["code"] == "request_body_timeout" and error["type"] == "invalid_request_error"
        assert reader.wait_closed(3)
        assert seen.wait_for(("/echo", "disconnect"))


def test_a_body_trickling_in_is_closed_by_the_total_timeout() -> None:
    with lean(body_timeout=0.3, body_total_timeout=0.8) as port, connect(port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
        reader = ResponseReader(s)
        start = time.monotonic()
        with contextlib.suppress(OSError):
            for _ in range(40):  # a byte every 0.1 s: never a 0.3 s gap
                s.sendall(b"a")
                time.sleep(0.1)
                if time.monotonic() - start > 2.0:
                    break
        (r,) = reader.read(1, timeout=3)
        assert r.status == 408 and "0.8" in r.json()["error"]["message"]
        assert reader.wait_closed(3)
        assert time.monotonic() - start < 2.5


def test_a_slow_but_steady_body_is_served() -> None:
    with lean(body_timeout=0.5) as port, connect(port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\n\r\n")
        for _ in range(8):
            time.sleep(0.1)
            s.sendall(b"x")
        (r,) = ResponseReader(s).read(1)
        assert r.status == 200 and r.json() == {"size": 8}


def test_chunked_body_without_its_final_chunk_is_closed() -> None:
    seen = Seen()
    with lean(seen) as port, connect(port) as s:
        s.sendall(
            b"POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        )
        reader = ResponseReader(s)
        (r,) = reader.read(1, timeout=3)
        assert r.status == 408
        assert reader.wait_closed(3)
        assert seen.wait_for(("/chunks", "disconnect"))


def test_expect_100_continue_without_a_body_is_closed() -> None:
    with lean() as port, connect(port) as s:
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        reader = ResponseReader(s)
        s.settimeout(3)
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        start = time.monotonic()
        (r,) = reader.read(1, timeout=3)
        assert r.status == 408 and time.monotonic() - start > SHORT * 0.8
        assert reader.wait_closed(3)


def test_an_idle_keep_alive_connection_and_a_slow_head_are_closed() -> None:
    with lean(keepalive_timeout=0.3, head_timeout=0.6) as port:
        with connect(port) as s:  # never sends anything: the keep-alive timeout
            closed_within(ResponseReader(s), 0.2, 1.5)
        with connect(port) as s:  # a head that never ends: the head timeout, from its first byte
            time.sleep(0.2)
            s.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\n")
            closed_within(ResponseReader(s), 0.5, 2.0)


def test_normal_keep_alive_requests_are_unaffected() -> None:
    with lean() as port, connect(port) as s:
        reader = ResponseReader(s)
        for i in range(5):
            s.sendall(request("POST", "/echo", b"x" * (i + 1)))
            time.sleep(0.15)  # below every timeout
            assert reader.read(i + 1)[-1].json() == {"size": i + 1}
        s.sendall(request("GET", "/echo") + request("POST", "/echo", b"abc"))  # pipelined
        responses = reader.read(7)
        assert [r.status for r in responses] == [200] * 7 and not reader.closed


# --- many stalled clients ------------------------------------------------------------------------


def test_many_stalled_bodies_do_not_hold_up_other_requests() -> None:
    seen = Seen()
    with lean(seen, body_timeout=1.5) as port:
        stalled: list[socket.socket] = []
        try:
            for _ in range(200):
                c = connect(port)
                c.sendall(b"POST /stall HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\na")
                stalled.append(c)
            latencies = []
            with connect(port) as s:
                reader = ResponseReader(s)
                for i in range(10):
                    start = time.monotonic()
                    s.sendall(request("GET", "/healthz"))
                    reader.read(i + 1, timeout=2)
                    latencies.append(time.monotonic() - start)
            assert max(latencies) < 0.5, latencies
            assert all(r.status == 200 for r in reader.responses)
            # ...and each stalled one is answered 408 and closed by its timeout
            end = time.monotonic() + 6
            answered = 0
            for c in stalled:
                r = ResponseReader(c)
                (resp,) = r.read(1, timeout=max(0.1, end - time.monotonic()))
                answered += resp.status == 408 and r.wait_closed(1)
            assert answered == len(stalled)
            assert seen.wait_for(("/stall", "disconnect"))
        finally:
            for c in stalled:
                c.close()


# --- Host header --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"GET /echo HTTP/1.1\r\n\r\n", "missing_host_header"),
        (b"GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "duplicate_host_header"),
        (b"GET /echo HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", "duplicate_host_header"),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nab", "missing_host_header"),
    ],
)
def test_host_header_rules(raw: bytes, code: str) -> None:
    with lean() as port, connect(port) as s:
        s.sendall(raw)
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert r.status == 400 and r.header("connection") == "close"
        assert r.json()["error"]["code"] == code
        assert reader.wait_closed()


def test_http10_without_host_is_served() -> None:
    with lean() as port, connect(port) as s:
        s.sendall(b"GET /echo HTTP/1.0\r\n\r\n")
        reader = ResponseReader(s)
        assert reader.wait_closed()  # (a close-delimited answer)
        assert reader.raw.startswith(b"HTTP/1.1 200 ")


# --- an early answer closes instead of reading the rest of the body -----------------------------


def test_an_answer_before_the_body_ends_closes_the_connection() -> None:
    with lean(body_timeout=5.0) as port, connect(port) as s:
        s.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000\r\n\r\n")
        reader = ResponseReader(s)
        (r,) = reader.read(1)
        assert r.status == 413 and r.header("connection") == "close"
        # The server discards input for at most LINGER_S while closing (so that a reset does not
        # destroy the answer), then closes: the client's sends fail well before 1 GB.
        start = time.monotonic()
        failed = False
        s.settimeout(0.5)
        chunk = b"x" * 65536
        while time.monotonic() - start < 3 * LINGER_S:
            try:
                s.send(chunk)
            except TimeoutError:
                continue
            except OSError:
                failed = True
                break
        assert failed and time.monotonic() - start < LINGER_S + 1.5


def test_a_whole_body_already_received_keeps_the_connection() -> None:
    with lean() as port, connect(port) as s:
        reader = ResponseReader(s)
        s.sendall(request("POST", "/early", b"abc") + request("GET", "/echo"))
        first, second = reader.read(2)
        assert (first.status, second.status) == (413, 200)
        assert first.header("connection") is None and not reader.closed


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["head_timeout_s", "body_timeout_s", "body_total_timeout_s", "keepalive_timeout_s"]
)
def test_listen_timeouts_must_be_positive(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        ListenConfig(**{key: 0})
    with pytest.raises(ValueError, match=key):
        ListenConfig(**{key: float("nan")})


def test_uvicorn_is_refused_for_the_public_listener_at_config_load() -> None:
    """uvicorn has no head size or time limit and no body timeout (issue 19)."""
    with pytest.raises(ConfigError) as err:
        decode(GatewayConfig, {"listen": {"server": "uvicorn"}})
    (problem,) = err.value.problems
    assert problem.startswith("listen.server: uvicorn is refused for the public listener")
    assert decode(GatewayConfig, {"listen": {"server": "lean"}}).listen.server == "lean"


def test_listen_timeouts_reach_the_public_listener_and_the_gateway_answers_408() -> None:
    listen = ListenConfig(
        port=free_port(),
        admin_port=free_port(),
        head_timeout_s=1.5,
        body_timeout_s=SHORT,
        body_total_timeout_s=9.0,
        keepalive_timeout_s=2.5,
    )
    config = dataclasses.replace(GatewayConfig(), listen=listen)
    with running_gateway(config=config) as gw:
        public = gw.gateway.listeners()[0]
        assert (
            public.head_timeout,
            public.body_timeout,
            public.body_total_timeout,
            public.keepalive_timeout,
        ) == (1.5, SHORT, 9.0, 2.5)
        with connect(listen.port) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
            reader = ResponseReader(s)
            (r,) = reader.read(1, timeout=5)
            assert r.status == 408
            error = r.json()["error"]
            assert error["code"] == "request_body_timeout" and "param" in error
            assert reader.wait_closed(3)
