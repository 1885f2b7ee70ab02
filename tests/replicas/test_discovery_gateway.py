"""DNS discovery through a real gateway: simulated replicas on 127.0.0.2 and
127.0.0.3 (one port, two addresses, as behind a headless Service), a stub
resolver, and requests flowing the whole time. A new address joins routing
only after its health check passes; a vanished one stops getting requests,
its stream in flight finishes, and it is removed once idle."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx

from gateway.app import create_app
from gateway.config.discovery import DiscoveryConfig
from gateway.config.scheduling import SchedulingConfig
from gateway.http.serving import BackgroundServers, Listener, free_port
from gateway.sim.app import SimReplica
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, make_config
from tests.simkit import chat_body, metric, wait_for

A, B = "127.0.0.2", "127.0.0.3"


class StubDns:
    def __init__(self, *addresses: str) -> None:
        self.addresses: Sequence[str] = addresses
        self.fail = False

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        assert host == "sim.pool.svc"
        if self.fail:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return self.addresses


class Traffic(threading.Thread):
    """Short requests one after the other until stopped: (sent at, status, replica) each."""

    def __init__(self, gw: RunningGateway) -> None:
        super().__init__(daemon=True)
        self._url = gw.url + "/v1/chat/completions"
        self.stop = threading.Event()
        self.seen: list[tuple[float, int, str]] = []

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            for _ in range(100_000):
                if self.stop.is_set():
                    return
                sent = time.monotonic()
                r = client.post(self._url, json=chat_body(stream=False, max_tokens=3))
                self.seen.append((sent, r.status_code, r.headers.get("x-gateway-replica", "")))

    def since(self, t: float) -> set[str]:
        """The replicas of the requests sent after `t` (monotonic)."""
        return {replica for sent, _, replica in self.seen if sent > t}

    def count_since(self, t: float) -> int:
        return sum(1 for sent, _, _ in self.seen if sent > t)


@contextmanager
def _sims(port: int) -> Iterator[None]:
    listeners = [Listener(SimReplica(SimConfig(speed=1)).app, host, port) for host in (A, B)]
    with BackgroundServers(listeners):
        yield


def _replicas(gw: RunningGateway) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in gw.replicas()}


def test_replicas_join_after_health_and_leave_while_requests_flow() -> None:
    port = free_port(A)
    name_a, name_b = f"pool-{A}:{port}", f"pool-{B}:{port}"
    dns = StubDns(A)
    entry = DiscoveryConfig(
        name="pool", host="sim.pool.svc", port=port, interval_s=0.2, resolve_timeout_s=0.2
    )
    cfg = make_config([], discovery=(entry,), scheduling=SchedulingConfig(policy="round-robin"))
    with _sims(port):
        gateway = create_app(cfg, resolver=dns.resolve)
        with BackgroundServers(gateway.listeners()) as servers:
            lc = cfg.listen
            gw = RunningGateway(
                gateway,
                f"http://{lc.host}:{lc.port}",
                f"http://{lc.admin_host}:{lc.admin_port}",
                servers,
            )
            assert list(_replicas(gw)) == [name_a]  # resolved and checked before serving
            traffic = Traffic(gw)
            traffic.start()
            try:
                _join(gw, dns, traffic, name_a, name_b, port)
                _leave(gw, dns, traffic, name_a, name_b)
                _keep_on_failure(gw, dns, name_b)
            finally:
                traffic.stop.set()
                traffic.join(30)
            assert traffic.seen and all(status == 200 for _, status, _ in traffic.seen)


def _join(gw: RunningGateway, dns: StubDns, traffic: Traffic, a: str, b: str, port: int) -> None:
    b_url = f"http://{B}:{port}"
    httpx.post(b_url + "/sim/fault", json={"health_status": 503}, timeout=10).raise_for_status()
    mark = time.monotonic()
    dns.addresses = [A, B]
    wait_for(lambda: b in _replicas(gw), timeout=10)
    # Failing its health checks (loading): in the set, out of routing.
    wait_for(lambda: _replicas(gw)[b]["checked"], timeout=10)
    wait_for(lambda: traffic.count_since(mark) >= 10, timeout=20)
    assert _replicas(gw)[b]["healthy"] is False
    assert traffic.since(mark) == {a}
    httpx.post(b_url + "/sim/fault", json={"clear": True}, timeout=10).raise_for_status()
    wait_for(lambda: _replicas(gw)[b]["healthy"], timeout=20)
    joined = time.monotonic()
    wait_for(lambda: traffic.since(joined) == {a, b}, timeout=20)


def _leave(gw: RunningGateway, dns: StubDns, traffic: Traffic, a: str, b: str) -> None:
    stream_text: list[str] = []
    on_a = threading.Event()

    def stream() -> None:  # a long stream on A (round-robin: at most a few tries)
        url = gw.url + "/v1/chat/completions"
        for _ in range(8):
            with httpx.stream("POST", url, json=chat_body(True, max_tokens=200), timeout=60) as r:
                if r.headers.get("x-gateway-replica") != a:
                    continue
                on_a.set()
                stream_text.append("".join(r.iter_text()))
                return

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    assert on_a.wait(30), "no stream landed on the replica that leaves"
    dns.addresses = [B]
    wait_for(lambda: _replicas(gw)[a]["leaving"], timeout=10)
    mark = time.monotonic()  # requests sent from now on never go to A
    assert _replicas(gw)[a]["in_flight"] >= 1  # its stream still runs: not removed
    assert metric(gw.metrics_text(), "gateway_replica_draining", replica=a) == 1
    streamer.join(60)
    assert stream_text and stream_text[0].rstrip().endswith("data: [DONE]")
    wait_for(lambda: a not in _replicas(gw), timeout=20)
    assert traffic.since(mark) == {b}
    text = gw.metrics_text()
    assert f'replica="{a}"' not in text and f'replica="{b}"' in text


def _keep_on_failure(gw: RunningGateway, dns: StubDns, b: str) -> None:
    dns.fail = True
    wait_for(
        lambda: (
            metric(gw.metrics_text(), "gateway_discovery_failures_total", discovery="pool") >= 2
        ),
        timeout=10,
    )
    assert list(_replicas(gw)) == [b] and _replicas(gw)[b]["leaving"] is False
