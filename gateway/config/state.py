"""The `state` section: where shared state lives (in-process, or Redis for
several gateway instances). Validated here; the stores are in `gateway.state`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, parse_qs, urlsplit, urlunsplit

from gateway.config.ranges import check_ranges, ranged

_REDIS_SCHEMES = ("redis", "rediss", "unix")


def _redis_db(parts: SplitResult) -> int:
    """The database number a Redis URL names (`/<db>`, or `?db=` for unix://)."""
    query = parse_qs(parts.query, keep_blank_values=True)
    if parts.scheme == "unix":
        if set(query) - {"db"}:
            raise ValueError("url unix:// takes no query parameter but db")
        raw = query.get("db", ["0"])[-1]
    else:
        if query:
            raise ValueError(
                "url must not have query parameters (pool size and timeouts are keys of "
                "state.redis)"
            )
        raw = parts.path.strip("/") or "0"
    if not raw.isdigit():
        raise ValueError(f"url names database {raw!r}, expected a number >= 0")
    return int(raw)


def _check_redis_url(url: str, *, sentinel: bool, cluster: bool) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"url {mask_url_password(url)!r} cannot be parsed: {exc}") from None
    if parts.scheme not in _REDIS_SCHEMES:
        raise ValueError(
            f"url must be redis://, rediss:// or unix://, got {mask_url_password(url)!r}"
        )
    db = _redis_db(parts)
    if parts.scheme == "unix":
        if not parts.path or parts.path == "/":
            raise ValueError("url unix:// needs the socket path, e.g. unix:///run/redis.sock")
        if sentinel or cluster:
            raise ValueError("url unix:// cannot be used with sentinel or cluster")
    elif not sentinel and not parts.hostname:
        raise ValueError(f"url needs a host (redis://host:6379/0), got {mask_url_password(url)!r}")
    elif sentinel and (parts.hostname or port):
        raise ValueError("url must not name a host with sentinel (the sentinels find the master)")
    if cluster and db != 0:
        raise ValueError(f"url names database {db}, but Redis Cluster has only database 0")


def _check_host_port(node: str) -> None:
    host, sep, port = node.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"nodes must be host:port, got {node!r}")


@dataclass(frozen=True, slots=True)
class SentinelConfig:
    """Redis Sentinel: the master's name and the sentinels to ask for it."""

    master: str
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.master:
            raise ValueError("master must not be empty")
        if not self.nodes:
            raise ValueError("nodes: give at least one sentinel (host:port)")
        for node in self.nodes:
            _check_host_port(node)

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """`nodes` as (host, port) pairs."""
        pairs = (n.rpartition(":") for n in self.nodes)
        return tuple((host.strip("[]"), int(port)) for host, _, port in pairs)


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """The Redis (or Valkey) server, cluster or sentinel set shared by the gateways."""

    url: str = ""
    sentinel: SentinelConfig | None = None
    cluster: bool = False
    pool_size: int = ranged(32, ge=1)
    connect_timeout_s: float = ranged(0.5, gt=0)
    command_timeout_s: float = ranged(0.25, gt=0)
    lease_ttl_s: float = ranged(10.0, gt=0)
    on_failure: Literal["open", "closed"] = "open"
    probe_interval_s: float = ranged(1.0, gt=0)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.cluster and self.sentinel is not None:
            raise ValueError("cluster and sentinel exclude each other: give one")
        if not self.url and self.sentinel is None:
            raise ValueError("url is required (redis://, rediss:// or unix://), or sentinel")
        if self.url:
            _check_redis_url(self.url, sentinel=self.sentinel is not None, cluster=self.cluster)
        if self.lease_ttl_s <= self.command_timeout_s:
            raise ValueError(
                f"lease_ttl_s must be > command_timeout_s ({self.command_timeout_s}), got "
                f"{self.lease_ttl_s} (else leases expire before they can be renewed)"
            )


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Where shared state lives: in-process (`memory`) or `redis` (see config/README.md)."""

    backend: Literal["memory", "redis"] = "memory"
    key_prefix: str = "gw:"
    redis: RedisConfig | None = None

    def __post_init__(self) -> None:
        if "{" in self.key_prefix or "}" in self.key_prefix:
            raise ValueError(
                f"key_prefix must not contain {{ or }} (Redis Cluster hash tags), "
                f"got {self.key_prefix!r}"
            )
        if self.backend == "redis" and self.redis is None:
            raise ValueError("backend redis needs redis.url (or redis.sentinel)")
        if self.backend == "memory" and self.redis is not None:
            raise ValueError("redis is set but backend is memory: set backend: redis or remove it")


def mask_url_password(url: str) -> str:
    """`url` with the password of its userinfo (if any) replaced by `***`."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
