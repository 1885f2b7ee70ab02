"""The public listener sends a response head with the body that follows it in one write."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from gateway.http.serving import BackgroundServers, Listener, free_port
from gateway.http.uvicorn_writes import HeadWithBody
from tests.http.lifespan import run_lifespan


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_head_and_body_of_one_turn_make_one_write_and_stream_chunks_pass_through() -> None:
    async def scenario() -> list[list[bytes]]:
        loop = asyncio.get_running_loop()
        out = []
        rec = _Recorder()
        t = HeadWithBody(rec, loop)  # type: ignore[arg-type]
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert rec.writes == []
        t.write(b"hi")
        out.append(list(rec.writes))
        rec.writes.clear()
        t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")  # a stream's head
        await asyncio.sleep(0)  # end of the turn: it goes out alone
        t.write(b"data: 1\n\n")
        t.write(b"data: 2\n\n")
        out.append(list(rec.writes))
        rec.writes.clear()
        t.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
        t.close()  # a held head is never lost
        out.append(list(rec.writes))
        assert rec.closed and t.get_extra_info("peername") == "info:peername"
        return out

    one, stream, closed = asyncio.run(scenario())
    assert one == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"]
    assert stream == [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n",
        b"data: 1\n\n",
        b"data: 2\n\n",
    ]
    assert closed == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await run_lifespan(receive, send)
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
    )
    await send({"type": "http.response.body", "body": b"hello"})


def test_a_served_response_arrives_whole_over_keep_alive() -> None:
    port = free_port()
    with (
        BackgroundServers([Listener(_app, "127.0.0.1", port)]),
        socket.create_connection(("127.0.0.1", port), timeout=5) as s,
    ):
        for _ in range(3):
            s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            data = b""
            for _ in range(50):
                data += s.recv(65536)
                if data.endswith(b"hello"):
                    break
            assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"\r\n\r\nhello")
