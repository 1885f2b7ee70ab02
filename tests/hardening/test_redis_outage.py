"""Two gateway instances sharing a real `redis-server`, Redis killed and
restored while requests run on both: every request is answered, as
`state.redis.on_failure` says (`open`: served on in-process limits; `closed`:
503 `state_unavailable` with `Retry-After`), both instances admit again
within seconds of the restore, and afterwards no lease is left in Redis and
nothing is in flight on either instance.

Leases live 30 s here, longer than the test: a lease that was not released
stays visible instead of expiring before it is counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from gateway.sim import SimCluster
from tests.fleet import GatewayProcess
from tests.redisserver import RedisServer, redis_server
from tests.state.test_fleet import DEFAULT_POLICY, chat, config, counter, sim_config

pytestmark = pytest.mark.redis

WORKERS = 6  # per instance, each sending one request after another
LEASE_TTL_S = 30.0
KV_KEY = "adm:{sim-0}:kv"


@dataclass
class Answers:
    by_phase: dict[str, list[httpx.Response]] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    #: a refusal answered before Redis was killed (none may be)
    early_refusals: list[str] = field(default_factory=list)
    killed_at: float = float("inf")


@contextmanager
def two_instances(
    tmp_path: Path, on_failure: str
) -> Iterator[tuple[RedisServer, list[GatewayProcess]]]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text(DEFAULT_POLICY)
    with ExitStack() as stack:
        sims = stack.enter_context(SimCluster([sim_config()]))
        server = stack.enter_context(redis_server())
        cfg = config(sims, server.url, policies, on_failure=on_failure)
        cfg["state"]["redis"]["lease_ttl_s"] = LEASE_TTL_S
        gws = [stack.enter_context(GatewayProcess(cfg, tmp_path, name=f"gw{i}")) for i in range(2)]
        yield server, gws
        for gw in gws:
            assert "Traceback" not in gw.log()


async def load(urls: list[str], phase: list[str], answers: Answers) -> None:
    """Requests on every instance until `phase` says "done"; each answer is
    filed under the phase its request started in."""

    async def worker(client: httpx.AsyncClient, url: str, w: int) -> None:
        for i in range(10_000):
            started = phase[0]
            if started == "done":
                return
            try:
                r = await client.post(url + "/v1/chat/completions", json=chat(30, 20, seed=i + w))
            except httpx.TransportError as exc:
                answers.lost.append(f"{url} in {started}: {type(exc).__name__}")
                continue
            answers.by_phase.setdefault(started, []).append(r)
            if r.status_code != 200 and time.monotonic() < answers.killed_at:
                answers.early_refusals.append(f"{url} in {started}: {r.status_code} {r.text}")

    async with httpx.AsyncClient(timeout=30.0) as client:
        await asyncio.gather(*(worker(client, url, w) for url in urls for w in range(WORKERS)))


async def admits(client: httpx.AsyncClient, url: str, timeout_s: float) -> float:
    """Seconds until `url` serves a request again."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        r = await client.post(url + "/v1/chat/completions", json=chat(30, 5, seed=99))
        if r.status_code == 200:
            return time.monotonic() - t0
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not admit again within {timeout_s} s")


async def peak_lease(server: RedisServer, seconds: float) -> int:
    """The most KV tokens leased on the replica in Redis, sampled for `seconds`."""
    client, peak = redis.Redis(port=server.port), 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, counter(client, KV_KEY))
        await asyncio.sleep(0.02)
    return peak


async def scenario(
    server: RedisServer, gws: list[GatewayProcess]
) -> tuple[Answers, list[float], int]:
    answers, phase = Answers(), ["before"]
    task = asyncio.create_task(load([gw.url for gw in gws], phase, answers))
    try:
        await asyncio.sleep(1.0)
        answers.killed_at = time.monotonic()
        phase[0] = "outage"  # a request started before may still meet Redis down
        server.stop()
        await asyncio.sleep(2.0)
        server.start()
        phase[0] = "restored"
        async with httpx.AsyncClient(timeout=30.0) as client:
            recovery = [await admits(client, gw.url, 10.0) for gw in gws]
        phase[0] = "after"
        leased = await peak_lease(server, 1.0)
    finally:
        phase[0] = "done"
        await asyncio.wait_for(task, 60)
    return answers, recovery, leased


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.timeout(90)  # ~10 s a case on a quiet machine
@pytest.mark.parametrize("on_failure", ["open", "closed"])
def test_redis_killed_and_restored_under_two_busy_instances(
    tmp_path: Path, on_failure: str
) -> None:
    with two_instances(tmp_path, on_failure) as (server, gws):
        answers, recovery, leased = asyncio.run(scenario(server, gws))
        statuses = {p: sorted({r.status_code for r in rs}) for p, rs in answers.by_phase.items()}
        counts = {p: len(rs) for p, rs in answers.by_phase.items()}
        print(f"\n{on_failure}: {counts} {statuses} recovery {recovery} leased {leased}")
        assert answers.lost == []
        assert answers.early_refusals == []
        assert all(len(answers.by_phase.get(p, [])) > 10 for p in ("before", "outage", "after"))
        assert statuses["after"] == [200]
        refused = [r for rs in answers.by_phase.values() for r in rs if r.status_code != 200]
        if on_failure == "open":
            assert all(v == [200] for v in statuses.values()), statuses
        else:
            assert 503 in statuses["outage"], "closed mode refuses while Redis is down"
            for r in refused:
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "state_unavailable"
                assert float(r.headers["retry-after"]) > 0
        assert max(recovery) < 5.0, recovery
        # Nothing held: every lease taken in Redis was released, not left to expire.
        client = redis.Redis(port=server.port)
        assert leased > 0, "the instances lease in Redis again after the restore"
        keys = [k.decode()[3:] for k in client.scan_iter("gw:adm:*") if not k.endswith(b":e")]
        assert {k: counter(client, k) for k in keys} == dict.fromkeys(keys, 0)
        for gw in gws:
            text = gw.metrics_text()
            assert _metric(text, "gateway_in_flight_requests") == 0
            assert _metric(text, "gateway_state_store_up") == 1
            assert _metric(text, "gateway_state_store_fallbacks_total") >= 1  # it saw the outage
