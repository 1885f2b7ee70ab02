"""The redis-py client of `RedisStateStore`: a plain server (`redis://`,
`rediss://`, `unix://`), a Sentinel-managed master, or a Cluster."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

Client = Redis | RedisCluster


def connect(
    url: str,
    *,
    sentinel_master: str | None,
    sentinel_nodes: Sequence[tuple[str, int] | str] | None,
    cluster: bool,
    pool_size: int,
    connect_timeout_s: float,
    command_timeout_s: float,
    password: str | None,
) -> tuple[Client, list[Redis]]:
    # One quick retry (a pooled connection may be stale after a Redis restart),
    # no backoff: an outage must surface within the command timeout.
    common: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": command_timeout_s,
        "retry": Retry(NoBackoff(), 1),
        "decode_responses": False,
    }
    if password is not None:
        common["password"] = password
    if sentinel_master is not None:
        if not sentinel_nodes:
            raise ValueError("sentinel_master needs sentinel_nodes")
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            [_node(n) for n in sentinel_nodes],
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=command_timeout_s,
        )
        # The URL carries no host with Sentinel, only what the master needs.
        parts = urlsplit(url)
        if parts.password is not None and password is None:
            common["password"] = unquote(parts.password)
        if parts.path.strip("/").isdigit():
            common["db"] = int(parts.path.strip("/"))
        common["ssl"] = parts.scheme == "rediss"
        master: Redis = sentinel.master_for(sentinel_master, max_connections=pool_size, **common)
        return master, list(sentinel.sentinels)
    if cluster:
        return RedisCluster.from_url(url, max_connections=pool_size, **common), []
    # A blocking pool: a burst waits for a connection instead of failing as if
    # Redis were down (the store's slots keep the wait outside any timeout).
    pool = BlockingConnectionPool.from_url(url, max_connections=pool_size, timeout=None, **common)
    return Redis.from_pool(pool), []  # the client owns (and closes) the pool


def _node(node: tuple[str, int] | str) -> tuple[str, int]:
    """A sentinel's address: `(host, port)` or `"host:port"` (`"[::1]:26379"`)."""
    if isinstance(node, tuple):
        return node
    host, _, port = node.rpartition(":")
    return host.strip("[]"), int(port)
