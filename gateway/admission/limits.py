"""Whether one replica can admit a request now, and the limits to reserve under.

Per replica (all in tokens unless noted; see `controller.py`): healthy and
not draining; the engine's own waiting queue ≤ `max_engine_waiting`; KV:
leased + need ≤ watermark(class) × capacity − external use; prefill:
backlog + uncached prompt ≤ TTFT target(class) × prefill rate; in flight
under the concurrency bound. With no known capacity, in-flight counts only.
"""

from __future__ import annotations

from gateway.admission.ledger import Demand, Limits
from gateway.config.schema import AdmissionConfig
from gateway.replicas.registry import Replica


def replica_limits(
    cfg: AdmissionConfig, replica: Replica, demand: Demand, cls: str
) -> Limits | str:
    """The reserve limits on `replica`, or why it cannot admit now."""
    s = replica.live
    if not replica.healthy or s is None or not s.healthy:
        return "unhealthy"
    if replica.draining or replica.leaving:
        return "draining"
    if s.capacity_tokens is None:
        bounds = [b for b in (cfg.unknown_capacity_max_in_flight, s.max_in_flight) if b is not None]
        bound = min(bounds) if bounds else None
        if bound is not None and s.in_flight + 1 > bound:
            return "in_flight"
        return Limits(None, None, bound)
    if (
        cfg.max_engine_waiting is not None
        and s.engine_waiting is not None
        and s.engine_waiting > cfg.max_engine_waiting
    ):
        return "engine_queue"
    free = s.capacity_tokens - s.external_tokens
    kv = int(cfg.watermark(cls) * s.capacity_tokens) - s.external_tokens
    if demand.kv_tokens <= free:
        kv = max(kv, demand.kv_tokens)  # an idle ledger takes any request that fits
    prefill = max(int(cfg.ttft_target(cls) * s.prefill_tokens_per_s), demand.prefill_tokens)
    limits = Limits(kv, prefill, s.max_in_flight)
    if s.leased_tokens + demand.kv_tokens > kv:
        return "kv"
    if s.prefill_backlog_tokens + demand.prefill_tokens > prefill:
        return "prefill"
    if s.max_in_flight is not None and s.in_flight + 1 > s.max_in_flight:
        return "in_flight"
    return limits
