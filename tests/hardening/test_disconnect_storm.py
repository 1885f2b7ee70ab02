"""A disconnect storm of hundreds of clients at once, most of them queued
behind a small in-flight limit, the rest streaming on the replicas: zero
residue afterwards in the gateway (admin /metrics, leases, reservations) and
in the simulators (nothing running, waiting or pinned)."""

from __future__ import annotations

import pytest

from tests.hardening.storm import storm


@pytest.mark.timeout(90)  # ~12 s on a quiet machine
def test_a_storm_of_hundreds_of_dropping_clients_leaves_no_residue() -> None:
    cancelled_at = storm(500, workers=120, seed=1000, max_in_flight=4)
    # Clients dropped both while queued and while their request ran.
    assert cancelled_at.get("queued", 0) > 0, cancelled_at
    assert cancelled_at.get("streaming", 0) > 0, cancelled_at
