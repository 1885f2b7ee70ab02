"""`kv-headroom`: free KV fraction left after this request's uncached tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.interfaces import Services

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

TYPE = "kv-headroom"


@dataclass(frozen=True, slots=True)
class Params:
    pass


class KVHeadroomScorer:
    kind: ClassVar[str] = "scorer"

    def score(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]:
        out: list[float] = []
        for r in candidates:
            load = cycle.load(r)
            used = load.kv_used_tokens + cycle.uncached_tokens(r)
            out.append(1.0 - used / load.capacity_tokens if load.capacity_tokens else 0.0)
        return out


def factory(params: Params, services: Services) -> KVHeadroomScorer:
    return KVHeadroomScorer()
