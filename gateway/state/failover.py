"""`FailoverStore`: a shared store (Redis) and what to do while it is down.

`state.redis.on_failure` chooses (config/README.md, `state`):

- `open`: a call the shared store fails (`StoreUnavailable`, or no answer
  within `call_timeout_s`, when set) is retried at once on the in-process fallback, and
  every later call goes there too, so requests go on with limits this
  instance alone enforces;
- `closed`: every call raises `StateUnavailable` (503 `state_unavailable`)
  at once, without waiting for the shared store each time.

A background probe pings the shared store every `probe_interval_s` (while up
too, so an idle gateway notices an outage) and switches back when it
answers. Each transition logs one warning and sets `gateway_state_store_up`.

A reservation remembers which store made it (a tag on its id), and
settle / release / renew go to that store. Release and settle never raise
because of an outage, nor wait for a store known to be down (they try once
in the background); a shared reservation that cannot be given back is left
to expire by its lease TTL (`state.redis.lease_ttl_s`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, TypeVar

from gateway.errors import StateUnavailable
from gateway.state.base import (
    Claim,
    Reservation,
    ReserveResult,
    Stamp,
    StateStore,
    StoreUnavailable,
    TextRead,
    TextWrite,
)
from gateway.supervise import Supervisor

if TYPE_CHECKING:
    from gateway.observability.metrics import GatewayMetrics

log = logging.getLogger("gateway.state")

T = TypeVar("T")
OnFailure = Literal["open", "closed"]

# Reservation ids are tagged with the store that made them.
_SHARED = "s"
_LOCAL = "l"
# What the shared store's failures look like: its own error, or our timeout.
_DOWN = (StoreUnavailable, TimeoutError)


class FailoverStore:
    """A `StateStore` over `primary` (shared) with `fallback` (in-process) or
    refusal while `primary` is down. Call `start()` in the app's lifespan
    (the first check and the probe) and `close()` at shutdown."""

    #: Shared with the other instances (while the shared store is up): the
    #: admission ledger reserves through the store on every lease.
    shared: ClassVar[bool] = True

    def release_now(self, reservation: Reservation) -> bool:
        return False  # the shared store must be asked (`release`)

    def __init__(
        self,
        primary: StateStore,
        fallback: StateStore,
        *,
        on_failure: OnFailure,
        probe_interval_s: float,
        call_timeout_s: float | None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self._primary = primary
        self._fallback = fallback
        self._on_failure = on_failure
        self._probe_interval_s = probe_interval_s
        self._call_timeout_s = call_timeout_s
        self._metrics = metrics
        self._up = True
        # Bumped on every transition: a failure of a call that started before the
        # store came back does not switch it off again.
        self._epoch = 0
        self._tasks = Supervisor("state-store")
        self._probe: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()
        self._closing = False
        if metrics is not None:
            metrics.state_store_up.set(1)

    @property
    def up(self) -> bool:
        """Whether calls go to the shared store."""
        return self._up

    @property
    def ready(self) -> bool:
        """Whether requests that need shared state can be served (`/readyz`)."""
        return self._up or self._on_failure == "open"

    async def start(self) -> None:
        """Check the shared store once, then probe it in the background. Never
        raises for an unreachable store: the gateway starts in its failure mode."""
        await self._check()
        if self._probe is None:
            self._probe = self._tasks.spawn("probe", self._probe_loop)

    async def close(self) -> None:
        self._closing = True
        tasks = [*self._finishing, *([self._probe] if self._probe is not None else [])]
        self._probe = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self._primary.close()
        finally:
            await self._fallback.close()

    # -- the StateStore protocol -------------------------------------------------

    async def reserve(
        self,
        claims: Sequence[Claim],
        ttl_s: float,
        stamps: Sequence[Stamp] = (),
        reads: Sequence[TextRead] = (),
    ) -> ReserveResult:
        if self._up:
            epoch = self._epoch
            try:
                async with asyncio.timeout(self._call_timeout_s):
                    result = await self._primary.reserve(claims, ttl_s, stamps, reads)
                return _tagged(result, _SHARED)
            except _DOWN as exc:
                self._failed(exc, epoch)
        result = await self._usable().reserve(claims, ttl_s, stamps, reads)
        return _tagged(result, _LOCAL)

    async def settle(
        self,
        reservation: Reservation,
        actual: Mapping[str, int] | None = None,
        writes: Sequence[TextWrite] = (),
    ) -> None:
        """The writes go where the reservation was made (best effort, like
        the settle: lost if the shared store is down by then)."""
        await self._finish(reservation, lambda s, r: s.settle(r, actual, writes))

    async def release(self, reservation: Reservation) -> None:
        await self._finish(reservation, lambda s, r: s.release(r))

    async def renew(self, reservation: Reservation, ttl_s: float) -> bool:
        tag, inner = _untag(reservation)
        if tag == _LOCAL:
            return await self._fallback.renew(inner, ttl_s)
        if self._up:
            epoch = self._epoch
            try:
                async with asyncio.timeout(self._call_timeout_s):
                    return await self._primary.renew(inner, ttl_s)
            except _DOWN as exc:
                self._failed(exc, epoch)
        self._usable()  # closed: raises
        return False  # open: the shared lease can no longer be vouched for

    async def put(
        self, key: str, value: int, key_ttl_s: float | None = None, *, only_if_absent: bool = False
    ) -> int:
        return await self._call(
            lambda s: s.put(key, value, key_ttl_s, only_if_absent=only_if_absent)
        )

    async def get(self, keys: Sequence[str]) -> list[int]:
        return await self._call(lambda s: s.get(keys))

    async def get_text(self, key: str, refresh_ttl_s: float | None = None) -> str | None:
        return await self._call(lambda s: s.get_text(key, refresh_ttl_s))

    async def put_text(self, key: str, value: str, key_ttl_s: float) -> None:
        await self._call(lambda s: s.put_text(key, value, key_ttl_s))

    async def count_keys(self, pattern: str) -> int:
        return await self._call(lambda s: s.count_keys(pattern))

    async def ping(self) -> None:
        await self._call(lambda s: s.ping())

    # -- failover ------------------------------------------------------------------

    async def _call(self, op: Callable[[StateStore], Awaitable[T]]) -> T:
        """`op` on the shared store while it is up; else (or when it fails now)
        on the fallback (`open`) or refused (`closed`)."""
        if self._up:
            epoch = self._epoch
            try:
                async with asyncio.timeout(self._call_timeout_s):
                    return await op(self._primary)
            except _DOWN as exc:
                self._failed(exc, epoch)
        return await op(self._usable())

    async def _finish(
        self,
        reservation: Reservation,
        op: Callable[[StateStore, Reservation], Awaitable[None]],
    ) -> None:
        """Settle or release in the store that made the reservation; never raises
        because the shared store is down (its lease expires by its TTL)."""
        tag, inner = _untag(reservation)
        if tag == _LOCAL:
            await op(self._fallback, inner)
        elif self._up:
            await self._finish_shared(op, inner)
        else:
            # Tried once in the background, so the caller does not wait for a
            # store known to be down; the shared store stops renewing it either way.
            task = asyncio.get_running_loop().create_task(self._finish_shared(op, inner))
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)

    async def _finish_shared(
        self, op: Callable[[StateStore, Reservation], Awaitable[None]], inner: Reservation
    ) -> None:
        epoch = self._epoch
        try:
            async with asyncio.timeout(self._call_timeout_s):
                await op(self._primary, inner)
        except _DOWN as exc:
            self._mark_down(exc, epoch)
            log.debug("state store down: reservation %s left to expire", inner.id)

    def _usable(self) -> StateStore:
        """The store to use while the shared one is down; raises in `closed` mode."""
        if self._on_failure == "closed":
            raise StateUnavailable(
                "Shared state is unavailable; try again shortly.",
                retry_after=self._probe_interval_s,
            )
        return self._fallback

    async def _check(self) -> None:
        epoch = self._epoch
        try:
            async with asyncio.timeout(self._call_timeout_s):
                await self._primary.ping()
        except _DOWN as exc:
            self._mark_down(exc, epoch)
        else:
            self._mark_up()

    async def _probe_loop(self) -> None:
        # A flag as well as the cancel: a cancel that lands while the redis client
        # waits under its own timeout may come out as a timeout error instead.
        while not self._closing:
            await asyncio.sleep(self._probe_interval_s)
            await self._check()

    def _failed(self, exc: BaseException, epoch: int) -> None:
        """A call to the shared store failed: switch (before retrying elsewhere),
        unless the caller is being cancelled, which the redis client's own
        timeouts can turn into a timeout error: then it goes on being cancelled."""
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError from exc
        self._mark_down(exc, epoch)

    def _mark_down(self, exc: BaseException, epoch: int) -> None:
        if not self._up or epoch != self._epoch:
            return
        self._up = False
        self._epoch += 1
        then = (
            "serving with in-process limits"
            if self._on_failure == "open"
            else "refusing requests that need shared state (503 state_unavailable)"
        )
        log.warning(
            "state store unavailable (%s): %s until it answers (on_failure: %s)",
            _describe(exc),
            then,
            self._on_failure,
        )
        if self._metrics is not None:
            self._metrics.state_store_up.set(0)
            self._metrics.state_store_fallbacks.inc()

    def _mark_up(self) -> None:
        if self._up:
            return
        self._up = True
        self._epoch += 1
        log.warning("state store available again: shared state in use")
        if self._metrics is not None:
            self._metrics.state_store_up.set(1)


def _tagged(result: ReserveResult, tag: str) -> ReserveResult:
    res = result.reservation
    if res is None:
        return result
    return result._replace(reservation=res._replace(id=tag + res.id))


def _untag(reservation: Reservation) -> tuple[str, Reservation]:
    rid = reservation.id
    return rid[:1], reservation._replace(id=rid[1:])


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__
