"""The access log: off by default, one line per finished request when on, never the body."""

from __future__ import annotations

import logging

import pytest

from gateway.sim.cluster import SimCluster
from tests.gwharness import running_gateway

SECRET_PROMPT = "the launch code is 0000-hunter2"


def _one_request(access_log: bool, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    caplog.set_level(logging.INFO, logger="gateway.access")
    with (
        SimCluster.start(1, speed=50) as sim,
        running_gateway(sim.urls, access_log=access_log) as gw,
    ):
        client = gw.openai()
        resp = client.chat.completions.with_raw_response.create(
            model="sim-model",
            max_tokens=4,
            messages=[{"role": "user", "content": SECRET_PROMPT}],
            extra_headers={"x-request-id": "req-log-1"},
        )
        assert resp.http_response.status_code == 200
    return [r for r in caplog.records if r.name == "gateway.access"]


def test_access_log_is_off_by_default(caplog: pytest.LogCaptureFixture) -> None:
    assert _one_request(False, caplog) == []


def test_access_log_line_names_the_request_and_never_the_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = _one_request(True, caplog)
    assert len(records) == 1
    line = records[0].getMessage()
    assert "id=req-log-1" in line and "outcome=ok" in line and "status=200" in line
    assert SECRET_PROMPT not in line and "hunter2" not in line
