"""Several gateway processes sharing one Redis behave as one gateway.

Each test runs real `gateway serve` processes (tests/fleet.py) in front of
the same simulated vLLM replicas and a real `redis-server` of its own
(tests/redisserver.py), and hits them concurrently over loopback.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import xxhash

from gateway.ingress.protocol import parse_request
from gateway.scheduling.conversation import opening
from gateway.sim import SimCluster, SimConfig
from tests.fleet import GatewayProcess
from tests.redisserver import RedisServer, redis_server

pytestmark = pytest.mark.redis

SPEED = 25.0
KV_TOKENS = 8192
AGENT_POLICY = """\
name: agent
match: {tasks: [agent]}
session: {max_requests: 4, idle_ttl_s: 600}
"""
DEFAULT_POLICY = "name: default\n"


def words(n: int, seed: int) -> str:
    """~n simulator tokens."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out, x = [], seed * 7919 + 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(letters[x % 26] + letters[(x // 26) % 26] + letters[(x // 676) % 26])
    return " ".join(out)


def chat(n_prompt: int, n_out: int, seed: int) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": words(n_prompt, seed)}],
        "max_tokens": n_out,
        "ignore_eos": True,
    }


def sim_config() -> SimConfig:
    return SimConfig(speed=SPEED, kv_tokens=KV_TOKENS, max_model_len=KV_TOKENS)


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    d = tmp_path / "policies"
    d.mkdir()
    (d / "default.yaml").write_text(DEFAULT_POLICY)
    (d / "agent.yaml").write_text(AGENT_POLICY)
    return d


def config(
    sims: SimCluster, redis_url: str, policies: Path, *, on_failure: str = "open", **extra: Any
) -> dict[str, Any]:
    return {
        "replicas": [
            {"name": f"sim-{i}", "url": url, "kind": "vllm"} for i, url in enumerate(sims.urls)
        ],
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1, "healthy_after": 1},
        "admission": {"poll_interval_s": 0.05, "stale_after_s": 1.0},
        "policies": str(policies),
        "state": {
            "backend": "redis",
            "redis": {
                "url": redis_url,
                "lease_ttl_s": 1.0,
                "probe_interval_s": 0.2,
                "command_timeout_s": 0.25,
                "on_failure": on_failure,
            },
        },
        **extra,
    }


@contextmanager
def fleet(
    n_sims: int, tmp_path: Path, policies: Path, n_gateways: int = 2, **kw: Any
) -> Iterator[tuple[SimCluster, RedisServer, list[GatewayProcess]]]:
    with ExitStack() as stack:
        sims = stack.enter_context(
            SimCluster(
                [SimConfig(speed=SPEED, kv_tokens=KV_TOKENS, max_model_len=KV_TOKENS)] * n_sims
            )
        )
        server = stack.enter_context(redis_server())
        cfg = config(sims, server.url, policies, **kw)
        gws = [
            stack.enter_context(GatewayProcess(cfg, tmp_path, name=f"gw{i}"))
            for i in range(n_gateways)
        ]
        yield sims, server, gws


def counter(client: redis.Redis, key: str) -> int:
    """A counter of the Redis store as the gateway sees it: base + live entries."""
    base, live = client.hmget("gw:" + key, "b", "l")
    return int(base or 0) + int(live or 0)


async def post_all(
    requests: list[tuple[GatewayProcess, dict[str, Any], dict[str, str]]], timeout: float = 60.0
) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=timeout) as client:
        return list(
            await asyncio.gather(
                *(
                    client.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
                    for gw, body, headers in requests
                )
            )
        )


def test_leases_on_a_replica_never_exceed_its_capacity(tmp_path: Path, policies: Path) -> None:
    with fleet(1, tmp_path, policies) as (sims, server, gws):
        client = redis.Redis(port=server.port)
        peak, stop = [0], threading.Event()

        def sample() -> None:
            for _ in range(200_000):
                if stop.is_set():
                    return
                peak[0] = max(peak[0], counter(client, "adm:{sim-0}:kv"))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # 24 requests x ~1700 KV tokens, half through each instance: ~5x what fits.
        reqs = [(gws[i % 2], chat(1500, 200, seed=i), {}) for i in range(24)]
        try:
            answers = asyncio.run(post_all(reqs, timeout=120.0))
        finally:
            stop.set()
            sampler.join(10)
        assert [r.status_code for r in answers].count(200) == 24
        assert KV_TOKENS / 3 < peak[0] <= KV_TOKENS  # contended, never over
        assert sims.stats(0, records=False)["totals"]["preemptions"] == 0
        assert counter(client, "adm:{sim-0}:kv") == 0  # all released


def test_a_tenants_tokens_per_minute_hold_across_instances(tmp_path: Path, policies: Path) -> None:
    auth = {
        "enabled": True,
        "isolation_secret": "an-isolation-secret-for-tests",
        "keys": [{"tenant": "acme", "key": "sk-acme"}],
        "tenants": {"acme": {"tokens_per_min": 3000}},
    }
    with fleet(1, tmp_path, policies, auth=auth) as (_sims, _server, gws):
        headers = {"Authorization": "Bearer sk-acme"}
        # ~300 tokens each (100 in, 200 out): the limit holds ~10 of them a minute.
        reqs = [(gws[i % 2], chat(100, 200, seed=i), headers) for i in range(30)]
        answers: list[httpx.Response] = []
        for start in range(0, len(reqs), 6):
            answers += asyncio.run(post_all(reqs[start : start + 6]))
        ok = [r for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code == 429]
        assert len(ok) + len(refused) == len(answers)
        assert refused and all(
            r.headers["x-gateway-reject-reason"] == "tenant_tokens_per_min" for r in refused
        )
        used = sum(r.json()["usage"]["total_tokens"] for r in ok)
        worst = max(int(r.headers["x-gateway-input-tokens"]) + 200 for r in ok)
        assert used <= 3000 + worst


def test_a_session_budget_is_never_overshot(tmp_path: Path, policies: Path) -> None:
    with fleet(2, tmp_path, policies) as (_sims, _server, gws):
        headers = {"X-Task": "agent", "X-Session-Id": "chain-1"}
        reqs = [(gws[i % 2], chat(50, 20, seed=i), headers) for i in range(12)]
        answers = asyncio.run(post_all(reqs))
        codes = sorted(r.status_code for r in answers)
        assert codes.count(200) == 4, codes
        assert codes.count(429) == 8
        assert {r.headers["x-gateway-reject-reason"] for r in answers if r.status_code == 429} == {
            "session_requests"
        }


def test_a_sessions_turns_stay_on_one_replica_whichever_instance_gets_them(
    tmp_path: Path, policies: Path
) -> None:
    with fleet(3, tmp_path, policies) as (_sims, _server, gws), httpx.Client(timeout=30) as client:
        for s in range(4):
            seen = set()
            for turn in range(6):
                gw = gws[turn % 2]
                r = client.post(
                    gw.url + "/v1/chat/completions",
                    json=chat(20, 5, seed=100 * s + turn),
                    headers={"X-Session-Id": f"conversation-{s}"},
                )
                assert r.status_code == 200, r.text
                seen.add(r.headers["x-gateway-replica"])
            assert len(seen) == 1, (s, seen)


def test_instances_follow_the_shared_session_map(tmp_path: Path, policies: Path) -> None:
    """Where the store says a session lives is where every instance sends it
    (here another instance "moved" it: the map is rewritten under them)."""
    with fleet(3, tmp_path, policies) as (_sims, server, gws), httpx.Client(timeout=30) as client:
        headers = {"X-Session-Id": "moved-session"}
        url = "/v1/chat/completions"
        first = client.post(gws[0].url + url, json=chat(20, 5, seed=1), headers=headers)
        key = "gw:aff:{" + xxhash.xxh3_128_hexdigest(b"moved-session") + "}"
        store = redis.Redis(port=server.port)
        assert store.get(key) == first.headers["x-gateway-replica"].encode()
        elsewhere = next(f"sim-{i}" for i in range(3) if f"sim-{i}" != store.get(key).decode())
        store.set(key, elsewhere, px=60_000)
        for turn, gw in enumerate([gws[1], gws[0], gws[1]]):
            r = client.post(gw.url + url, json=chat(20, 5, seed=2 + turn), headers=headers)
            assert r.headers["x-gateway-replica"] == elsewhere


def test_a_conversation_without_a_session_header_follows_the_shared_map(
    tmp_path: Path, policies: Path
) -> None:
    """A chat's implicit session key (its opening's hash) goes through the
    shared map like a client's: the later turns of a short conversation go
    where the map says, whichever instance gets them."""
    with fleet(3, tmp_path, policies) as (_sims, server, gws), httpx.Client(timeout=30) as client:
        url = "/v1/chat/completions"
        messages: list[dict[str, str]] = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is a prefix cache?"},
        ]
        body: dict[str, Any] = {"model": "sim-model", "max_tokens": 5, "ignore_eos": True}
        first = client.post(gws[0].url + url, json={**body, "messages": messages})
        assert first.status_code == 200, first.text
        chat_open = opening(
            parse_request("chat", json.dumps({**body, "messages": messages}).encode())
        )
        assert chat_open is not None
        key = "gw:aff:{" + xxhash.xxh3_128_hexdigest(chat_open.key.encode()) + "}"
        store = redis.Redis(port=server.port)
        assert store.get(key) == first.headers["x-gateway-replica"].encode()
        elsewhere = next(f"sim-{i}" for i in range(3) if f"sim-{i}" != store.get(key).decode())
        store.set(key, elsewhere, px=60_000)  # as if another instance had moved it
        for turn, gw in enumerate([gws[1], gws[0], gws[1]]):
            messages += [
                {"role": "assistant", "content": f"answer {turn}"},
                {"role": "user", "content": f"follow-up {turn}"},
            ]
            r = client.post(gw.url + url, json={**body, "messages": messages})
            assert r.status_code == 200, r.text
            assert r.headers["x-gateway-replica"] == elsewhere, turn


def test_a_killed_instances_leases_expire_and_the_other_keeps_serving(
    tmp_path: Path, policies: Path
) -> None:
    with fleet(1, tmp_path, policies) as (_sims, server, gws):
        client = redis.Redis(port=server.port)
        doomed, survivor = gws

        async def long_streams() -> None:
            async with httpx.AsyncClient(timeout=60.0) as http:
                body = {**chat(500, 1500, seed=1), "stream": True}

                async def one() -> None:
                    try:
                        async with http.stream(
                            "POST", doomed.url + "/v1/chat/completions", json=body
                        ) as r:
                            async for _ in r.aiter_bytes():
                                pass
                    except httpx.HTTPError:
                        pass  # the instance is killed under it

                tasks = [asyncio.create_task(one()) for _ in range(3)]
                for _ in range(500):
                    if counter(client, "adm:{sim-0}:kv") >= 3 * 2000:
                        break
                    await asyncio.sleep(0.01)
                assert counter(client, "adm:{sim-0}:kv") >= 3 * 2000
                doomed.kill()
                await asyncio.gather(*tasks)

        asyncio.run(long_streams())
        # lease_ttl_s is 1 s: the dead instance's leases lapse, nobody released them.
        end = time.monotonic() + 10.0
        while counter(client, "adm:{sim-0}:kv") and time.monotonic() < end:
            time.sleep(0.05)
        assert counter(client, "adm:{sim-0}:kv") == 0
        r = httpx.post(survivor.url + "/v1/chat/completions", json=chat(50, 10, seed=2), timeout=30)
        assert r.status_code == 200, r.text


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_redis_outage_open_keeps_serving_and_recovers(tmp_path: Path, policies: Path) -> None:
    with (
        fleet(1, tmp_path, policies, n_gateways=1) as (_sims, server, [gw]),
        httpx.Client(timeout=30.0) as client,
    ):

        def ask(seed: int) -> httpx.Response:
            return client.post(gw.url + "/v1/chat/completions", json=chat(30, 5, seed=seed))

        assert ask(1).status_code == 200
        server.stop()
        t0 = time.monotonic()
        answers = [ask(i) for i in range(2, 8)]
        assert [r.status_code for r in answers] == [200] * 6
        assert time.monotonic() - t0 < 10.0  # nobody waited on the dead server for long
        assert _metric(gw.metrics_text(), "gateway_state_store_up") == 0
        server.start()
        end = time.monotonic() + 10.0
        while _metric(gw.metrics_text(), "gateway_state_store_up") != 1:
            assert time.monotonic() < end, "did not recover"
            time.sleep(0.1)
        assert ask(9).status_code == 200


def test_redis_outage_closed_answers_503_fast(tmp_path: Path, policies: Path) -> None:
    with (
        fleet(1, tmp_path, policies, n_gateways=1, on_failure="closed") as (
            _sims,
            server,
            [gw],
        ),
        httpx.Client(timeout=30.0) as client,
    ):
        url = gw.url + "/v1/chat/completions"
        assert client.post(url, json=chat(30, 5, seed=1)).status_code == 200
        server.stop()
        for i in range(5):
            t0 = time.monotonic()
            r = client.post(url, json=chat(30, 5, seed=2 + i))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "state_unavailable"
            assert r.headers["x-gateway-reject-reason"] == "state_unavailable"
            assert "retry-after" in r.headers
            assert time.monotonic() - t0 < 2.0
        server.start()
        end = time.monotonic() + 10.0
        while client.post(url, json=chat(30, 5, seed=50)).status_code != 200:
            assert time.monotonic() < end, "did not recover"
            time.sleep(0.1)


@pytest.mark.parametrize("on_failure", ["open", "closed"])
def test_startup_without_redis_behaves_as_configured(
    tmp_path: Path, policies: Path, on_failure: str
) -> None:
    with ExitStack() as stack:
        sims = stack.enter_context(SimCluster([sim_config()]))
        server = stack.enter_context(redis_server())
        url = server.url
        server.stop()  # a port nobody listens on
        cfg = config(sims, url, policies, on_failure=on_failure)
        gw = GatewayProcess(cfg, tmp_path)
        stack.callback(gw.stop)
        gw.start(wait_ready=False)
        ready = httpx.get(gw.url + "/readyz", timeout=5.0)
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat(30, 5, seed=1), timeout=30.0)
        if on_failure == "open":
            end = time.monotonic() + 10.0
            while httpx.get(gw.url + "/readyz", timeout=5.0).status_code != 200:
                assert time.monotonic() < end
                time.sleep(0.1)
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat(30, 5, seed=1), timeout=30)
            assert r.status_code == 200, r.text
        else:
            assert ready.status_code == 503
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "state_unavailable"
