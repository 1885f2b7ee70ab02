"""Admission end to end: a real gateway in front of simulated replicas (accelerated time)."""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from gateway.config.schema import AdmissionConfig, GatewayConfig
from gateway.sim.cluster import SimCluster
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, running_gateway

SPEED = 25.0


def adm(**kw: Any) -> AdmissionConfig:
    """Admission config polling fast enough for accelerated simulators."""
    return AdmissionConfig(**{"poll_interval_s": 0.05, "stale_after_s": 1.0, **kw})


def words(n: int, seed: int) -> str:
    """~n simulator tokens: n words of three letters (each ' abc' is one token)."""
    rng = random.Random(seed)
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=3)) for _ in range(n))


def chat(n_prompt: int, n_out: int, seed: int) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": words(n_prompt, seed)}],
        "max_tokens": n_out,
        "extra_body": {"ignore_eos": True},
    }


@contextmanager
def stack(
    n: int, admission: AdmissionConfig, **sim: Any
) -> Iterator[tuple[SimCluster, RunningGateway]]:
    sim.setdefault("speed", SPEED)
    with (
        SimCluster([SimConfig(**sim)] * n) as cluster,
        running_gateway(cluster.urls, admission=admission) as gw,
    ):
        wait_until(
            lambda: all(r["healthy"] and r["live"]["capacity_tokens"] for r in gw.replicas())
        )
        yield cluster, gw


def wait_until(pred: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def sim_request_ids(cluster: SimCluster, n: int) -> set[str]:
    return {r["x_request_id"] for i in range(n) for r in cluster.stats(i)["requests"]}


def ledgers_are_zero(gw: RunningGateway) -> bool:
    live = [r["live"] for r in gw.replicas()]
    return all(
        x["leased_tokens"] == 0 and x["prefill_backlog_tokens"] == 0 and x["in_flight"] == 0
        for x in live
    )


def queue_length(gw: RunningGateway) -> int:
    return sum(q["length"] for q in gw.admin("/admin/replicas")["admission"]["queue"].values())


async def _overload(gw: RunningGateway, n: int) -> list[str]:
    client = gw.async_openai(timeout=120.0)
    sem = asyncio.Semaphore(n)

    async def one(i: int) -> str:
        async with sem:
            try:
                await client.chat.completions.create(**chat(1500, 200, seed=i))
            except openai.APIStatusError as exc:
                return f"status {exc.status_code}"
            return "ok"

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


def run_overload(enabled: bool) -> tuple[list[str], int, dict[str, Any]]:
    # 2 replicas x 8192 KV tokens; 24 concurrent requests x ~1700 tokens ≈ 2.5x what fits.
    cfg = adm(enabled=enabled)
    with stack(2, cfg, kv_tokens=8192, max_model_len=8192) as (cluster, gw):
        results = asyncio.run(_overload(gw, 24))
        preemptions = sum(cluster.stats(i)["totals"]["preemptions"] for i in range(2))
        wait_until(lambda: ledgers_are_zero(gw))
        return results, preemptions, gw.admin("/admin/replicas")


@pytest.mark.slow
def test_overload_admission_prevents_preemption() -> None:
    _, off_preemptions, _ = run_overload(enabled=False)
    on_results, on_preemptions, admin = run_overload(enabled=True)
    assert off_preemptions > 0, "the overload must make the engines thrash without admission"
    assert on_preemptions == 0
    assert on_results == ["ok"] * 24  # every admitted request finishes (none rejected here)
    assert all(q["length"] == 0 for q in admin["admission"]["queue"].values())


def _hog(gw: RunningGateway) -> httpx.Client:
    """Start a long request that leases most of replica 0's KV; returns the client to close."""
    client = httpx.Client(timeout=60)
    body = {**chat(2000, 4000, seed=999)}
    body.update(body.pop("extra_body"))
    req = client.build_request(
        "POST", gw.url + "/v1/chat/completions", json={**body, "stream": True}
    )
    client.send(req, stream=True)
    return client


def test_deadline_while_queued_answers_promptly_and_never_dispatches() -> None:
    with stack(1, adm(), kv_tokens=8192, max_model_len=8192) as (cluster, gw):
        hog = _hog(gw)
        wait_until(lambda: gw.replicas()[0]["live"]["in_flight"] == 1)
        body = {**chat(2000, 500, seed=1)}
        body.update(body.pop("extra_body"))
        t0 = time.monotonic()
        resp = httpx.post(
            gw.url + "/v1/chat/completions",
            json=body,
            timeout=30,
            headers={"x-request-id": "late-1", "x-request-timeout": "1.0"},
        )
        elapsed = time.monotonic() - t0
        assert resp.status_code in (503, 504), resp.text
        assert resp.headers["x-gateway-reject-reason"] in (
            "deadline_exceeded",
            "deadline_unreachable",
        )
        assert elapsed < 1.0 + 0.5  # answered at (or before) the deadline, within a small bound
        assert "late-1" not in sim_request_ids(cluster, 1)
        assert queue_length(gw) == 0
        hog.close()
        wait_until(lambda: ledgers_are_zero(gw))


def test_disconnect_while_queued_leaves_queue_and_never_reaches_engine() -> None:
    with stack(1, adm(), kv_tokens=8192, max_model_len=8192) as (cluster, gw):
        hog = _hog(gw)
        wait_until(lambda: gw.replicas()[0]["live"]["in_flight"] == 1)
        body = {**chat(2000, 500, seed=2)}
        body.update(body.pop("extra_body"))

        async def go_away() -> None:
            async with httpx.AsyncClient(timeout=30) as c:
                task = asyncio.ensure_future(
                    c.post(
                        gw.url + "/v1/chat/completions",
                        json=body,
                        headers={"x-request-id": "gone-1"},
                    )
                )
                await asyncio.to_thread(wait_until, lambda: queue_length(gw) == 1)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        asyncio.run(go_away())
        wait_until(lambda: queue_length(gw) == 0, timeout=5)
        hog.close()
        wait_until(lambda: ledgers_are_zero(gw))
        time.sleep(0.2)
        assert "gone-1" not in sim_request_ids(cluster, 1)
        assert (
            'gateway_admission_rejected_total{priority="standard",reason="client_gone"} 1.0'
            in gw.metrics_text()
        )


def test_leases_never_leak_after_errors_disconnects_and_deadlines() -> None:
    with stack(2, adm(), kv_tokens=8192, max_model_len=8192) as (cluster, gw):
        cluster.set_fault(1, error_status=500, count=3)
        cluster.set_fault(0, die_after_tokens=5, count=2)

        async def mixed() -> None:
            async with httpx.AsyncClient(timeout=30) as c:

                async def one(i: int) -> None:
                    body = chat(1200, 300, seed=100 + i)
                    body.update(body.pop("extra_body"))
                    body["stream"] = i % 2 == 0
                    headers = {"x-request-timeout": "0.8"} if i % 5 == 0 else {}
                    call = c.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
                    if i % 4 == 1:  # the client gives up early
                        try:
                            await asyncio.wait_for(call, 0.3)
                        except TimeoutError:
                            return
                    else:
                        await call

                await asyncio.gather(*(one(i) for i in range(30)))

        asyncio.run(mixed())
        wait_until(lambda: ledgers_are_zero(gw))
        wait_until(lambda: queue_length(gw) == 0)
        text = gw.metrics_text()
        assert 'gateway_replica_kv_leased_tokens{replica="' in text
        assert "gateway_admission_admitted_total" in text


def test_admin_shows_capacity_from_both_engines() -> None:
    with (
        SimCluster(
            [
                SimConfig(speed=SPEED, kv_tokens=16384, max_model_len=8192),
                SimConfig(flavor="llamacpp", speed=SPEED, kv_tokens=16384, parallel=4),
            ]
        ) as cluster,
        running_gateway(cluster.urls, admission=adm()) as gw,
    ):
        wait_until(lambda: all(r["live"] and r["live"]["capacity_tokens"] for r in gw.replicas()))
        vllm, llama = gw.replicas()
        assert vllm["live"]["capacity_tokens"] == 16384
        assert llama["live"]["capacity_tokens"] == 16384 and llama["live"]["max_in_flight"] == 4
        assert vllm["live"]["healthy"] and not vllm["live"]["stale"]
        out = gw.openai().chat.completions.create(
            model="sim-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        assert out.choices[0].message.content
        assert isinstance(gw.gateway.config, GatewayConfig)


def test_interactive_admitted_before_a_queue_of_batch(tmp_path: Any) -> None:
    (tmp_path / "tasks.yaml").write_text(
        "- {name: chat, priority: interactive}\n- {name: bulk, priority: batch}\n"
    )
    sim = SimConfig(speed=SPEED, kv_tokens=8192, max_model_len=8192)
    cfg = adm(max_in_flight=1)
    with (
        SimCluster([sim]) as cluster,
        running_gateway(cluster.urls, admission=cfg, policies=str(tmp_path)) as gw,
    ):
        wait_until(
            lambda: all(r["healthy"] and r["live"]["capacity_tokens"] for r in gw.replicas())
        )

        async def scenario() -> None:
            async with httpx.AsyncClient(timeout=60) as c:

                def send(rid: str, task: str, n_out: int) -> asyncio.Future[httpx.Response]:
                    body = {
                        "model": "sim-model",
                        "max_tokens": n_out,
                        "ignore_eos": True,
                        "messages": [{"role": "user", "content": words(50, hash(rid) % 1000)}],
                    }
                    return asyncio.ensure_future(
                        c.post(
                            gw.url + "/v1/chat/completions",
                            json=body,
                            headers={"x-request-id": rid, "x-task": task},
                        )
                    )

                first = send("hold", "bulk", 300)  # occupies the only slot for a while
                await asyncio.to_thread(
                    wait_until, lambda: gw.replicas()[0]["live"]["in_flight"] == 1
                )
                batch = [send(f"b{i}", "bulk", 5) for i in range(4)]
                await asyncio.to_thread(wait_until, lambda: queue_length(gw) == 4)
                vip = send("vip", "chat", 5)
                await asyncio.to_thread(wait_until, lambda: queue_length(gw) == 5)
                results = await asyncio.gather(first, *batch, vip)
                assert [r.status_code for r in results] == [200] * 6

        asyncio.run(scenario())
        order = [
            r["x_request_id"]
            for r in sorted(cluster.stats(0)["requests"], key=lambda r: r["arrival"])
        ]
        assert order == ["hold", "vip", "b0", "b1", "b2", "b3"]


def test_replica_that_stops_answering_polls_is_stale_and_unhealthy() -> None:
    from gateway.config.schema import ReplicaConfig
    from gateway.http.serving import free_port

    dead = ReplicaConfig(
        url=f"http://127.0.0.1:{free_port()}", name="dead", kind="vllm", capacity_tokens=1000
    )
    with running_gateway([dead], admission=adm(stale_after_s=0.2)) as gw:
        wait_until(lambda: gw.replicas()[0]["live"]["healthy"] is False)
        live = gw.replicas()[0]["live"]
        assert live["stale"] and live["read_at"] is None and live["capacity_tokens"] == 1000
        assert 'gateway_replica_live_healthy{replica="dead"} 0.0' in gw.metrics_text()


def test_admission_config_is_strict() -> None:
    from gateway.config.decode import ConfigError
    from gateway.config.schema import parse_config

    cfg = parse_config({"admission": {"watermarks": {"batch": 0.5}}})
    assert cfg.admission.watermarks == {"interactive": 0.92, "standard": 0.85, "batch": 0.5}
    for bad in (
        {"watermarks": {"bulk": 0.5}},
        {"watermarks": {"batch": 1.5}},
        {"poll_interval_s": 0},
        {"output_reservation": "guess"},
        {"stale_after_s": 0.1, "poll_interval_s": 0.5},
    ):
        with pytest.raises(ConfigError) as info:
            parse_config({"admission": bad})
        assert "admission" in str(info.value)
