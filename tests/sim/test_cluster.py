"""SimCluster and create_sim_app: mixed replicas, cadence at real time, clean shutdown."""

from __future__ import annotations

import itertools
import statistics
import time

import httpx
from starlette.applications import Starlette

from gateway.http.serving import BackgroundServers, Listener, free_port
from gateway.sim import SimCluster, SimConfig, create_sim_app
from tests.sim.helpers import TIMEOUT, chat


def test_mixed_replicas_in_one_loop() -> None:
    configs = [
        SimConfig(flavor="vllm", speed=100.0),
        SimConfig(flavor="llamacpp", speed=100.0, model="llama"),
    ]
    with SimCluster(configs) as cluster, httpx.Client(timeout=TIMEOUT) as client:
        assert len(set(cluster.urls)) == 2
        assert client.get(cluster.urls[0] + "/health").content == b""
        assert client.get(cluster.urls[1] + "/health").json() == {"status": "ok"}
        cluster.set_fault(1, error_status=500)
        assert (
            client.post(
                cluster.urls[0] + "/v1/chat/completions", json=chat("hi", max_tokens=1)
            ).status_code
            == 200
        )
        assert (
            client.post(
                cluster.urls[1] + "/v1/chat/completions", json=chat("hi", max_tokens=1)
            ).status_code
            == 500
        )
        assert cluster.stats(0)["flavor"] == "vllm" and cluster.stats(1)["model"] == "llama"
        light = client.get(cluster.urls[0] + "/sim/stats", params={"records": "0"}).json()
        assert light["requests"] == [] and light["totals"]["requests"] == 1
        assert len(client.get(cluster.urls[0] + "/sim/stats").json()["requests"]) == 1


def test_chunk_every_50ms_at_real_time() -> None:
    cfg = SimConfig(speed=1.0, step_base_s=0.05, decode_seq_s=0.0, prefill_token_s=0.0)
    with SimCluster([cfg]) as cluster, httpx.Client(timeout=TIMEOUT) as client:
        arrivals: list[float] = []
        body = chat("hi", max_tokens=6, ignore_eos=True, stream=True)
        with client.stream("POST", cluster.urls[0] + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(arrivals[1:-1])]
    assert len(gaps) == 4
    assert 0.035 < statistics.median(gaps) < 0.09


def test_create_sim_app_runs_and_stops_cleanly() -> None:
    app = create_sim_app(SimConfig(flavor="llamacpp", speed=100.0))
    assert isinstance(app, Starlette)
    port = free_port()
    servers = BackgroundServers([Listener(app, "127.0.0.1", port)]).start()
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/completion",
            json={"prompt": "x", "n_predict": 2},
            timeout=TIMEOUT,
        )
        assert r.json()["tokens_predicted"] == 2
    finally:
        servers.stop()
    assert servers.loop is not None and servers.loop.is_closed()
