"""Poll each replica's live state (`gateway.engines.readings`) into `Replica.live`.

One task per replica, one request at a time, every `admission.poll_interval_s`
(jittered ±20 %), each GET bounded by `admission.poll_timeout_s`. vLLM:
`/metrics`; llama.cpp: `/props` (until it answered once), `/slots`, and
`/metrics` unless it answered 404/501 (server started without `--metrics`).
Replicas whose kind is still unknown are skipped until health checks detect it.
After every reading or failure `on_update` is called (the admission
controller wakes its queue on fresh readings). Replicas that join or leave
at run time get or lose their task (`Membership`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from gateway.config.schema import AdmissionConfig
from gateway.engines.readings import (
    EngineReading,
    MetricsParseError,
    parse_llamacpp,
    parse_vllm_metrics,
)
from gateway.errors import GatewayError
from gateway.replicas.livestate import ReplicaLive
from gateway.replicas.registry import ProbeClient, Replica, ReplicaRegistry
from gateway.replicas.tasks import ReplicaTasks

log = logging.getLogger("gateway.replicas.poller")


class PollError(Exception):
    """A poll did not yield a reading."""


class LiveStatePoller:
    def __init__(
        self,
        registry: ReplicaRegistry,
        client: ProbeClient,
        cfg: AdmissionConfig,
        trackers: dict[str, ReplicaLive],
        on_update: Callable[[Replica], None],
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._client = client
        self._cfg = cfg
        self._trackers = trackers
        self._on_update = on_update
        self._rng = rng or random.Random()
        self._clock = clock
        self._tasks = ReplicaTasks("poll", self._loop)
        self._props: dict[str, Any] = {}
        self._no_metrics: set[str] = set()
        registry.subscribe(self)

    async def start(self) -> None:
        self._tasks.start(self._registry)

    async def stop(self) -> None:
        await self._tasks.stop()

    def replica_added(self, replica: Replica) -> None:
        self._tasks.add(replica)

    def replica_removed(self, replica: Replica) -> None:
        self._tasks.remove(replica.name)
        self._props.pop(replica.name, None)
        self._no_metrics.discard(replica.name)

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(r) for r in self._registry))

    async def _loop(self, replica: Replica, first_now: bool) -> None:
        # A replica that joined is polled once its health check has found its kind.
        while True:
            await asyncio.sleep(self._cfg.poll_interval_s * (0.8 + 0.4 * self._rng.random()))
            await self.poll(replica)

    async def poll(self, replica: Replica) -> None:
        tracker = self._trackers.get(replica.name)
        if tracker is None or replica.kind not in ("vllm", "llamacpp"):
            return  # left the set, or its kind is not known yet
        try:
            reading = await self._read(replica)
        except PollError as exc:
            tracker.poll_failed(self._clock())
            if tracker.failures == self._cfg.unhealthy_after_failures:
                log.warning("replica %s stopped answering live-state polls: %s", replica.name, exc)
        else:
            tracker.observe(reading, self._clock())
        replica.live = tracker.state
        self._on_update(replica)

    async def _read(self, replica: Replica) -> EngineReading:
        if replica.kind == "vllm":
            text = await self._get_text(replica, "/metrics")
            try:
                return parse_vllm_metrics(text or "")
            except MetricsParseError as exc:
                raise PollError(f"bad /metrics: {exc}") from exc
        return await self._read_llamacpp(replica)

    async def _read_llamacpp(self, replica: Replica) -> EngineReading:
        if replica.name not in self._props:
            props = await self._get_json(replica, "/props")
            if props is not None:
                self._props[replica.name] = props
        slots = await self._get_json(replica, "/slots")
        text = None
        if replica.name not in self._no_metrics:
            text = await self._get_text(replica, "/metrics")
            if text is None:
                self._no_metrics.add(replica.name)
        try:
            return parse_llamacpp(self._props.get(replica.name), slots, text)
        except MetricsParseError as exc:
            raise PollError(f"bad /metrics: {exc}") from exc

    async def _get_text(self, replica: Replica, path: str) -> str | None:
        """Body text; None when the route does not exist (404/501)."""
        try:
            resp = await self._client.get(
                replica.url + path, self._cfg.poll_timeout_s, replica.auth_headers()
            )
        except GatewayError as exc:
            raise PollError(exc.message) from exc
        if resp.status in (404, 501):
            return None
        if resp.status != 200:
            raise PollError(f"{path} answered HTTP {resp.status}")
        return resp.body.decode("utf-8", "replace")

    async def _get_json(self, replica: Replica, path: str) -> Any:
        text = await self._get_text(replica, path)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise PollError(f"{path} is not JSON: {exc}") from exc
