"""What an adapter may ask of its replica: the caller owns the connection.

The replica set (`gateway.replicas`) and the policy stage hand an adapter
these callables, bound to one replica with its auth and timeout, so that
engine knowledge (paths, payloads, answer shapes) stays in the adapter and the
HTTP client stays with its owner.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.engines.readings import EngineReading


class EngineGet(Protocol):
    """GETs on one replica. Both answer None when the route is absent (any
    status but 200 for detection; 404/501 for polls) and raise the caller's
    error for a failed request."""

    async def text(self, path: str) -> str | None: ...

    async def json(self, path: str) -> Any: ...


class EnginePost(Protocol):
    """POST a JSON payload to one replica; the decoded JSON answer (raises on
    any status but 200)."""

    async def __call__(self, path: str, payload: dict[str, Any]) -> Any: ...


class LiveReader(Protocol):
    """Reads one replica's live state; may keep what need not be read twice."""

    async def read(self, get: EngineGet) -> EngineReading:
        """One reading; `MetricsParseError` on a malformed answer."""
        ...
