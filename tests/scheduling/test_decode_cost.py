"""Decode-aware cost, the decode hot-spot guard, bounded placement of new
sessions, spreading ties and implicit session keys (pure logic)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.scheduling import DecodeConfig, HotspotConfig, SchedulingConfig
from gateway.ingress.protocol import parse_request
from gateway.replicas.livestate import LiveState
from gateway.scheduling.conversation import opening
from gateway.scheduling.decode import DecodeLoad, cost_s, crowded, step_work
from gateway.scheduling.router import SchedulingRouter
from tests.scheduling.test_scheduling import SYSTEM, ctx_for, replicas, route, router

CFG = DecodeConfig()


def test_cost_formula_by_hand() -> None:
    load = DecodeLoad(running=10, attended_tokens=100_000, step_budget=8192, max_seqs=256)
    d = 10 * 5.0 + 100_000 * 0.0008  # 130 prefill-token equivalents per step
    assert step_work(load, CFG) == pytest.approx(d)
    # 20k tokens of prefill in chunks of 8182: 3 steps, each slowed by d; then 256 outputs
    expected = (20_000 + 3 * d + 256 * d) / 10_000
    assert cost_s(load, CFG, 20_000, 256, 10_000.0) == pytest.approx(expected)
    assert cost_s(DecodeLoad(), CFG, 20_000, 256, 10_000.0) == pytest.approx(2.0)  # idle: P / R
    full = load._replace(max_seqs=10)  # no free sequence: half an output of steps first
    assert cost_s(full, CFG, 0, 256, 10_000.0) == pytest.approx((d + 128 * d + 256 * d) / 10_000)


@given(
    running=st.integers(0, 300),
    attended=st.integers(0, 10**7),
    prefill=st.integers(0, 10**6),
    extra=st.integers(1, 50),
)
def test_cost_grows_with_every_decode_input(
    running: int, attended: int, prefill: int, extra: int
) -> None:
    base = DecodeLoad(running=running, attended_tokens=attended)
    c = cost_s(base, CFG, prefill, 256, 10_000.0)
    assert cost_s(base._replace(running=running + extra), CFG, prefill, 256, 1e4) > c
    assert cost_s(base._replace(attended_tokens=attended + extra), CFG, prefill, 256, 1e4) > c
    assert cost_s(base, CFG, prefill + extra, 256, 10_000.0) > c


def test_running_decodes_lose_an_otherwise_equal_race() -> None:
    """Same prefix everywhere (none), same queue: the replica streaming 12 long
    answers ranks last, the idle one first."""
    r, cands = router(), replicas(3)
    cands[0].ledger.live = LiveState(engine_running=12, used_tokens=12 * 30_000)
    cands[1].ledger.live = LiveState(engine_running=2, used_tokens=2 * 30_000)
    cands[2].ledger.live = LiveState(engine_running=0, used_tokens=0)
    for i in range(5):
        ranked = r.rank(ctx_for(f"a fresh prompt {i} " * 100), cands).replicas
        assert [x.name for x in ranked] == ["r2", "r1", "r0"]


def test_decode_hot_spot_loses_affinity() -> None:
    """The replica that cached the prompt but runs far more decode work than
    the others is hot: the next turn goes elsewhere."""
    r, cands = router(), replicas(3)
    base = SYSTEM + "history " * 2000  # completions: no session, only the hot guard acts
    owner = route(r, ctx_for_completion(base), [cands[0]])
    owner.ledger.live = LiveState(
        engine_running=60, used_tokens=60 * 25_000, capacity_tokens=10**7
    )  # d = 300 + 1200 > 1024
    assert isinstance(r, SchedulingRouter)
    cycle = r.cycle(ctx_for_completion(base + " next"), cands)
    assert cycle.hot == {owner.name}
    assert r.rank(ctx_for_completion(base + " next"), cands).replicas[0] is not owner


def test_thresholds_are_configurable() -> None:
    r = router(hotspot=HotspotConfig(decode_tokens=10_000.0))  # d = 1500 stays below
    cands = replicas(3)
    cands[0].ledger.live = LiveState(
        engine_running=60, used_tokens=60 * 25_000, capacity_tokens=10**7
    )
    assert isinstance(r, SchedulingRouter)
    assert r.cycle(ctx_for_completion("x " * 100), cands).hot == frozenset()


def test_crowded_is_bounded_load() -> None:
    def loads(*seqs: int) -> list[tuple[str, DecodeLoad]]:
        return [(f"r{i}", DecodeLoad(sequences=n)) for i, n in enumerate(seqs)]

    assert crowded(loads(1, 0, 0), 1.15) == {"r0"}  # bound ceil(1.15 * 2 / 3) = 1
    assert crowded(loads(1, 1, 0), 1.15) == frozenset()  # bound 2
    assert crowded(loads(2, 2, 0), 1.15) == {"r0", "r1"}
    assert crowded(loads(5, 5, 5), 1.15) == frozenset()
    assert crowded(loads(9), 1.15) == frozenset()  # nothing to compare with


def test_new_sessions_sharing_a_cached_system_prompt_spread() -> None:
    """Every session's first turn carries the same long system prompt, cached
    on the first session's replica; sessions keep running (their decodes stay
    outstanding), so new ones go where fewer sequences run."""
    r, cands = router(), replicas(3)
    counts = {x.name: 0 for x in cands}
    for s in range(12):
        ctx = ctx_for(SYSTEM + f" task {s}", f"agent-{s}")
        chosen = route(r, ctx, cands)
        ctx.exchange = _started()
        counts[chosen.name] += 1
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def _started() -> Any:
    from gateway.request.context import Exchange

    return Exchange(sent_at=0.0, phase="streaming", first_byte_at=0.0)


def test_equal_cost_requests_without_a_session_spread() -> None:
    """Ties are broken by request id, never by a prefix they all share."""
    r, cands = router(), replicas(3)
    firsts = set()
    for i in range(30):
        ctx = ctx_for_completion(SYSTEM)
        ctx.request_id = f"req-{i}"
        firsts.add(r.rank(ctx, cands).replicas[0].name)
    assert firsts == {"r0", "r1", "r2"}


def ctx_for_completion(prompt: str) -> Any:
    ctx = ctx_for("unused")
    from gateway.request.context import Parsed
    from gateway.request.parsed import ClientDeadlines

    raw = json.dumps({"model": "m", "prompt": prompt}).encode()
    ctx.endpoint = "completions"
    ctx.parsed = Parsed(parse_request("completions", raw), None, ClientDeadlines())
    return ctx


def _chat(messages: list[dict[str, Any]], **body: Any) -> Any:
    raw = json.dumps({"model": "m", "messages": messages, **body}).encode()
    return parse_request("chat", raw)


def implicit_session_key(req: Any) -> str | None:
    found = opening(req)
    return found.key if found is not None else None


def test_implicit_session_key_follows_a_conversation() -> None:
    sys_msg = {"role": "system", "content": "You are helpful."}
    turn1 = [sys_msg, {"role": "user", "content": "hi, I am Ann"}]
    turn3 = [
        *turn1,
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "sure"},
        {"role": "user", "content": "thanks"},
    ]
    other = [sys_msg, {"role": "user", "content": "hi, I am Bob"}]
    key = implicit_session_key(_chat(turn1))
    assert key is not None and key.startswith("conv:")
    assert implicit_session_key(_chat(turn3)) == key
    assert implicit_session_key(_chat(other)) != key
    assert implicit_session_key(_chat(turn1, cache_salt="tenant-b")) != key
    assert implicit_session_key(_chat([sys_msg])) is None  # no user message yet
    assert implicit_session_key(ctx_for_completion("x").request) is None
    found = opening(_chat(turn3))
    assert found is not None and found.shared_bytes == len("<|system|>\x1fYou are helpful.\x1f")
    assert opening(_chat(turn1[1:])) == (implicit_session_key(_chat(turn1[1:])), 0, False)
    assert found.follow_up


def test_short_chat_follows_its_first_turn_and_can_be_turned_off() -> None:
    cands = replicas(3)
    r = router()
    opening = [{"role": "user", "content": "What is a monad?"}]
    first = route(r, ctx_for_messages(opening, "t1"), cands)
    for turn in range(2, 6):
        for x in cands:  # the first turn's replica is now the busiest
            x.ledger.live = LiveState(engine_running=3 if x is first else 0)
        follow = [*opening, {"role": "assistant", "content": "a"}, {"role": "user", "content": "?"}]
        assert route(r, ctx_for_messages(follow, f"t{turn}"), cands) is first

    off = router(implicit_sessions=False)
    assert isinstance(off, SchedulingRouter)
    assert off.session_key(ctx_for_messages(opening, "x")) is None


def ctx_for_messages(messages: list[dict[str, Any]], request_id: str) -> Any:
    ctx = ctx_for("unused")
    from gateway.request.context import Parsed
    from gateway.request.parsed import ClientDeadlines

    ctx.request_id = request_id
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    ctx.parsed = Parsed(parse_request("chat", raw), None, ClientDeadlines())
    return ctx


def test_decode_config_is_validated_with_its_path() -> None:
    from gateway.config.decode import ConfigError, decode
    from gateway.config.schema import GatewayConfig

    for bad, where in (
        ({"decode": {"max_num_seqs": 0}}, "scheduling.decode"),
        ({"decode": {"kv_cost_tokens": -1}}, "scheduling.decode"),
        ({"decode": {"bogus": 1}}, "scheduling.decode.bogus"),
        ({"implicit_sessions": "yes"}, "scheduling.implicit_sessions"),
        ({"hotspot": {"decode_ratio": 0.5}}, "scheduling.hotspot"),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            decode(GatewayConfig, {"scheduling": bad})
    assert SchedulingConfig().decode == DecodeConfig()


def test_identical_first_turns_spread_by_load() -> None:
    """The same opening sent by many clients at once is not one conversation:
    first turns never follow the implicit key, so they spread."""
    r, cands = router(), replicas(3)
    opening_only = [{"role": "user", "content": "What is the capital of France?"}]
    placed = []
    for i in range(6):
        ctx = ctx_for_messages(opening_only, f"same-{i}")
        placed.append(route(r, ctx, cands).name)
        ctx.exchange = _started()  # still streaming
    assert len(set(placed)) == 3, placed
