"""`queue-depth`: fewer requests waiting in the engine (or, unknown, in flight)
is better; the shortest queue scores 1, relative to it the others less."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.interfaces import Services, ratio_to_best

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

TYPE = "queue-depth"


@dataclass(frozen=True, slots=True)
class Params:
    #: Added to every queue length before comparing (damps small differences).
    smoothing: float = 1.0

    def __post_init__(self) -> None:
        if not self.smoothing > 0:
            raise ValueError(f"smoothing must be > 0, got {self.smoothing}")


class QueueDepthScorer:
    kind: ClassVar[str] = "scorer"

    def __init__(self, params: Params) -> None:
        self._smoothing = params.smoothing

    def score(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]:
        return ratio_to_best([float(cycle.load(r).waiting) for r in candidates], self._smoothing)


def factory(params: Params, services: Services) -> QueueDepthScorer:
    return QueueDepthScorer(params)
