"""DNS discovery's rounds, on a real registry with a stub resolver (no network):
join, leave (leaving, then removed once idle), come back, failures keep the set."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.config.decode import ConfigError
from gateway.config.discovery import DiscoveryConfig
from gateway.config.schema import parse_config
from gateway.replicas.discovery import DnsDiscovery, resolve_host
from gateway.replicas.registry import Replica, ReplicaRegistry

ENTRY = DiscoveryConfig(
    name="vllm", host="vllm-headless", port=8000, api_key="sk-x", kind="vllm", weight=2.0
)


class StubDns:
    def __init__(self, *addresses: str) -> None:
        self.addresses: Sequence[str] = addresses
        self.error: OSError | None = None
        self.hang = False
        self.asked: list[tuple[str, int]] = []

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        if self.hang:
            await asyncio.sleep(3600)
        if self.error is not None:
            raise self.error
        return self.addresses


class Members:
    """Records what the registry tells its subscribers."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def replica_added(self, replica: Replica) -> None:
        self.events.append(("added", replica.name))

    def replica_removed(self, replica: Replica) -> None:
        self.events.append(("removed", replica.name))


def _setup(dns: StubDns) -> tuple[ReplicaRegistry, DnsDiscovery, Members, list[str]]:
    registry = ReplicaRegistry(())
    members = Members()
    registry.subscribe(members)
    failures: list[str] = []
    disc = DnsDiscovery(
        [ENTRY], registry, resolver=dns.resolve, on_failure=lambda e: failures.append(e.name)
    )
    return registry, disc, members, failures


def _names(registry: ReplicaRegistry) -> list[str]:
    return sorted(r.name for r in registry)


def test_addresses_join_unhealthy_leave_and_are_removed_once_idle() -> None:
    async def scenario() -> None:
        dns = StubDns("10.0.0.1", "10.0.0.2")
        registry, disc, members, _ = _setup(dns)
        await disc.refresh(ENTRY)
        assert dns.asked == [("vllm-headless", 8000)]
        assert _names(registry) == ["vllm-10.0.0.1:8000", "vllm-10.0.0.2:8000"]
        one = registry.get("vllm-10.0.0.1:8000")
        assert one is not None
        assert (one.url, one.kind, one.config.api_key, one.config.weight) == (
            "http://10.0.0.1:8000",
            "vllm",
            "sk-x",
            2.0,
        )
        assert registry.healthy() == []  # joins routing only after a health check
        for r in registry:
            r.health.healthy = True
        assert len(registry.healthy()) == 2

        dns.addresses = ["10.0.0.2"]
        one.ledger.in_flight = 1  # a request still running on it
        await disc.refresh(ENTRY)
        assert one.leaving and [r.name for r in registry.healthy()] == ["vllm-10.0.0.2:8000"]
        assert "vllm-10.0.0.1:8000" in _names(registry)  # kept while busy
        await disc.refresh(ENTRY)
        assert "vllm-10.0.0.1:8000" in _names(registry)
        one.ledger.in_flight = 0
        await disc.refresh(ENTRY)
        assert _names(registry) == ["vllm-10.0.0.2:8000"]
        assert members.events == [
            ("added", "vllm-10.0.0.1:8000"),
            ("added", "vllm-10.0.0.2:8000"),
            ("removed", "vllm-10.0.0.1:8000"),
        ]

    asyncio.run(scenario())


def test_an_address_back_before_removal_serves_again() -> None:
    async def scenario() -> None:
        dns = StubDns("10.0.0.1")
        registry, disc, members, _ = _setup(dns)
        await disc.refresh(ENTRY)
        (r,) = list(registry)
        r.health.healthy, r.ledger.in_flight = True, 1
        dns.addresses = ["10.0.0.9"]
        await disc.refresh(ENTRY)
        assert r.leaving
        dns.addresses = ["10.0.0.1", "10.0.0.9"]
        await disc.refresh(ENTRY)
        assert not r.leaving and r in registry.healthy()
        assert ("removed", r.name) not in members.events

    asyncio.run(scenario())


@pytest.mark.parametrize("failure", ["error", "empty", "timeout"])
def test_a_failed_resolution_keeps_the_set_and_is_counted(failure: str) -> None:
    async def scenario() -> None:
        dns = StubDns("10.0.0.1", "10.0.0.2")
        registry, disc, _, failures = _setup(dns)
        entry = ENTRY
        await disc.refresh(entry)
        if failure == "error":
            dns.error = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        elif failure == "empty":
            dns.addresses = []
        else:
            dns.hang = True
            entry = DiscoveryConfig(
                name="vllm", host="vllm-headless", port=8000, resolve_timeout_s=0.05
            )
        await asyncio.wait_for(disc.refresh(entry), 10)
        assert failures == ["vllm"]
        assert _names(registry) == ["vllm-10.0.0.1:8000", "vllm-10.0.0.2:8000"]
        assert not any(r.leaving for r in registry)

    asyncio.run(scenario())


def test_ipv6_names_and_urls_are_bracketed_and_a_taken_name_is_skipped() -> None:
    async def scenario() -> None:
        dns = StubDns("fd00::1", "10.0.0.1")
        registry = ReplicaRegistry(())
        registry.add(
            parse_config(
                {"replicas": [{"url": "http://10.0.0.1:8000", "name": "vllm-10.0.0.1:8000"}]}
            ).replicas[0]
        )
        disc = DnsDiscovery([ENTRY], registry, resolver=dns.resolve)
        await disc.refresh(ENTRY)
        assert _names(registry) == ["vllm-10.0.0.1:8000", "vllm-[fd00::1]:8000"]
        six = registry.get("vllm-[fd00::1]:8000")
        assert six is not None and six.url == "http://[fd00::1]:8000"
        await disc.refresh(ENTRY)  # the clash is not retried into a second replica
        assert len(registry) == 2

    asyncio.run(scenario())


def test_resolve_host_returns_loopback_addresses() -> None:
    found = asyncio.run(resolve_host("localhost", 80))
    assert "127.0.0.1" in found or "::1" in found
    assert len(found) == len(set(found))


def test_discovery_config_is_validated_with_its_path() -> None:
    good = {"name": "pool", "host": "vllm.ns.svc", "port": 8000}
    cfg = parse_config({"discovery": [good]})
    assert cfg.discovery[0].interval_s == 10.0 and cfg.replicas == ()
    for bad, problem in (
        ({**good, "host": "http://x"}, "discovery[0]"),
        ({**good, "port": 0}, "discovery[0]"),
        ({**good, "interval_s": 0}, "discovery[0]"),
        ({**good, "scheme": "ftp"}, "discovery[0].scheme"),
        ({**good, "ttl": 1}, "discovery[0].ttl: unknown key"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config({"discovery": [bad]})
        assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
    with pytest.raises(ConfigError, match="duplicate"):
        parse_config({"discovery": [good, good]})


def test_serve_accepts_discovery_without_static_replicas(tmp_path: Path) -> None:
    from gateway.cli import _build_parser, _serve_config

    only_dns = tmp_path / "dns.yaml"
    only_dns.write_text("discovery: [{name: pool, host: vllm.svc, port: 8000}]\n")
    cfg = _serve_config(_build_parser().parse_args(["serve", "--config", str(only_dns)]))
    assert cfg.replicas == () and cfg.discovery[0].host == "vllm.svc"
    neither = tmp_path / "none.yaml"
    neither.write_text("log_format: json\n")
    with pytest.raises(ConfigError, match="discovery"):
        _serve_config(_build_parser().parse_args(["serve", "--config", str(neither)]))


def test_a_crashed_round_is_logged_and_the_loop_restarted(caplog: pytest.LogCaptureFixture) -> None:
    class Crashy(StubDns):
        async def resolve(self, host: str, port: int) -> Sequence[str]:
            if not self.asked:
                self.asked.append((host, port))
                raise RuntimeError("a bug in a resolver")
            return await super().resolve(host, port)

    async def scenario() -> list[str]:
        dns = Crashy("10.0.0.1")
        registry = ReplicaRegistry(())
        entry = DiscoveryConfig(
            name="vllm", host="h", port=8000, interval_s=0.01, resolve_timeout_s=0.01
        )
        disc = DnsDiscovery([entry], registry, resolver=dns.resolve)
        await disc.start()
        try:
            for _ in range(200):  # the restart waits 0.1 s
                if len(registry):
                    break
                await asyncio.sleep(0.02)
        finally:
            await disc.stop()
        return _names(registry)

    with caplog.at_level(logging.ERROR, "gateway.supervise"):
        assert asyncio.run(scenario()) == ["vllm-10.0.0.1:8000"]
    crashes = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert len(crashes) == 1 and "discovery" in crashes[0].getMessage()
    assert crashes[0].exc_info is not None
