"""`StateStore` in Redis: several gateway instances share one set of counters.

Every operation that reads and writes is one Lua script (`lua/*.lua`, run by
EVALSHA, reloaded on NOSCRIPT), timed by the server's clock so instances
agree. A reservation's entries expire in Redis after at most `lease_ttl_s`;
one background task renews this instance's live reservations in batches, so
a killed gateway's reservations give their capacity back within
`lease_ttl_s`. Key layout and consistency: README.md.

Connectivity errors of any kind surface as `StoreUnavailable`, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, ClassVar

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from gateway.state.base import (
    Claim,
    Reservation,
    ReserveResult,
    Stamp,
    StoreUnavailable,
    TextRead,
    TextWrite,
)
from gateway.state.redis_client import Client, connect
from gateway.supervise import Supervisor

log = logging.getLogger(__name__)


_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,  # also BusyLoading, MaxConnections, Sentinel's MasterNotFound
    rexc.TimeoutError,
    rexc.ClusterDownError,  # also MasterDown
    rexc.TryAgainError,
    rexc.ReadOnlyError,  # a failover demoted the node we still talk to
    rexc.SlotNotCoveredError,
    OSError,  # includes TimeoutError
)
# Reservations renewed by one script call (bounds the script's run time).
_RENEW_BATCH = 256
_ENTRIES = ":e"


class CrossSlotKeys(ValueError):
    """A call's keys hash to several Redis Cluster slots: give them one hash tag."""


def _script(name: str) -> str:
    lua = resources.files("gateway.state") / "lua"
    return (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


def _ms(seconds: float | None) -> int:
    return -1 if seconds is None else max(0, round(seconds * 1000))


def _text(raw: object) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc


class RedisStateStore:
    shared: ClassVar[bool] = True

    def release_now(self, reservation: Reservation) -> bool:
        return False  # the shared store must be asked (`release`)

    def __init__(
        self,
        client: Client,
        *,
        key_prefix: str = "",
        lease_ttl_s: float = 10.0,
        max_in_flight: int | None = None,
        also_close: Sequence[Redis] = (),
    ) -> None:
        """`max_in_flight`: calls that may wait on Redis at once (the pool size);
        more queue here, and a queue is load, not an outage. `also_close`:
        clients closed with this store (a Sentinel's connections)."""
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError(f"key_prefix {key_prefix!r}: no braces (callers choose hash tags)")
        if lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, not {lease_ttl_s}")
        self._client = client
        self._also_close = list(also_close)
        self._cluster = isinstance(client, RedisCluster)
        self._prefix = key_prefix
        self._lease_ttl_s = lease_ttl_s
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(_script(name))
            for name in ("reserve", "settle", "renew", "get")
        }
        # Unique across instances: a random per-store prefix and a counter.
        self._id_prefix = secrets.token_hex(6)
        self._ids = itertools.count(1)
        # Reservations this instance renews: id -> (reservation, local deadline).
        self._live: dict[str, tuple[Reservation, float]] = {}
        self._tasks = Supervisor("redis-state")
        self._renewer: asyncio.Task[None] | None = None
        self._closed = False
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        # Set by a call that found Redis unreachable, cleared by one that got an
        # answer: calls queued meanwhile fail at once instead of each waiting
        # out its own timeout on a dead server (the probe's ping always tries).
        self._broken = False

    @classmethod
    def from_settings(
        cls,
        url: str,
        *,
        key_prefix: str = "",
        lease_ttl_s: float = 10.0,
        sentinel_master: str | None = None,
        sentinel_nodes: Sequence[tuple[str, int] | str] | None = None,
        cluster: bool = False,
        pool_size: int = 32,
        connect_timeout_s: float = 1.0,
        command_timeout_s: float = 1.0,
        password: str | None = None,
    ) -> RedisStateStore:
        """Build the client: a plain server (`redis://`, `rediss://`, `unix://`),
        a Sentinel-managed master, or a Cluster."""
        client, also_close = connect(
            url,
            sentinel_master=sentinel_master,
            sentinel_nodes=sentinel_nodes,
            cluster=cluster,
            pool_size=pool_size,
            connect_timeout_s=connect_timeout_s,
            command_timeout_s=command_timeout_s,
            password=password,
        )
        return cls(
            client,
            key_prefix=key_prefix,
            lease_ttl_s=lease_ttl_s,
            max_in_flight=pool_size,
            also_close=also_close,
        )

    @property
    def live_reservations(self) -> int:
        """Reservations this instance is renewing."""
        return len(self._live)

    async def reserve(
        self,
        claims: Sequence[Claim],
        ttl_s: float,
        stamps: Sequence[Stamp] = (),
        reads: Sequence[TextRead] = (),
    ) -> ReserveResult:
        if reads and self._cluster:  # the text keys live in other slots
            result, found = await asyncio.gather(
                self.reserve(claims, ttl_s, stamps),
                asyncio.gather(*(self.get_text(r.key, r.refresh_ttl_s) for r in reads)),
            )
            return result._replace(texts=tuple(found))
        res_id = f"{self._id_prefix}.{next(self._ids)}"
        keys = self._keys([c.key for c in claims] + [s.key for s in stamps])
        keys += [self._prefix + r.key for r in reads]
        args: list[str | int] = [res_id, self._lease_ms(ttl_s), len(claims), len(reads)]
        for c in claims:
            args += (c.amount, -1 if c.limit is None else c.limit, _ms(c.key_ttl_s))
            args.append(_ms(c.window_s))
        for s in stamps:
            args += (s.value, _ms(s.key_ttl_s), 1 if s.only_if_absent else 0)
        args += [_ms(r.refresh_ttl_s) for r in reads]
        ok, at_ms, failed, current, retry_ms, *stored = await self._run("reserve", keys, args)
        values = tuple(int(v) for v in stored[: len(stamps)])
        texts = tuple(_text(v) for v in stored[len(stamps) :])
        if not ok:
            c = claims[failed - 1]
            retry = None if retry_ms < 0 else retry_ms / 1000
            return ReserveResult(None, c.key, int(current), c.limit, values, retry, texts)
        res = Reservation(res_id, tuple(claims), at_ms / 1000)
        if ttl_s > self._lease_ttl_s:
            self._track(res, time.monotonic() + ttl_s)
        return ReserveResult(res, stamps=values, texts=texts)

    async def settle(
        self,
        reservation: Reservation,
        actual: Mapping[str, int] | None = None,
        writes: Sequence[TextWrite] = (),
    ) -> None:
        # Stop renewing first: if the call fails, the entries expire with their lease.
        self._live.pop(reservation.id, None)
        if writes and self._cluster:  # the text keys live in other slots
            await asyncio.gather(
                self.settle(reservation, actual),
                *(self.put_text(w.key, w.value, w.key_ttl_s) for w in writes),
            )
            return
        if not reservation.claims and not writes:
            return
        actual = actual or {}
        keys = self._keys([c.key for c in reservation.claims])
        keys += [self._prefix + w.key for w in writes]
        args: list[str | int] = [reservation.id, round(reservation.at * 1000)]
        args.append(len(reservation.claims))
        for c in reservation.claims:
            args += (actual.get(c.key, 0), _ms(c.key_ttl_s), _ms(c.window_s))
        for w in writes:
            args += (w.value, max(1, _ms(w.key_ttl_s)))
        await self._run("settle", keys, args)

    async def release(self, reservation: Reservation) -> None:
        await self.settle(reservation, None)

    async def renew(self, reservation: Reservation, ttl_s: float) -> bool:
        deadline = time.monotonic() + ttl_s
        (alive,) = await self._renew_batch([(reservation, self._lease_ms(ttl_s))])
        if alive and ttl_s > self._lease_ttl_s:
            self._track(reservation, deadline)
        else:
            self._live.pop(reservation.id, None)
        return alive

    async def put(
        self, key: str, value: int, key_ttl_s: float | None = None, *, only_if_absent: bool = False
    ) -> int:
        result = await self.reserve((), 0.0, (Stamp(key, value, key_ttl_s, only_if_absent),))
        return result.stamps[0]

    async def get(self, keys: Sequence[str]) -> list[int]:
        if not keys:
            return []
        values = await self._run("get", self._keys(keys), [])
        return [int(v) for v in values]

    async def get_text(self, key: str, refresh_ttl_s: float | None = None) -> str | None:
        async with self._call():
            if refresh_ttl_s is None:
                raw = await self._client.get(self._prefix + key)
            else:
                raw = await self._client.getex(self._prefix + key, px=max(1, _ms(refresh_ttl_s)))
        return _text(raw)

    async def put_text(self, key: str, value: str, key_ttl_s: float) -> None:
        async with self._call():
            await self._client.set(self._prefix + key, value.encode(), px=max(1, _ms(key_ttl_s)))

    async def count_keys(self, pattern: str) -> int:
        """SCAN (every node of a cluster), skipping the `:e` companion sets; a
        key SCAN returns twice (it may, while keys change) counts once."""
        companion = _ENTRIES.encode()
        found: set[bytes] = set()
        async with self._call():
            async for raw in self._client.scan_iter(match=self._prefix + pattern, count=1000):
                name = raw if isinstance(raw, bytes) else str(raw).encode()
                if not name.endswith(companion):
                    found.add(name)
        return len(found)

    async def ping(self) -> None:
        async with self._call(probe=True):
            await self._client.ping()

    async def close(self) -> None:
        """Stop renewing and close the connections. Reservations still held
        are not released: they expire within `lease_ttl_s`."""
        self._closed = True
        task, self._renewer = self._renewer, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._live.clear()
        await self._client.aclose()
        for other in self._also_close:
            await other.aclose()

    def _lease_ms(self, ttl_s: float) -> int:
        return max(1, _ms(min(ttl_s, self._lease_ttl_s)))

    def _keys(self, keys: Sequence[str]) -> list[str]:
        out: list[str] = []
        for key in keys:
            full = self._prefix + key
            out += (full, full + _ENTRIES)
        if self._cluster and len({key_slot(k.encode()) for k in out}) > 1:
            raise CrossSlotKeys(
                f"keys {list(keys)} span several Redis Cluster slots: give the keys of "
                "one call a common hash tag, e.g. 't:{tenant}:tok'"
            )
        return out

    async def _run(self, script: str, keys: list[str], args: Sequence[str | int]) -> Any:
        async with self._call():
            return await self._scripts[script](keys=keys, args=args)

    @contextlib.asynccontextmanager
    async def _call(self, probe: bool = False) -> AsyncIterator[None]:
        """One call to Redis: wait for a slot, fail at once while Redis is known
        unreachable (unless probing), translate connectivity errors."""
        async with contextlib.AsyncExitStack() as stack:
            if self._slots is not None:
                await stack.enter_async_context(self._slots)
            if self._broken and not probe:
                raise StoreUnavailable("redis: unreachable at the last attempt")
            try:
                with _translated():
                    yield
            except StoreUnavailable:
                self._broken = True
                raise
            self._broken = False

    def _track(self, reservation: Reservation, deadline: float) -> None:
        self._live[reservation.id] = (reservation, deadline)
        if self._renewer is None and not self._closed:
            self._renewer = self._tasks.spawn("renewer", self._renew_loop)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._lease_ttl_s / 3)
            now = time.monotonic()
            batch: list[tuple[Reservation, int]] = []
            for res, deadline in list(self._live.values()):
                left = deadline - now
                if left <= self._lease_ttl_s:
                    self._live.pop(res.id, None)  # its last lease: expires at its deadline
                if left > 0:
                    batch.append((res, self._lease_ms(left)))
            if not batch:
                continue
            try:
                alive = await self._renew_batch(batch)
            except StoreUnavailable as exc:
                log.warning("renewing %d reservations failed: %s", len(batch), exc)
                continue
            except rexc.RedisError:
                log.exception("renewing %d reservations failed", len(batch))
                continue
            for (res, _lease), ok in zip(batch, alive, strict=True):
                if not ok:
                    self._live.pop(res.id, None)

    async def _renew_batch(self, batch: Sequence[tuple[Reservation, int]]) -> list[bool]:
        """One script call per chunk (per hash slot in a cluster), run concurrently."""
        groups: dict[int, list[int]] = {}
        for i, (res, _lease) in enumerate(batch):
            if res.claims:
                slot = key_slot((self._prefix + res.claims[0].key).encode()) if self._cluster else 0
                groups.setdefault(slot, []).append(i)
        chunks = [
            idx[start : start + _RENEW_BATCH]
            for idx in groups.values()
            for start in range(0, len(idx), _RENEW_BATCH)
        ]
        replies = await asyncio.gather(*(self._renew_chunk(batch, c) for c in chunks))
        alive = [True] * len(batch)  # a reservation without claims has nothing to lose
        for chunk, reply in zip(chunks, replies, strict=True):
            for i, ok in zip(chunk, reply, strict=True):
                alive[i] = bool(ok)
        return alive

    async def _renew_chunk(
        self, batch: Sequence[tuple[Reservation, int]], chunk: list[int]
    ) -> list[int]:
        keys: list[str] = []
        args: list[str | int] = []
        for i in chunk:
            res, lease_ms = batch[i]
            keys += self._keys([c.key for c in res.claims])
            args += (res.id, len(res.claims), lease_ms)
        reply: list[int] = await self._run("renew", keys, args)
        return reply
