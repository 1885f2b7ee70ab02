"""Baseline routers for comparison, selectable as `scheduling.policy`:
`round-robin`, `least-load`, `session-hash` (bounded-load consistent hashing
of the session key; least-load without one)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from gateway.scheduling.cycle import Ranking
from gateway.scheduling.hashing import bounded_load_choice

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.request.context import RequestContext


def _least_load(candidates: list[Replica]) -> list[Replica]:
    return sorted(candidates, key=lambda r: (r.in_flight / r.config.weight, -r.config.weight))


class _Stateless:
    """A baseline keeps nothing per replica or session."""

    def on_routed(self, ctx: RequestContext, ranking: Ranking, replica: Replica) -> None:
        return None

    def on_answered(self, ctx: RequestContext, replica: Replica) -> None:
        return None

    def forget_replica(self, name: str) -> None:
        return None

    def session_replica(self, key: str) -> str | None:
        return None

    def session_key(self, ctx: RequestContext) -> str | None:
        return ctx.session_key

    def session_count(self) -> int:
        return 0


class RoundRobinRouter(_Stateless):
    def __init__(self) -> None:
        self._counter = itertools.count()

    def rank(self, ctx: RequestContext, candidates: list[Replica]) -> Ranking:
        if not candidates:
            return Ranking([])
        start = next(self._counter) % len(candidates)
        return Ranking(candidates[start:] + candidates[:start])


class LeastLoadRouter(_Stateless):
    """Fewest in-flight requests per unit weight first; ties by weight, then config order."""

    def rank(self, ctx: RequestContext, candidates: list[Replica]) -> Ranking:
        return Ranking(_least_load(candidates))


class SessionHashRouter(_Stateless):
    def __init__(self, load_factor: float) -> None:
        self._factor = load_factor

    def rank(self, ctx: RequestContext, candidates: list[Replica]) -> Ranking:
        key = ctx.session_key
        if not key or not candidates:
            return Ranking(_least_load(candidates))
        loads = [float(r.in_flight) for r in candidates]
        first = bounded_load_choice(key, candidates, loads, self._factor)
        return Ranking([first] + [r for r in _least_load(candidates) if r is not first])
