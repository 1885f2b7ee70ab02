"""Routing through a real gateway in front of 3-4 simulated replicas.

Where each request went is read from the `x-gateway-replica` response header;
prefix hits from the simulator's own counters (`/sim/stats`)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.config.scheduling import SchedulingConfig
from gateway.config.schema import AdmissionConfig, ReplicaConfig
from gateway.sim.cluster import SimCluster
from tests.gwharness import RunningGateway, running_gateway

SYSTEM = "You are a meticulous coding agent working in a large repository. " * 60


def wait_healthy(gw: RunningGateway, n: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sum(1 for r in gw.replicas() if r["healthy"]) == n:
            return
        time.sleep(0.05)
    raise AssertionError(f"replicas never became healthy: {gw.replicas()}")


def names_by_url(gw: RunningGateway) -> dict[str, str]:
    return {r["url"]: r["name"] for r in gw.replicas()}


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with SimCluster.start(4, speed=40, kv_tokens=131072, max_model_len=65536) as c:
        yield c


@pytest.fixture
def gw(cluster: SimCluster) -> Iterator[RunningGateway]:
    cluster.reset()
    for i in range(4):
        cluster.set_fault(i, clear=True)
    with running_gateway(cluster.urls) as g:
        wait_healthy(g, 4)
        yield g


def chat(gw: RunningGateway, content: str, session: str | None = None, **kw: Any) -> str:
    headers = {"x-session-id": session} if session else {}
    raw = gw.openai().chat.completions.with_raw_response.create(
        model="sim-model",
        messages=[{"role": "user", "content": content}],
        max_tokens=4,
        extra_headers=headers,
        **kw,
    )
    raw.parse()
    replica = raw.headers.get("x-gateway-replica")
    assert replica
    return replica


def hits(cluster: SimCluster) -> list[int]:
    return [cluster.stats(i)["totals"]["prefix_hits_tokens"] for i in range(len(cluster.urls))]


def test_session_turns_stay_on_one_replica_and_hit_the_cache(
    gw: RunningGateway, cluster: SimCluster
) -> None:
    history = SYSTEM
    seen = []
    for turn in range(6):
        history += f"\nassistant: calling a tool ({turn})\ntool: " + f"output line {turn} " * 150
        seen.append(chat(gw, history, session="agent-7"))
    assert len(set(seen)) == 1
    total_hits = sum(hits(cluster))
    prompt = sum(cluster.stats(i)["totals"]["prompt_tokens"] for i in range(4))
    assert total_hits > 0.6 * prompt  # every turn after the first reuses the previous one


def test_fifty_sessions_spread_over_all_replicas(gw: RunningGateway) -> None:
    placed = Counter(
        chat(gw, SYSTEM + f"task number {s}: fix the bug", session=f"s-{s}") for s in range(50)
    )
    assert len(placed) == 4
    assert max(placed.values()) <= 1.5 * 50 / 4


def test_giant_shared_prefix_under_load_is_not_a_hot_spot(cluster: SimCluster) -> None:
    """Routing alone (admission off, which would also divert) must spread the burst."""
    giant = "shared context that every request carries " * 1500  # ~16k tokens
    cluster.reset()
    with running_gateway(cluster.urls, admission=AdmissionConfig(enabled=False)) as gw:
        wait_healthy(gw, 4)
        chat(gw, giant + " warm-up")  # one replica now holds the prefix
        placed = Counter(asyncio.run(_burst(gw, giant, 32)))
    assert len(placed) >= 3, placed
    assert max(placed.values()) <= 0.6 * 32, placed


async def _burst(gw: RunningGateway, giant: str, n: int) -> list[str]:
    client = gw.async_openai()

    async def one(i: int) -> str:
        raw = await client.chat.completions.with_raw_response.create(
            model="sim-model",
            max_tokens=64,
            messages=[{"role": "user", "content": giant + f" question {i}"}],
        )
        return str(raw.headers["x-gateway-replica"])

    async with client:
        return list(await asyncio.gather(*(one(i) for i in range(n))))


def test_unhealthy_replica_sessions_move_elsewhere(gw: RunningGateway, cluster: SimCluster) -> None:
    history = SYSTEM + "first turn " * 200
    home = chat(gw, history, session="mover")
    index = list(names_by_url(gw).values()).index(home)
    cluster.set_fault(index, health_status=503)
    end = time.monotonic() + 20
    while time.monotonic() < end and any(r["healthy"] for r in gw.replicas() if r["name"] == home):
        time.sleep(0.05)
    moved = [chat(gw, history + f" turn {t}" * 50, session="mover") for t in range(3)]
    assert home not in moved
    assert len(set(moved)) == 1  # and it stays on its new replica


def test_llamacpp_session_keeps_replica_and_slot() -> None:
    with SimCluster.start(3, flavor="llamacpp", speed=40, kv_tokens=65536, parallel=4) as c:
        configs = [ReplicaConfig(url=u, kind="llamacpp") for u in c.urls]
        with running_gateway(configs, scheduling=SchedulingConfig(llamacpp_slots=4)) as g:
            wait_healthy(g, 3)
            history = SYSTEM
            seen = []
            for turn in range(4):
                history += f" tool output {turn} " * 100
                seen.append(chat(g, history, session="llama-agent"))
                chat(g, f"unrelated request {turn} " * 20, session=f"other-{turn}")
            assert len(set(seen)) == 1
            index = [r["name"] for r in g.replicas()].index(seen[0])
            mine = [
                r for r in c.stats(index)["requests"] if r["prompt_tokens"] > 1000
            ]  # the agent's turns
            assert len(mine) == 4
            assert len({r["slot"] for r in mine}) == 1
            assert all(r["body"].get("id_slot") == r["slot"] for r in mine)
            assert all(r["cached_tokens"] > 0 for r in mine[1:])
