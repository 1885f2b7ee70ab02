"""Passive health (outlier ejection, as Envoy does): a replica whose exchanges
keep failing is taken out of routing for a while, even when its `/health`
still answers 200 (an engine that dies mid-stream, or answers 5xx).

`health.eject_after` consecutive failed exchanges (connection failures, 5xx,
a stream that broke, no first byte in time) eject it for `health.eject_base_s`,
doubling while it keeps failing (up to `health.eject_max_s`): once back, a
single failure ejects it again. One exchange that works resets it. The
active `/health` probe is unchanged. `eject_after: 0` turns this off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.config.schema import HealthConfig
from gateway.errors import (
    GatewayError,
    UpstreamError,
    UpstreamNeverReached,
    UpstreamStaleConnection,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.replicas.registry import Replica

log = logging.getLogger(__name__)


def failed_exchange(err: GatewayError | None) -> bool | None:
    """Whether an attempt's outcome speaks against the replica: True (its
    fault), False (it answered), None (says nothing: a stale pooled connection,
    the client's own deadline)."""
    if err is None:
        return False
    if isinstance(err, UpstreamStaleConnection):
        return None
    if isinstance(err, UpstreamNeverReached | UpstreamUnavailable | UpstreamTimeout):
        return True
    if isinstance(err, UpstreamError):
        return err.status >= 500
    return None


class OutlierDetector:
    def __init__(
        self,
        cfg: HealthConfig,
        on_eject: Callable[[Replica], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg
        self._on_eject = on_eject
        self._clock = clock

    def record(self, replica: Replica, failed: bool | None) -> None:
        if failed is None or self._cfg.eject_after == 0:
            return
        e = replica.ejection
        if not failed:
            e.exchange_failures = 0
            e.ejections = 0
            return
        e.exchange_failures += 1
        if e.exchange_failures < self._cfg.eject_after:
            return
        e.ejections += 1
        cfg = self._cfg
        seconds = min(cfg.eject_max_s, cfg.eject_base_s * 2 ** (e.ejections - 1))
        e.until = self._clock() + seconds
        # Back from ejection, one more failure is enough to eject it again.
        e.exchange_failures = cfg.eject_after - 1
        log.warning(
            "replica %s ejected for %.1f s after failed exchanges (ejection %d)",
            replica.name,
            seconds,
            e.ejections,
        )
        if self._on_eject is not None:
            self._on_eject(replica)
