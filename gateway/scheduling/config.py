"""Scheduling (routing) configuration: which picker/profile routes requests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    policy: str = "least-load"
