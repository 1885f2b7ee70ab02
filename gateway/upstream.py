"""The one shared upstream HTTP client (aiohttp, chosen by measurement).

aiohttp's C parser costs ~8x less CPU per proxied request and ~5x less per
SSE chunk than httpx here (see bench/overhead.py), so it carries all engine
traffic. This module is the only place that knows it: swap it here.

Failures are translated into the gateway's error tree at this boundary:
connection refused / connect timeout → `UpstreamNeverReached` (the request
provably never reached an engine, safe to retry elsewhere); anything after
the request was written → `UpstreamUnavailable` (never retried).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamNeverReached, UpstreamStaleConnection, UpstreamUnavailable

_MAX_SMALL_BODY = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SmallResponse:
    status: int
    body: bytes
    content_type: str


def _body_not_written(exc: aiohttp.ClientOSError) -> bool:
    # aiohttp's only signal that the request body never left: this message
    # (client_reqrep.write_bytes). An engine cannot act on a request whose
    # JSON body it never received in full.
    return "Can not write request body" in str(exc)


class UpstreamResponse:
    """A live upstream response; read with `read_chunk` / `read_all`."""

    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def content_type(self) -> str:
        return self._resp.headers.get("Content-Type", "application/json")

    async def read_chunk(self) -> bytes:
        """The next bytes as they arrive; b"" at end of body."""
        try:
            return await self._resp.content.readany()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamUnavailable(f"upstream connection broke mid-response: {exc!r}") from exc

    async def read_all(self, limit: int = _MAX_SMALL_BODY) -> bytes:
        parts: list[bytes] = []
        size = 0
        while chunk := await self.read_chunk():
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UpstreamUnavailable(f"upstream response larger than {limit} bytes")
        return b"".join(parts)


class UpstreamClient:
    def __init__(self, cfg: UpstreamConfig) -> None:
        self._cfg = cfg
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._cfg.max_connections,
            limit_per_host=self._cfg.max_connections_per_replica,
            keepalive_timeout=self._cfg.keepalive_timeout_s,
            ttl_dns_cache=10,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._session

    @asynccontextmanager
    async def post(
        self, url: str, headers: Mapping[str, str], data: bytes, connect_timeout: float,
        reuse: bool = True,
    ) -> AsyncIterator[UpstreamResponse]:
        """POST and yield the response once headers arrive; closes the connection
        (the abort primitive for both engines) unless the body was fully read.
        `reuse=False` never returns the connection to the pool (llama.cpp closes
        its side after every streamed response while still advertising keep-alive)."""
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout)
        try:
            resp = await self.session.post(url, data=data, headers=dict(headers), timeout=timeout)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamNeverReached(f"cannot connect to upstream {url}: {exc}") from exc
        except aiohttp.ClientOSError as exc:
            if _body_not_written(exc):
                raise UpstreamStaleConnection(f"upstream {url} closed the connection: {exc}") from exc
            raise UpstreamUnavailable(f"upstream {url} failed before answering: {exc!r}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamUnavailable(f"upstream {url} failed before answering: {exc!r}") from exc
        try:
            yield UpstreamResponse(resp)
        finally:
            if resp.content.at_eof() and reuse:
                resp.release()
            else:
                resp.close()

    async def get(self, url: str, timeout: float, headers: Mapping[str, str] | None = None) -> SmallResponse:
        """A small bounded GET for health checks and metrics polls."""
        return await self._small("GET", url, None, timeout, dict(headers or {}))

    async def post_json_small(self, url: str, data: bytes, timeout: float,
                              headers: Mapping[str, str] | None = None) -> SmallResponse:
        """A small bounded POST (e.g. an engine's /tokenize)."""
        return await self._small("POST", url, data, timeout, {"Content-Type": "application/json", **(headers or {})})

    async def _small(self, method: str, url: str, data: bytes | None, timeout: float,
                     headers: dict[str, str]) -> SmallResponse:
        t = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self.session.request(method, url, data=data, timeout=t, headers=headers) as resp:
                body = await resp.content.read(_MAX_SMALL_BODY)
                return SmallResponse(resp.status, body, resp.headers.get("Content-Type", ""))
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamNeverReached(f"cannot connect to {url}: {exc}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamUnavailable(f"{method} {url} failed: {exc!r}") from exc
