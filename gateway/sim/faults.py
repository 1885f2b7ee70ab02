"""Injected faults of one replica (`POST /sim/fault`).

Fields, all optional:
- `health_status`: status of `/health` (503 = engine dead/loading shape; 200 restores).
- `die_after_tokens`: generation requests stream that many tokens, then the
  connection is dropped without a proper end (engine crash mid-generation).
- `error_status` + `error_message`: generation requests get this
  engine-shaped error instead of being served.
- `count`: how many generation requests the die/error fault applies to
  (default: every request until cleared).
- `paused`: freeze the engine loop (requests queue but no step runs), e.g.
  to line up a workload before it starts.
- `clear: true`: remove every fault first (then apply the other fields).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

_INT_FIELDS = ("health_status", "die_after_tokens", "error_status", "count")
_FIELDS = (*_INT_FIELDS, "error_message", "paused", "clear")


@dataclass(frozen=True, slots=True)
class RequestFault:
    """What to do to one generation request."""

    error_status: int | None = None
    error_message: str = ""
    die_after_tokens: int | None = None


@dataclass(slots=True)
class Faults:
    health_status: int | None = None
    die_after_tokens: int | None = None
    error_status: int | None = None
    error_message: str | None = None
    count: int | None = None
    paused: bool = False

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a `/sim/fault` body; ValueError names the bad field."""
        _validate(changes)
        if changes.get("clear"):
            self.clear()
        for key, value in changes.items():
            if key != "clear":
                setattr(self, key, value)
        if self.error_status is not None and self.error_message is None:
            self.error_message = "simulated engine error"

    def clear(self) -> None:
        self.health_status = self.die_after_tokens = self.error_status = None
        self.error_message = None
        self.count = None
        self.paused = False

    def take(self) -> RequestFault | None:
        """The fault for the next generation request, if any (counts it)."""
        if self.error_status is None and self.die_after_tokens is None:
            return None
        fault = RequestFault(self.error_status, self.error_message or "", self.die_after_tokens)
        if self.count is not None:
            self.count -= 1
            if self.count <= 0:
                self.die_after_tokens = self.error_status = None
                self.error_message = None
                self.count = None
        return fault

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _validate(changes: dict[str, Any]) -> None:
    for key, value in changes.items():
        if key not in _FIELDS:
            raise ValueError(f"unknown fault field {key!r} (known: {', '.join(_FIELDS)})")
        if (
            key in _INT_FIELDS
            and value is not None
            and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
        ):
            raise ValueError(f"{key} must be a non-negative integer or null, got {value!r}")
        if key in ("paused", "clear") and not isinstance(value, bool):
            raise ValueError(f"{key} must be a bool, got {value!r}")
        if key == "error_message" and value is not None and not isinstance(value, str):
            raise ValueError(f"error_message must be a string, got {value!r}")
    status = changes.get("error_status")
    if status is not None and not 400 <= status <= 599:
        raise ValueError(f"error_status must be within 400..599, got {status}")
    health = changes.get("health_status")
    if health is not None and not 200 <= health <= 599:
        raise ValueError(f"health_status must be within 200..599, got {health}")
