"""Four ~30 MB bodies at once into a real `gateway serve` process: each gets
its 400, `/healthz` keeps answering quickly throughout, and the process's
resident memory is back within 100 MB of its baseline afterwards.

The latency bound here is a CI safety bound on a shared machine; the target
(under 100 ms at most, on a quiet machine) is measured by bench/loop_stall.py.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.sim import SimCluster, SimConfig
from tests.fleet import ROOT, GatewayProcess

SIZE = 30_000_000
PROBE_BOUND_S = 0.5
RSS_SLACK_MB = 100.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def huge(shape: str) -> bytes:
    if shape == "prompt":
        text = ("lighthouse keeper " * (SIZE // 18 + 1))[:SIZE]
        messages: list[dict[str, object]] = [{"role": "user", "content": text}]
    elif shape == "messages":  # ~1M tiny messages: ~1M objects if parsed
        messages = [{"role": "user", "content": "hi"}] * (SIZE // 34)
    else:  # 10,000 messages of 3 KB
        messages = [{"role": "user", "content": "word " * 600}] * 10_000
    return json.dumps({"model": "sim-model", "messages": messages}).encode()


def post(port: int, raw: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("huge")
    with (
        SimCluster([SimConfig(speed=50)]) as sims,
        GatewayProcess(
            {
                "replicas": [{"name": "sim-0", "url": sims.urls[0], "kind": "vllm"}],
                "policies": str(ROOT / "policies"),
            },
            tmp,
        ) as proc,
    ):
        yield proc


@pytest.mark.parametrize("shape", ["prompt", "messages", "long-messages"])
def test_four_huge_bodies_at_once_leave_health_probes_and_memory_alone(
    gw: GatewayProcess, shape: str
) -> None:
    assert gw.proc is not None
    port = int(gw.url.rsplit(":", 1)[1])
    raw = huge(shape)
    httpx.get(gw.url + "/healthz", timeout=5)
    baseline = rss_mb(gw.proc.pid)
    probes: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=10) as client:
            for _ in range(3000):  # bounded: ~10 ms apart, well under a minute
                if stop.is_set():
                    return
                t0 = time.monotonic()
                assert client.get(gw.url + "/healthz").status_code == 200
                probes.append(time.monotonic() - t0)
                time.sleep(0.01)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: post(port, raw), range(4)))
    stop.set()
    prober.join(30)
    assert statuses == [400] * 4
    assert len(probes) > 10
    assert max(probes) < PROBE_BOUND_S, sorted(probes)[-5:]
    time.sleep(3)  # the heap is trimmed a second after the bodies, and again while they end
    after = rss_mb(gw.proc.pid)
    assert after < baseline + RSS_SLACK_MB, (baseline, after)
