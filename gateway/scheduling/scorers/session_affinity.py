"""`session-affinity`: 1 for the replica the session belongs to, else 0.

A known session belongs to the replica it was last routed to; a new one is
placed by bounded-load consistent hashing of its key (see
`SchedulingRouter._session_target`). No session key, or a hot target: 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.interfaces import Services

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

TYPE = "session-affinity"


@dataclass(frozen=True, slots=True)
class Params:
    pass


class SessionAffinityScorer:
    kind: ClassVar[str] = "scorer"

    def score(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]:
        target = cycle.session_target
        return [1.0 if r.name == target and r.name not in cycle.hot else 0.0 for r in candidates]


def factory(params: Params, services: Services) -> SessionAffinityScorer:
    return SessionAffinityScorer()
