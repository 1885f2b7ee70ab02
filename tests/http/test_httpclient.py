"""The upstream HTTP/1.1 client (gateway.http.client / gateway.forward.upstream) against
real loopback servers: keep-alive, framing, streaming, flow control, the
error mapping, cancellation and the pool's limits. Every test runs on both
the default asyncio loop and uvloop (the gateway's), bounded in time."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Self

import pytest
import uvloop

from gateway.config.schema import UpstreamConfig
from gateway.errors import UpstreamNeverReached, UpstreamStaleConnection, UpstreamUnavailable
from gateway.forward.upstream import UpstreamClient
from gateway.http.client_conn import HIGH_WATER
from gateway.http.serving import free_port

Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
JSON = {"Content-Type": "application/json"}
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    def runner(coro: Coroutine[Any, Any, Any]) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(20):
                return await coro

        return uvloop.run(bounded()) if request.param == "uvloop" else asyncio.run(bounded())

    return runner


class Server:
    """A scripted HTTP server: `handler` runs once per accepted connection."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.eofs: list[float] = []  # when a connection saw the client's EOF / reset
        self.heads: list[bytes] = []
        self.event = asyncio.Event()  # for handlers that wait on the test
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https://localhost' if self.tls else 'http://127.0.0.1'}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # (a cancelled handler task would be logged as an error by asyncio.streams)
        finally:
            writer.close()
            self._tasks.discard(task)

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's body; None once the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eofs.append(time.monotonic())
            return None
        self.heads.append(head)
        m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        return await reader.readexactly(int(m.group(1))) if m else b""

    async def wait_eof(self, reader: asyncio.StreamReader) -> None:
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.eofs.append(time.monotonic())


async def keepalive(
    srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    while (body := await srv.read_request(reader)) is not None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def started(cfg: UpstreamConfig | None = None) -> UpstreamClient:
    client = UpstreamClient(cfg or UpstreamConfig())
    await client.start()
    return client


async def post_all(
    client: UpstreamClient, url: str, body: bytes = b"{}", timeout: float = 2.0
) -> bytes:
    async with client.post(url, JSON, body, timeout) as resp:
        assert resp.status == 200
        return await resp.read_all()


async def until(cond: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_keepalive_reuses_one_connection_and_sends_a_lean_head(run: Any) -> None:
    async def main() -> None:
        async with Server(keepalive) as srv:
            client = await started()
            assert await post_all(client, srv.url + "/v1/x?a=1", b'{"n":1}') == b'{"n":1}'
            small = await client.get(srv.url + "/health", 2.0, {"Authorization": "Bearer k"})
            assert (small.status, small.body, small.content_type) == (200, b"", "text/plain")
            assert await post_all(client, srv.url + "/v1/x", b'{"n":2}') == b'{"n":2}'
            assert srv.connections == 1
            head = srv.heads[0].decode()
            assert head.startswith("POST /v1/x?a=1 HTTP/1.1\r\n")
            assert f"Host: {srv.url.split('//')[1]}\r\n" in head and "Content-Length: 7\r\n" in head
            assert "Content-Type: application/json\r\n" in head
            assert "user-agent" not in head.lower() and "accept-encoding" not in head.lower()
            get = srv.heads[1].decode()
            assert (
                get.startswith("GET /health HTTP/1.1\r\n") and "content-length" not in get.lower()
            )
            assert "Authorization: Bearer k\r\n" in get
            with pytest.raises(ValueError):
                await client.get(srv.url + "/health", 2.0, {"X-Evil": "a\r\nX-Injected: 1"})
            await client.close()

    run(main())


def test_connection_close_is_respected(run: Any) -> None:
    async def closing(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        await srv.wait_eof(reader)  # the server keeps its side open: the client must close

    async def main() -> None:
        async with Server(closing) as srv:
            client = await started()
            assert await post_all(client, srv.url) == b"{}"
            await until(lambda: len(srv.eofs) == 1)
            assert await post_all(client, srv.url) == b"{}"
            assert srv.connections == 2
            await client.close()

    run(main())


def test_chunked_response_streams_incrementally_then_the_connection_is_reused(run: Any) -> None:
    async def chunked(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while await srv.read_request(reader) is not None:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
                b"chunked\r\n\r\n"
                b"6\r\nfirst\n\r\n"
            )
            await srv.event.wait()
            srv.event.clear()
            writer.write(b"7\r\nsecond\n\r\n")
            await asyncio.sleep(0.05)
            writer.write(b"6\r\nthird\n\r\n0\r\n\r\n")

    async def main() -> None:
        async with Server(chunked) as srv:
            client = await started()
            for _ in range(2):
                async with client.post(srv.url, JSON, b"{}", 2.0) as resp:
                    assert resp.content_type == "text/event-stream"
                    assert await resp.read_chunk() == b"first\n"  # before "second" was even written
                    srv.event.set()
                    rest = b""
                    while chunk := await resp.read_chunk():
                        rest += chunk
                    assert rest == b"second\nthird\n"
                    assert await resp.read_chunk() == b""
            assert srv.connections == 1
            await client.close()

    run(main())


def test_complete_body_only_once_all_of_it_arrived_then_the_connection_is_reused(run: Any) -> None:
    async def split(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while await srv.read_request(reader) is not None:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nhello"
            )
            await writer.drain()
            await srv.event.wait()
            srv.event.clear()
            writer.write(b" you!")

    async def main() -> None:
        async with Server(split) as srv:
            client = await started()
            for _ in range(2):
                async with client.post(srv.url, JSON, b"{}", 2.0) as resp:
                    await until(lambda: resp._resp._conn is not None and bool(resp._resp._conn.buf))
                    assert resp.complete_body() is None  # half of it: nothing consumed
                    srv.event.set()
                    await until(lambda: resp._resp._conn is not None and resp._resp._conn.body_done)
                    assert resp.complete_body() == b"hello you!"
                    assert resp.complete_body() == b"" and await resp.read_chunk() == b""
            assert srv.connections == 1
            await client.close()

    run(main())


def test_unframed_response_is_read_until_eof(run: Any) -> None:
    async def unframed(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"part two")
        await writer.drain()
        writer.write_eof()

    async def main() -> None:
        async with Server(unframed) as srv:
            client = await started()
            assert await post_all(client, srv.url) == b"part one, part two"
            assert await post_all(client, srv.url) == b"part one, part two"
            assert srv.connections == 2
            await client.close()

    run(main())


def test_idle_connection_closed_by_the_peer_is_never_handed_out(run: Any) -> None:
    async def one_then_close(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(OK)  # keep-alive advertised, then closed anyway (like llama.cpp)
        await writer.drain()

    async def main() -> None:
        async with Server(one_then_close) as srv:
            client = await started()
            for _ in range(3):
                assert await post_all(client, srv.url) == b"{}"
                await asyncio.sleep(0.05)  # the FIN reaches the idle pooled connection
            assert srv.connections == 3
            await client.close()

    run(main())


def test_connect_refused_is_never_reached(run: Any) -> None:
    async def main() -> None:
        client = await started()
        url = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(UpstreamNeverReached) as info:
            await post_all(client, url)
        assert not isinstance(info.value, UpstreamStaleConnection)
        with pytest.raises(UpstreamNeverReached):
            await client.get(url + "/health", 1.0)
        with pytest.raises(UpstreamNeverReached):
            await post_all(client, "http://no-such-host.invalid:80")
        await client.close()

    run(main())


def test_reset_mid_body_raises_unavailable_from_read_chunk(run: Any) -> None:
    async def dies(srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
        await writer.drain()
        await asyncio.sleep(0.1)
        if srv.connections == 1:
            reset(writer)
        else:
            writer.write_eof()  # a plain FIN short of the Content-Length: truncated too

    async def main() -> None:
        async with Server(dies) as srv:
            client = await started()
            for _ in range(2):
                async with client.post(srv.url, JSON, b"{}", 2.0) as resp:
                    assert await resp.read_chunk() == b"0123456789"
                    with pytest.raises(UpstreamUnavailable) as info:
                        await resp.read_chunk()
                    assert not isinstance(info.value, UpstreamNeverReached)
            assert srv.connections == 2
            await client.close()

    run(main())


def test_leaving_the_context_early_closes_the_upstream_socket_at_once(run: Any) -> None:
    async def streams(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await srv.wait_eof(reader)

    async def main() -> None:
        async with Server(streams) as srv:
            client = await started()
            async with client.post(srv.url, JSON, b"{}", 2.0) as resp:
                assert await resp.read_chunk() == b"hello"
                left = time.monotonic()
            await until(lambda: len(srv.eofs) == 1, 2.0)
            assert srv.eofs[0] - left < 0.5
            await client.close()

    run(main())


def test_cancel_while_waiting_for_the_head_closes_and_frees_the_slot(run: Any) -> None:
    async def hangs_on_request(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while (body := await srv.read_request(reader)) is not None:
            if body == b"hang":
                await srv.wait_eof(reader)
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async def main() -> None:
        async with Server(hangs_on_request) as srv:
            client = await started(UpstreamConfig(max_connections=1))
            task = asyncio.create_task(post_all(client, srv.url, b"hang"))
            await until(lambda: len(srv.heads) == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: len(srv.eofs) == 1, 2.0)
            assert await post_all(client, srv.url, b"again", timeout=1.0) == b"again"
            # a caller's timeout around the head (the proxy's first-byte timeout),
            # on a reused connection
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await post_all(client, srv.url, b"hang")
            await until(lambda: len(srv.eofs) == 2, 2.0)
            assert await post_all(client, srv.url, b"once more", timeout=1.0) == b"once more"
            assert srv.connections == 3
            await client.close()

    run(main())


class Unaccepting:
    """A listener whose accept queue is full: further connects hang (SYN dropped)."""

    def __enter__(self) -> str:
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(0)
        addr = self.lsock.getsockname()
        self.fillers = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(addr)
            self.fillers.append(s)
        return f"http://127.0.0.1:{addr[1]}"

    def __exit__(self, *exc: object) -> None:
        for s in [*self.fillers, self.lsock]:
            s.close()


def test_connect_timeout_and_cancel_while_connecting_free_the_slot(run: Any) -> None:
    async def main() -> None:
        async with Server(keepalive) as srv:
            client = await started(UpstreamConfig(max_connections=1))
            with Unaccepting() as hanging:
                with pytest.raises(UpstreamNeverReached, match="timed out"):
                    await post_all(client, hanging, timeout=0.2)
                task = asyncio.create_task(post_all(client, hanging, timeout=10.0))
                await asyncio.sleep(0.1)
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert await post_all(client, srv.url, b"ok", timeout=1.0) == b"ok"
            await client.close()

    run(main())


def test_connection_limit_queues_fifo_then_times_out_naming_the_limit(run: Any) -> None:
    async def main() -> None:
        async with Server(keepalive) as srv:
            client = await started(UpstreamConfig(max_connections=1))
            async with client.post(srv.url, JSON, b"held", 2.0) as held:
                with pytest.raises(UpstreamNeverReached, match="max_connections=1"):
                    await post_all(client, srv.url, timeout=0.2)
                waiters = [
                    asyncio.create_task(post_all(client, srv.url, b"%d" % i)) for i in range(3)
                ]
                await asyncio.sleep(0.05)
                assert not any(w.done() for w in waiters)
                assert await held.read_all() == b"held"
            assert [await w for w in waiters] == [b"0", b"1", b"2"]
            assert srv.connections == 1
            await client.close()

            client = await started(
                UpstreamConfig(max_connections=10, max_connections_per_replica=1)
            )
            async with client.post(srv.url, JSON, b"held", 2.0):
                with pytest.raises(UpstreamNeverReached, match="max_connections_per_replica=1"):
                    await post_all(client, srv.url, timeout=0.2)
            await client.close()

    run(main())


def test_read_all_limit(run: Any) -> None:
    async def main() -> None:
        async with Server(keepalive) as srv:
            client = await started()
            async with client.post(srv.url, JSON, b"x" * 2000, 2.0) as resp:
                with pytest.raises(UpstreamUnavailable, match="larger than 1000"):
                    await resp.read_all(1000)
            async with client.post(srv.url, JSON, b"x" * 2000, 2.0) as resp:
                assert len(await resp.read_all(2000)) == 2000
            await client.close()

    run(main())


def test_keepalive_expiry_closes_idle_connections(run: Any) -> None:
    async def main() -> None:
        async with Server(keepalive) as srv:
            client = await started(UpstreamConfig(keepalive_timeout_s=0.2))
            assert await post_all(client, srv.url) == b"{}"
            start = time.monotonic()
            await until(lambda: len(srv.eofs) == 1, 2.0)
            assert 0.15 < srv.eofs[0] - start < 1.0
            assert await post_all(client, srv.url) == b"{}"
            assert srv.connections == 2
            await client.close()

    run(main())


def test_backpressure_keeps_the_client_buffer_bounded(run: Any) -> None:
    total = 64 * 1024 * 1024  # more than the kernel's socket buffers hold
    block = b"z" * 65536

    async def firehose(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()
        srv.event.set()

    async def main() -> None:
        async with Server(firehose) as srv:
            client = await started()
            async with client.post(srv.url, JSON, b"{}", 2.0) as resp:
                await asyncio.sleep(0.2)  # the server fills every buffer it can
                assert not srv.event.is_set()  # ... and is held back
                (conn,) = client.pool._all
                assert conn.paused and HIGH_WATER < conn.buffered <= HIGH_WATER + 512 * 1024
                got, biggest = 0, 0
                while chunk := await resp.read_chunk():
                    got += len(chunk)
                    biggest = max(biggest, len(chunk))
                    await asyncio.sleep(0.002)
            assert got == total
            assert biggest <= HIGH_WATER + 512 * 1024
            await client.close()

    run(main())


def test_reused_connection_reset_before_the_request_was_written_is_stale(run: Any) -> None:
    big = b"x" * (64 * 1024 * 1024)  # more than the loopback socket buffers hold

    async def second_unread(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(OK)
        await reader.readuntil(b"\r\n\r\n")  # the second request's head, its body left unread
        await asyncio.sleep(0.2)
        reset(writer)

    async def main() -> None:
        async with Server(second_unread) as srv:
            client = await started()
            assert await post_all(client, srv.url) == b"{}"
            with pytest.raises(UpstreamStaleConnection):
                await post_all(client, srv.url, big)
            await client.close()

    run(main())


@pytest.mark.parametrize("size", [10, 16 * 1024 * 1024])
def test_reused_connection_reset_after_the_whole_request_was_written_is_unavailable(
    run: Any, size: int
) -> None:
    async def third_read_then_reset(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for _ in range(2):
            await srv.read_request(reader)
            writer.write(OK)
        await srv.read_request(reader)  # read in full: the engine may have started
        await asyncio.sleep(0.05)
        reset(writer)

    async def main() -> None:
        async with Server(third_read_then_reset) as srv:
            client = await started()
            body = b"y" * size  # a large one drains asynchronously (resume_writing)
            assert await post_all(client, srv.url, body) == b"{}"
            assert await post_all(client, srv.url, body) == b"{}"
            assert srv.connections == 1
            with pytest.raises(UpstreamUnavailable) as info:
                await post_all(client, srv.url, body)
            assert not isinstance(info.value, UpstreamNeverReached)
            await client.close()

    run(main())


def test_https_goes_through_tls(run: Any) -> None:
    async def records(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        srv.heads.append(await reader.read(5))

    async def main() -> None:
        async with Server(records) as srv:
            client = await started()
            with pytest.raises(UpstreamNeverReached):
                await post_all(client, srv.url.replace("http://", "https://"))
            assert srv.heads[0][:2] == b"\x16\x03"  # a TLS handshake record, not "POST "
            await client.close()

    run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_https_round_trip_with_a_trusted_certificate(run: Any, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def main() -> None:
        async with Server(keepalive, tls=server_ctx) as srv:
            client = await started()
            with pytest.raises(UpstreamNeverReached, match="CERTIFICATE_VERIFY_FAILED"):
                await post_all(client, srv.url)  # the default context does not trust it
            client.pool._ssl = ssl.create_default_context(cafile=str(cert))
            assert await post_all(client, srv.url, b"secret") == b"secret"
            assert await post_all(client, srv.url, b"again") == b"again"
            assert (
                srv.connections == 1
            )  # one kept-alive connection (the refused handshake never got here)
            await client.close()

    run(main())


def test_close_fails_later_requests_and_breaks_live_ones(run: Any) -> None:
    async def streams(
        srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await srv.wait_eof(reader)

    async def main() -> None:
        async with Server(streams) as srv:
            client = await started()
            async with client.post(srv.url, JSON, b"{}", 2.0) as resp:
                assert await resp.read_chunk() == b"hello"
                await client.close()
                with pytest.raises(UpstreamUnavailable):
                    await resp.read_chunk()
            await until(lambda: len(srv.eofs) == 1, 2.0)
            with pytest.raises(RuntimeError):
                await post_all(client, srv.url)

    run(main())
