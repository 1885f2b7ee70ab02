"""Built-in pickers: `max-score` and `random-weighted`.

A picker orders all candidates (best first): the admission stage takes the
first one that can admit the request."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.hashing import rendezvous_weight
from gateway.scheduling.interfaces import Services

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

MAX_SCORE = "max-score"
RANDOM_WEIGHTED = "random-weighted"


@dataclass(frozen=True, slots=True)
class MaxScoreParams:
    #: Scores closer than this (relative to the total weight) are ties.
    tie_tolerance: float = 0.01

    def __post_init__(self) -> None:
        if not 0 <= self.tie_tolerance < 1:
            raise ValueError(f"tie_tolerance must be in [0, 1), got {self.tie_tolerance}")


class MaxScorePicker:
    """Highest total score first; ties broken by rendezvous hash of the
    session key (the client's or the implicit one; else the request id), so
    gateways agree on a session and equal requests spread."""

    kind: ClassVar[str] = "picker"

    def __init__(self, tie_tolerance: float) -> None:
        self._tol = tie_tolerance

    def order(
        self, cycle: Cycle, candidates: Sequence[Replica], scores: Sequence[float]
    ) -> list[Replica]:
        tol = self._tol * cycle.weight_total
        key = cycle.tie_key

        def rank(i: int) -> tuple[float, int]:
            bucket = float(round(scores[i] / tol)) if tol > 0 else scores[i]
            return (-bucket, -rendezvous_weight(key, candidates[i].name))

        return [candidates[i] for i in sorted(range(len(candidates)), key=rank)]


def max_score_factory(params: MaxScoreParams, services: Services) -> MaxScorePicker:
    return MaxScorePicker(params.tie_tolerance)


@dataclass(frozen=True, slots=True)
class RandomWeightedParams:
    pass


class RandomWeightedPicker:
    """Samples without replacement with probability proportional to score."""

    kind: ClassVar[str] = "picker"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def order(
        self, cycle: Cycle, candidates: Sequence[Replica], scores: Sequence[float]
    ) -> list[Replica]:
        # Efraimidis-Spirakis: key u^(1/w); zero weights go last in random order.
        keyed = []
        for replica, score in zip(candidates, scores, strict=True):
            u = self._rng.random()
            keyed.append(((u ** (1.0 / score)) if score > 0 else -u, replica))
        keyed.sort(key=lambda kv: kv[0], reverse=True)
        return [r for _, r in keyed]


def random_weighted_factory(
    params: RandomWeightedParams, services: Services
) -> RandomWeightedPicker:
    return RandomWeightedPicker(services.rng)
