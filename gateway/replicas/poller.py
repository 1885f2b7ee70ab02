"""Poll each replica's live state (`gateway.engines.readings`) into `Replica.live`.

One task per replica, one request at a time, every `admission.poll_interval_s`
(jittered ±20 %), each GET bounded by `admission.poll_timeout_s`. What is
read is the engine adapter's (`EngineAdapter.live_reader`: one reader per
replica, which may remember what need not be asked twice). Replicas whose
engine has no reader (kind still unknown, or a generic upstream) are skipped.
After every reading or failure `on_update` is called (the admission
controller wakes its queue on fresh readings). Replicas that join or leave
at run time get or lose their task (`Membership`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from gateway.config.schema import AdmissionConfig
from gateway.engines import LiveReader
from gateway.engines.readings import EngineReading, MetricsParseError
from gateway.replicas.livestate import ReplicaLive
from gateway.replicas.probe import PollError, ProbeClient, ReplicaGet
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.replicas.tasks import ReplicaTasks

log = logging.getLogger("gateway.replicas.poller")


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
        #: replica name -> (its engine kind, that engine's reader)
        self._readers: dict[str, tuple[str, LiveReader]] = {}
        registry.subscribe(self)

    async def start(self) -> None:
        self._tasks.start(self._registry)

    async def stop(self) -> None:
        await self._tasks.stop()

    def replica_added(self, replica: Replica) -> None:
        self._tasks.add(replica)

    def replica_removed(self, replica: Replica) -> None:
        self._tasks.remove(replica.name)
        self._readers.pop(replica.name, None)

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(r) for r in self._registry))

    async def _loop(self, replica: Replica, first_now: bool) -> None:
        # A replica that joined is polled once its health check has found its kind.
        while True:
            await asyncio.sleep(self._cfg.poll_interval_s * (0.8 + 0.4 * self._rng.random()))
            await self.poll(replica)

    async def poll(self, replica: Replica) -> None:
        tracker = self._trackers.get(replica.name)
        reader = self._reader(replica)
        if tracker is None or reader is None:
            return  # left the set, or its engine has no reading (kind not known yet)
        try:
            reading = await self._read(replica, reader)
        except PollError as exc:
            tracker.poll_failed(self._clock())
            if tracker.failures == self._cfg.unhealthy_after_failures:
                log.warning("replica %s stopped answering live-state polls: %s", replica.name, exc)
        else:
            tracker.observe(reading, self._clock())
        self._on_update(replica)  # admission publishes the tracker's state (`Replica.live`)

    def _reader(self, replica: Replica) -> LiveReader | None:
        known = self._readers.get(replica.name)
        if known is not None and known[0] == replica.kind:
            return known[1]
        reader = replica.engine.live_reader()
        if reader is not None:
            self._readers[replica.name] = (replica.kind, reader)
        return reader

    async def _read(self, replica: Replica, reader: LiveReader) -> EngineReading:
        get = ReplicaGet(
            self._client,
            replica.url,
            replica.auth_headers(),
            self._cfg.poll_timeout_s,
            strict=True,
        )
        try:
            return await reader.read(get)
        except MetricsParseError as exc:
            raise PollError(f"bad /metrics: {exc}") from exc
