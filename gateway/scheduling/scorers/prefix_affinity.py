"""`prefix-affinity`: the fraction of the prompt (in tokens) already cached
on the replica, by the prefix index, scaled down while the match is shorter
than `full_credit_tokens`: matched *length* counts, so a short shared system
prompt alone earns little even when it is most of a short prompt. Hot
replicas score 0 (hot-spot guard, see `Cycle.matched_tokens`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.interfaces import Services

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

TYPE = "prefix-affinity"


@dataclass(frozen=True, slots=True)
class Params:
    #: Matches shorter than this many tokens score 0.
    min_match_tokens: int = 0
    #: A match this long (tokens) or longer earns its full fraction; shorter ones
    #: proportionally less.
    full_credit_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.min_match_tokens < 0:
            raise ValueError(f"min_match_tokens must be >= 0, got {self.min_match_tokens}")
        if self.full_credit_tokens < 1:
            raise ValueError(f"full_credit_tokens must be >= 1, got {self.full_credit_tokens}")


class PrefixAffinityScorer:
    kind: ClassVar[str] = "scorer"

    def __init__(self, params: Params) -> None:
        self._min = params.min_match_tokens
        self._full = params.full_credit_tokens

    def score(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]:
        total = cycle.prompt_tokens
        out: list[float] = []
        for r in candidates:
            matched = cycle.matched_tokens(r)
            ok = total > 0 and matched >= max(1, self._min)
            out.append(matched / total * min(1.0, matched / self._full) if ok else 0.0)
        return out


def factory(params: Params, services: Services) -> PrefixAffinityScorer:
    return PrefixAffinityScorer(params)
