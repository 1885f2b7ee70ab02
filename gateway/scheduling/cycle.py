"""Per-request facts computed once and shared by every plugin of a profile:
prefix blocks, matched tokens per replica, load views, hot spots, the
session's target replica and the tie-break key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.scheduling.engine_view import EngineView
from gateway.scheduling.prefix import PrefixBlocks

if TYPE_CHECKING:
    from gateway.pipeline.context import RequestContext
    from gateway.replicas.registry import Replica


def tokens_per_block(prompt_tokens: int, blocks: PrefixBlocks) -> float:
    if not blocks.prompt_bytes:
        return 0.0
    return prompt_tokens * blocks.block_bytes / blocks.prompt_bytes


def indexed_tokens(matched_blocks: int, prompt_tokens: int, blocks: PrefixBlocks) -> int:
    """Tokens of the prompt covered by `matched_blocks` leading blocks."""
    return min(prompt_tokens, round(matched_blocks * tokens_per_block(prompt_tokens, blocks)))


@dataclass(frozen=True, slots=True)
class Load:
    """One replica's load in token units (max of the engine's and our own view)."""

    in_flight: int
    waiting: int
    backlog_tokens: int
    kv_used_tokens: int
    capacity_tokens: int
    prefill_rate: float
    engine: EngineView

    @property
    def kv_fraction(self) -> float:
        return self.kv_used_tokens / self.capacity_tokens if self.capacity_tokens else 0.0


@dataclass(slots=True)
class Cycle:
    ctx: RequestContext  # quoted: see gateway/pipeline/context.py
    blocks: PrefixBlocks
    prompt_tokens: int
    loads: dict[str, Load]
    matched_blocks: dict[str, int]
    hot: frozenset[str] = frozenset()
    session_target: str | None = None
    tie_key: str = ""
    weight_total: float = 1.0
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def tokens_per_block(self) -> float:
        return tokens_per_block(self.prompt_tokens, self.blocks)

    def matched_tokens(self, replica: Replica) -> int:
        """Tokens expected cached on the replica; 0 on a hot replica (it lost affinity)."""
        if replica.name in self.hot:
            return 0
        return self.indexed_tokens(replica)

    def indexed_tokens(self, replica: Replica) -> int:
        """Tokens of the prompt the prefix index holds for the replica (hot or not)."""
        return indexed_tokens(
            self.matched_blocks.get(replica.name, 0), self.prompt_tokens, self.blocks
        )

    def uncached_tokens(self, replica: Replica) -> int:
        return self.prompt_tokens - self.matched_tokens(replica)

    def load(self, replica: Replica) -> Load:
        return self.loads[replica.name]


@dataclass(slots=True)
class Ranking:
    """A router's answer: the candidates best first, plus what it computed on
    the way, handed back to `Router.on_routed` once admission chose one."""

    replicas: list[Replica]
    cycle: Cycle | None = None
    #: (replica, indexed tokens) when one replica was ranked without a cycle
    lone_match: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Threshold:
    """Far above the others: at least `absolute` AND at least `ratio` × the others' mean."""

    absolute: float
    ratio: float


def find_hot(
    loads: Sequence[tuple[str, Load]], backlog: Threshold, in_flight: Threshold, kv: Threshold
) -> frozenset[str]:
    """Replicas whose queued prefill work, requests in flight or KV use is far
    above the others'. A hot replica loses cache and session affinity."""
    if len(loads) < 2:
        return frozenset()
    measures = (
        (backlog, [float(load.backlog_tokens) for _, load in loads]),
        (in_flight, [float(load.in_flight) for _, load in loads]),
        (kv, [load.kv_fraction for _, load in loads]),
    )
    hot: set[str] = set()
    for threshold, values in measures:
        total, others = sum(values), len(values) - 1
        for (name, _), value in zip(loads, values, strict=True):
            if value >= threshold.absolute and value >= threshold.ratio * (total - value) / others:
                hot.add(name)
    return frozenset(hot)
