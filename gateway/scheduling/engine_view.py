"""The ONE adapter from `Replica.state` (the admission stage's live engine view)
to the numbers routing uses. Every field is optional: None means unknown and
the router falls back to its own bookkeeping or to config defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.admission.livestate import LiveState

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica

# Accepted attribute names on `Replica.state`, first present wins (aligns with
# gateway/admission/controller.py; older or alternative names are listed after).
_NAMES: dict[str, tuple[str, ...]] = {
    "capacity_tokens": ("capacity_tokens", "kv_capacity_tokens"),
    "used_tokens": ("kv_used_tokens", "used_tokens", "leased_tokens"),
    "backlog_tokens": ("prefill_backlog_tokens", "backlog_tokens"),
    "prefill_rate": ("prefill_rate", "prefill_tokens_per_s", "prefill_rate_tokens_s"),
    "waiting": ("waiting", "engine_waiting", "num_waiting"),
    "slots": ("slots",),
}


class EngineView(NamedTuple):
    """What routing reads of a replica's engine (a NamedTuple: built per request)."""

    capacity_tokens: int | None = None
    used_tokens: int | None = None
    backlog_tokens: int | None = None
    prefill_rate: float | None = None
    waiting: int | None = None
    #: llama.cpp: busy flag per slot id (from `/slots`), None when unknown.
    slots_busy: tuple[bool, ...] | None = None


def _pick(state: Any, key: str) -> Any:
    for name in _NAMES[key]:
        value = state.get(name) if isinstance(state, dict) else getattr(state, name, None)
        if value is not None:
            return value
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


def _slots(value: Any) -> tuple[bool, ...] | None:
    if not isinstance(value, list | tuple) or not value:
        return None
    busy: list[bool] = []
    for slot in value:
        flag = slot.get("is_processing") if isinstance(slot, dict) else getattr(slot, "is_processing", None)
        busy.append(bool(flag))
    return tuple(busy)


def capacity_tokens(replica: Replica) -> int | None:
    """`engine_view(replica).capacity_tokens`, without building the view."""
    state = replica.state
    if type(state) is LiveState:
        cap = state.capacity_tokens
        return int(cap) if cap is not None and cap >= 0 else replica.config.capacity_tokens
    return engine_view(replica).capacity_tokens


def engine_view(replica: Replica) -> EngineView:
    state = replica.state
    if state is None:
        return EngineView(capacity_tokens=replica.config.capacity_tokens)
    if type(state) is LiveState:
        return _live_view(replica, state)
    return generic_view(replica, state)


def _live_view(replica: Replica, s: LiveState) -> EngineView:
    """`generic_view` of the admission stage's own `LiveState`, without the name
    lookups (it runs on every request); equal by test."""
    cap = s.capacity_tokens
    if cap is None or cap < 0:
        cap = replica.config.capacity_tokens
    used = s.kv_used_tokens
    rate = s.prefill_tokens_per_s
    waiting = s.engine_waiting
    backlog = s.prefill_backlog_tokens
    return EngineView(
        capacity_tokens=None if cap is None else int(cap),
        used_tokens=int(used) if used >= 0 else None,
        backlog_tokens=int(backlog) if backlog >= 0 else None,
        prefill_rate=float(rate) if rate > 0 else None,
        waiting=int(waiting) if waiting is not None and waiting >= 0 else None,
    )


def generic_view(replica: Replica, state: Any) -> EngineView:
    num = {k: _number(_pick(state, k)) for k in ("capacity_tokens", "used_tokens", "backlog_tokens",
                                                 "prefill_rate", "waiting")}
    capacity = num["capacity_tokens"]
    if capacity is None and replica.config.capacity_tokens is not None:
        capacity = float(replica.config.capacity_tokens)
    rate = num["prefill_rate"]
    return EngineView(
        capacity_tokens=None if capacity is None else int(capacity),
        used_tokens=None if num["used_tokens"] is None else int(num["used_tokens"]),
        backlog_tokens=None if num["backlog_tokens"] is None else int(num["backlog_tokens"]),
        prefill_rate=rate if rate else None,
        waiting=None if num["waiting"] is None else int(num["waiting"]),
        slots_busy=_slots(_pick(state, "slots")),
    )
