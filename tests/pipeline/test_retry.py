"""Retry safety over real sockets.

Retried: attempts that provably never reached an engine (connection refused,
a 503 status before any body), on another replica, at most
`limits.max_retries` times. Never retried: an engine that accepted the
request and died mid-generation (it may have generated; a retry doubles cost).
"""

from __future__ import annotations

import httpx

from gateway.config.schema import HealthConfig, LimitsConfig, ReplicaConfig
from gateway.http.serving import BackgroundServers, Listener, free_port
from gateway.sim.app import SimReplica
from gateway.sim.config import SimConfig
from tests.gwharness import running_gateway
from tests.simkit import chat_body, metric, running_sims, settled

#: Health checks far apart: a replica that dies stays "healthy" for the test.
SLOW_HEALTH = HealthConfig(interval_s=60, timeout_s=1.0, unhealthy_after=1, healthy_after=1)
URL = "/v1/chat/completions"


def test_refused_connection_is_retried_on_another_replica() -> None:
    port = free_port()
    doomed = BackgroundServers([Listener(SimReplica(SimConfig(speed=50)).app, "127.0.0.1", port)])
    doomed.start()
    with (
        running_sims([SimConfig(speed=50)]) as sims,
        running_gateway(
            [
                ReplicaConfig(url=f"http://127.0.0.1:{port}", name="doomed", kind="vllm"),
                ReplicaConfig(url=sims.urls[0], name="alive", kind="vllm"),
            ],
            health=SLOW_HEALTH,
        ) as gw,
    ):
        assert all(r["healthy"] for r in gw.replicas())
        doomed.stop()  # now: connection refused, yet still believed healthy
        for i in range(12):
            resp = httpx.post(
                gw.url + URL,
                json=chat_body(stream=i % 2 == 0, max_tokens=5),
                headers={"x-session-id": f"s{i}"},
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
            if metric(gw.metrics_text(), "gateway_upstream_attempts_total", replica="doomed") >= 1:
                break
        text = settled(gw)
        assert (
            metric(
                text, "gateway_upstream_attempts_total", replica="doomed", result="never_reached"
            )
            >= 1
        )
        assert metric(text, "gateway_upstream_attempts_total", replica="doomed", result="ok") == 0


def test_engine_503_before_body_is_retried_elsewhere() -> None:
    with (
        running_sims([SimConfig(speed=50), SimConfig(speed=50)]) as sims,
        running_gateway(
            [ReplicaConfig(url=u, kind="vllm", name=f"r{i}") for i, u in enumerate(sims.urls)]
        ) as gw,
    ):
        sims.fault(0, error_status=503, error_message="The engine is currently busy")
        for i in range(12):
            resp = httpx.post(
                gw.url + URL,
                json=chat_body(stream=False, max_tokens=5),
                headers={"x-session-id": f"s{i}"},
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
            if sims.records(0):
                break
        text = settled(gw)
        assert len(sims.records(0)) >= 1, "the router never tried the busy replica"
        assert (
            metric(text, "gateway_upstream_attempts_total", replica="r0", result="never_reached")
            >= 1
        )
        assert len(sims.records(1)) == metric(text, "gateway_requests_total", outcome="ok")


def test_retries_are_bounded_by_max_retries() -> None:
    with (
        running_sims([SimConfig(speed=50) for _ in range(3)]) as sims,
        running_gateway(
            [ReplicaConfig(url=u, kind="vllm") for u in sims.urls],
            limits=LimitsConfig(max_retries=1),
        ) as gw,
    ):
        for i in range(3):
            sims.fault(i, error_status=503, error_message="busy")
        resp = httpx.post(gw.url + URL, json=chat_body(stream=False, max_tokens=5), timeout=30)
        assert resp.status_code in (502, 503)
        assert sum(len(sims.records(i)) for i in range(3)) == 2  # one attempt + one retry


def test_engine_dying_mid_generation_is_not_retried() -> None:
    with (
        running_sims([SimConfig(speed=50), SimConfig(speed=50)]) as sims,
        running_gateway([ReplicaConfig(url=u, kind="vllm") for u in sims.urls]) as gw,
    ):
        for i in range(2):
            sims.fault(i, die_after_tokens=3)
        # Streaming: the 200 has started; the failure arrives as an SSE error event.
        with httpx.stream(
            "POST", gw.url + URL, json=chat_body(stream=True, max_tokens=200), timeout=30
        ) as resp:
            assert resp.status_code == 200
            text = "".join(resp.iter_text())
        assert '"error"' in text and text.endswith("data: [DONE]\n\n")
        # Non-streaming: the engine accepted, then dropped the connection.
        resp2 = httpx.post(gw.url + URL, json=chat_body(stream=False, max_tokens=200), timeout=30)
        assert resp2.status_code == 502
        assert resp2.json()["error"]["code"] == "upstream_unavailable"
        assert resp2.headers.get("x-gateway-reject-reason") == "upstream_unavailable"
        text = settled(gw)
        assert sum(len(sims.records(i)) for i in range(2)) == 2, (
            "one engine attempt per request, no retry"
        )
        assert metric(text, "gateway_upstream_attempts_total", result="never_reached") == 0
        assert metric(text, "gateway_upstream_attempts_total", result="error") == 2
