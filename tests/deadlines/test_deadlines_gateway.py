"""Deadlines end to end: a real gateway in front of the simulator, real sockets.

Before the response starts → 504 `deadline_exceeded` shortly after the
deadline; mid-stream → an SSE error event, then the stream ends; the engine
aborts in both cases. `X-Stainless-(Read-)Timeout` is honoured, also as sent
by the real openai SDK. The remaining budget is forwarded as an absolute
`X-Request-Deadline`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.config.schema import ReplicaConfig
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, running_gateway
from tests.simkit import MSG, Sims, chat_body, metric, running_sims, settled, wait_for

SLACK_S = 1.0  # generous bound on "shortly after the deadline" under CPU contention


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Sims, RunningGateway]]:
    with (
        running_sims([SimConfig(speed=20, kv_tokens=65536)]) as sims,
        running_gateway([ReplicaConfig(url=sims.urls[0], kind="vllm")]) as gw,
    ):
        yield sims, gw


@pytest.fixture
def fresh(env: tuple[Sims, RunningGateway]) -> tuple[Sims, RunningGateway]:
    sims, gw = env
    sims.fault(0, clear=True)
    sims.reset()
    return sims, gw


def _aborted(sims: Sims) -> dict[str, Any]:
    recs = wait_for(lambda: [r for r in sims.records() if r["aborted"]], timeout=10)
    assert len(recs) == 1
    wait_for(lambda: sims.stats()["totals"]["kv_blocks_pinned"] == 0)
    return recs[0]


def _post(
    gw: RunningGateway, body: dict[str, Any], headers: dict[str, str]
) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    return resp, time.monotonic() - t0


@pytest.mark.parametrize(
    "header", ["x-request-timeout", "x-request-deadline", "x-stainless-read-timeout"]
)
def test_deadline_before_start_is_504(fresh: tuple[Sims, RunningGateway], header: str) -> None:
    sims, gw = fresh
    value = f"{time.time() + 0.4:.3f}" if header == "x-request-deadline" else "0.4"
    resp, elapsed = _post(gw, chat_body(stream=False), {header: value})
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "deadline_exceeded"
    assert resp.json()["error"]["type"] == "server_error"
    assert resp.headers["x-gateway-reject-reason"] == "deadline_exceeded"
    # An absolute instant cannot be met by a retry: tell the SDKs not to retry.
    assert resp.headers.get("x-should-retry") == (
        "false" if header == "x-request-deadline" else None
    )
    assert 0.3 < elapsed < 0.4 + SLACK_S, elapsed
    rec = _aborted(sims)
    assert rec["output_tokens"] < 20000


def test_deadline_while_queued_at_the_engine_is_504(fresh: tuple[Sims, RunningGateway]) -> None:
    sims, gw = fresh
    sims.fault(0, paused=True)  # the engine accepts but never runs a step
    resp, elapsed = _post(gw, chat_body(stream=True), {"x-request-timeout": "0.3"})
    assert resp.status_code == 504, resp.text
    assert elapsed < 0.3 + SLACK_S
    sims.fault(0, paused=False)
    _aborted(sims)


def test_deadline_mid_stream_is_an_sse_error_then_end(fresh: tuple[Sims, RunningGateway]) -> None:
    sims, gw = fresh
    t0 = time.monotonic()
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json=chat_body(stream=True),
        headers={"x-request-timeout": "0.5"},
        timeout=30,
    ) as resp:
        assert resp.status_code == 200
        text = "".join(resp.iter_text())
    elapsed = time.monotonic() - t0
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))
    assert error["error"]["code"] == "deadline_exceeded"
    assert sum(1 for e in events if '"choices"' in e) > 3, "tokens streamed before the deadline"
    assert 0.4 < elapsed < 0.5 + SLACK_S
    _aborted(sims)
    text = settled(gw)
    assert metric(text, "gateway_deadline_exceeded_total", stage="streaming") >= 1


def test_client_timeout_does_not_cut_a_flowing_stream(fresh: tuple[Sims, RunningGateway]) -> None:
    """The SDK's read timeout bounds the response start and idle gaps, not a live stream."""
    sims, gw = fresh
    body = chat_body(stream=True, max_tokens=1200)  # ~0.9 s of tokens at speed 20
    t0 = time.monotonic()
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json=body,
        headers={"x-stainless-read-timeout": "0.3"},
        timeout=30,
    ) as resp:
        text = "".join(resp.iter_text())
    assert time.monotonic() - t0 > 0.3
    assert '"error"' not in text and text.endswith("data: [DONE]\n\n")
    assert sims.records()[0]["output_tokens"] == 1200


def test_malformed_deadline_header_is_400_naming_it(fresh: tuple[Sims, RunningGateway]) -> None:
    sims, gw = fresh
    for header, value in (
        ("x-request-deadline", "next tuesday"),
        ("x-request-timeout", "-3"),
        ("x-stainless-timeout", "soon"),
    ):
        resp, _ = _post(gw, chat_body(stream=False, max_tokens=5), {header: value})
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert err["param"] == header and err["code"] == "invalid_deadline_header"
        assert header in err["message"].lower()
    assert sims.records() == []


def test_remaining_budget_is_forwarded_as_absolute_deadline(
    fresh: tuple[Sims, RunningGateway],
) -> None:
    sims, gw = fresh
    sent = time.time()
    resp, _ = _post(gw, chat_body(stream=False, max_tokens=5), {"x-request-timeout": "30"})
    assert resp.status_code == 200
    forwarded = float(sims.records()[0]["headers_seen"]["x-request-deadline"])
    assert sent + 29 < forwarded < sent + 31
    assert float(resp.headers["x-gateway-queue-ms"]) >= 0
    assert float(resp.headers["x-gateway-overhead-ms"]) >= 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_openai_sdk_client_timeout_is_honoured(
    fresh: tuple[Sims, RunningGateway], stream: bool
) -> None:
    """The real SDK sends its timeout (X-Stainless-Read-Timeout); the engine is
    aborted no later than when the client gives up."""
    sims, gw = fresh
    if stream:
        sims.fault(0, paused=True)  # no first token: the client waits for the response start
    client = gw.openai(timeout=0.6, max_retries=0)
    # Either the client's own timer fires first, or the gateway's 504 reaches it first.
    with pytest.raises((openai.APITimeoutError, openai.InternalServerError)):
        result = client.chat.completions.create(
            model="sim-model",
            messages=MSG,  # type: ignore[arg-type]
            max_tokens=20000,
            stream=stream,
            extra_body={"ignore_eos": True},
        )
        if stream:
            for _ in result:  # type: ignore[union-attr]
                pass
    gave_up = time.time()
    if stream:
        sims.fault(0, paused=False)
    rec = _aborted(sims)
    assert rec["abort_wall"] <= gave_up + 0.25, rec["abort_wall"] - gave_up
    assert float(rec["headers_seen"]["x-request-deadline"]) > 0


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-request-deadline", "1"),
        ("x-request-timeout", "1e-9"),
        ("x-request-deadline", "past"),
        ("x-stainless-timeout", "0.001"),
        ("x-stainless-read-timeout", "1e-9"),
    ],
)
def test_a_deadline_already_past_never_reaches_the_engine(
    fresh: tuple[Sims, RunningGateway], header: str, value: str
) -> None:
    sims, gw = fresh
    if value == "past":
        value = f"{time.time() - 5:.3f}"
    before = metric(gw.metrics_text(), "gateway_deadline_exceeded_total", stage="ingress")
    resp, _ = _post(gw, chat_body(stream=True), {header: value})
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "deadline_exceeded"
    assert "stage: ingress" in resp.json()["error"]["message"]
    assert resp.headers.get("x-should-retry") == "false"
    assert sims.stats()["totals"]["requests"] == 0  # the engine never saw it
    after = metric(gw.metrics_text(), "gateway_deadline_exceeded_total", stage="ingress")
    assert after == before + 1
