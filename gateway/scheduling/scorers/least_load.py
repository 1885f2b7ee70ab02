"""`least-load`: fewest requests in flight per unit of replica weight."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.interfaces import Services, ratio_to_best

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

TYPE = "least-load"


@dataclass(frozen=True, slots=True)
class Params:
    smoothing: float = 1.0

    def __post_init__(self) -> None:
        if not self.smoothing > 0:
            raise ValueError(f"smoothing must be > 0, got {self.smoothing}")


class LeastLoadScorer:
    kind: ClassVar[str] = "scorer"

    def __init__(self, params: Params) -> None:
        self._smoothing = params.smoothing

    def score(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]:
        loads = [cycle.load(r).in_flight / r.config.weight for r in candidates]
        return ratio_to_best(loads, self._smoothing)


def factory(params: Params, services: Services) -> LeastLoadScorer:
    return LeastLoadScorer(params)
