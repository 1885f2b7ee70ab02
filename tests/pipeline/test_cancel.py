"""Abort latency over real sockets: a raw client closes its connection at a
known instant; the simulator records when the engine aborted (`abort_wall`).

(a) mid-stream, (b) a non-streaming request while the engine generates,
(c) a request still queued at the gateway (the engine never sees it).
The measured figures are printed (`pytest -s`) and bounded generously.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.config.schema import AdmissionConfig, ReplicaConfig
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, running_gateway
from tests.rawhttp import RawRequest
from tests.simkit import Sims, chat_body, metric, metrics_when, running_sims, settled, wait_for

SPEED = 20.0
MAX_TOKENS = 8000  # ~6 s of decoding at SPEED: always cancelled long before the end
#: vLLM aborts as soon as the connection closes; llama.cpp notices within its poll.
BOUND_S = {"vllm": 0.5, "llamacpp": 0.5 + 1.0 / SPEED}


@pytest.fixture(
    params=[("vllm", "lean"), ("llamacpp", "lean"), ("vllm", "uvicorn"), ("llamacpp", "uvicorn")],
    ids=lambda p: "-".join(p),
)
def setup(request: pytest.FixtureRequest) -> Iterator[tuple[str, Sims, RunningGateway]]:
    """Each engine flavour behind the gateway, its public listener on both servers
    (the lean server reports a disconnect itself; under uvicorn a watcher task does)."""
    flavor, server = request.param
    with (
        running_sims([SimConfig(flavor=flavor, speed=SPEED, parallel=4, kv_tokens=65536)]) as sims,
        running_gateway([ReplicaConfig(url=sims.urls[0], kind=flavor)], server=server) as gw,
    ):
        yield flavor, sims, gw


def _aborted_record(sims: Sims) -> dict[str, Any]:
    recs = wait_for(lambda: [r for r in sims.records() if r["aborted"]], timeout=10)
    assert len(recs) == 1
    return recs[0]


def _engine_idle(sims: Sims) -> dict[str, Any]:
    def idle() -> dict[str, Any] | None:
        totals = sims.stats()["totals"]
        return totals if totals["running"] == 0 and totals["kv_blocks_pinned"] == 0 else None

    return wait_for(idle, timeout=10)


def test_abort_mid_stream(setup: tuple[str, Sims, RunningGateway]) -> None:
    flavor, sims, gw = setup
    req = RawRequest(gw.url + "/v1/chat/completions", chat_body(stream=True, max_tokens=MAX_TOKENS))
    req.read_until(b"data: ", count=5)
    assert req.status == 200, req.received
    closed = req.close()
    rec = _aborted_record(sims)
    latency = rec["abort_wall"] - closed
    print(
        f"\n[{flavor}] streaming: close -> engine abort {latency * 1000:.1f} ms "
        f"after {rec['output_tokens']} tokens"
    )
    assert -0.05 < latency < BOUND_S[flavor]
    assert rec["output_tokens"] < MAX_TOKENS
    _engine_idle(sims)
    text = settled(gw)
    assert metric(text, "gateway_cancellations_total", stage="streaming") == 1


def test_abort_non_streaming_while_generating(setup: tuple[str, Sims, RunningGateway]) -> None:
    flavor, sims, gw = setup
    req = RawRequest(
        gw.url + "/v1/chat/completions", chat_body(stream=False, max_tokens=MAX_TOKENS)
    )
    wait_for(lambda: [r for r in sims.records() if r["output_tokens"] >= 5])
    closed = req.close()
    rec = _aborted_record(sims)
    latency = rec["abort_wall"] - closed
    print(
        f"\n[{flavor}] non-streaming: close -> engine abort {latency * 1000:.1f} ms "
        f"after {rec['output_tokens']} tokens"
    )
    assert -0.05 < latency < BOUND_S[flavor]
    _engine_idle(sims)
    text = settled(gw)
    assert metric(text, "gateway_cancellations_total") == 1
    if flavor == "vllm":
        assert metric(text, "gateway_cancellations_total", stage="waiting_first_byte") == 1
    # llama.cpp answers non-streaming requests from an upstream stream (gateway.reassemble):
    # once its first chunk has arrived the stage is "streaming", which is timing-dependent here.


def test_queued_request_leaves_the_queue_and_never_reaches_the_engine() -> None:
    cfg = SimConfig(speed=SPEED, kv_tokens=65536)
    with (
        running_sims([cfg]) as sims,
        running_gateway(
            [ReplicaConfig(url=sims.urls[0], kind="vllm")],
            admission=AdmissionConfig(max_in_flight=1),
        ) as gw,
    ):
        url = gw.url + "/v1/chat/completions"
        first = RawRequest(url, chat_body(stream=True))
        first.read_until(b"data: ", count=2)
        second = RawRequest(url, chat_body(stream=False, max_tokens=10))
        text = metrics_when(gw, "gateway_in_flight_requests", 2)
        if len(sims.records()) > 1:
            first.close()
            second.close()
            pytest.skip("needs admission queue (max_in_flight did not hold the second request)")
        second.close()
        text = metrics_when(gw, "gateway_cancellations_total", 1, stage="queued")
        assert metric(text, "gateway_in_flight_requests") == 1
        first.close()
        _aborted_record(sims)
        _engine_idle(sims)
        assert len(sims.records()) == 1, "the queued request must never be sent upstream"
        text = settled(gw)
        assert metric(text, "gateway_requests_admitted_total") == 2
        assert metric(text, "gateway_requests_total", outcome="cancelled") == 2
