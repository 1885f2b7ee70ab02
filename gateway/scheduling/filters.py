"""Built-in filters: `healthy` and `admissible`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.interfaces import AdmitCheck, Services

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

HEALTHY = "healthy"
ADMISSIBLE = "admissible"


@dataclass(frozen=True, slots=True)
class NoParams:
    pass


class HealthyFilter:
    """Keeps replicas that pass health checks."""

    kind: ClassVar[str] = "filter"

    def filter(self, cycle: Cycle, candidates: list[Replica]) -> list[Replica]:
        return [r for r in candidates if r.healthy]


def healthy_factory(params: NoParams, services: Services) -> HealthyFilter:
    return HealthyFilter()


class AdmissibleFilter:
    """Keeps replicas the admission stage could admit the request to now.

    When none could, every candidate stays: the admission stage then queues
    the request for the best-ranked one instead of failing it here."""

    kind: ClassVar[str] = "filter"

    def __init__(self, can_admit: AdmitCheck | None) -> None:
        self._can_admit = can_admit

    def filter(self, cycle: Cycle, candidates: list[Replica]) -> list[Replica]:
        check = self._can_admit
        if check is None:
            return candidates
        kept = [r for r in candidates if check(cycle.ctx, r)]
        return kept or candidates


def admissible_factory(params: NoParams, services: Services) -> AdmissibleFilter:
    return AdmissibleFilter(services.can_admit)
