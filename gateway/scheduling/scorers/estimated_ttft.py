"""`estimated-ttft`: seconds to the first token, and the decode load the request joins.

    cost(r) = ttft(r) + join(r)     (`gateway.scheduling.decode`, `Cycle.cost_s`)

`ttft` counts the prefill queued on r and this request's uncached tokens
there, in chunks that share each step's token budget with r's running
decodes, each step slowed by those decodes; `join` is what the running
decodes add to the request's own output tokens. Without decode load this is
`(queued prefill + uncached tokens) / prefill rate`.

The replica with the least estimate scores 1, the others `(best + s) / (t + s)`
where `s = smoothing_tokens / mean rate` keeps tiny differences from mattering.
This one scorer already trades cache affinity against load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gateway.scheduling.interfaces import Services, ratio_to_best

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle

TYPE = "estimated-ttft"


@dataclass(frozen=True, slots=True)
class Params:
    smoothing_tokens: float = 8192.0

    def __post_init__(self) -> None:
        if not self.smoothing_tokens > 0:
            raise ValueError(f"smoothing_tokens must be > 0, got {self.smoothing_tokens}")


class EstimatedTTFTScorer:
    kind: ClassVar[str] = "scorer"

    def __init__(self, params: Params) -> None:
        self._smoothing = params.smoothing_tokens

    def score(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]:
        if not candidates:
            return []
        estimates = [cycle.cost_s(r) for r in candidates]
        mean_rate = sum(cycle.load(r).prefill_rate for r in candidates) / len(candidates)
        return ratio_to_best(estimates, self._smoothing / mean_rate)


def factory(params: Params, services: Services) -> EstimatedTTFTScorer:
    return EstimatedTTFTScorer(params)
