"""Admission metrics: per priority class counters, per replica live gauges.

Per class: `gateway_admission_admitted_total`, `gateway_admission_rejected_total`
(by reason), `gateway_admission_queue_wait_seconds` (histogram),
`gateway_admission_queue_length` and `_queue_tokens`.
Per replica: `gateway_replica_kv_capacity_tokens`, `_kv_used_tokens`
(metrics view), `_kv_leased_tokens` (ledger view), `_prefill_backlog_tokens`,
`_prefill_tokens_per_second`, `_live_healthy`, `_live_stale`, and per replica and
model `gateway_replica_prompt_ratio` (the learned engine count / estimate, once it
applies). Gauges are read at scrape time (a collector), so they never lag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.observability.cells import LockFreeCounter, LockFreeHistogram
from gateway.observability.metrics import Children
from gateway.replicas.livestate import LiveState
from gateway.replicas.registry import Replica

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

QueueView = Callable[[], Iterable[tuple[str, int, int]]]  # (class, length, tokens)
RatioView = Callable[[], Iterable[tuple[str, str, float]]]  # (replica, model, ratio)

_REPLICA_GAUGES: tuple[tuple[str, str, Callable[[LiveState], float | None]], ...] = (
    ("kv_capacity_tokens", "KV cache capacity in tokens.", lambda s: s.capacity_tokens),
    ("kv_used_tokens", "KV tokens in use per the engine's metrics.", lambda s: s.used_tokens),
    (
        "kv_leased_tokens",
        "KV tokens leased by admitted requests (ledger).",
        lambda s: s.leased_tokens,
    ),
    (
        "prefill_backlog_tokens",
        "Uncached prompt tokens admitted, first token not yet seen.",
        lambda s: s.prefill_backlog_tokens,
    ),
    (
        "prefill_tokens_per_second",
        "Measured (or default) prefill rate.",
        lambda s: s.prefill_tokens_per_s,
    ),
    ("live_healthy", "1 while live-state polls succeed.", lambda s: 1 if s.healthy else 0),
    (
        "live_stale",
        "1 when the last good reading is older than the staleness bound.",
        lambda s: 1 if s.stale else 0,
    ),
)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.admitted = LockFreeCounter(
            "gateway_admission_admitted",
            "Requests admitted to a replica, by class.",
            ["priority"],
            registry=registry,
        )
        self.rejected = Counter(
            "gateway_admission_rejected",
            "Requests that left admission without a lease, by class and reason.",
            ["priority", "reason"],
            registry=registry,
        )
        self.queue_wait = LockFreeHistogram(
            "gateway_admission_queue_wait_seconds",
            "Time spent in the gateway queue before admission, by class.",
            ["priority"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.admitted_by = Children(self.admitted)
        self.queue_wait_by = Children(self.queue_wait)
        self._registry = registry

    def watch(self, replicas: Iterable[Replica], queue: QueueView, ratios: RatioView) -> None:
        """`replicas` is read at every scrape (the set may change at run time)."""
        self._registry.register(_LiveCollector(replicas, queue, ratios))


class _LiveCollector(Collector):
    def __init__(self, replicas: Iterable[Replica], queue: QueueView, ratios: RatioView) -> None:
        self._replicas = replicas
        self._queue = queue
        self._ratios = ratios

    def collect(self) -> Iterator[Metric]:
        for name, doc, get in _REPLICA_GAUGES:
            family = GaugeMetricFamily(f"gateway_replica_{name}", doc, labels=["replica"])
            for r in self._replicas:
                value = get(r.live) if r.live is not None else None
                if value is not None:
                    family.add_metric([r.name], float(value))
            yield family
        length = GaugeMetricFamily(
            "gateway_admission_queue_length", "Requests waiting, by class.", labels=["priority"]
        )
        tokens = GaugeMetricFamily(
            "gateway_admission_queue_tokens", "KV tokens waiting, by class.", labels=["priority"]
        )
        for cls, n, t in self._queue():
            length.add_metric([cls], n)
            tokens.add_metric([cls], t)
        yield length
        yield tokens
        ratio = GaugeMetricFamily(
            "gateway_replica_prompt_ratio",
            "Learned engine prompt count / estimate (the p90), once it applies.",
            labels=["replica", "model"],
        )
        for replica, model, value in self._ratios():
            ratio.add_metric([replica, model], value)
        yield ratio
