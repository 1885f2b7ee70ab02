"""Config values naming plugins and profiles (decoded strictly by `configtools`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One configured plugin instance: a unique name, a registered type, its parameters."""

    name: str
    type: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScorerRef:
    """A scorer used by a profile, with its weight (required: no silent default)."""

    plugin: str
    weight: float

    def __post_init__(self) -> None:
        if not self.weight >= 0:
            raise ValueError(f"weight must be >= 0, got {self.weight}")


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """Filters narrow the candidates, weighted scorers rank them, one picker orders them."""

    name: str
    picker: str
    filters: tuple[str, ...] = ()
    scorers: tuple[ScorerRef, ...] = ()
