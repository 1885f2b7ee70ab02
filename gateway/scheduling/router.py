"""Routing: rank the eligible replicas for a request.

The pipeline only sees the `Router` protocol. `build_router` returns a
baseline router or a `SchedulingRouter` running the configured profile
(filters → weighted scorers → picker) over facts computed once per request
(`Cycle`): prefix blocks matched against each replica's prefix index, load
in token units (engine view and our own bookkeeping, the larger of the two),
hot spots and the session's target replica.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gateway.config.decode import decode, to_plain
from gateway.config.scheduling import SchedulingConfig
from gateway.ingress.protocol import prompt_parts
from gateway.request.context import PrefixBlocks, RequestContext
from gateway.scheduling.baselines import LeastLoadRouter, RoundRobinRouter, SessionHashRouter
from gateway.scheduling.conversation import opening
from gateway.scheduling.cycle import (
    Cycle,
    HotThresholds,
    Load,
    Ranking,
    Threshold,
    find_hot,
    indexed_tokens,
)
from gateway.scheduling.decode import DecodeLoad
from gateway.scheduling.engine_view import capacity_tokens, engine_view, max_seqs
from gateway.scheduling.feedback import learn
from gateway.scheduling.hashing import bounded_load_choice
from gateway.scheduling.interfaces import AdmitCheck, Filter, Picker, Scorer, Services
from gateway.scheduling.metrics import SchedulingMetrics
from gateway.scheduling.prefix import PrefixIndex, prefix_blocks, seed_of
from gateway.scheduling.profile import Profile, WeightedScorer, named
from gateway.scheduling.registry import REGISTRY
from gateway.scheduling.slots import SlotPinner
from gateway.scheduling.tracker import Routed, Tracker
from gateway.scheduling.validate import validate

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.replicas.registry import Replica

log = logging.getLogger("gateway.scheduling")


class Router(Protocol):
    def rank(self, ctx: RequestContext, candidates: list[Replica]) -> Ranking:
        """Candidates in order of preference (best first); never adds replicas."""
        ...

    def on_routed(self, ctx: RequestContext, ranking: Ranking, replica: Replica) -> None:
        """Learn from the final decision (e.g. the prefix index)."""
        ...

    def on_answered(self, ctx: RequestContext, replica: Replica) -> None:
        """Learn from the engine's answer (its reported cache hits)."""
        ...

    def forget_replica(self, name: str) -> None:
        """Drop what is kept about a replica that left the set."""
        ...

    def session_replica(self, key: str) -> str | None:
        """Where this instance last routed the session (None: not remembered)."""
        ...

    def session_count(self) -> int:
        """Sessions this instance remembers a replica for."""
        ...

    def session_key(self, ctx: RequestContext) -> str | None:
        """The session key routing follows: the client's, else an implicit one (or None)."""
        ...


class SchedulingRouter:
    def __init__(
        self,
        cfg: SchedulingConfig,
        profile: Profile,
        services: Services,
        metrics: SchedulingMetrics,
    ) -> None:
        self._cfg = cfg
        self.profile = profile
        self._services = services
        self._tracker = services.tracker
        self._metrics = metrics
        self._slots = SlotPinner(cfg.llamacpp_slots)
        self._indexes: dict[str, PrefixIndex] = {}
        h = cfg.hotspot
        self._hot = HotThresholds(
            Threshold(h.backlog_tokens, h.backlog_ratio),
            Threshold(h.in_flight, h.in_flight_ratio),
            Threshold(h.kv_fraction, h.kv_ratio),
            Threshold(h.decode_tokens, h.decode_ratio),
        )

    def rank(self, ctx: RequestContext, candidates: list[Replica]) -> Ranking:
        """Also sets `ctx.routing.cached_tokens`: the prompt tokens the prefix
        index expects cached on each candidate, which admission subtracts from
        the prefill work it reserves."""
        if len(candidates) == 1 and candidates[0].healthy:
            # Nothing to choose (the filters keep a lone healthy replica, the
            # picker orders one): only its expected cache hit is computed.
            lone = candidates[0]
            matched = self._indexed(ctx, lone)
            ctx.routing.cached_tokens = {lone.name: matched} if matched else {}
            return Ranking(list(candidates), lone_match=(lone.name, matched))
        cycle = self.cycle(ctx, candidates)
        ctx.routing.cached_tokens = {
            r.name: n for r in candidates if (n := cycle.indexed_tokens(r))
        }
        return Ranking(self.profile.run(cycle, list(candidates)), cycle)

    def _indexed(self, ctx: RequestContext, replica: Replica) -> int:
        """Tokens of the prompt the replica's prefix index holds (0 for a prompt
        shorter than one block: nothing to look up)."""
        blocks = self.blocks(ctx)
        if not blocks.hashes:
            return 0
        index = self.index(replica, capacity_tokens(replica))
        return indexed_tokens(
            index.matched_blocks(blocks.hashes), self.prompt_tokens(ctx, blocks), blocks
        )

    def on_routed(self, ctx: RequestContext, ranking: Ranking, replica: Replica) -> None:
        cycle = ranking.cycle
        blocks = self.blocks(ctx)
        if cycle is not None:
            prompt_tokens = cycle.prompt_tokens
            matched = cycle.indexed_tokens(replica) if replica.name in cycle.matched_blocks else 0
        else:  # ranked without a cycle (a lone replica): what `rank` found, if for this replica
            prompt_tokens = self.prompt_tokens(ctx, blocks)
            lone = ranking.lone_match
            matched = (
                lone[1]
                if lone is not None and lone[0] == replica.name
                else self._indexed(ctx, replica)
            )
        if blocks.hashes:  # a prompt shorter than one block has nothing to index
            index = self.index(replica, capacity_tokens(replica))
            ctx.routing.index_stamps = index.insert(blocks.hashes)
        key = self.session_key(ctx)
        slot = self._slots.apply(ctx, replica, self._tracker, key)
        kv = prompt_tokens + (ctx.output_limit or 0) * ctx.choices
        routed = Routed(ctx, replica.name, kv, prompt_tokens - matched, slot, prompt_tokens)
        self._tracker.add(routed)
        if key:
            self._tracker.remember_session(key, replica.name)
        decisions, prompt, hits = self._metrics.routed_to(self.profile.name, replica.name)
        decisions.inc()
        prompt.inc(prompt_tokens)
        hits.inc(matched)

    def on_answered(self, ctx: RequestContext, replica: Replica) -> None:
        """The engine's reported cache hits correct the replica's index (`feedback.py`)."""
        blocks = ctx.routing.prefix
        if blocks is not None:
            estimate = self.prompt_tokens(ctx, blocks)
            learn(self._indexes.get(replica.name), ctx, replica.name, estimate, self._metrics)

    def forget_replica(self, name: str) -> None:
        self._indexes.pop(name, None)
        self._slots.forget(name)
        self._tracker.forget_replica(name)
        self._metrics.forget_replica(name)

    def session_replica(self, key: str) -> str | None:
        return self._tracker.session_replica(key)

    def session_count(self) -> int:
        return self._tracker.session_count()

    def index(self, replica: Replica, capacity_tokens: int | None) -> PrefixIndex:
        cfg = self._cfg
        capacity = capacity_tokens or cfg.default_capacity_tokens
        blocks = int(capacity * cfg.chars_per_token / cfg.block_bytes)
        index = self._indexes.get(replica.name)
        if index is None:
            index = PrefixIndex(blocks, cfg.index_ttl_s, self._services.clock)
            self._indexes[replica.name] = index
        elif index.capacity_blocks != max(1, blocks):
            index.resize(blocks)
        return index

    def cycle(self, ctx: RequestContext, candidates: list[Replica]) -> Cycle:
        blocks = self.blocks(ctx)
        prompt_tokens = self.prompt_tokens(ctx, blocks)
        loads = bound_rates({r.name: self._load(r) for r in candidates}, self._cfg.max_rate_spread)
        matched = {
            r.name: self.index(r, loads[r.name].capacity_tokens).matched_blocks(blocks.hashes)
            for r in candidates
        }
        decode = self._cfg.decode
        key = self.session_key(ctx)
        cycle = Cycle(
            ctx,
            blocks,
            prompt_tokens,
            loads,
            matched,
            find_hot(list(loads.items()), self._hot, decode),
            # Equal costs spread: never a tie key that many requests share (a prefix).
            tie_key=key or ctx.request_id,
            session_key=key,
            decode_cfg=decode,
            output_tokens=min(ctx.output_limit or decode.output_tokens, decode.output_tokens),
        )
        explicit = bool(ctx.session_key)
        if explicit or blocks.follow_up:  # an implicit key: later turns follow it
            cycle.session_target = self._session_target(
                key, candidates, ctx.routing.session_replica, place_new=explicit
            )
        if key and self._is_new(key, ctx):
            cycle.hot |= cycle.crowded_for_new_session(self._cfg.session_load_factor)
        return cycle

    def _is_new(self, key: str, ctx: RequestContext) -> bool:
        return ctx.routing.session_replica is None and self._tracker.session_replica(key) is None

    def session_key(self, ctx: RequestContext) -> str | None:
        """The client's session key, else (`implicit_sessions`) the conversation's."""
        return ctx.session_key or self.blocks(ctx).conversation

    def prompt_tokens(self, ctx: RequestContext, blocks: PrefixBlocks) -> int:
        return max(0, ctx.prompt_tokens or round(blocks.prompt_bytes / self._cfg.chars_per_token))

    def blocks(self, ctx: RequestContext) -> PrefixBlocks:
        if ctx.routing.prefix is not None:
            return ctx.routing.prefix
        req = ctx.request
        assert req is not None
        model, salt = ctx.model, ctx.cache_salt
        blocks = prefix_blocks(prompt_parts(req), model, salt, self._cfg.block_bytes)
        chat = opening(req, seed_of(model, salt))
        if chat is not None:
            implicit = self._cfg.implicit_sessions and not ctx.session_key
            key = chat.key if implicit else None
            blocks = blocks._replace(
                conversation=key, shared_bytes=chat.shared_bytes, follow_up=chat.follow_up
            )
        ctx.routing.prefix = blocks
        return blocks

    def _load(self, replica: Replica) -> Load:
        view = engine_view(replica)
        name = replica.name
        prefilling, backlog, decoding, attended = self._tracker.loads(name)
        kv_used = max(view.used_tokens or 0, self._tracker.kv_tokens(name))
        return Load(
            in_flight=replica.in_flight,
            waiting=max(view.waiting or 0, prefilling),
            backlog_tokens=max(view.backlog_tokens or 0, backlog),
            kv_used_tokens=kv_used,
            capacity_tokens=view.capacity_tokens or self._cfg.default_capacity_tokens,
            prefill_rate=view.prefill_rate or self._cfg.default_prefill_rate,
            engine=view,
            decode=DecodeLoad(
                running=max(view.running or 0, decoding),
                # the engine's KV in use is what its running sequences attend to
                attended_tokens=max(view.engine_used_tokens or 0, attended),
                step_budget=self._cfg.decode.max_num_batched_tokens,
                max_seqs=max_seqs(replica, view, self._cfg),
                sequences=max((view.running or 0) + (view.waiting or 0), prefilling + decoding),
            ),
        )

    def _session_target(
        self,
        key: str | None,
        candidates: list[Replica],
        shared: str | None = None,
        place_new: bool = True,
    ) -> str | None:
        """The session's replica: where the shared store (several instances) or
        this instance last sent it, else a bounded-load hash of its key. An
        implicit key (`place_new` false) is only followed: a conversation's
        first turn goes where its cost is least (a prompt that is one growing
        user message gets a new key every turn, and the prefix index leads it);
        `cycle` asks only for a later turn's."""
        if not key or not candidates:
            return None
        known = shared or self._tracker.session_replica(key)
        if known is not None and any(r.name == known for r in candidates):
            return known
        if not place_new:
            return None
        counts = self._tracker.session_counts()
        loads = [float(counts.get(r.name, 0)) for r in candidates]
        return bounded_load_choice(key, candidates, loads, self._cfg.session_load_factor).name


def bound_rates(loads: dict[str, Load], spread: float) -> dict[str, Load]:
    """Keep each replica's prefill rate within `spread`× of the candidates' median.

    A rate measured on one replica next to the configured default on the
    others (or a noisy reading) would otherwise make that replica look
    several times faster and attract every request."""
    rates = sorted(load.prefill_rate for load in loads.values())
    if len(rates) < 2:
        return loads
    median = rates[len(rates) // 2]
    lo, hi = median / spread, median * spread
    return {
        name: load
        if lo <= load.prefill_rate <= hi
        else dataclasses.replace(load, prefill_rate=min(hi, max(lo, load.prefill_rate)))
        for name, load in loads.items()
    }


def build_profile(
    cfg: SchedulingConfig, name: str, services: Services, metrics: SchedulingMetrics
) -> Profile:
    specs = {p.name: p for p in cfg.effective_plugins()}
    built: dict[str, object] = {}

    def plugin(ref: str) -> object:
        if ref not in built:
            spec = specs[ref]
            ptype = REGISTRY[spec.type]
            built[ref] = ptype.factory(
                decode(ptype.params, spec.parameters, f"plugins.{ref}.parameters"), services
            )
        return built[ref]

    profile = next(p for p in cfg.effective_profiles() if p.name == name)
    filters = [named(metrics, f, "filter", _as_filter(plugin(f))) for f in profile.filters]
    scorers = [
        WeightedScorer(named(metrics, s.plugin, "scorer", _as_scorer(plugin(s.plugin))), s.weight)
        for s in profile.scorers
    ]
    picker = named(metrics, profile.picker, "picker", _as_picker(plugin(profile.picker)))
    return Profile(profile.name, filters, scorers, picker)


def _as_filter(p: object) -> Filter:
    assert hasattr(p, "filter")
    return p  # type: ignore[return-value]


def _as_scorer(p: object) -> Scorer:
    assert hasattr(p, "score")
    return p  # type: ignore[return-value]


def _as_picker(p: object) -> Picker:
    assert hasattr(p, "order")
    return p  # type: ignore[return-value]


def build_router(
    cfg: SchedulingConfig,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    can_admit: AdmitCheck | None = None,
) -> Router:
    """The router `cfg.policy` names; ConfigError if `cfg`'s plugin specs are invalid."""
    validate(cfg)
    if cfg.policy == "round-robin":
        return RoundRobinRouter()
    if cfg.policy == "least-load":
        return LeastLoadRouter()
    if cfg.policy == "session-hash":
        return SessionHashRouter(cfg.session_load_factor)
    metrics = SchedulingMetrics(registry)
    services = Services(
        clock=clock,
        rng=rng or random.Random(),
        tracker=Tracker(clock, cfg.index_ttl_s, cfg.max_sessions),
        can_admit=can_admit,
    )
    profile = build_profile(cfg, cfg.policy, services, metrics)
    log.info(
        "scheduling policy %s: %s",
        cfg.policy,
        to_plain(next(p for p in cfg.effective_profiles() if p.name == cfg.policy)),
    )
    return SchedulingRouter(cfg, profile, services, metrics)
