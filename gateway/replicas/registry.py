"""Replica registry and health checking.

Each replica is probed every `health.interval_s` (jittered) with its engine's
`GET /health` (vLLM: 200 when ready, refused while loading; llama.cpp: 503
"Loading model" while loading). A replica becomes unhealthy after
`unhealthy_after` consecutive failures and healthy again after
`healthy_after` successes. The first probe also detects the engine kind when
the config says `auto` (llama.cpp serves `/props`; vLLM serves `vllm:`
metrics) and reads the served models with their `max_model_len`.

The replica set may change at run time (`gateway.replicas.discovery`): the
registry tells its subscribers (`Membership`: health checks, live-state
polls, admission, routing, metrics) when a replica joins or leaves. A new
replica starts unhealthy, so it joins routing only after a health check
passes. A replica that is draining (`POST /admin/replicas/{name}/drain`) or
leaving (its address vanished from DNS) gets no new requests; those in
flight finish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Iterator
from typing import Any, Literal, Protocol

from gateway.config.schema import HealthConfig, ReplicaConfig
from gateway.engines import EngineAdapter, adapter_for, detect_kind
from gateway.errors import GatewayError
from gateway.replicas.livestate import LiveState
from gateway.replicas.parts import Ejection, Found, Health, Ledger, Status
from gateway.replicas.probe import ProbeClient, ReplicaGet
from gateway.replicas.tasks import ReplicaTasks

log = logging.getLogger("gateway.replicas.registry")


class Replica:
    """One engine replica: its configuration and one part per owner
    (`gateway/replicas/parts.py`); the properties read through the parts."""

    __slots__ = ("config", "ejection", "found", "health", "ledger", "name", "status", "url")

    def __init__(self, config: ReplicaConfig) -> None:
        self.config = config
        # copies of config.name / config.url (read many times per request)
        self.name = config.name
        self.url = config.url
        self.health = Health()
        self.found = Found(adapter_for(config.kind).kind, config.max_model_len)
        self.ledger = Ledger()
        self.ejection = Ejection()
        self.status = Status()

    @property
    def kind(self) -> str:
        return self.found.kind

    @property
    def engine(self) -> EngineAdapter:
        """The adapter of the replica's engine kind (the generic one until detected)."""
        return adapter_for(self.found.kind)

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    @property
    def models(self) -> list[dict[str, Any]]:
        return self.found.models

    @property
    def max_model_len(self) -> int | None:
        return self.found.max_model_len

    @property
    def in_flight(self) -> int:
        return self.ledger.in_flight

    @property
    def live(self) -> LiveState | None:
        return self.ledger.live

    @property
    def draining(self) -> bool:
        return self.status.draining

    @property
    def leaving(self) -> bool:
        return self.status.leaving

    def routable(self, now: float) -> bool:
        """Whether new requests may go here at `now` (monotonic): healthy, not
        draining nor leaving, not ejected for failing exchanges."""
        status = self.status
        return (
            self.health.healthy
            and not status.draining
            and not status.leaving
            and self.ejection.until <= now
        )

    def auth_headers(self) -> dict[str, str]:
        key = self.config.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def describe(self) -> dict[str, Any]:
        h, live = self.health, self.ledger.live
        return {
            "name": self.name,
            "url": self.url,
            "kind": self.kind,
            "healthy": h.healthy,
            "checked": h.checked,
            "last_check_age_s": None
            if h.last_check is None
            else round(time.monotonic() - h.last_check, 3),
            "last_error": h.last_error,
            "models": [m.get("id") for m in self.models],
            "max_model_len": self.max_model_len,
            "in_flight": self.in_flight,
            "draining": self.draining,
            "leaving": self.leaving,
            "ejected_for_s": max(0.0, round(self.ejection.until - time.monotonic(), 3)),
            "exchange_failures": self.ejection.exchange_failures,
            "live": live.describe() if live is not None else None,
        }


class Membership(Protocol):
    """Told when the replica set changes (after the change)."""

    def replica_added(self, replica: Replica) -> None: ...
    def replica_removed(self, replica: Replica) -> None: ...


class ReplicaRegistry:
    def __init__(self, configs: tuple[ReplicaConfig, ...]) -> None:
        # Replaced, never changed in place: an iteration under way keeps its snapshot.
        self.replicas = [Replica(c) for c in configs]
        self._by_name = {r.name: r for r in self.replicas}
        self._members: list[Membership] = []
        self.changed = asyncio.Event()

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    def get(self, name: str) -> Replica | None:
        return self._by_name.get(name)

    def healthy(self) -> list[Replica]:
        """Replicas new requests may go to (`Replica.routable`)."""
        now = time.monotonic()
        return [r for r in self.replicas if r.routable(now)]

    def subscribe(self, member: Membership) -> None:
        self._members.append(member)

    def add(self, config: ReplicaConfig) -> Replica | None:
        """A new replica (unhealthy until checked); None if the name is taken."""
        if config.name in self._by_name:
            return None
        replica = Replica(config)
        self._by_name[replica.name] = replica
        self.replicas = [*self.replicas, replica]
        log.info("replica %s joined (%s), waiting for a health check", replica.name, replica.url)
        for m in self._members:
            m.replica_added(replica)
        return replica

    def remove(self, name: str) -> Replica | None:
        """Take a replica out of the set (callers wait until it is idle)."""
        replica = self._by_name.pop(name, None)
        if replica is None:
            return None
        replica.status.leaving = True  # whoever still holds it (a queued request) skips it
        self.replicas = [r for r in self.replicas if r is not replica]
        log.info("replica %s removed", name)
        for m in reversed(self._members):
            m.replica_removed(replica)
        self.notify()
        return replica

    def set_draining(self, name: str, draining: bool) -> Replica | None:
        """Drain (no new requests; in flight finish) or undrain; None if unknown."""
        return self._mark(name, "draining", draining)

    def set_leaving(self, name: str, leaving: bool) -> Replica | None:
        """Mark a replica leaving (no new requests; the caller removes it once
        idle), or serving again; None if unknown."""
        return self._mark(name, "leaving", leaving)

    def _mark(self, name: str, flag: Literal["draining", "leaving"], on: bool) -> Replica | None:
        replica = self._by_name.get(name)
        if replica is not None and getattr(replica.status, flag) != on:
            setattr(replica.status, flag, on)
            log.warning("replica %s %s %s", name, "is" if on else "is no longer", flag)
            self.notify()
        return replica

    def models(self) -> list[dict[str, Any]]:
        """Union of the replicas' served models (first seen wins)."""
        seen: dict[str, dict[str, Any]] = {}
        for r in self.replicas:
            for m in r.models:
                mid = m.get("id")
                if isinstance(mid, str) and mid not in seen:
                    seen[mid] = m
        return list(seen.values())

    def notify(self) -> None:
        """Wake anyone waiting for a replica change (health, capacity)."""
        self.changed.set()
        self.changed = asyncio.Event()


class HealthMonitor:
    def __init__(
        self,
        registry: ReplicaRegistry,
        client: ProbeClient,
        cfg: HealthConfig,
        rng: random.Random | None = None,
    ) -> None:
        self._registry = registry
        self._client = client
        self._cfg = cfg
        self._rng = rng or random.Random()
        self._tasks = ReplicaTasks("health", self._loop)
        registry.subscribe(self)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(r) for r in self._registry))

    async def start(self) -> None:
        self._tasks.start(self._registry)

    async def stop(self) -> None:
        await self._tasks.stop()

    def replica_added(self, replica: Replica) -> None:
        self._tasks.add(replica)

    def replica_removed(self, replica: Replica) -> None:
        self._tasks.remove(replica.name)

    async def _loop(self, replica: Replica, first_now: bool) -> None:
        if first_now:
            await self.check(replica)
        while True:
            delay = self._cfg.interval_s * (0.8 + 0.4 * self._rng.random())
            await asyncio.sleep(delay)
            await self.check(replica)

    async def check(self, replica: Replica) -> None:
        ok, error = await self._probe(replica)
        h = replica.health
        h.last_check = time.monotonic()
        h.checked = True
        h.last_error = error
        if ok:
            h.ok_streak += 1
            h.fail_streak = 0
            if not h.healthy and h.ok_streak >= self._cfg.healthy_after:
                await self._discover(replica)
                h.healthy = True
                log.info("replica %s is healthy (%s)", replica.name, replica.kind)
                self._registry.notify()
        else:
            h.fail_streak += 1
            h.ok_streak = 0
            if h.healthy and h.fail_streak >= self._cfg.unhealthy_after:
                h.healthy = False
                log.warning("replica %s is unhealthy: %s", replica.name, error)
                self._registry.notify()

    async def _probe(self, replica: Replica) -> tuple[bool, str | None]:
        try:
            resp = await self._client.get(
                replica.url + "/health", self._cfg.timeout_s, replica.auth_headers()
            )
        except GatewayError as exc:
            return False, exc.message
        if resp.status == 200:
            return True, None
        return False, f"/health answered HTTP {resp.status}"

    async def _discover(self, replica: Replica) -> None:
        get = ReplicaGet(self._client, replica.url, replica.auth_headers(), self._cfg.timeout_s)
        try:
            if replica.engine.generic:
                replica.found.kind = await detect_kind(get)
        except GatewayError as exc:
            log.warning("cannot detect engine kind of %s: %s", replica.name, exc.message)
        await self._read_models(replica)
        if replica.config.max_model_len is None:
            try:
                n_ctx = await replica.engine.context_length(get)
            except GatewayError:
                n_ctx = None
            replica.found.max_model_len = n_ctx or replica.found.max_model_len

    async def _read_models(self, replica: Replica) -> None:
        try:
            resp = await self._client.get(
                replica.url + "/v1/models", self._cfg.timeout_s, replica.auth_headers()
            )
            data = json.loads(resp.body) if resp.status == 200 else None
        except (GatewayError, ValueError) as exc:
            log.warning("cannot read models of %s: %s", replica.name, exc)
            return
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            return
        replica.found.models = [m for m in models if isinstance(m, dict)]
        if replica.config.max_model_len is None:
            lens = [m.get("max_model_len") for m in replica.models]
            found = [v for v in lens if isinstance(v, int) and v > 0]
            if found:
                replica.found.max_model_len = min(found)
