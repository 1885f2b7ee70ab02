"""The `StateStore` protocol and its value types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


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
    #: A sliding window: the amount counts against `limit` for `window_s`
    #: seconds from when it was reserved (a settled amount too), then drops
    #: out (tenant requests and tokens per minute). None: a plain counter.
    window_s: float | None = None


class Stamp(NamedTuple):
    """Set a plain value in the same atomic step as a reserve (e.g. a session's
    first- and last-seen times), whether or not the claims fit."""

    key: str
    value: int
    key_ttl_s: float | None = None
    only_if_absent: bool = False


class TextRead(NamedTuple):
    """Read a text value in the same step as a reserve (None if missing);
    `refresh_ttl_s` restarts its TTL."""

    key: str
    refresh_ttl_s: float | None = None


class TextWrite(NamedTuple):
    """Set a text value in the same step as a settle; it expires `key_ttl_s`
    after this write."""

    key: str
    value: str
    key_ttl_s: float


class Reservation(NamedTuple):
    id: str
    claims: tuple[Claim, ...]
    #: when it was reserved, in the store's clock (seconds): a window claim's
    #: settled amount counts until `at + window_s`
    at: float = 0.0


class ReserveResult(NamedTuple):
    reservation: Reservation | None
    failed_key: str | None = None
    current: int = 0
    limit: int | None = None
    #: the values the stamps left stored, in order
    stamps: tuple[int, ...] = ()
    #: a window claim that failed: seconds until enough of it drops out (None: unknown)
    retry_after_s: float | None = None
    #: the values of the reserve's text reads, in order (None: missing)
    texts: tuple[str | None, ...] = ()

    @property
    def ok(self) -> bool:
        return self.reservation is not None


@dataclass(slots=True)
class Rider:
    """Text reads and writes that ride on a request's budget reservation, so
    they cost no round trip of their own: the reads on its `reserve`, the
    writes on its `settle`. Mutable, one per request."""

    reads: tuple[TextRead, ...]
    #: what the reads found, once a reserve carried them (None: not carried)
    texts: tuple[str | None, ...] | None = None
    #: whether a reservation is held that will carry `writes` when it settles
    carried: bool = False
    writes: list[TextWrite] = field(default_factory=list)


class StoreUnavailable(Exception):
    """The store cannot be reached (connection refused, timeout, failover in
    progress). Raised by shared stores; the in-process store never raises it."""


class StateStore(Protocol):
    """Counters with limits, atomic per operation."""

    @property
    def shared(self) -> bool:
        """Whether other gateway instances see the counters. Not shared (the
        in-process store): a caller may keep a hot counter in its own memory."""
        ...

    def release_now(self, reservation: Reservation) -> bool:
        """Release without suspending when the store can (True: done); False:
        nothing done, use `release` (a shared store must be asked)."""
        ...

    async def reserve(
        self,
        claims: Sequence[Claim],
        ttl_s: float,
        stamps: Sequence[Stamp] = (),
        reads: Sequence[TextRead] = (),
    ) -> ReserveResult:
        """Atomically apply every claim, or none if any would exceed its limit;
        apply `stamps` and the text `reads` in the same step either way (a
        shared store: in the same round trip).

        The reservation expires after `ttl_s` unless settled, released or
        renewed: a crashed holder cannot leak capacity forever (a shared store
        may keep a shorter expiry in the shared service and renew it while
        the holder lives)."""
        ...

    async def settle(
        self,
        reservation: Reservation,
        actual: Mapping[str, int] | None = None,
        writes: Sequence[TextWrite] = (),
    ) -> None:
        """End a reservation: keys in `actual` keep that amount permanently
        (until the key's TTL), all other claimed amounts are given back.
        Idempotent: settling twice (or after expiry) changes nothing. A
        counter never goes below 0 (its key may have expired meanwhile).
        The text `writes` are applied in the same step (a shared store: in
        the same round trip), whether or not the reservation was still live."""
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
        """Current counter values (0 for missing keys; window claims count while
        inside their window)."""
        ...

    async def get_text(self, key: str, refresh_ttl_s: float | None = None) -> str | None:
        """A text value (None if missing); `refresh_ttl_s` restarts its TTL."""
        ...

    async def put_text(self, key: str, value: str, key_ttl_s: float) -> None:
        """Set a text value that expires `key_ttl_s` after its last write or refresh."""
        ...

    async def count_keys(self, pattern: str) -> int:
        """How many live keys (counters with a value, values, texts) match the
        glob `pattern` (without the key prefix). A full scan: for the admin
        API (the session table), never on the request path."""
        ...

    async def ping(self) -> None:
        """Return when the store answers; raise `StoreUnavailable` otherwise."""
        ...

    async def close(self) -> None: ...
