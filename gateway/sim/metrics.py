"""Prometheus exposition in each engine's own names.

vLLM: `prometheus_client` on a per-replica `CollectorRegistry` (several replicas
share a process), labels `model_name` and `engine="0"`. Gauges and counters are
read from the engine state at scrape time; histograms are observed as requests
progress, in simulated seconds. `vllm:cache_config_info` also carries
`model_name` (real vLLM labels it with `engine` and the cache config only).

llama.cpp: hand-written text exactly as llama-server prints it (`llamacpp:`
prefix, no labels, no `_created` samples), served only with `--metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.sim.config import SimConfig
from gateway.sim.engine import Totals
from gateway.sim.request import RequestRecord

_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_LABELS = ("model_name", "engine")
_FINISH_REASONS = ("stop", "length", "abort")

Snapshot = Callable[[], tuple[Totals, dict[str, Any]]]

_DOCS = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
}
#: (metric, key of the scheduler gauges)
_GAUGES = (
    ("vllm:num_requests_running", "running"),
    ("vllm:num_requests_waiting", "waiting"),
    ("vllm:kv_cache_usage_perc", "kv_usage"),
    ("vllm:gpu_cache_usage_perc", "kv_usage"),
)
#: (metric, field of Totals)
_COUNTERS = (
    ("vllm:prefix_cache_queries", "prefix_queries_tokens"),
    ("vllm:prefix_cache_hits", "prefix_hits_tokens"),
    ("vllm:num_preemptions", "preemptions"),
    ("vllm:prompt_tokens", "prompt_tokens"),
    ("vllm:generation_tokens", "generation_tokens"),
)


class _VllmCollector(Collector):
    """Gauges and counters computed from the engine state on each scrape."""

    def __init__(
        self, config: SimConfig, snapshot: Snapshot, finished: Callable[[], dict[str, int]]
    ):
        self._config = config
        self._snapshot = snapshot
        self._finished = finished
        self._labels = [config.model, "0"]

    def collect(self) -> Iterable[Metric]:
        totals, gauges = self._snapshot()
        for name, key in _GAUGES:
            if name != "vllm:gpu_cache_usage_perc" or self._config.legacy_metrics:
                yield self._gauge(name, _DOCS[name], gauges[key])
        yield self._cache_config_info()
        for name, key in _COUNTERS:
            yield self._counter(name, _DOCS[name], getattr(totals, key))
        yield self._request_success()

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=_LABELS)
        family.add_metric(self._labels, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=_LABELS)
        family.add_metric(self._labels, value)
        return family

    def _request_success(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=(*_LABELS, "finished_reason"),
        )
        finished = self._finished()
        for reason in _FINISH_REASONS:
            family.add_metric([*self._labels, reason], finished.get(reason, 0))
        return family

    def _cache_config_info(self) -> GaugeMetricFamily:
        cfg = self._config
        info = {
            "block_size": str(cfg.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "kv_cache_size_tokens": str(cfg.num_gpu_blocks * cfg.block_size),
            "num_gpu_blocks": str(cfg.num_gpu_blocks),
        }
        family = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=(*_LABELS, *info),
        )
        family.add_metric([*self._labels, *info.values()], 1.0)
        return family


class VllmMetrics:
    """The vLLM flavour's `/metrics`; also the engine's `Observer`."""

    def __init__(self, config: SimConfig, snapshot: Snapshot) -> None:
        self._config = config
        self._snapshot = snapshot
        self._finished: dict[str, int] = {}
        self._build()

    def _build(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_VllmCollector(self._config, self._snapshot, lambda: self._finished))
        self._ttft = self._histogram("vllm:time_to_first_token_seconds", _TTFT_BUCKETS)
        self._e2e = self._histogram("vllm:e2e_request_latency_seconds", _LATENCY_BUCKETS)
        self._queue = self._histogram("vllm:request_queue_time_seconds", _LATENCY_BUCKETS)
        self._itl = self._histogram("vllm:inter_token_latency_seconds", _ITL_BUCKETS)

    def _histogram(self, name: str, buckets: tuple[float, ...]) -> Any:
        hist = Histogram(name, _DOCS[name], _LABELS, buckets=buckets, registry=self.registry)
        return hist.labels(self._config.model, "0")

    def reset(self) -> None:
        self._finished = {}
        self._build()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # --- Observer ----------------------------------------------------------------
    def on_first_token(self, record: RequestRecord) -> None:
        if record.first_token is not None:
            self._ttft.observe(record.first_token - record.arrival)

    def on_token_gap(self, gap: float) -> None:
        self._itl.observe(gap)

    def on_finish(self, record: RequestRecord) -> None:
        reason = record.finish_reason or "abort"
        self._finished[reason] = self._finished.get(reason, 0) + 1
        end = record.abort_time if record.aborted else record.finish
        if end is not None:
            self._e2e.observe(end - record.arrival)
        if record.scheduled is not None:
            self._queue.observe(record.scheduled - record.arrival)


_LLAMA_DOCS = {
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens",
    "prompt_tokens_cached_total": "Number of prompt tokens reused from the cache",
    "prompt_seconds_total": "Total time spent processing prompts",
    "tokens_predicted_total": "Number of generation tokens processed",
    "tokens_predicted_seconds_total": "Total time spent generating tokens",
    "n_decode_total": (
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal "
        "decoding"
    ),
    "n_tokens_max": "Largest observed sequence length (prompt + generation)",
    "spec_decode_num_draft_tokens_total": "Speculative: Total draft tokens generated",
    "spec_decode_num_accepted_tokens_total": (
        "Speculative: Total draft tokens accepted by the target model"
    ),
    "spec_decode_num_drafts_total": "Speculative: Total speculative decoding verification steps",
    "prompt_tokens_seconds": "Average prompt throughput in tokens/s",
    "predicted_tokens_seconds": "Average generation throughput in tokens/s",
    "requests_processing": "Number of requests processing",
    "requests_deferred": "Number of requests deferred",
    "n_busy_slots_per_decode": "Average number of busy slots per llama_decode() call",
}


def llamacpp_metrics_text(totals: Totals, gauges: dict[str, Any]) -> str:
    """`/metrics` of llama-server b11434 (times in simulated seconds; no speculative decoding).

    `n_tokens_max` is typed as a counter although it is a maximum, as llama-server does."""
    decodes = totals.steps
    prompt_tps = totals.prompt_tokens_processed / totals.prompt_time if totals.prompt_time else 0.0
    gen_tps = totals.generation_tokens / totals.generation_time if totals.generation_time else 0.0
    defs = [
        ("counter", "prompt_tokens_total", totals.prompt_tokens_processed),
        ("counter", "prompt_tokens_cached_total", totals.prefix_hits_tokens),
        ("counter", "prompt_seconds_total", totals.prompt_time),
        ("counter", "tokens_predicted_total", totals.generation_tokens),
        ("counter", "tokens_predicted_seconds_total", totals.generation_time),
        ("counter", "n_decode_total", decodes),
        ("counter", "n_tokens_max", gauges.get("n_tokens_max", 0)),
        ("counter", "spec_decode_num_draft_tokens_total", 0),
        ("counter", "spec_decode_num_accepted_tokens_total", 0),
        ("counter", "spec_decode_num_drafts_total", 0),
        ("gauge", "prompt_tokens_seconds", prompt_tps),
        ("gauge", "predicted_tokens_seconds", gen_tps),
        ("gauge", "requests_processing", gauges["running"]),
        ("gauge", "requests_deferred", gauges["deferred"]),
        ("gauge", "n_busy_slots_per_decode", totals.busy_slots_total / max(decodes, 1)),
    ]
    lines: list[str] = []
    for kind, name, value in defs:
        lines += [
            f"# HELP llamacpp:{name} {_LLAMA_DOCS[name]}",
            f"# TYPE llamacpp:{name} {kind}",
            f"llamacpp:{name} {_number(value)}",
        ]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
