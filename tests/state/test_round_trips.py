"""Round trips to Redis per request, counted by Redis itself (`MONITOR`)
against a real `gateway serve` process and a real `redis-server`.

A request with a session budget takes two round trips to take (the budget
reservation, carrying the session map's read, then the admission lease on
the replica routing chose from it) and two to give back (the lease's release,
then the budget's settle, carrying the map's write when the session moved).
A request without a budget: the map's read, the lease, and its release
(carrying the map's write when the session moved). The failover probe's `PING`, the batched
lease renewals and a new connection's `HELLO` / `SCRIPT LOAD` are the
instance's, not a request's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import pytest

from bench.profile_redis import Monitor, script_names
from tests.state.test_fleet import chat, fleet, policies

pytestmark = pytest.mark.redis

__all__ = ["policies"]  # the fixture, used by name

#: per instance, not per request
_BACKGROUND = frozenset({"ping", "evalsha renew", "hello", "script"})


def _per_request(top: Counter[str]) -> Counter[str]:
    return Counter({name: n for name, n in top.items() if name not in _BACKGROUND})


def _send(url: str, n: int, headers: dict[str, str], new_session: bool) -> None:
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            h = dict(headers)
            if new_session:
                h["X-Session-Id"] = f"{headers['X-Session-Id']}-{i}"
            r = client.post(url + "/v1/chat/completions", json=chat(10, 2, seed=i), headers=h)
            assert r.status_code == 200, r.text


@pytest.mark.parametrize("new_session", [False, True], ids=["same-session", "new-session-each"])
def test_a_budgeted_requests_session_map_rides_on_its_reservation(
    tmp_path: Path, policies: Path, new_session: bool
) -> None:
    n = 12
    with fleet(2, tmp_path, policies, n_gateways=1) as (_sims, server, (gw,)):
        headers = {"X-Task": "agent", "X-Session-Id": "trips"}
        _send(gw.url, 1, {**headers, "X-Session-Id": "warm"}, False)  # scripts loaded
        monitor = Monitor(server.port, scripts=script_names())
        # Same session: four turns each (the policy's max_requests).
        for group in range(n // 4):
            sid = {**headers, "X-Session-Id": f"trips-{group}"}
            _send(gw.url, 4, sid, new_session)
        top, _inside = monitor.stop()
    trips = _per_request(top)
    assert trips["evalsha reserve"] == 2 * n, trips  # budget, lease
    # The lease's release, the budget's settle (and a long prefill's handover).
    assert 2 * n <= trips["evalsha settle"] <= 3 * n, trips
    # The session map rides on them: no command of its own.
    assert not {"get", "getex", "set"} & set(trips), trips
    assert sum(trips.values()) <= 5 * n, trips


@pytest.mark.parametrize("new_session", [False, True], ids=["same-session", "new-session-each"])
def test_a_request_without_a_budget_reads_the_map_once_and_writes_on_its_release(
    tmp_path: Path, policies: Path, new_session: bool
) -> None:
    n = 10
    with fleet(2, tmp_path, policies, n_gateways=1) as (_sims, server, (gw,)):
        _send(gw.url, 1, {"X-Session-Id": "warm"}, False)
        monitor = Monitor(server.port, scripts=script_names())
        _send(gw.url, n, {"X-Session-Id": "plain"}, new_session)
        top, _inside = monitor.stop()
    trips = _per_request(top)
    # One read each, the lease, and its release carrying the map's write.
    assert trips["getex"] == n, trips
    assert trips["evalsha reserve"] == n, trips
    assert "set" not in trips, trips
    assert sum(trips.values()) <= 3 * n + n // 2, trips  # + a long prefill's handover
