"""A kept-alive connection's next request that arrives by the idle deadline is
answered, even when the event loop gets to it only after the deadline (busy:
uvloop, what `gateway serve` runs on, handles due timers before it reads), and
the idle timeout defaults above the clients' own, so it is they who close."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvloop

from gateway.config.schema import ListenConfig
from gateway.http.server import LeanServer
from gateway.http.serving import free_port

IDLE_S = 0.5


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (msg := await receive())["type"] != "lifespan.shutdown":
            await send({"type": msg["type"] + ".complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


class _Blocking(asyncio.Protocol):
    """Holds the event loop in its I/O callback (as parsing a big input would):
    the loop polls again only after its due timers have run."""

    def data_received(self, data: bytes) -> None:
        time.sleep(1.0)


@contextmanager
def uvloop_server() -> Iterator[tuple[int, int]]:
    """The lean server and a blocking listener, on one uvloop loop in a thread."""
    port, blocking_port = free_port(), free_port()
    server = LeanServer(app, "127.0.0.1", port, idle_timeout=IDLE_S, capture_signals=False)
    loop = uvloop.new_event_loop()

    async def main() -> None:
        blocker = await loop.create_server(_Blocking, "127.0.0.1", blocking_port)
        try:
            await server.serve()
        finally:
            blocker.close()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    for _ in range(500):  # bounded: 5 s
        if server.started:
            break
        time.sleep(0.01)
    assert server.started
    try:
        yield port, blocking_port
    finally:
        server.should_exit = True
        thread.join(10)
        loop.close()


def get(sock: socket.socket, path: str) -> None:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def answer(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_request_that_arrived_by_the_idle_deadline_is_answered_on_a_busy_loop() -> None:
    with uvloop_server() as (port, blocking_port):
        for _ in range(3):  # the race is certain each time: the loop is held across it
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as kept,
                socket.create_connection(("127.0.0.1", blocking_port), timeout=10) as blocker,
            ):
                get(kept, "/first")
                assert answer(kept).startswith(b"HTTP/1.1 200")
                t0 = time.monotonic()
                time.sleep(0.1)
                blocker.sendall(b"x")  # the loop is held from ~0.1 s to ~1.1 s
                time.sleep(0.25)
                get(kept, "/second")  # at ~0.35 s: before the 0.5 s idle deadline
                assert time.monotonic() - t0 < IDLE_S
                got = answer(kept)
                assert got.startswith(b"HTTP/1.1 200"), got


def test_the_idle_timeout_outlasts_the_clients_and_load_balancers() -> None:
    # httpx / the OpenAI SDKs: 5 s; AWS ALB: 60 s. A server closing first races
    # the request a client may be sending on the connection at that moment.
    assert ListenConfig().keepalive_timeout_s > 60


def test_a_connection_never_used_closes_after_the_head_timeout() -> None:
    async def scenario() -> float:
        port = free_port()
        server = LeanServer(app, "127.0.0.1", port, idle_timeout=60, head_timeout=0.3)
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        t0 = time.monotonic()
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        took = time.monotonic() - t0
        writer.close()
        server.should_exit = True
        await task
        return took

    assert 0.25 < asyncio.run(scenario()) < 2.0
