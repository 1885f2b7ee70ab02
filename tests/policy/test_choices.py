"""`n` / `best_of` (several sequences per request) and values the engines
refuse: validated by the policy stage, counted in full by admission and budgets."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gateway.admission.demand import DemandEstimator
from gateway.config.schema import AdmissionConfig, GatewayConfig
from gateway.errors import BadRequest, RateLimited
from gateway.ingress.protocol import parse_request
from gateway.pipeline import release
from gateway.policies.policyset import LimitsSpec, Policy, SessionSpec
from gateway.policy.budgets import Budgets
from gateway.policy.limits import choices, output_limit
from gateway.request.context import Contract, Exchange
from gateway.sim import SimCluster
from gateway.state import MemoryStateStore
from tests.ctxkit import make_ctx
from tests.gwharness import running_gateway


def contract(**limits: Any) -> Contract:
    return Contract(Policy(name="p", limits=LimitsSpec(**limits)))


def request(**fields: Any) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_request("chat", json.dumps(body).encode())


@pytest.mark.parametrize(
    ("fields", "expected"), [({}, 1), ({"n": 4}, 4), ({"n": 2, "best_of": 5}, 5), ({"n": 8}, 8)]
)
def test_choices_are_n_or_best_of(fields: dict[str, Any], expected: int) -> None:
    assert choices(contract(), request(**fields)) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 9), ("n", 0), ("n", -1), ("n", 1000), ("n", "2"), ("n", True), ("best_of", 99)],
)
def test_choices_out_of_range_or_of_the_wrong_type_are_400_naming_the_field(
    field: str, value: Any
) -> None:
    with pytest.raises(BadRequest) as exc:
        choices(contract(max_n=8), request(**{field: value}))
    assert exc.value.status == 400
    assert exc.value.param == field


def test_zero_max_tokens_is_refused_before_any_engine_work() -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(BadRequest) as exc:
            output_limit(contract(), request(**{name: 0}), None, "estimated")
        assert exc.value.param == name


def test_n_multiplies_the_output_reservation() -> None:
    estimator = DemandEstimator(AdmissionConfig())
    one = make_ctx(prompt=100, output=500)
    four = make_ctx(prompt=100, output=500)
    assert four.contract is not None
    four.contract.choices = 4
    assert estimator.demand(one).kv_tokens == 600
    assert estimator.demand(four).kv_tokens == 100 + 4 * 500


def test_n_cannot_overshoot_a_session_budget() -> None:
    policy = Policy(name="agent", session=SessionSpec(max_total_tokens=1000))
    budgets = Budgets(GatewayConfig(), MemoryStateStore())

    async def run() -> None:
        fits = make_ctx(session="s", policy=policy, prompt=100, output=200)  # 300
        async with release.reservation(budgets, fits):
            fits.exchange = Exchange(sent_at=0.0, status=200)  # no usage: the whole 300 kept
        many = make_ctx(session="s", policy=policy, prompt=100, output=200)
        assert many.contract is not None
        many.contract.choices = 4  # 100 + 4 x 200 = 900 > 1000 - 300
        with pytest.raises(RateLimited) as exc:
            async with release.reservation(budgets, many):
                pass
        assert exc.value.reason == "session_tokens"

    asyncio.run(run())


def test_the_gateway_refuses_what_engines_refuse() -> None:
    with SimCluster.start(1, speed=50) as sim, running_gateway(sim.urls) as gw:
        url = gw.url + "/v1/chat/completions"
        base = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        for extra, param in [
            ({"n": 1000}, "n"),
            ({"n": -1}, "n"),
            ({"max_tokens": 0}, "max_tokens"),
        ]:
            r = httpx.post(url, json={**base, **extra}, timeout=30)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == param
        assert sim.stats(0, records=False)["totals"]["requests"] == 0
        ok = httpx.post(url, json={**base, "n": 1, "max_tokens": 5}, timeout=30)
        assert ok.status_code == 200, ok.text
