"""A replica's parts, one per owner: each is written by one module, read by all.

| part | written by |
|---|---|
| `Replica.config` | the replica set (`registry.py`), once |
| `Health` | health checks (`HealthMonitor`, `registry.py`) |
| `Found` | what health checks discovered of the engine (`HealthMonitor._discover`) |
| `Ledger` | admission (`gateway/admission/controller.py`): in-flight count and live state |
| `Ejection` | passive health (`outliers.py`) |
| `Status` | the replica set (`ReplicaRegistry`: drain, leave) |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.replicas.livestate import LiveState


@dataclass(slots=True, eq=False)
class Health:
    healthy: bool = False
    checked: bool = False
    fail_streak: int = 0
    ok_streak: int = 0
    last_check: float | None = None
    last_error: str | None = None


@dataclass(slots=True, eq=False)
class Found:
    """The engine kind (`unknown` until detected), served models, context length."""

    kind: str
    max_model_len: int | None
    models: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Ledger:
    in_flight: int = 0
    #: engine readings merged with the admission ledger (None until admission tracks it)
    live: LiveState | None = None


@dataclass(slots=True, eq=False)
class Ejection:
    """Consecutive failed exchanges, ejections in a row, out of routing until (monotonic)."""

    exchange_failures: int = 0
    ejections: int = 0
    until: float = 0.0


@dataclass(slots=True, eq=False)
class Status:
    #: no new requests (admin drain); those in flight finish
    draining: bool = False
    #: no new requests, removed once idle (its address vanished, or it was removed)
    leaving: bool = False
