"""The admin /metrics exports no `<name>_created` series, whether or not
prometheus_client would add them (`PROMETHEUS_DISABLE_CREATED_SERIES`): a plain
install and the container export the same families."""

from __future__ import annotations

import re
from collections.abc import Iterator

import prometheus_client.metrics
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from gateway.config.schema import ReplicaConfig
from gateway.sim.config import SimConfig
from tests.deploy.deployfiles import POLICIES
from tests.gwharness import RunningGateway, running_gateway
from tests.simkit import running_sims

_FAMILY = re.compile(r"^# TYPE (\S+) ", re.M)


@pytest.fixture(scope="module")
def gw() -> Iterator[RunningGateway]:
    with (
        running_sims([SimConfig(speed=50.0)]) as sims,
        running_gateway(
            [ReplicaConfig(url=sims.urls[0], kind="vllm")], policies=str(POLICIES)
        ) as gw,
    ):
        gw.openai().chat.completions.create(
            model="sim-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        yield gw


def _scrape(gw: RunningGateway, created: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", created)
    probe = CollectorRegistry()
    Counter("probe", "a counter", registry=probe).inc()
    assert ("probe_created" in generate_latest(probe).decode()) == created
    return gw.metrics_text()


def test_no_created_series_whatever_prometheus_client_is_told(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_created = _scrape(gw, True, monkeypatch)
    without = _scrape(gw, False, monkeypatch)
    assert "gateway_requests_total" in with_created
    for text in (with_created, without):
        assert not re.search(r"^\S+_created[ {]", text, re.M), "a *_created sample is exported"
        assert not [f for f in _FAMILY.findall(text) if f.endswith("_created")]
    assert _FAMILY.findall(with_created) == _FAMILY.findall(without)
