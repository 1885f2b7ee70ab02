"""No leaks: 200 requests with random disconnect points and random deadlines.

Afterwards every lease, queue slot, budget reservation and simulator KV
block is free, and the gateway's counters add up:
admitted = finished + cancelled + failed (tests/hardening/storm.py).
"""

from __future__ import annotations

from tests.hardening.storm import storm


def test_no_leaks_under_random_disconnects_and_deadlines() -> None:
    storm(200, workers=12, seed=7, max_in_flight=3)
