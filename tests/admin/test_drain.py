"""Drain / undrain through the admin API, against a real gateway and two
simulated replicas: a drained replica gets no new request (routing,
admission and session affinity all skip it) while its streamed request in
flight finishes; undrain brings it back."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from gateway.config.scheduling import SchedulingConfig
from gateway.sim.cluster import SimCluster
from tests.gwharness import RunningGateway, running_gateway
from tests.simkit import chat_body, metric, wait_for


def _ask(gw: RunningGateway, **headers: str) -> str:
    """A short request; the replica it was served by."""
    body = chat_body(stream=False, max_tokens=4)
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.headers["x-gateway-replica"]


def _post(gw: RunningGateway, path: str) -> httpx.Response:
    return httpx.post(gw.admin_url + path, timeout=10)


class _Stream(threading.Thread):
    """A long streamed request read to its end in the background."""

    def __init__(self, gw: RunningGateway) -> None:
        super().__init__(daemon=True)
        self._gw = gw
        self.replica: str | None = None
        self.started = threading.Event()
        self.text = ""
        self.status = 0

    def run(self) -> None:
        body = chat_body(stream=True, max_tokens=300)  # ~4.5 s at speed 1
        url = self._gw.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=60) as r:
            self.status, self.replica = r.status_code, r.headers.get("x-gateway-replica")
            chunks: list[str] = []
            for chunk in r.iter_text():
                chunks.append(chunk)
                self.started.set()
            self.text = "".join(chunks)
        self.started.set()


def test_drain_stops_new_traffic_while_the_stream_in_flight_finishes() -> None:
    with (
        SimCluster.start(2, speed=1) as sims,
        running_gateway(sims.urls, scheduling=SchedulingConfig(policy="round-robin")) as gw,
    ):
        stream = _Stream(gw)
        stream.start()
        assert stream.started.wait(30)
        drained = stream.replica
        assert drained is not None
        other = next(u.split("//", 1)[1] for u in sims.urls if not u.endswith(drained))

        answer = _post(gw, f"/admin/replicas/{drained}/drain")
        assert answer.status_code == 200 and answer.json()["replica"]["draining"] is True
        assert {r["name"]: r["draining"] for r in gw.replicas()} == {drained: True, other: False}
        assert metric(gw.metrics_text(), "gateway_replica_draining", replica=drained) == 1
        assert metric(gw.metrics_text(), "gateway_replica_draining", replica=other) == 0

        served = [_ask(gw) for _ in range(6)]
        assert served == [other] * 6
        assert stream.is_alive(), "the in-flight stream ended before the new requests ran"
        stream.join(60)
        assert stream.status == 200 and stream.text.rstrip().endswith("data: [DONE]")
        assert '"error"' not in stream.text

        answer = _post(gw, f"/admin/replicas/{drained}/undrain")
        assert answer.status_code == 200 and answer.json()["replica"]["draining"] is False
        assert drained in {_ask(gw) for _ in range(4)}
        assert metric(gw.metrics_text(), "gateway_replica_draining", replica=drained) == 0


def test_a_drained_replica_loses_its_sessions_and_unknown_names_are_404() -> None:
    with SimCluster.start(2, speed=50) as sims, running_gateway(sims.urls) as gw:
        wait_for(lambda: len([r for r in gw.replicas() if r["healthy"]]) == 2)
        home = _ask(gw, **{"x-session-id": "chain-7"})
        assert _ask(gw, **{"x-session-id": "chain-7"}) == home  # affinity holds
        assert _post(gw, f"/admin/replicas/{home}/drain").status_code == 200
        moved = _ask(gw, **{"x-session-id": "chain-7"})
        assert moved != home
        missing = _post(gw, "/admin/replicas/no-such-replica/drain")
        assert missing.status_code == 404
        error: dict[str, Any] = missing.json()["error"]
        assert error["type"] == "not_found_error" and error["code"] == "unknown_replica"
        assert _post(gw, "/admin/replicas/no-such-replica/undrain").status_code == 404
