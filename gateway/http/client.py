"""A lean HTTP/1.1 client: asyncio Protocols + httptools, one keep-alive pool.

Only what the gateway needs to talk to engines: GET/POST with the whole
request in one `transport.write`, responses framed by Content-Length,
chunked or EOF, streamed as they arrive with bounded buffering
(`pause_reading` above `HIGH_WATER`). No compression, no redirects, no
cookies. Timeouts other than connecting are the caller's (cancel the task).

Errors (`gateway.forward.upstream` maps them onto the gateway's tree):
  ConnectFailed     the request provably never reached the server: connect
                    refused / timed out / DNS, no free pool slot in time, or a
                    fresh connection lost before the request was fully written;
  StaleConnection   the same on a reused keep-alive connection (the peer had
                    closed it): worth one retry on a fresh connection;
  ConnectionBroken  anything after the request may have reached the server.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Mapping
from typing import Final, cast

from gateway.http.client_conn import (
    Conn,
    ConnectFailed,
    ConnectionBroken,
    HTTPClientError,
    Key,
    StaleConnection,
)
from gateway.http.client_response import Response
from gateway.http.target import Target, encode_request

__all__ = [
    "Conn",
    "ConnectFailed",
    "ConnectionBroken",
    "HTTPClientError",
    "Pool",
    "Response",
    "StaleConnection",
    "Target",
    "encode_request",
]

DNS_TTL_S: Final = 10.0
_MAX_TARGETS: Final = 1024
_EXPIRED: Final = object()
_CLOSED: Final = object()


def _expire(fut: asyncio.Future[object]) -> None:
    if not fut.done():
        fut.set_result(_EXPIRED)


class Pool:
    """Keep-alive connections keyed by (scheme, host, port). A slot is an open
    (or opening) connection, busy or idle; at the limit a request takes an
    idle connection of its key, evicts an idle one of another key, or waits
    FIFO for one, bounded by its connect timeout."""

    def __init__(
        self, max_connections: int, max_per_key: int = 0, keepalive_s: float = 4.0
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._max = max_connections
        self._max_per_key = max_per_key
        self._keepalive = keepalive_s
        self._sweep_every = min(1.0, max(0.05, keepalive_s / 2))
        self._idle: dict[Key, dict[Conn, None]] = {}  # oldest first
        self._per_key: dict[Key, int] = {}
        self._total = 0
        self._all: set[Conn] = set()
        self._waiters: list[tuple[Key, asyncio.Future[object]]] = []
        self._waking = False
        self._sweeper: asyncio.TimerHandle | None = None
        self._targets: dict[str, Target] = {}
        self._dns: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._ssl: ssl.SSLContext | None = None
        self.closed = False

    # -- the request path ---------------------------------------------------

    def target(self, url: str) -> Target:
        t = self._targets.get(url)
        if t is None:
            if len(self._targets) >= _MAX_TARGETS:
                self._targets.clear()
            t = self._targets[url] = Target(url)
        return t

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        connect_timeout: float,
    ) -> Response:
        """Send and wait for the response head (the caller bounds that wait)."""
        target = self.target(url)
        data = encode_request(method, target, headers, body)
        conn = await self.acquire(target, connect_timeout)
        return await self.send(conn, data)

    async def send(self, conn: Conn, data: bytes) -> Response:
        try:
            await conn.exchange(data)
        except BaseException:
            self.release(conn, False)
            raise
        return Response(conn)

    async def acquire(self, target: Target, timeout: float) -> Conn:
        if self.closed:
            raise RuntimeError("the HTTP client is closed")
        key = target.key
        conn = self._take_idle(key)
        if conn is not None:
            return conn
        deadline = self._loop.time() + timeout
        if not self._reserve(key):
            got = await self._wait(key, deadline, timeout)
            if got is not None:
                return got
        try:
            return await self._open(target, deadline, timeout)
        except BaseException:
            self._free(key)
            raise

    def release(self, conn: Conn, reuse: bool) -> None:
        conn.active = False
        if reuse and conn.reusable() and not self.closed and self._keepalive > 0:
            conn.reset()
            self._to_idle(conn)
        else:
            conn.abort()
            self.drop(conn)

    # -- slots ------------------------------------------------------------------

    def _take_idle(self, key: Key) -> Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        cutoff = self._loop.time() - self._keepalive
        while idle:
            conn = idle.popitem()[0]  # the most recently used
            if conn.dead or conn.idle_since <= cutoff or conn.closing():
                conn.abort()
                self.drop(conn, wake=False)
                continue
            conn.active = True
            return conn
        return None

    def _to_idle(self, conn: Conn) -> None:
        conn.idle_since = self._loop.time()
        self._idle.setdefault(conn.key, {})[conn] = None
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self._sweep_every, self._sweep)
        if self._waiters:
            self._wake()

    def _reserve(self, key: Key) -> bool:
        per = self._per_key.get(key, 0)
        if self._max_per_key and per >= self._max_per_key:
            return False
        if self._total >= self._max:
            victim = next((c for idle in self._idle.values() for c in idle), None)
            if victim is None:
                return False
            victim.abort()
            self.drop(victim, wake=False)
        self._total += 1
        self._per_key[key] = per + 1
        return True

    def _free(self, key: Key, wake: bool = True) -> None:
        self._total -= 1
        left = self._per_key[key] - 1
        if left:
            self._per_key[key] = left
        else:
            del self._per_key[key]
        if wake and self._waiters:
            self._wake()

    def drop(self, conn: Conn, wake: bool = True) -> None:
        """Give up `conn`'s slot (idempotent); the caller closed it."""
        if not conn.slot:
            return
        conn.slot = False
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle:
            idle.pop(conn, None)
        self._free(conn.key, wake)

    async def _wait(self, key: Key, deadline: float, timeout: float) -> Conn | None:
        fut: asyncio.Future[object] = self._loop.create_future()
        entry = (key, fut)
        self._waiters.append(entry)
        timer = self._loop.call_at(deadline, _expire, fut)
        try:
            got = await fut
        except BaseException:
            if fut.done() and not fut.cancelled():  # granted, then cancelled
                self._give_back(key, fut.result())
            raise
        finally:
            timer.cancel()
            if entry in self._waiters:
                self._waiters.remove(entry)
        if got is _EXPIRED:
            per = self._per_key.get(key, 0)
            if self._max_per_key and per >= self._max_per_key:
                which = f"max_connections_per_replica={self._max_per_key}"
            else:
                which = f"max_connections={self._max}"
            raise ConnectFailed(
                f"no free upstream connection within {timeout:g} s ({which} reached)"
            )
        if got is _CLOSED:
            raise RuntimeError("the HTTP client is closed")
        return cast(Conn | None, got)

    def _give_back(self, key: Key, got: object) -> None:
        if isinstance(got, Conn):
            got.abort()
            self.drop(got)
        elif got is None:
            self._free(key)

    def _wake(self) -> None:
        if self._waking:
            return
        self._waking = True
        try:
            waiting = []
            for key, fut in self._waiters:
                if fut.done():
                    continue
                conn = self._take_idle(key)
                if conn is not None:
                    fut.set_result(conn)
                elif self._reserve(key):
                    fut.set_result(None)
                else:
                    waiting.append((key, fut))
            self._waiters = waiting
        finally:
            self._waking = False

    def _sweep(self) -> None:
        self._sweeper = None
        cutoff = self._loop.time() - self._keepalive
        left = False
        for idle in list(self._idle.values()):
            expired = []
            for conn in idle:
                if conn.idle_since > cutoff:
                    break
                expired.append(conn)
            for conn in expired:
                conn.abort()
                self.drop(conn, wake=False)
            left = left or bool(idle)
        if self._waiters:
            self._wake()
        if left:
            self._sweeper = self._loop.call_later(self._sweep_every, self._sweep)

    # -- connecting -------------------------------------------------------------

    async def _open(self, target: Target, deadline: float, timeout: float) -> Conn:
        loop, key = self._loop, target.key
        tls = self._ssl_context() if target.tls else None
        try:
            async with asyncio.timeout_at(deadline):
                if target.literal:
                    hosts = [target.host]
                else:
                    hosts = await self._resolve(target.host, target.port)
                error: OSError | None = None
                for host in hosts:
                    try:
                        _, conn = await loop.create_connection(
                            lambda: Conn(self, key),
                            host,
                            target.port,
                            ssl=tls,
                            server_hostname=target.host if tls else None,
                        )
                        break
                    except OSError as exc:
                        error = exc
                else:
                    raise error or OSError(0, "no address for the host")
        except TimeoutError as exc:
            raise ConnectFailed(f"connect timed out after {timeout:g} s") from exc
        except OSError as exc:  # (the address stays in the chained cause, for the log)
            raise ConnectFailed(f"cannot connect: {_os_reason(exc)}") from exc
        if self.closed:
            conn.abort()
            raise RuntimeError("the HTTP client is closed")
        self._all.add(conn)
        conn.active = True
        return conn

    async def _resolve(self, host: str, port: int) -> list[str]:
        now = self._loop.time()
        hit = self._dns.get((host, port))
        if hit is not None and hit[0] > now:
            return hit[1]
        infos = await self._loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addrs = list(dict.fromkeys(str(info[4][0]) for info in infos))
        self._dns[(host, port)] = (now + DNS_TTL_S, addrs)
        return addrs

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def close(self) -> None:
        """Close every connection; later requests raise RuntimeError."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_result(_CLOSED)
        for conn in list(self._all):
            conn.abort()
            self.drop(conn, wake=False)
        await asyncio.sleep(0)  # let the transports report connection_lost


def _os_reason(exc: OSError) -> str:
    """What failed, without the address (asyncio puts it in the message)."""
    if isinstance(exc, ssl.SSLError):  # (names the certificate problem, not the address)
        return str(exc)
    if exc.errno:
        return os.strerror(exc.errno)
    return exc.strerror or type(exc).__name__
