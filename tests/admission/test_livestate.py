"""`ReplicaLive`: the snapshot published after a ledger change equals a full rebuild."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.schema import AdmissionConfig
from gateway.engines.readings import EngineReading
from gateway.replicas.livestate import ReplicaLive

readings = st.builds(
    EngineReading,
    capacity_tokens=st.one_of(st.none(), st.integers(1, 10**7)),
    used_tokens=st.one_of(st.none(), st.integers(0, 10**7)),
    running=st.one_of(st.none(), st.integers(0, 64)),
    waiting=st.one_of(st.none(), st.integers(0, 64)),
    max_in_flight=st.one_of(st.none(), st.integers(1, 64)),
    prompt_tokens_total=st.one_of(st.none(), st.floats(0, 1e9)),
    generation_tokens_total=st.one_of(st.none(), st.floats(0, 1e9)),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("read"), readings, st.floats(0, 5)),
        st.tuples(st.just("fail"), st.none(), st.floats(0, 5)),
        st.tuples(
            st.just("ledger"),
            st.tuples(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 64)),
            st.floats(0, 5),
        ),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, capacity=st.one_of(st.none(), st.integers(1, 10**6)))
def test_ledger_change_snapshot_equals_full_rebuild(
    ops: list[tuple[str, object, float]], capacity: int | None
) -> None:
    live = ReplicaLive(AdmissionConfig(stale_after_s=2.0), capacity)
    now = 1000.0
    for kind, arg, dt in ops:
        now += dt  # readings go stale after 2 s without one
        if kind == "read":
            assert isinstance(arg, EngineReading)
            live.observe(arg, now)
        elif kind == "fail":
            live.poll_failed(now)
        else:
            assert isinstance(arg, tuple)
            fast = live.ledger_changed(*arg, now)
            assert fast == live._snapshot(now)
            assert live.state is fast
