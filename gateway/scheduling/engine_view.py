"""What routing reads of a replica's engine: the admission stage's `LiveState`
(engine readings merged with the gateway's ledger) as an `EngineView`.
Every field is optional: None means unknown, and the router falls back to
its own bookkeeping or to config defaults.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.config.scheduling import SchedulingConfig
from gateway.replicas.registry import Replica


class EngineView(NamedTuple):
    """What routing reads of a replica's engine (a NamedTuple: built per request)."""

    capacity_tokens: int | None = None
    used_tokens: int | None = None
    backlog_tokens: int | None = None
    prefill_rate: float | None = None
    waiting: int | None = None
    #: KV tokens in use per the engine's own metrics (not the ledger's leases)
    engine_used_tokens: int | None = None
    #: sequences the engine runs now (vLLM `num_requests_running`, llama.cpp busy slots)
    running: int | None = None
    #: sequences it may run at once: llama.cpp slots, or the admission bound on in-flight
    max_seqs: int | None = None
    #: llama.cpp: busy flag per slot id, None when unknown (the live state does
    #: not list slots today: pinning then uses the slot count `max_seqs`, else
    #: `scheduling.llamacpp_slots`).
    slots_busy: tuple[bool, ...] | None = None


def capacity_tokens(replica: Replica) -> int | None:
    """`engine_view(replica).capacity_tokens`, without building the view."""
    s = replica.live
    cap = s.capacity_tokens if s is not None else None
    return cap if cap is not None and cap >= 0 else replica.config.capacity_tokens


def engine_view(replica: Replica) -> EngineView:
    s = replica.live
    if s is None:
        return EngineView(capacity_tokens=replica.config.capacity_tokens)
    used = s.kv_used_tokens
    rate = s.prefill_tokens_per_s
    waiting = s.engine_waiting
    backlog = s.prefill_backlog_tokens
    running = s.engine_running
    max_seqs = s.max_in_flight
    return EngineView(
        capacity_tokens=capacity_tokens(replica),
        used_tokens=used if used >= 0 else None,
        backlog_tokens=backlog if backlog >= 0 else None,
        prefill_rate=rate if rate > 0 else None,
        waiting=waiting if waiting is not None and waiting >= 0 else None,
        engine_used_tokens=s.used_tokens
        if s.used_tokens is not None and s.used_tokens >= 0
        else None,
        running=running if running is not None and running >= 0 else None,
        max_seqs=max_seqs if max_seqs is not None and max_seqs > 0 else None,
    )


def max_seqs(replica: Replica, view: EngineView, cfg: SchedulingConfig) -> int:
    """Sequences the replica runs at once: an engine's slots (llama.cpp), else
    `max_num_seqs` (or the admission bound on its in-flight requests, when lower)."""
    limit = cfg.decode.max_num_seqs
    if replica.engine.slot_field is not None:
        limit = view.max_seqs or cfg.llamacpp_slots or limit
    return min(limit, view.max_seqs or limit)
