"""2,000 slow clients against the lean server: slowloris heads and trickled
bodies, each sending a byte now and then, held open while a normal client
keeps getting its answers; then the server's own timeouts close every slow
one (a head is bounded from its first byte, a body in total, however
steadily it trickles)."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gateway.http.serving import BackgroundServers, Listener, free_port
from tests.http.test_httpserver import ResponseReader, connect, request
from tests.http.test_slow_clients import Seen, make_app

SLOW = 2000
HEAD_TIMEOUT = 4.0
BODY_TOTAL_TIMEOUT = 4.0
# Two descriptors per connection (client and server side in this process), and some spare.
FDS_NEEDED = 2 * SLOW + 500


@contextmanager
def _enough_fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FDS_NEEDED:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {FDS_NEEDED} needed for {SLOW} clients")
    if soft != resource.RLIM_INFINITY and soft < FDS_NEEDED:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _SlowClient:
    """One slow connection: sends a byte now and then until the server answers or closes."""

    def __init__(self, port: int, first: bytes) -> None:
        self.sock = connect(port, timeout=10)
        self.sock.sendall(first)
        self.sock.setblocking(False)
        self.received = b""
        self.closed = False

    def poll(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            except ConnectionResetError:
                data = b""
            self.received += data
            self.closed = not data

    def trickle(self) -> None:
        self.poll()
        if not self.closed and not self.received:
            with contextlib.suppress(BlockingIOError):
                self.sock.send(b"a")


def _open_slow(port: int) -> tuple[list[_SlowClient], list[_SlowClient]]:
    """Half slowloris heads, half bodies declared long and sent a byte at a time."""
    heads: list[_SlowClient] = []
    bodies: list[_SlowClient] = []
    for i in range(SLOW):
        if i % 2:
            first = b"POST /slow-body HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\na"
            bodies.append(_SlowClient(port, first))
        else:
            heads.append(_SlowClient(port, b"GET /slow-head HTTP/1.1\r\nHost: t\r\nX-Filler: a"))
    return heads, bodies


def _normal_requests(port: int, count: int) -> list[float]:
    latencies = []
    with connect(port) as s:
        reader = ResponseReader(s)
        for i in range(count):
            start = time.monotonic()
            s.sendall(request("GET", "/healthz"))
            responses = reader.read(i + 1, timeout=10)
            latencies.append(time.monotonic() - start)
            assert responses[-1].status == 200
    return latencies


@pytest.mark.slow
def test_2000_slow_clients_do_not_stop_normal_requests_and_are_closed_by_timeouts() -> None:
    port = free_port()
    seen = Seen()
    listener = Listener(
        make_app(seen),
        "127.0.0.1",
        port,
        server="lean",
        head_timeout=HEAD_TIMEOUT,
        body_timeout=1.0,
        body_total_timeout=BODY_TOTAL_TIMEOUT,
        keepalive_timeout=5.0,
    )
    with _enough_fds(), BackgroundServers([listener]):
        heads: list[_SlowClient] = []
        bodies: list[_SlowClient] = []
        try:
            heads, bodies = _open_slow(port)
            slow = heads + bodies
            latencies: list[float] = []
            # The slow clients keep sending (more often than `body_timeout`) while normal
            # requests come, until the server closes them: bounded in rounds and time.
            end = time.monotonic() + max(HEAD_TIMEOUT, BODY_TOTAL_TIMEOUT) + 20
            for _ in range(1000):
                for c in slow:
                    c.trickle()
                if all(c.closed for c in slow) or time.monotonic() > end:
                    break
                latencies += _normal_requests(port, 3)
                time.sleep(0.2)
            assert latencies and max(latencies) < 5.0, latencies  # generous: shared CPUs
        finally:
            for c in heads + bodies:
                c.sock.close()
        assert all(c.closed and c.received == b"" for c in heads)  # a slow head: closed unanswered
        assert all(c.closed and c.received.startswith(b"HTTP/1.1 408 ") for c in bodies)
        assert b"not complete within" in bodies[0].received  # the total bound, not a stall
        assert seen.wait_for(("/slow-body", "disconnect"))
        assert _normal_requests(port, 1)  # still serving
