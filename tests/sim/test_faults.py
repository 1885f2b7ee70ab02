"""Fault injection: health status, injected errors, crashes mid-generation, pause."""

from __future__ import annotations

import httpx
import pytest

from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import TIMEOUT, chat, records, totals, wait_until


def test_health_status_fault(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(2, flavor="vllm")
    cluster.set_fault(1, health_status=503)
    assert client.get(cluster.urls[0] + "/health").status_code == 200
    r = client.get(cluster.urls[1] + "/health")
    assert r.status_code == 503 and r.content == b""
    cluster.set_fault(1, health_status=200)
    assert client.get(cluster.urls[1] + "/health").status_code == 200


def test_llamacpp_health_fault_shape(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="llamacpp")
    r = client.post(cluster.urls[0] + "/sim/fault", json={"health_status": 503})
    assert r.status_code == 200
    h = client.get(cluster.urls[0] + "/health")
    assert h.status_code == 503 and h.json()["error"]["message"] == "Loading model"
    client.post(cluster.urls[0] + "/sim/fault", json={"clear": True})
    assert client.get(cluster.urls[0] + "/health").status_code == 200


def test_error_fault_with_count(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="vllm")
    cluster.set_fault(0, error_status=500, error_message="boom", count=2)
    u = cluster.urls[0] + "/v1/chat/completions"
    for _ in range(2):
        r = client.post(u, json=chat("hi", max_tokens=1))
        assert r.status_code == 500
        assert r.json() == {
            "error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
        }
    assert client.post(u, json=chat("hi", max_tokens=1)).status_code == 200
    recs = records(cluster)
    assert [r["finish_reason"] for r in recs] == ["error", "error", "length"]
    assert totals(cluster)["requests"] == 3 and totals(cluster)["errors"] == 2


def test_llamacpp_error_fault_shape(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="llamacpp")
    cluster.set_fault(0, error_status=503, error_message="busy")
    r = client.post(cluster.urls[0] + "/v1/chat/completions", json=chat("hi"))
    assert r.status_code == 503
    assert r.json() == {"error": {"code": 503, "message": "busy", "type": "unavailable_error"}}


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
def test_die_after_tokens_mid_stream(make_cluster: ClusterFactory, flavor: str) -> None:
    cluster = make_cluster(flavor=flavor, speed=50.0)
    cluster.set_fault(0, die_after_tokens=3)
    url = cluster.urls[0] + "/v1/chat/completions"
    lines: list[str] = []
    body = chat("hi", max_tokens=50, ignore_eos=True, stream=True)
    with httpx.Client(timeout=TIMEOUT) as c, c.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            lines.extend(r.iter_lines())
    data = [line for line in lines if line.startswith("data: ")]
    assert len(data) == 4  # role chunk + 3 tokens
    assert "[DONE]" not in "".join(data)
    wait_until(lambda: totals(cluster)["running"] == 0)
    rec = records(cluster)[0]
    assert rec["error"] == "simulated crash" and rec["output_tokens"] >= 3
    assert totals(cluster)["kv_blocks_pinned"] == 0


def test_die_after_tokens_non_streaming(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(flavor="vllm")
    cluster.set_fault(0, die_after_tokens=2, count=1)
    url = cluster.urls[0] + "/v1/chat/completions"
    with httpx.Client(timeout=TIMEOUT) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            c.post(url, json=chat("hi", max_tokens=20, ignore_eos=True))
        assert c.post(url, json=chat("hi", max_tokens=2)).status_code == 200


def test_fault_validation(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    u = make_cluster(flavor="vllm").urls[0] + "/sim/fault"
    assert client.post(u, json={"bogus": 1}).status_code == 400
    assert client.post(u, json={"error_status": 200}).status_code == 400
    assert client.post(u, json={"die_after_tokens": "3"}).status_code == 400
    state = client.post(u, json={"die_after_tokens": 3}).json()
    assert state["die_after_tokens"] == 3
    assert client.post(u, json={"clear": True}).json()["die_after_tokens"] is None


def test_pause_holds_requests(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(flavor="vllm")
    cluster.set_fault(0, paused=True)
    assert cluster.stats(0)["paused"] is True
    with (
        httpx.Client(timeout=TIMEOUT) as c,
        c.stream(
            "POST",
            cluster.urls[0] + "/v1/chat/completions",
            json=chat("hi", max_tokens=2, stream=True),
        ) as r,
    ):
        wait_until(lambda: totals(cluster)["waiting"] == 1)
        cluster.set_fault(0, paused=False)
        assert sum(1 for line in r.iter_lines() if line.startswith("data: ")) >= 3
