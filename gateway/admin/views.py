"""What the admin routes read of a running gateway (`gateway.app.Gateway`
satisfies `AdminView`), so the admin app knows nothing of how the gateway
is wired."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from gateway.config.schema import GatewayConfig
from gateway.observability.metrics import GatewayMetrics


class ReplicaView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def draining(self) -> bool: ...
    @property
    def leaving(self) -> bool: ...
    def describe(self) -> dict[str, Any]: ...


class RegistryView(Protocol):
    def __iter__(self) -> Iterator[ReplicaView]: ...
    def set_draining(self, name: str, draining: bool) -> ReplicaView | None:
        """The replica, drained or not; None when no replica has that name."""
        ...


class Named(Protocol):
    @property
    def name(self) -> str: ...


class PolicySetView(Protocol):
    @property
    def policies(self) -> Sequence[Named]: ...
    def describe(self) -> list[dict[str, Any]]: ...


class PolicyView(Protocol):
    @property
    def policies(self) -> PolicySetView: ...
    def reload(self) -> PolicySetView:
        """The new set; ConfigError (the current set stays) when it is invalid."""
        ...


class AdmissionView(Protocol):
    def describe(self) -> dict[str, Any]: ...


class SessionsView(Protocol):
    async def count(self) -> dict[str, Any]:
        """How many sessions the gateway tracks, by what tracks them."""
        ...

    async def lookup(self, key: str, tenant: str | None) -> dict[str, Any] | None:
        """One session's counters and replica; None when nothing tracks it."""
        ...


class AdminView(Protocol):
    @property
    def config(self) -> GatewayConfig: ...
    @property
    def registry(self) -> RegistryView: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def admission(self) -> AdmissionView: ...
    @property
    def policy(self) -> PolicyView: ...
    @property
    def sessions(self) -> SessionsView: ...
