"""One request must not stall the others (issue 19 item 2): four ~30 MB prompts
sent at once through a real gateway while `/healthz` is probed. Before the
fix, counting each prompt held the event loop for seconds."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.sim import SimCluster
from tests.gwharness import RunningGateway, running_gateway
from tests.simkit import wait_for

HUGE_BYTES = 30_000_000
SENDERS = 4
#: A generous safety bound (the p99 < 50 ms target is bench/loop_stall.py's).
PROBE_BOUND_S = 1.0


@pytest.fixture(scope="module")
def gw() -> Iterator[RunningGateway]:
    with (
        SimCluster.start(1, speed=50, max_model_len=32768) as sim,
        running_gateway(sim.urls) as running,
    ):
        wait_for(lambda: all(r["healthy"] and r["max_model_len"] for r in running.replicas()))
        yield running


def _huge_body() -> bytes:
    words = ("alpha", "Beta", "gamma", "delta,", "eps123", "zeta.", "lighthouse")
    text = " ".join(words[i % len(words)] for i in range(HUGE_BYTES // 6))[:HUGE_BYTES]
    return json.dumps(
        {"model": "sim-model", "messages": [{"role": "user", "content": text}]}
    ).encode()


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    """From a worker thread: a blocking socket gives the GIL up while it sends."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _probe_while(url: str, pending: list[Future[tuple[int, bytes]]]) -> list[tuple[int, float]]:
    """GET /healthz every 20 ms until every request is answered (bounded)."""
    probes: list[tuple[int, float]] = []
    end = time.monotonic() + 120
    with httpx.Client(timeout=30) as client:
        while not all(f.done() for f in pending) and time.monotonic() < end and len(probes) < 6000:
            t0 = time.monotonic()
            status = client.get(url + "/healthz").status_code
            probes.append((status, time.monotonic() - t0))
            time.sleep(0.02)
    return probes


def test_four_huge_prompts_do_not_stall_health_probes(gw: RunningGateway) -> None:
    body = _huge_body()
    with ThreadPoolExecutor(SENDERS) as pool:
        pending = [pool.submit(_post, gw.url, body) for _ in range(SENDERS)]
        probes = _probe_while(gw.url, pending)
        answers = [f.result(timeout=120) for f in pending]
    assert len(probes) >= 5
    assert {status for status, _ in probes} == {200}
    slowest = max(seconds for _, seconds in probes)
    assert slowest < PROBE_BOUND_S, f"/healthz took {slowest:.2f} s while huge prompts arrived"
    for status, raw in answers:
        assert status == 400
        error = json.loads(raw)["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    small = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(gw.base_url + "/chat/completions", json=small, timeout=30).status_code == 200
