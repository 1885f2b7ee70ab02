"""One interface per extension point: filter, scorer, picker.

A filter narrows the candidates; a scorer returns one value per candidate
(the framework clamps it to [0, 1] and multiplies it by the profile weight);
the picker turns the total scores into the order the admission stage tries.
Plugins read the request's precomputed facts from `Cycle` and never import
the replica registry at runtime (see `__init__`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import random

    from gateway.replicas.registry import Replica
    from gateway.request.context import RequestContext
    from gateway.scheduling.cycle import Cycle
    from gateway.scheduling.tracker import Tracker

AdmitCheck = Callable[["RequestContext", "Replica"], bool]


@dataclass(slots=True)
class Services:
    """What plugin factories may use: injected clock, random source, shared bookkeeping."""

    clock: Callable[[], float]
    rng: random.Random
    tracker: Tracker
    can_admit: AdmitCheck | None = None
    extras: dict[str, object] = field(default_factory=dict)


class Filter(Protocol):
    kind: ClassVar[str]

    def filter(self, cycle: Cycle, candidates: list[Replica]) -> list[Replica]: ...


class Scorer(Protocol):
    kind: ClassVar[str]

    def score(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]: ...


class Picker(Protocol):
    kind: ClassVar[str]

    def order(
        self, cycle: Cycle, candidates: Sequence[Replica], scores: Sequence[float]
    ) -> list[Replica]: ...


def clamp01(value: float) -> float:
    if math.isnan(value):  # NaN scores nothing
        return 0.0
    return max(0.0, min(value, 1.0))


def ratio_to_best(values: Sequence[float], smoothing: float) -> list[float]:
    """Lower is better: best gets 1, twice the (smoothed) cost gets ~0.5."""
    best = min(values, default=0.0)
    return [(best + smoothing) / (v + smoothing) for v in values]
