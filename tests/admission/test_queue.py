"""The admission queue: order (class, deadline, arrival), bounds, removal, drain rate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.admission.queue import AdmissionQueue, QueueFull

CLASSES = ("interactive", "standard", "batch")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(
    max_requests: int = 100, max_tokens: int = 10**9, clock: Clock | None = None
) -> AdmissionQueue[str]:
    return AdmissionQueue(
        CLASSES,
        dict.fromkeys(CLASSES, max_requests),
        dict.fromkeys(CLASSES, max_tokens),
        clock or Clock(),
    )


def test_order_is_class_then_deadline_then_arrival() -> None:
    q = make()
    q.push("b1", "batch", 1.0, 10)
    q.push("s-late", "standard", 50.0, 10)
    q.push("s-early", "standard", 20.0, 10)
    q.push("s-early-2", "standard", 20.0, 10)
    q.push("i", "interactive", 99.0, 10)
    assert [e.item for e in q.ordered()] == ["i", "s-early", "s-early-2", "s-late", "b1"]


def test_bounds_per_class_in_requests_and_tokens() -> None:
    q: AdmissionQueue[str] = AdmissionQueue(
        CLASSES,
        {"interactive": 1, "standard": 5, "batch": 5},
        {"interactive": 100, "standard": 100, "batch": 100},
        Clock(),
    )
    q.push("i1", "interactive", 1.0, 10)
    with pytest.raises(QueueFull) as info:
        q.push("i2", "interactive", 1.0, 10)
    assert info.value.cls == "interactive" and info.value.retry_after >= 1
    q.push("s1", "standard", 1.0, 60)
    with pytest.raises(QueueFull):
        q.push("s2", "standard", 1.0, 41)
    q.push("b1", "batch", 1.0, 100)  # other classes are independent
    assert len(q) == 3


def test_remove_is_idempotent_and_frees_the_bounds() -> None:
    q = make(max_requests=1)
    e = q.push("x", "batch", 1.0, 5)
    assert q.remove(e) and not q.remove(e)
    assert len(q) == 0 and q.stats["batch"].tokens == 0
    q.push("y", "batch", 1.0, 5)
    assert [x.item for x in q.ordered()] == ["y"]


def test_retry_after_follows_the_drain_rate() -> None:
    clock = Clock()
    q = make(clock=clock)
    entries = [q.push(str(i), "standard", 100.0, 1) for i in range(30)]
    for e in entries[:10]:  # 10 admissions, one every 0.5 s: 2 per second
        clock.now += 0.5
        q.remove(e, admitted=True)
    assert q.stats["standard"].drain_per_s == pytest.approx(2.0)
    assert q.retry_after("standard") == 10.0  # 20 left at 2/s
    assert q.retry_after("batch") == 5.0  # nothing observed: a fixed guess


@given(st.lists(st.tuples(st.sampled_from(CLASSES), st.floats(0, 100), st.booleans()), max_size=60))
def test_ordered_is_sorted_and_counts_match(ops: list[tuple[str, float, bool]]) -> None:
    q = make()
    live = []
    for i, (cls, deadline, drop) in enumerate(ops):
        e = q.push(f"{i}", cls, deadline, 1)
        live.append(e)
        if drop:
            q.remove(live.pop(0))
    out = list(q.ordered())
    assert len(out) == len(q) == len(live)
    keys = [(CLASSES.index(e.cls), e.deadline, e.seq) for e in out]
    assert keys == sorted(keys)
    ahead = [q.ahead_tokens(e) for e in out]
    assert ahead == list(range(len(out)))
