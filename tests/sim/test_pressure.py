"""Overcommitting memory: preemptions in vLLM, deferrals in llama.cpp."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import TIMEOUT, chat, long_text, records, totals, wait_until


async def _fire(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        return await asyncio.gather(*(client.post(url, json=b) for b in bodies))


def _metric(client: httpx.Client, url: str, name: str) -> float:
    for family in text_string_to_metric_families(client.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


def test_vllm_preempts_when_blocks_run_out(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    cluster = make_cluster(flavor="vllm", kv_tokens=2048, max_model_len=1024, speed=200.0)
    bodies = [chat(long_text(60, f"u{i}"), max_tokens=300, ignore_eos=True) for i in range(8)]
    responses = asyncio.run(_fire(cluster.urls[0] + "/v1/chat/completions", bodies))
    assert all(r.status_code == 200 for r in responses)
    assert all(r.json()["usage"]["completion_tokens"] == 300 for r in responses)
    t = totals(cluster)
    assert t["preemptions"] > 0
    assert t["kv_blocks_pinned"] == 0 and t["running"] == 0
    assert sum(r["preemptions"] for r in records(cluster)) == t["preemptions"]
    text = client.get(cluster.urls[0] + "/metrics").text
    assert (
        f'vllm:num_preemptions_total{{engine="0",model_name="sim-model"}} {t["preemptions"]}.0'
        in text
    )


def test_vllm_respects_max_num_seqs(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="vllm", max_num_seqs=2, speed=50.0)
    u = cluster.urls[0]
    bodies = [chat(f"q{i}", max_tokens=100, ignore_eos=True) for i in range(5)]
    seen: list[tuple[float, float]] = []

    async def run() -> list[httpx.Response]:
        task = asyncio.ensure_future(_fire(u + "/v1/chat/completions", bodies))
        for _ in range(200):
            if task.done():
                break
            await asyncio.sleep(0.005)
            seen.append(
                (
                    _metric(client, u, "vllm:num_requests_running"),
                    _metric(client, u, "vllm:num_requests_waiting"),
                )
            )
        return await task

    asyncio.run(run())
    assert max(r for r, _ in seen) == 2
    assert max(w for _, w in seen) >= 1


def test_llamacpp_defers_when_all_slots_busy(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    cluster = make_cluster(flavor="llamacpp", kv_tokens=8192, parallel=2, speed=50.0)
    u = cluster.urls[0]
    bodies = [chat(f"q{i}", max_tokens=200, ignore_eos=True) for i in range(5)]
    seen: list[float] = []

    async def run() -> list[httpx.Response]:
        task = asyncio.ensure_future(_fire(u + "/v1/chat/completions", bodies))
        for _ in range(400):
            if task.done():
                break
            await asyncio.sleep(0.005)
            seen.append(_metric(client, u, "llamacpp:requests_deferred"))
        return await task

    responses = asyncio.run(run())
    assert all(r.json()["usage"]["completion_tokens"] == 200 for r in responses)
    assert max(seen) >= 1
    t = totals(cluster)
    assert t["deferrals"] == 3
    assert sum(1 for r in records(cluster) if r["deferred"]) == 3
    assert t["preemptions"] == 0


def test_llamacpp_pinned_slot_defers_even_with_idle_slots(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(flavor="llamacpp", kv_tokens=8192, parallel=4, speed=50.0)
    bodies = [chat(f"q{i}", max_tokens=50, ignore_eos=True, id_slot=1) for i in range(3)]
    asyncio.run(_fire(cluster.urls[0] + "/v1/chat/completions", bodies))
    recs = records(cluster)
    assert {r["slot"] for r in recs} == {1}
    assert totals(cluster)["deferrals"] == 2


def test_llamacpp_unified_pool_evicts_idle_caches(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    cluster = make_cluster(flavor="llamacpp", kv_tokens=2048, parallel=2, unified_kv=True)
    u = cluster.urls[0] + "/v1/chat/completions"
    for i in range(3):
        r = client.post(u, json=chat(long_text(300, f"p{i}"), max_tokens=10))
        assert r.status_code == 200
    wait_until(lambda: totals(cluster)["kv_tokens_used"] <= 2048)
