"""GET /admin/sessions and /admin/sessions/{key}: the session table, with the
in-process store and with Redis (several instances share it)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.config.state import RedisConfig, StateConfig
from gateway.sim.cluster import SimCluster
from tests.gwharness import RunningGateway, running_gateway
from tests.redisserver import redis_server

SESSIONS = ["chain-a", "chain-b", "chain-c"]
TURNS = {"chain-a": 3, "chain-b": 1, "chain-c": 2}


@contextmanager
def _gateway(tmp_path: Path, state: StateConfig | None) -> Iterator[RunningGateway]:
    (tmp_path / "agent.yaml").write_text(
        "name: agent\nlimits: {max_output_tokens: 100}\n"
        "session: {max_total_tokens: 1000000, idle_ttl_s: 600}\n"
    )
    with (
        SimCluster.start(2, speed=50) as sims,
        running_gateway(sims.urls, policies=str(tmp_path), state=state or StateConfig()) as gw,
    ):
        yield gw


def _turns(gw: RunningGateway) -> dict[str, str]:
    """Session-keyed requests; the replica each session was served by."""
    served: dict[str, str] = {}
    client = gw.openai()
    for key in SESSIONS:
        for _ in range(TURNS[key]):
            resp = client.chat.completions.with_raw_response.create(
                model="sim-model",
                messages=[{"role": "user", "content": f"next step of {key}"}],
                max_tokens=5,
                extra_headers={"X-Task": "agent", "x-session-id": key},
            )
            served[key] = resp.headers["x-gateway-replica"]
    # A request without a session key is in no budget table; its implicit
    # conversation key (gateway/scheduling/conversation.py) is an affinity.
    client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return served


def _check_table(gw: RunningGateway, served: dict[str, str], scope: str) -> None:
    table = httpx.get(gw.admin_url + "/admin/sessions", timeout=10).json()
    assert table["budgets"] == 3 and table["affinity_scope"] == scope
    if scope == "shared":
        assert table["affinity"] == 4  # the three keys and the unkeyed chat's implicit one
    else:  # the router may also remember the unkeyed conversation (implicit sessions)
        assert table["affinity"] in (3, 4)
    for key, replica in served.items():
        one = httpx.get(gw.admin_url + f"/admin/sessions/{key}", timeout=10)
        assert one.status_code == 200, one.text
        data = one.json()
        assert data["replica"] == replica
        budget = data["budget"]
        assert budget["requests"] == TURNS[key]
        assert budget["tokens"] > 5 * TURNS[key]  # prompt + output of each turn, settled
        assert 0 < budget["first_seen_ms"] <= budget["last_seen_ms"]
    unknown = httpx.get(gw.admin_url + "/admin/sessions/never-seen", timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_session"


def test_session_table_with_the_in_process_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with _gateway(tmp_path, None) as gw:
        served = _turns(gw)
        _check_table(gw, served, "instance")
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("gateway"))
    assert not any(key in logged for key in SESSIONS)  # session keys are user data


def test_session_table_with_redis(tmp_path: Path) -> None:
    with redis_server() as redis:
        state = StateConfig(backend="redis", redis=RedisConfig(url=redis.url))
        with _gateway(tmp_path, state) as gw:
            served = _turns(gw)
            _check_table(gw, served, "shared")
