"""Live state of one replica: engine readings + the gateway's ledger, as one snapshot.

`ReplicaLive` is the mutable tracker (one per replica) fed by the poller
(`observe`, `poll_failed`) and by the admission ledger (`ledger_changed`).
After every change it publishes an immutable `LiveState` on `Replica.state`,
which routing scorers and the admin API read without locks (a NamedTuple:
it is rebuilt twice per request, and a frozen dataclass's field-by-field
`object.__setattr__` costs ~5x as much to build):

    capacity_tokens         KV capacity (config override, else the engine's)
    used_tokens             KV tokens in use per the engine's metrics (None: unknown)
    leased_tokens           KV tokens leased by admitted requests (ledger view)
    prefill_backlog_tokens  uncached prompt tokens admitted, first token not yet seen
    in_flight               admitted, unfinished requests (ledger view)
    engine_waiting          the engine's own waiting queue (None: unknown)
    engine_running          sequences the engine runs now (None: unknown)
    max_in_flight           concurrency bound (config, else llama.cpp slots)
    prefill_tokens_per_s    measured prefill rate (else the configured default)
    decode_tokens_per_s     measured decode rate (None: not measured yet)
    preemptions_total       the engine's preemption counter (None: not exposed)
    healthy                 the last polls succeeded (False after N failures)
    stale                   the last good reading is older than the staleness bound
    read_at                 monotonic time of the last good reading (None: never)

Rates come from counter deltas over time, sampled only while the engine was
busy with prefill (the gateway's backlog was non-empty at both ends of the
interval): an idle engine's throughput says nothing about its capacity.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gateway.config.schema import AdmissionConfig
from gateway.engines.readings import EngineReading

_EWMA = 0.3


class LiveState(NamedTuple):
    capacity_tokens: int | None = None
    used_tokens: int | None = None
    leased_tokens: int = 0
    prefill_backlog_tokens: int = 0
    in_flight: int = 0
    engine_waiting: int | None = None
    engine_running: int | None = None
    max_in_flight: int | None = None
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float | None = None
    preemptions_total: float | None = None
    healthy: bool = True
    stale: bool = True
    read_at: float | None = None

    @property
    def kv_used_tokens(self) -> int:
        """The larger of the ledger and metrics views (traffic from elsewhere counts)."""
        return max(self.leased_tokens, self.used_tokens or 0)

    @property
    def external_tokens(self) -> int:
        """KV use the engine reports beyond what this ledger leased (0 when stale)."""
        if self.stale or self.used_tokens is None:
            return 0
        return max(0, self.used_tokens - self.leased_tokens)

    def estimated_ttft_s(self, prefill_tokens: int) -> float:
        """Queue + prefill time for `prefill_tokens` more on this replica."""
        rate = self.prefill_tokens_per_s or 1.0
        return (self.prefill_backlog_tokens + prefill_tokens) / rate

    def describe(self) -> dict[str, Any]:
        out = self._asdict()
        out["prefill_tokens_per_s"] = round(self.prefill_tokens_per_s, 1)
        return out


# Field order of LiveState: capacity, used, leased, backlog, in_flight, then the rest.
_make_live = LiveState._make
assert LiveState._fields[2:5] == ("leased_tokens", "prefill_backlog_tokens", "in_flight")


class RateMeter:
    """EWMA of counter deltas per second, sampled only when `busy`."""

    __slots__ = ("_last", "rate")

    def __init__(self) -> None:
        self._last: tuple[float, float, bool] | None = None
        self.rate: float | None = None

    def update(self, now: float, counter: float | None, busy: bool) -> None:
        if counter is None:
            return
        last, self._last = self._last, (now, counter, busy)
        if last is None or not (busy and last[2]):
            return
        dt, delta = now - last[0], counter - last[1]
        if dt <= 0 or delta <= 0:  # restarted engine (counter reset) or nothing done
            return
        sample = delta / dt
        self.rate = sample if self.rate is None else (1 - _EWMA) * self.rate + _EWMA * sample


class ReplicaLive:
    """Mutable per-replica tracker that publishes `LiveState` snapshots."""

    def __init__(self, cfg: AdmissionConfig, capacity_override: int | None) -> None:
        self._cfg = cfg
        self._capacity_override = capacity_override
        self.reading: EngineReading | None = None
        self.read_at: float | None = None
        self.failures = 0
        self.leased = 0
        self.backlog = 0
        self.in_flight = 0
        self._prefill = RateMeter()
        self._decode = RateMeter()
        self._known_capacity: int | None = capacity_override
        self.state = self._snapshot(now=None)

    def observe(self, reading: EngineReading, now: float) -> LiveState:
        busy = self.backlog > 0 or bool(reading.waiting)
        self._prefill.update(now, reading.prompt_tokens_total, busy)
        self._decode.update(now, reading.generation_tokens_total, bool(reading.running))
        self.reading, self.read_at, self.failures = reading, now, 0
        if self._capacity_override is None and reading.capacity_tokens:
            self._known_capacity = reading.capacity_tokens
        return self._publish(now)

    def poll_failed(self, now: float) -> LiveState:
        self.failures += 1
        return self._publish(now)

    def ledger_changed(self, leased: int, backlog: int, in_flight: int, now: float) -> LiveState:
        """The ledger moved (twice per request): when the reading's staleness is
        unchanged, only the three ledger fields of the snapshot change."""
        self.leased, self.backlog, self.in_flight = leased, backlog, in_flight
        s = self.state
        if s.stale != self._stale(now):
            return self._publish(now)
        self.state = _make_live((s[0], s[1], leased, backlog, in_flight, *s[5:]))
        return self.state

    def _publish(self, now: float) -> LiveState:
        self.state = self._snapshot(now)
        return self.state

    def _prefill_rate(self) -> float:
        # Measured over wall time first; the engine's own average (llama.cpp) next.
        if self._prefill.rate:
            return self._prefill.rate
        r = self.reading
        if r is not None and r.prompt_tokens_per_s:
            return r.prompt_tokens_per_s
        return self._cfg.default_prefill_tokens_per_s

    def _stale(self, now: float | None) -> bool:
        return (
            self.reading is None
            or now is None
            or self.read_at is None
            or now - self.read_at > self._cfg.stale_after_s
        )

    def _snapshot(self, now: float | None) -> LiveState:
        r = self.reading
        stale = self._stale(now)
        max_in_flight = self._cfg.max_in_flight
        if r is not None and r.max_in_flight is not None:
            max_in_flight = min(max_in_flight or r.max_in_flight, r.max_in_flight)
        decode = self._decode.rate or (r.decode_tokens_per_s if r is not None else None)
        return LiveState(
            capacity_tokens=self._known_capacity,
            used_tokens=None if r is None else r.used_tokens,
            leased_tokens=self.leased,
            prefill_backlog_tokens=self.backlog,
            in_flight=self.in_flight,
            engine_waiting=None if r is None or stale else r.waiting,
            engine_running=None if r is None else r.running,
            max_in_flight=max_in_flight,
            prefill_tokens_per_s=self._prefill_rate(),
            decode_tokens_per_s=decode,
            preemptions_total=None if r is None else r.preemptions_total,
            healthy=self.failures < self._cfg.unhealthy_after_failures,
            stale=stale,
            read_at=self.read_at,
        )
