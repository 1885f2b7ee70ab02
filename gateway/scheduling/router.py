"""Routing: rank the eligible replicas for a request.

The prefix-affinity scheduling framework replaces the least-in-flight router
here; the pipeline only sees the `Router` protocol.
"""

from __future__ import annotations

from typing import Protocol

from gateway.context import RequestContext
from gateway.replicas import Replica


class Router(Protocol):
    def rank(self, ctx: RequestContext, candidates: list[Replica]) -> list[Replica]:
        """Candidates in order of preference (best first); never adds replicas."""
        ...

    def on_routed(self, ctx: RequestContext, replica: Replica) -> None:
        """Learn from the final decision (e.g. the prefix index)."""
        ...


class LeastInFlightRouter:
    """Fewest in-flight requests first; ties by weight, then config order."""

    def rank(self, ctx: RequestContext, candidates: list[Replica]) -> list[Replica]:
        return sorted(candidates, key=lambda r: (r.in_flight / r.config.weight, -r.config.weight))

    def on_routed(self, ctx: RequestContext, replica: Replica) -> None:
        return None


def build_router(policy: str) -> Router:
    return LeastInFlightRouter()
