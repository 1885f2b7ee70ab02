"""Replicas from DNS: each `discovery` entry's name (a Kubernetes headless
Service) is re-resolved every `interval_s`, each resolution bounded by
`resolve_timeout_s`.

- A new address becomes a replica named `<name>-<address>:<port>`. It starts
  unhealthy, so it joins routing only once a health check passes
  (`HealthMonitor`, told by the registry).
- A vanished address's replica is leaving: no new requests, those in flight
  finish; it is removed at the first round that finds it idle. An address
  that comes back before then serves again.
- A failed resolution (error, timeout, no address at all) keeps the current
  set: logged, and counted in `gateway_discovery_failures_total`. A DNS
  blip must not empty the fleet.

The resolver is injected (`Resolver`): the gateway's is `resolve_host`
(`loop.getaddrinfo`), tests pass a stub.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Sequence

from gateway.config.discovery import DiscoveryConfig
from gateway.config.schema import ReplicaConfig
from gateway.replicas.registry import ReplicaRegistry
from gateway.supervise import Supervisor

log = logging.getLogger("gateway.replicas.discovery")

#: (host, port) → its addresses (IPv4 / IPv6 literals); raises OSError when it cannot
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


async def resolve_host(host: str, port: int) -> list[str]:
    """The host's A and AAAA addresses, in the resolver's order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    return list(dict.fromkeys(found))


def replica_config(entry: DiscoveryConfig, address: str) -> ReplicaConfig:
    return ReplicaConfig(
        url=entry.replica_url(address),
        name=entry.replica_name(address),
        kind=entry.kind,
        api_key=entry.api_key,
        weight=entry.weight,
        capacity_tokens=entry.capacity_tokens,
        max_model_len=entry.max_model_len,
        upstream_streaming=entry.upstream_streaming,
    )


class DnsDiscovery:
    def __init__(
        self,
        entries: Sequence[DiscoveryConfig],
        registry: ReplicaRegistry,
        *,
        resolver: Resolver = resolve_host,
        on_failure: Callable[[DiscoveryConfig], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._entries = tuple(entries)
        self._registry = registry
        self._resolver = resolver
        self._on_failure = on_failure
        self._rng = rng or random.Random()
        #: per entry: address → the name of its replica
        self._found: dict[str, dict[str, str]] = {e.name: {} for e in self._entries}
        self._clashes: set[str] = set()
        self._supervisor = Supervisor("discovery")

    async def refresh_all(self) -> None:
        await asyncio.gather(*(self.refresh(e) for e in self._entries))

    async def start(self) -> None:
        for e in self._entries:
            self._supervisor.spawn(e.name, functools.partial(self._loop, e))

    async def stop(self) -> None:
        await self._supervisor.stop()

    async def _loop(self, entry: DiscoveryConfig) -> None:
        while True:
            await asyncio.sleep(entry.interval_s * (0.9 + 0.2 * self._rng.random()))
            await self.refresh(entry)

    async def refresh(self, entry: DiscoveryConfig) -> None:
        """One round: resolve, add new addresses, mark vanished ones leaving,
        remove leaving replicas that are idle."""
        addresses = await self._resolve(entry)
        if addresses is not None:
            self._apply(entry, addresses)
        self._reap(entry)

    async def _resolve(self, entry: DiscoveryConfig) -> set[str] | None:
        try:
            async with asyncio.timeout(entry.resolve_timeout_s):
                found = await self._resolver(entry.host, entry.port)
        except (OSError, TimeoutError) as exc:  # socket.gaierror is an OSError
            self._failed(entry, str(exc) or type(exc).__name__)
            return None
        if not found:
            self._failed(entry, "no address")
            return None
        return set(found)

    def _failed(self, entry: DiscoveryConfig, why: str) -> None:
        log.warning(
            "discovery %s: cannot resolve %s (%s); keeping its %d replicas",
            entry.name,
            entry.host,
            why,
            len(self._found[entry.name]),
        )
        if self._on_failure is not None:
            self._on_failure(entry)

    def _apply(self, entry: DiscoveryConfig, addresses: set[str]) -> None:
        known = self._found[entry.name]
        for address in sorted(addresses - known.keys()):
            replica = self._registry.add(replica_config(entry, address))
            if replica is None:
                if address not in self._clashes:  # (said once)
                    self._clashes.add(address)
                    log.warning(
                        "discovery %s: a replica named %s exists already; %s skipped",
                        entry.name,
                        entry.replica_name(address),
                        address,
                    )
                continue
            known[address] = replica.name
        for address, name in known.items():
            self._registry.set_leaving(name, address not in addresses)

    def _reap(self, entry: DiscoveryConfig) -> None:
        known = self._found[entry.name]
        for address, name in list(known.items()):
            replica = self._registry.get(name)
            if replica is None or (replica.leaving and replica.in_flight == 0):
                self._registry.remove(name)
                del known[address]
