"""Prometheus metrics of one gateway instance (served on the admin listener).

Labels stay low-cardinality: task, outcome, replica, stage. Never request ids.
Each app has its own registry (no globals), so tests can run several gateways
in one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.metrics_core import Metric

from gateway import __version__, buildinfo
from gateway.observability.cells import LockFreeCounter, LockFreeGauge, LockFreeHistogram

M_co = TypeVar("M_co", covariant=True)


class _Labelled(Protocol[M_co]):
    def labels(self, *values: str) -> M_co: ...


class Children(Generic[M_co]):
    """A labelled metric's children cached by label values.

    `metric.labels(...)` validates and stringifies on every call (~3 µs);
    the hot path asks for the same few children per request. Label values
    here are low-cardinality by construction (task, outcome, stage,
    replica), so the cache stays as small as prometheus' own."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: _Labelled[M_co]) -> None:
        self._metric = metric
        self._cache: dict[tuple[str, ...], M_co] = {}

    def __call__(self, *values: str) -> M_co:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._metric.labels(*values)
        return child

    def forget_where(self, index: int, value: str) -> None:
        """Drop the cached children whose label at `index` is `value`."""
        for key in [k for k in self._cache if k[index] == value]:
            del self._cache[key]


_WITH_CREATED = frozenset({"counter", "histogram", "summary"})


class GatewayRegistry(CollectorRegistry):
    """The gateway's registry: prometheus_client's `<name>_created` samples (a creation
    timestamp per counter, histogram and summary child) are left out of every scrape,
    whatever `PROMETHEUS_DISABLE_CREATED_SERIES` says, so that every install exports the
    same series (docs/metrics.md)."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            if family.type in _WITH_CREATED:
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or GatewayRegistry()
        r = self.registry
        self.requests = LockFreeCounter(
            "gateway_requests",
            "Requests finished, by task and outcome.",
            ["task", "outcome"],
            registry=r,
        )
        self.duration = LockFreeHistogram(
            "gateway_request_duration_seconds",
            "Time from receipt to last byte, by task and outcome.",
            ["task", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfb = LockFreeHistogram(
            "gateway_time_to_first_byte_seconds",
            "Time from receipt to the first response byte sent to the client.",
            ["task"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_attempts = LockFreeCounter(
            "gateway_upstream_attempts",
            "Upstream attempts by replica and result.",
            ["replica", "result"],
            registry=r,
        )
        self.cancellations = Counter(
            "gateway_cancellations",
            "Requests whose client went away, by stage.",
            ["stage"],
            registry=r,
        )
        self.in_flight = LockFreeGauge(
            "gateway_in_flight_requests", "Requests being processed.", registry=r
        )
        self.admitted = LockFreeCounter(
            "gateway_requests_admitted",
            "Requests that entered the pipeline; equals the sum of gateway_requests_total "
            "(finished + cancelled + failed) once they settle.",
            registry=r,
        )
        self.deadline_exceeded = Counter(
            "gateway_deadline_exceeded",
            "Requests stopped by their deadline, by stage.",
            ["stage"],
            registry=r,
        )
        self.tokens = LockFreeCounter(
            "gateway_tokens",
            "Tokens of finished requests by task, as the engines reported them in `usage`: "
            "direction prompt (of which cached: prompt tokens served from the prefix cache) "
            "or completion.",
            ["task", "direction"],
            registry=r,
        )
        self.tokens_by = Children(self.tokens)
        self.requests_by = Children(self.requests)
        self.duration_by = Children(self.duration)
        self.ttfb_by = Children(self.ttfb)
        self.attempts_by = Children(self.upstream_attempts)
        Info(
            "gateway_build",
            "The running gateway: version, and whether its request path is compiled.",
            registry=r,
        ).info({"version": __version__, "compiled": "true" if buildinfo.compiled() else "false"})
        self.replica_healthy = Gauge(
            "gateway_replica_healthy",
            "1 when the replica passes health checks.",
            ["replica"],
            registry=r,
        )
        self.replica_ejections = Counter(
            "gateway_replica_ejections",
            "Times a replica was taken out of routing for failing exchanges (passive health).",
            ["replica"],
            registry=r,
        )
        self.replica_in_flight = Gauge(
            "gateway_replica_in_flight",
            "Requests forwarded to the replica.",
            ["replica"],
            registry=r,
        )
        self.replica_draining = Gauge(
            "gateway_replica_draining",
            "1 while the replica gets no new requests: drained through the admin API, "
            "or leaving (its address vanished from DNS discovery).",
            ["replica"],
            registry=r,
        )
        self.discovery_failures = Counter(
            "gateway_discovery_failures",
            "DNS resolutions of a `discovery` entry that failed (the replica set was kept).",
            ["discovery"],
            registry=r,
        )
        self.state_store_up = Gauge(
            "gateway_state_store_up",
            "1 while the shared state store (state.backend: redis) answers; always 1 with "
            "the in-process store.",
            registry=r,
        )
        self.state_store_up.set(1)
        self.state_store_fallbacks = Counter(
            "gateway_state_store_fallbacks",
            "Times the shared state store was lost: on_failure open switched to in-process "
            "state, closed started answering 503 state_unavailable.",
            registry=r,
        )

    def forget_replica(self, name: str) -> None:
        """Drop the series of a replica that left the set (bounded label sets
        when DNS discovery replaces replicas)."""
        for gauge in (self.replica_healthy, self.replica_in_flight, self.replica_draining):
            with contextlib.suppress(KeyError):
                gauge.remove(name)
        with contextlib.suppress(KeyError):
            self.replica_ejections.remove(name)
        self.upstream_attempts.remove_where("replica", name)
        self.attempts_by.forget_where(0, name)
