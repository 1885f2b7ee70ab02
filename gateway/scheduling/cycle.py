"""Per-request facts computed once and shared by every plugin of a profile:
prefix blocks, matched tokens per replica, load views (prefill and decode),
hot spots, the session's target replica and the tie-break key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.config.scheduling import DecodeConfig
from gateway.request.context import PrefixBlocks
from gateway.scheduling.decode import DecodeLoad, cost_s, crowded, step_work
from gateway.scheduling.engine_view import EngineView

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.request.context import RequestContext


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
    decode: DecodeLoad = DecodeLoad()

    @property
    def kv_fraction(self) -> float:
        return self.kv_used_tokens / self.capacity_tokens if self.capacity_tokens else 0.0


@dataclass(slots=True)
class Cycle:
    ctx: RequestContext  # quoted: see gateway/request/context.py
    blocks: PrefixBlocks
    prompt_tokens: int
    loads: dict[str, Load]
    matched_blocks: dict[str, int]
    hot: frozenset[str] = frozenset()
    session_target: str | None = None
    tie_key: str = ""
    #: the session key routing uses: the client's, else the implicit one (or None)
    session_key: str | None = None
    decode_cfg: DecodeConfig = DecodeConfig()
    #: this request's output counted in its decode cost (`DecodeConfig.output_tokens` at most)
    output_tokens: int = 0
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

    def crowded_for_new_session(self, factor: float) -> frozenset[str]:
        """Replicas running more than their share of sequences (`decode.crowded`)
        whose cached prefix of this prompt is only the shared opening (system
        prompt, tools): a new session loses affinity to them, as if hot. A
        match reaching into the conversation's own messages keeps it."""
        over = crowded(((name, load.decode) for name, load in self.loads.items()), factor)
        shared_blocks = self.blocks.shared_bytes // self.blocks.block_bytes + 1
        return frozenset(n for n in over if self.matched_blocks.get(n, 0) <= shared_blocks)

    def cost_s(self, replica: Replica) -> float:
        """Estimated seconds to the first token plus the delay the replica's
        running decodes add to this request's own (`gateway.scheduling.decode`)."""
        load = self.loads[replica.name]
        prefill = load.backlog_tokens + self.uncached_tokens(replica)
        return cost_s(load.decode, self.decode_cfg, prefill, self.output_tokens, load.prefill_rate)


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


@dataclass(frozen=True, slots=True)
class HotThresholds:
    backlog: Threshold
    in_flight: Threshold
    kv: Threshold
    #: decode work per step (`decode.step_work`, prefill-token equivalents)
    decode: Threshold


def find_hot(
    loads: Sequence[tuple[str, Load]], limits: HotThresholds, decode_cfg: DecodeConfig
) -> frozenset[str]:
    """Replicas whose queued prefill work, requests in flight, KV use or decode
    work per step is far above the others'. A hot replica loses cache and
    session affinity."""
    if len(loads) < 2:
        return frozenset()
    measures = (
        (limits.backlog, [float(load.backlog_tokens) for _, load in loads]),
        (limits.in_flight, [float(load.in_flight) for _, load in loads]),
        (limits.kv, [load.kv_fraction for _, load in loads]),
        (limits.decode, [step_work(load.decode, decode_cfg) for _, load in loads]),
    )
    hot: set[str] = set()
    for threshold, values in measures:
        total, others = sum(values), len(values) - 1
        for (name, _), value in zip(loads, values, strict=True):
            if value >= threshold.absolute and value >= threshold.ratio * (total - value) / others:
                hot.add(name)
    return frozenset(hot)
