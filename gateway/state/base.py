"""The `StateStore` protocol and its value types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable


class Claim(NamedTuple):
    """Add `amount` to counter `key` only if the result stays ≤ `limit` (None: no limit).

    `key_ttl_s`: the counter expires this long after its last change (None:
    never), e.g. a fixed rate window or an idle session.

    A NamedTuple, not a frozen dataclass: three are built per admitted request,
    and a frozen dataclass costs several times as much to build.
    """

    key: str
    amount: int
    limit: int | None = None
    key_ttl_s: float | None = None


class Reservation(NamedTuple):
    id: str
    claims: tuple[Claim, ...]


class ReserveResult(NamedTuple):
    reservation: Reservation | None
    failed_key: str | None = None
    current: int = 0
    limit: int | None = None

    @property
    def ok(self) -> bool:
        return self.reservation is not None


class StateStore(Protocol):
    """Counters with limits, atomic per operation.

    A store may declare `shared = False` (the in-process store): no other
    gateway instance sees its counters, so a caller may keep a hot counter in
    its own memory instead. A store without the attribute counts as shared.
    """

    async def reserve(self, claims: Sequence[Claim], ttl_s: float) -> ReserveResult:
        """Atomically apply every claim, or none if any would exceed its limit.

        The reservation expires after `ttl_s` unless settled, released or
        renewed: a crashed holder cannot leak capacity forever."""
        ...

    async def settle(
        self, reservation: Reservation, actual: Mapping[str, int] | None = None
    ) -> None:
        """End a reservation: keys in `actual` keep that amount permanently
        (until the key's TTL), all other claimed amounts are given back.
        Idempotent: settling twice (or after expiry) changes nothing. A
        counter never goes below 0 (its key may have expired meanwhile)."""
        ...

    async def release(self, reservation: Reservation) -> None:
        """Give back everything (same as `settle(reservation, None)`)."""
        ...

    async def renew(self, reservation: Reservation, ttl_s: float) -> bool:
        """Extend a live reservation; False if it already expired."""
        ...

    async def put(
        self, key: str, value: int, key_ttl_s: float | None = None, *, only_if_absent: bool = False
    ) -> int:
        """Set a plain value (e.g. a session's first/last-seen time); with
        `only_if_absent`, keep an existing value. Refreshes the key's TTL
        either way and returns the value now stored."""
        ...

    async def get(self, keys: Sequence[str]) -> list[int]:
        """Current counter values (0 for missing keys)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class LocalRelease(Protocol):
    """An in-process store can release without suspending: a lease closing on
    the hot path then needs no task to shield its release from cancellation."""

    def release_now(self, reservation: Reservation) -> None: ...
