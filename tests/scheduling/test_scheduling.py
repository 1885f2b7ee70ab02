"""Scheduling framework, pure logic: config validation, score bounds, pickers,
baselines, hot spots, session placement and llama.cpp slot pinning."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from starlette.datastructures import Headers

from gateway.config.decode import ConfigError, decode
from gateway.config.scheduling import SchedulingConfig
from gateway.config.schema import GatewayConfig, ReplicaConfig
from gateway.ingress.protocol import parse_request
from gateway.replicas.registry import Replica
from gateway.request.context import Parsed, RequestContext
from gateway.request.parsed import ClientDeadlines
from gateway.scheduling.interfaces import clamp01
from gateway.scheduling.registry import REGISTRY
from gateway.scheduling.router import Router, SchedulingRouter, build_router
from tests.ctxkit import make_ctx


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replicas(n: int, kind: str = "vllm") -> list[Replica]:
    out = []
    for i in range(n):
        r = Replica(ReplicaConfig(url=f"http://127.0.0.1:{9000 + i}", name=f"r{i}", kind=kind))  # type: ignore[arg-type]
        r.health.healthy = True
        out.append(r)
    return out


def ctx_for(text: str, session: str | None = None, **body: Any) -> RequestContext:
    raw = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": text}], **body}
    ).encode()
    ctx = RequestContext(
        request_id="x",
        endpoint="chat",
        path="/v1/chat/completions",
        headers=Headers({}),
        received_at=0.0,
    )
    ctx.parsed = Parsed(parse_request("chat", raw), session, ClientDeadlines())
    return ctx


def router(policy: str = "default", clock: Clock | None = None, **kw: Any) -> Router:
    cfg = SchedulingConfig(policy=policy, **kw)
    return build_router(
        cfg, registry=CollectorRegistry(), clock=clock or Clock(), rng=random.Random(1)
    )


def route(r: Router, ctx: RequestContext, cands: list[Replica]) -> Replica:
    ranking = r.rank(ctx, cands)
    ctx.replica = ranking.replicas[0]
    r.on_routed(ctx, ranking, ranking.replicas[0])
    return ranking.replicas[0]


# --- config validation -----------------------------------------------------


def decode_errors(sched: dict[str, Any]) -> str:
    # Decoding checks the scalars, building the router the plugin specs.
    with pytest.raises(ConfigError) as info:
        cfg = decode(GatewayConfig, {"scheduling": sched}).scheduling
        build_router(cfg, registry=CollectorRegistry())
    return str(info.value)


def test_default_config_is_valid_and_uses_default_profile() -> None:
    cfg = decode(GatewayConfig, {"scheduling": {}}).scheduling
    assert cfg.policy == "default"
    assert isinstance(build_router(cfg, registry=CollectorRegistry()), SchedulingRouter)


@pytest.mark.parametrize(
    ("sched", "expected"),
    [
        (
            {
                "plugins": [{"name": "x", "type": "nope"}],
                "profiles": [{"name": "p", "picker": "x"}],
                "policy": "p",
            },
            "plugins[0].type: unknown plugin type 'nope'",
        ),
        (
            {
                "plugins": [{"name": "x", "type": "max-score"}, {"name": "x", "type": "healthy"}],
                "profiles": [{"name": "p", "picker": "x"}],
                "policy": "p",
            },
            "plugins[1].name: duplicate plugin name 'x'",
        ),
        (
            {
                "profiles": [{"name": "p", "picker": "max-score", "filters": ["healthy", "ghost"]}],
                "policy": "p",
            },
            "profiles[0].filters[1]: no plugin named 'ghost' is defined",
        ),
        (
            {
                "profiles": [
                    {"name": "p", "picker": "max-score", "scorers": [{"plugin": "least-load"}]}
                ],
                "policy": "p",
            },
            "scheduling.profiles[0].scorers[0].weight: required key is missing",
        ),
        (
            {"profiles": [{"name": "p", "picker": "least-load"}], "policy": "p"},
            "profiles[0].picker: plugin 'least-load' is a scorer, expected a picker",
        ),
        (
            {
                "profiles": [
                    {"name": "p", "picker": "max-score"},
                    {"name": "p", "picker": "max-score"},
                ],
                "policy": "p",
            },
            "profiles[1].name: duplicate profile name 'p'",
        ),
        (
            {
                "plugins": [
                    {
                        "name": "t",
                        "type": "estimated-ttft",
                        "parameters": {"smoothing_tokens": "big"},
                    }
                ]
            },
            "plugins[0].parameters.smoothing_tokens: expected a number",
        ),
        (
            {"plugins": [{"name": "t", "type": "estimated-ttft", "parameters": {"bogus": 1}}]},
            "plugins[0].parameters.bogus: unknown key",
        ),
        ({"policy": "fastest"}, "policy: unknown profile or baseline 'fastest'"),
        ({"block_bytes": 0}, "block_bytes: must be > 0"),
        ({"hotspot": {"kv_fraction": 2.0}}, "scheduling.hotspot.kv_fraction: must be in (0, 1]"),
    ],
)
def test_config_errors_name_the_key_path(sched: dict[str, Any], expected: str) -> None:
    assert expected in decode_errors(sched)


def test_every_registered_plugin_builds_with_default_parameters() -> None:
    plugins = [{"name": name, "type": name} for name in REGISTRY]
    scorers = [{"plugin": n, "weight": 1.0} for n, t in REGISTRY.items() if t.kind == "scorer"]
    filters = [n for n, t in REGISTRY.items() if t.kind == "filter"]
    for picker in (n for n, t in REGISTRY.items() if t.kind == "picker"):
        cfg = decode(
            SchedulingConfig,
            {
                "plugins": plugins,
                "policy": "p",
                "profiles": [
                    {"name": "p", "picker": picker, "filters": filters, "scorers": scorers}
                ],
            },
        )
        r = build_router(cfg, registry=CollectorRegistry(), rng=random.Random(0))
        cands = replicas(3)
        assert set(map(id, r.rank(ctx_for("hi"), cands).replicas)) == set(map(id, cands))


# --- invariants ---------------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(0, 50), st.booleans()), min_size=1, max_size=6),
    st.text(max_size=3000),
    st.sampled_from([None, "s1", "s2"]),
    st.sampled_from(["default", "round-robin", "least-load", "session-hash"]),
)
@settings(max_examples=60, deadline=None)
def test_scores_bounded_and_pick_is_a_filtered_candidate(
    loads: list[tuple[int, bool]], text: str, session: str | None, policy: str
) -> None:
    cands = replicas(len(loads))
    for r, (inflight, healthy) in zip(cands, loads, strict=True):
        r.ledger.in_flight = inflight
        r.health.healthy = healthy
    rt = router(policy)
    ctx = ctx_for(text or "x", session)
    ranking = rt.rank(ctx, cands)
    ranked = ranking.replicas
    assert len(ranked) == len({id(x) for x in ranked})
    assert all(x in cands for x in ranked)
    if policy == "default":
        assert ranked == [] or all(x.healthy for x in ranked)
        assert isinstance(rt, SchedulingRouter)
        cycle = ranking.cycle or rt.cycle(ctx, ranked)  # a lone healthy replica: no cycle
        for scorer in rt.profile.scorers:
            assert all(0.0 <= clamp01(v) <= 1.0 for v in scorer.named.plugin.score(cycle, ranked))
        kept = [x for x in cands if x.healthy]
        assert {id(x) for x in ranked} == {id(x) for x in kept}


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_clamp01(value: float) -> None:
    assert 0.0 <= clamp01(value) <= 1.0


# --- behaviour ------------------------------------------------------------------

SYSTEM = "You are a careful coding agent. " * 200  # ~6 KB shared prefix


def test_session_turns_follow_the_prefix_index() -> None:
    r, cands = router(), replicas(4)
    history = SYSTEM
    first = route(r, ctx_for(history, "agent-1"), cands)
    for turn in range(5):
        history += f" tool result {turn} " * 300
        for x in cands:
            x.ledger.in_flight = 0
        assert route(r, ctx_for(history, None), cands) is first  # no session key: prefix alone


def test_longer_match_wins_over_a_shared_system_prompt() -> None:
    r, cands = router(), replicas(3)
    a = SYSTEM + "conversation A " * 500
    b = SYSTEM + "conversation B " * 500
    ra = route(r, ctx_for(a), [cands[0]])
    rb = route(r, ctx_for(b), [cands[1]])
    assert (ra, rb) == (cands[0], cands[1])
    assert r.rank(ctx_for(b + " more"), cands).replicas[0] is cands[1]
    assert r.rank(ctx_for(a + " more"), cands).replicas[0] is cands[0]


def test_hot_replica_loses_affinity() -> None:
    clock = Clock()
    r, cands = router(clock=clock, default_prefill_rate=10000.0), replicas(3)
    base = SYSTEM + "history " * 2000
    owner = route(r, ctx_for(base), [cands[0]])
    # pile up prefill work on the owner: many requests that have not started yet
    for i in range(12):
        route(r, ctx_for(f"{i} other work " * 20000), [owner])
    ranked = r.rank(ctx_for(base + " next"), cands).replicas
    assert isinstance(r, SchedulingRouter)
    assert ranked[0] is not owner


def test_new_sessions_spread_with_bounded_load() -> None:
    r, cands = router(), replicas(4)
    counts = {x.name: 0 for x in cands}
    for s in range(80):
        counts[route(r, ctx_for(f"hello {s}", f"session-{s}"), cands).name] += 1
    assert max(counts.values()) <= 1.3 * 80 / 4


def test_ties_agree_across_gateways() -> None:
    cands = replicas(4)
    for s in range(20):
        picks = {
            router().rank(ctx_for("same prompt", f"s{s}"), cands).replicas[0].name for _ in range(3)
        }
        assert len(picks) == 1


def test_baselines() -> None:
    cands = replicas(3)
    rr = router("round-robin")
    assert [route(rr, ctx_for("x"), cands).name for _ in range(4)] == ["r0", "r1", "r2", "r0"]
    ll = router("least-load")
    cands[0].ledger.in_flight, cands[1].ledger.in_flight, cands[2].ledger.in_flight = 3, 1, 2
    assert ll.rank(ctx_for("x"), cands).replicas[0] is cands[1]
    sh = router("session-hash")
    picks = {sh.rank(ctx_for("x", "sess"), cands).replicas[0].name for _ in range(5)}
    assert len(picks) == 1


def test_llamacpp_slot_pinning() -> None:
    r = router(llamacpp_slots=2)
    [replica] = replicas(1, kind="llamacpp")
    first = ctx_for("turn 1", "s-a")
    route(r, first, [replica])
    assert first.routing.pinned_slot == 0 and first.routing.pinned_field == "id_slot"
    other = ctx_for("other", "s-b")
    route(r, other, [replica])
    assert other.routing.pinned_slot == 1
    busy = ctx_for("turn 2", "s-a")  # slot 0 still busy with turn 1: engine chooses
    route(r, busy, [replica])
    assert busy.routing.pinned_slot is None
    first.finished_at = busy.finished_at = 1.0
    again = ctx_for("turn 3", "s-a")
    route(r, again, [replica])
    assert again.routing.pinned_slot == 0
    own = ctx_for("turn 4", "s-a", id_slot=1)
    route(r, own, [replica])
    assert own.routing.pinned_slot is None  # the client's own id_slot stands
    assert own.request is not None and own.request.body["id_slot"] == 1


def test_one_fast_looking_replica_does_not_attract_all_work() -> None:
    """Regression: a measured rate next to defaults (20x apart) made one replica win
    every request while its queue grew without bound; rates are bounded around the median."""
    from gateway.replicas.livestate import LiveState  # the admission stage's published state

    r, cands = router(), replicas(4)
    cands[0].ledger.live = LiveState(prefill_backlog_tokens=100_000, prefill_tokens_per_s=160_000.0)
    for other in cands[1:]:
        other.ledger.live = LiveState(prefill_backlog_tokens=0, prefill_tokens_per_s=8000.0)
    assert r.rank(ctx_for("a new prompt " * 2000), cands).replicas[0] is not cands[0]


def test_engine_state_is_read_through_the_adapter() -> None:
    from gateway.replicas.livestate import LiveState
    from gateway.scheduling.engine_view import engine_view

    [rep] = replicas(1)
    rep.ledger.live = LiveState(
        capacity_tokens=1000,
        used_tokens=300,
        leased_tokens=500,
        prefill_backlog_tokens=70,
        engine_waiting=3,
        prefill_tokens_per_s=1234.0,
    )
    view = engine_view(rep)
    assert (
        view.capacity_tokens,
        view.used_tokens,
        view.backlog_tokens,
        view.waiting,
        view.prefill_rate,
    ) == (1000, 500, 70, 3, 1234.0)
    rep.ledger.live = None
    assert engine_view(rep).backlog_tokens is None


_OPT_INT = st.none() | st.integers(min_value=-5, max_value=10**9)


@given(
    cap=_OPT_INT,
    used=_OPT_INT,
    leased=st.integers(min_value=0, max_value=10**9),
    backlog=st.integers(min_value=-5, max_value=10**9),
    waiting=_OPT_INT,
    rate=st.floats(min_value=-1.0, max_value=1e7, allow_nan=False),
    config_cap=st.none() | st.integers(min_value=1, max_value=10**9),
)
def test_engine_view_keeps_known_values_and_says_unknown_otherwise(
    cap: int | None,
    used: int | None,
    leased: int,
    backlog: int,
    waiting: int | None,
    rate: float,
    config_cap: int | None,
) -> None:
    from gateway.replicas.livestate import LiveState
    from gateway.scheduling.engine_view import capacity_tokens, engine_view

    replica = Replica(ReplicaConfig(url="http://127.0.0.1:1", capacity_tokens=config_cap))
    live = replica.ledger.live = LiveState(
        capacity_tokens=cap,
        used_tokens=used,
        leased_tokens=leased,
        prefill_backlog_tokens=backlog,
        engine_waiting=waiting,
        prefill_tokens_per_s=rate,
    )
    view = engine_view(replica)
    assert view.capacity_tokens == (cap if cap is not None and cap >= 0 else config_cap)
    assert capacity_tokens(replica) == view.capacity_tokens
    assert (
        view.used_tokens == live.kv_used_tokens
    )  # the larger of ledger and metrics, never negative
    assert view.backlog_tokens == (backlog if backlog >= 0 else None)
    assert view.waiting == (waiting if waiting is not None and waiting >= 0 else None)
    assert view.prefill_rate == (rate if rate > 0 else None)


def test_a_lone_replica_learns_the_same_as_a_ranked_cycle() -> None:
    """Routing skips scoring for a lone healthy replica; what on_routed records is unchanged."""

    def routed_twice(lone: bool) -> list[tuple[int, int]]:
        rt = router("default")
        assert isinstance(rt, SchedulingRouter)
        cands = replicas(1)
        out = []
        for _ in range(2):
            ctx = ctx_for("A long shared system prompt. " * 200, None)
            ranking = rt.rank(ctx, cands)
            if not lone:
                ranking.cycle = rt.cycle(ctx, cands)
            ctx.replica = ranking.replicas[0]
            rt.on_routed(ctx, ranking, ranking.replicas[0])
            routed = rt._tracker.outstanding(ranking.replicas[0].name)[-1]
            out.append((routed.kv_tokens, routed.uncached_tokens))
        return out

    lone, cycled = routed_twice(True), routed_twice(False)
    assert lone == cycled
    assert lone[1][1] < lone[0][1]  # the second identical prompt is expected cached


@pytest.mark.parametrize("n", [1, 3])
def test_admission_reserves_prefill_only_for_what_the_index_expects_uncached(n: int) -> None:
    """`rank` tells admission (`ctx.cached_tokens`) how much of the prompt the
    chosen replica's prefix index holds; the prefill claim is the rest."""
    from gateway.admission.demand import DemandEstimator
    from gateway.config.schema import AdmissionConfig

    rt = router("default")
    assert isinstance(rt, SchedulingRouter)
    cands = replicas(n)
    estimator = DemandEstimator(AdmissionConfig())
    first = make_ctx(text="A long shared system prompt. " * 200, prompt=1500)
    chosen = route(rt, first, cands)
    assert first.routing.cached_tokens == {}  # nothing routed before: nothing expected cached
    assert estimator.demand(first, chosen.name).prefill_tokens == 1500
    again = make_ctx(text="A long shared system prompt. " * 200, prompt=1500)
    ranked = rt.rank(again, cands).replicas
    assert ranked[0] is chosen
    cached = again.routing.cached_tokens[chosen.name]
    assert 1000 < cached <= 1500
    assert estimator.demand(again, chosen.name).prefill_tokens == 1500 - cached
    assert all(again.routing.cached_tokens.get(r.name, 0) == 0 for r in cands if r is not chosen)
    short = ctx_for("hi", None)
    rt.rank(short, cands)
    assert short.routing.cached_tokens == {}


def test_finished_requests_do_not_accumulate_on_a_lone_replica() -> None:
    """A lone replica is ranked without reading the tracker; finished entries must still go."""
    rt = router("default")
    assert isinstance(rt, SchedulingRouter)
    cands = replicas(1)
    for _ in range(2000):
        ctx = ctx_for("hello there")
        ranking = rt.rank(ctx, cands)
        ctx.replica = ranking.replicas[0]
        rt.on_routed(ctx, ranking, ranking.replicas[0])
        ctx.finished_at = 1.0
    assert len(rt._tracker._routed["r0"]) <= 128
