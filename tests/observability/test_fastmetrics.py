"""The lock-free hot-path metrics expose exactly what prometheus_client would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.observability.cells import LockFreeCounter, LockFreeGauge, LockFreeHistogram

BUCKETS = (0.005, 0.01, 0.1, 1, 2.5, 600)
_LABELS = st.sampled_from(["chat", "agent", "bat ch", 'q"uote'])


def _exposition(registry: CollectorRegistry) -> list[str]:
    return sorted(
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    )


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(_LABELS, _LABELS, st.floats(min_value=0, max_value=1000, allow_nan=False)),
        max_size=30,
    ),
    gauge_moves=st.lists(st.booleans(), max_size=20),
)
def test_same_exposition_as_prometheus_client(
    ops: list[tuple[str, str, float]], gauge_moves: list[bool]
) -> None:
    ref, fast = CollectorRegistry(), CollectorRegistry()
    rc = Counter("t_requests", "Requests.", ["task", "outcome"], registry=ref)
    fc = LockFreeCounter("t_requests", "Requests.", ["task", "outcome"], registry=fast)
    rh = Histogram("t_seconds", "Seconds.", ["task"], buckets=BUCKETS, registry=ref)
    fh = LockFreeHistogram("t_seconds", "Seconds.", ["task"], buckets=BUCKETS, registry=fast)
    rg = Gauge("t_in_flight", "In flight.", registry=ref)
    fg = LockFreeGauge("t_in_flight", "In flight.", registry=fast)
    ru = Counter("t_admitted", "Admitted.", registry=ref)
    fu = LockFreeCounter("t_admitted", "Admitted.", registry=fast)
    for task, outcome, value in ops:
        rc.labels(task, outcome).inc(value)
        fc.labels(task, outcome).inc(value)
        rh.labels(task).observe(value)
        fh.labels(task).observe(value)
        ru.inc()
        fu.inc()
    for up in gauge_moves:
        (rg.inc if up else rg.dec)()
        (fg.inc if up else fg.dec)()
    assert _exposition(fast) == _exposition(ref)
