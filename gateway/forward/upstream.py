"""The one shared upstream HTTP client (`gateway.http.client`, chosen by measurement).

A keep-alive HTTP/1.1 pool on asyncio Protocols + httptools: a proxied small
request costs well under half the CPU of aiohttp's ClientSession here, and
an SSE chunk reaches the caller without any task or timer of its own. This
module is the only place the rest of the gateway touches it: swap it here.

Failures are translated into the gateway's error tree at this boundary:
connection refused / connect timeout / DNS failure / no free pool slot in
time → `UpstreamNeverReached` (the request provably never reached an engine,
safe to retry elsewhere); a reused keep-alive connection the engine had
already closed, lost before the request was fully written and before any
response byte → `UpstreamStaleConnection` (retry on a fresh connection);
anything once the request may have been read → `UpstreamUnavailable`
(never retried).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

from gateway.config.schema import UpstreamConfig
from gateway.errors import UpstreamNeverReached, UpstreamStaleConnection, UpstreamUnavailable
from gateway.http.client import (
    Conn,
    ConnectFailed,
    HTTPClientError,
    Pool,
    Response,
    StaleConnection,
    encode_request,
)

log = logging.getLogger(__name__)

_MAX_SMALL_BODY = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SmallResponse:
    status: int
    body: bytes
    content_type: str


class UpstreamResponse:
    """A live upstream response; read with `read_chunk` / `read_all`."""

    __slots__ = ("_name", "_resp")

    def __init__(self, resp: Response, name: str = "") -> None:
        self._resp, self._name = resp, name

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def content_type(self) -> str:
        return self._resp.header(b"content-type") or "application/json"

    async def read_chunk(self) -> bytes:
        """The next bytes as they arrive; b"" at end of body."""
        try:
            return await self._resp.read_chunk()
        except HTTPClientError as exc:
            log.warning("replica %s: upstream connection broke mid-response: %s", self._name, exc)
            raise UpstreamUnavailable(
                f"replica {self._name} broke the connection mid-response"
            ) from exc

    def complete_body(self) -> bytes | None:
        """The whole body when it has already arrived (nothing to wait for), else None."""
        return self._resp.complete_body()

    async def read_all(self, limit: int = _MAX_SMALL_BODY) -> bytes:
        parts: list[bytes] = []
        size = 0
        while chunk := await self.read_chunk():
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UpstreamUnavailable(f"upstream response larger than {limit} bytes")
        return b"".join(parts)


def _translate(replica: str, exc: HTTPClientError) -> UpstreamUnavailable:
    """The client-facing error names the replica, never its address (the
    client's errors carry none; the cause, with it, stays chained and is
    logged by the caller)."""
    if isinstance(exc, StaleConnection):
        return UpstreamStaleConnection(f"replica {replica} closed the connection: {exc}")
    if isinstance(exc, ConnectFailed):
        return UpstreamNeverReached(f"cannot connect to replica {replica}: {exc}")
    return UpstreamUnavailable(f"replica {replica} failed before answering: {exc}")


def _netloc(url: str) -> str:
    return urlsplit(url).netloc


class _Post(AbstractAsyncContextManager[UpstreamResponse]):
    __slots__ = ("_data", "_headers", "_name", "_pool", "_resp", "_reuse", "_timeout", "_url")

    def __init__(
        self,
        pool: Pool,
        url: str,
        headers: Mapping[str, str],
        data: bytes,
        timeout: float,
        reuse: bool,
        name: str,
    ) -> None:
        self._pool, self._url, self._headers, self._data = pool, url, headers, data
        self._timeout, self._reuse, self._name = timeout, reuse, name
        self._resp: Response | None = None

    async def __aenter__(self) -> UpstreamResponse:
        try:
            resp = await self._pool.request(
                "POST", self._url, self._headers, self._data, self._timeout
            )
        except HTTPClientError as exc:
            level = logging.DEBUG if isinstance(exc, StaleConnection) else logging.WARNING
            log.log(level, "replica %s: upstream exchange failed: %s", self._name, exc)
            raise _translate(self._name, exc) from exc
        self._resp = resp
        return UpstreamResponse(resp, self._name)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._resp is not None:
            self._resp.release(self._reuse)
            self._resp = None


class UpstreamClient:
    def __init__(self, cfg: UpstreamConfig) -> None:
        self._cfg = cfg
        self._pool: Pool | None = None

    async def start(self) -> None:
        cfg = self._cfg
        self._pool = Pool(
            cfg.max_connections, cfg.max_connections_per_replica, cfg.keepalive_timeout_s
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._pool

    def post(
        self,
        url: str,
        headers: Mapping[str, str],
        data: bytes,
        connect_timeout: float,
        reuse: bool = True,
        name: str = "",
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        """POST and yield the response once headers arrive; closes the connection
        (the abort primitive for both engines) unless the body was fully read.
        `reuse=False` never returns the connection to the pool (llama.cpp closes
        its side after every streamed response while still advertising keep-alive).
        Errors name the replica `name` (default: the URL's host:port)."""
        return _Post(self.pool, url, headers, data, connect_timeout, reuse, name or _netloc(url))

    async def get(
        self, url: str, timeout: float, headers: Mapping[str, str] | None = None
    ) -> SmallResponse:
        """A small bounded GET for health checks and metrics polls."""
        return await self._small("GET", url, None, timeout, dict(headers or {}))

    async def post_json_small(
        self, url: str, data: bytes, timeout: float, headers: Mapping[str, str] | None = None
    ) -> SmallResponse:
        """A small bounded POST (e.g. an engine's /tokenize)."""
        return await self._small(
            "POST", url, data, timeout, {"Content-Type": "application/json", **(headers or {})}
        )

    async def _small(
        self, method: str, url: str, data: bytes | None, timeout: float, headers: dict[str, str]
    ) -> SmallResponse:
        """Connect within `timeout` (→ UpstreamNeverReached), and have the whole
        exchange done within it (→ UpstreamUnavailable; so is a body over
        8 MiB). A stale pooled connection is retried once, on the next idle or
        a new connection: the request provably never got there."""
        pool = self.pool
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for attempt in range(2):
            try:
                target = pool.target(url)
                payload = encode_request(method, target, headers, data)
                conn = await pool.acquire(target, max(0.0, deadline - loop.time()))
            except HTTPClientError as exc:
                raise UpstreamNeverReached(f"cannot connect to {url}: {exc}") from exc
            try:
                async with asyncio.timeout_at(deadline):
                    return await _exchange(pool, conn, payload, _netloc(url))
            except StaleConnection as exc:
                if attempt:
                    raise _translate(_netloc(url), exc) from exc
            except HTTPClientError as exc:
                raise _translate(_netloc(url), exc) from exc
            except TimeoutError as exc:
                raise UpstreamUnavailable(
                    f"{method} {url} failed: no answer within {timeout:g} s"
                ) from exc
        raise AssertionError("unreachable")


async def _exchange(pool: Pool, conn: Conn, payload: bytes, name: str) -> SmallResponse:
    resp = await pool.send(conn, payload)
    try:
        body = await UpstreamResponse(resp, name).read_all(_MAX_SMALL_BODY)
        return SmallResponse(resp.status, body, resp.header(b"content-type") or "")
    finally:
        resp.release(True)
