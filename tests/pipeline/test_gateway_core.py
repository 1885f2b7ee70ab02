"""Core proxy behaviour over real sockets: a real gateway (its public listener
on the lean server and on uvicorn), real upstreams on loopback, the official
openai SDK and httpx as clients."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import openai
import pytest

from gateway.config.schema import HealthConfig, ReplicaConfig
from gateway.http.serving import BackgroundServers, Listener, free_port
from tests.gwharness import RunningGateway, running_gateway
from tests.upstreams import LLAMACPP_CONTEXT_ERROR, VLLM_CONTEXT_ERROR, Script, scripted_app

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture
def scripted() -> Iterator[tuple[Script, str]]:
    script = Script()
    port = free_port()
    with BackgroundServers([Listener(scripted_app(script), "127.0.0.1", port)]):
        yield script, f"http://127.0.0.1:{port}"


@pytest.fixture(params=["lean", "uvicorn"])
def gw_scripted(
    scripted: tuple[Script, str], request: pytest.FixtureRequest
) -> Iterator[tuple[Script, RunningGateway]]:
    script, url = scripted
    with running_gateway(
        [ReplicaConfig(url=url, kind="vllm", api_key="engine-key")], server=request.param
    ) as gw:
        yield script, gw


def test_streaming_is_incremental(gw_scripted: tuple[Script, RunningGateway]) -> None:
    script, gw = gw_scripted
    script.chunks, script.chunk_delay_s = 10, 0.05
    client = gw.openai()
    start = time.monotonic()
    arrivals = []
    for chunk in client.chat.completions.create(model="m", messages=MSG, stream=True):  # type: ignore[arg-type]
        if chunk.choices:
            arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 10
    # Ten chunks 50 ms apart: the first must arrive long before the last.
    assert arrivals[-1] - arrivals[0] > 0.3, arrivals
    assert arrivals[0] < arrivals[-1] / 2, arrivals


def test_stream_headers_and_usage_not_injected_for_client(
    gw_scripted: tuple[Script, RunningGateway],
) -> None:
    script, gw = gw_scripted
    body = {"model": "m", "messages": MSG, "stream": True}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as resp:
        text = "".join(resp.iter_text())
        assert resp.headers["cache-control"] == "no-cache"
        assert resp.headers["x-accel-buffering"] == "no"
        assert resp.headers["content-type"].startswith("text/event-stream")
    # The gateway asked the engine for usage (accounting) but the client did not: no usage chunk.
    assert script.seen[-1]["body"]["stream_options"] == {"include_usage": True}
    assert '"usage"' not in text and text.endswith("data: [DONE]\n\n")


def test_request_id_round_trip_and_authorization_never_forwarded(
    gw_scripted: tuple[Script, RunningGateway],
) -> None:
    script, gw = gw_scripted
    resp = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "m", "messages": MSG},
        headers={
            "x-request-id": "req-abc-123",
            "authorization": "Bearer client-secret",
            "cookie": "session=1",
        },
        timeout=30,
    )
    assert resp.status_code == 200
    assert resp.headers["x-request-id"] == "req-abc-123"
    upstream = script.seen[-1]["headers"]
    assert upstream["x-request-id"] == "req-abc-123"
    assert upstream["authorization"] == "Bearer engine-key"
    assert "cookie" not in upstream
    generated = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "m", "messages": MSG}, timeout=30
    )
    rid = generated.headers["x-request-id"]
    assert len(rid) >= 16 and script.seen[-1]["headers"]["x-request-id"] == rid


def test_non_streaming_body_passes_through_unchanged(
    gw_scripted: tuple[Script, RunningGateway],
) -> None:
    _, gw = gw_scripted
    resp = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "m", "messages": MSG}, timeout=30
    )
    assert resp.json()["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    assert resp.headers["x-gateway-replica"]
    assert float(resp.headers["x-gateway-overhead-ms"]) >= 0


@pytest.mark.parametrize(
    "engine_body", [VLLM_CONTEXT_ERROR, LLAMACPP_CONTEXT_ERROR], ids=["vllm", "llamacpp"]
)
def test_engine_errors_come_out_openai_shaped(
    scripted: tuple[Script, str], engine_body: dict
) -> None:
    script, url = scripted
    script.status, script.error_body = 400, engine_body
    kind = "vllm" if engine_body is VLLM_CONTEXT_ERROR else "llamacpp"
    with (
        running_gateway([ReplicaConfig(url=url, kind=kind)]) as gw,
        pytest.raises(openai.BadRequestError) as exc,
    ):
        gw.openai().chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    err = exc.value.body
    assert isinstance(err, dict)
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "context_length_exceeded"
    assert exc.value.status_code == 400


def test_bad_requests(gw_scripted: tuple[Script, RunningGateway]) -> None:
    script, gw = gw_scripted
    url = gw.url + "/v1/chat/completions"
    bad = httpx.post(
        url, content=b"{nope", headers={"content-type": "application/json"}, timeout=10
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    wrong = httpx.post(url, json={"model": "m", "messages": MSG, "max_tokens": "ten"}, timeout=10)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "max_tokens"
    missing = httpx.get(gw.url + "/metrics", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    for path in ("/tokenize", "/admin/replicas", "/v1/embeddings"):
        assert httpx.post(gw.url + path, json={}, timeout=10).status_code == 404
    assert httpx.get(url, timeout=10).status_code == 405
    # A trailing slash is an unknown path, not a redirect built from the Host header.
    slash = httpx.post(url + "/", json={}, headers={"host": "evil.example"}, timeout=10)
    assert slash.status_code == 404 and "location" not in slash.headers
    assert slash.json()["error"]["type"] == "not_found_error"
    # Every answer carries a request id (the client's when valid); a 405 says what is allowed.
    assert httpx.get(gw.url + "/nope", timeout=10).headers["x-request-id"]
    mine = httpx.get(gw.url + "/nope", headers={"x-request-id": "req-42"}, timeout=10)
    assert mine.headers["x-request-id"] == "req-42"
    not_allowed = httpx.get(url, timeout=10)
    assert not_allowed.headers["x-request-id"] and "POST" in not_allowed.headers["allow"]
    assert httpx.get(gw.url + "/healthz", timeout=10).headers["x-request-id"]
    assert script.seen == []


@pytest.mark.parametrize("server", ["lean", "uvicorn"])
def test_body_too_large(scripted: tuple[Script, str], server: Literal["lean", "uvicorn"]) -> None:
    from gateway.config.schema import LimitsConfig

    script, url = scripted
    with running_gateway([url], server=server, limits=LimitsConfig(max_body_bytes=4096)) as gw:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 10000}]}
        resp = httpx.post(gw.url + "/v1/chat/completions", json=big, timeout=10)
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "request_too_large"
        chunked = httpx.post(
            gw.url + "/v1/chat/completions", content=iter([b"x" * 3000] * 3), timeout=10
        )
        assert chunked.status_code == 413
    assert script.seen == []


def test_upstream_down_is_502_or_503() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with running_gateway([ReplicaConfig(url=dead, kind="vllm")]) as gw:
        resp = httpx.post(
            gw.url + "/v1/chat/completions", json={"model": "m", "messages": MSG}, timeout=10
        )
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "no_healthy_replica"
        assert int(resp.headers["retry-after"]) >= 1
        assert httpx.get(gw.url + "/readyz", timeout=10).status_code == 503
        assert httpx.get(gw.url + "/healthz", timeout=10).status_code == 200


def test_connect_failure_after_health_is_502() -> None:
    """A replica marked healthy that refuses the connection: 502 after trying it."""
    dead = f"http://127.0.0.1:{free_port()}"
    # no health probe in the test's time, to undo `healthy` before the request
    quiet = HealthConfig(interval_s=300.0, eject_after=0)
    with running_gateway([ReplicaConfig(url=dead, kind="vllm")], health=quiet) as gw:
        replica = gw.gateway.registry.replicas[0]
        replica.health.healthy = True  # as if it died right after its last good probe
        resp = httpx.post(
            gw.url + "/v1/chat/completions", json={"model": "m", "messages": MSG}, timeout=10
        )
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "upstream_connect_failed"


def test_unhealthy_replica_gets_no_traffic_until_it_recovers() -> None:
    a, b = Script(), Script()
    pa, pb = free_port(), free_port()
    with BackgroundServers(
        [Listener(scripted_app(a), "127.0.0.1", pa), Listener(scripted_app(b), "127.0.0.1", pb)]
    ):
        replicas = [
            ReplicaConfig(url=f"http://127.0.0.1:{p}", kind="vllm", name=n)
            for p, n in ((pa, "a"), (pb, "b"))
        ]
        with running_gateway(replicas) as gw:
            b.health_status = 503
            _wait(lambda: not gw.gateway.registry.get("b").healthy)  # type: ignore[union-attr]
            before = len(b.seen)
            client = gw.openai()
            for _ in range(6):
                client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
            assert len(b.seen) == before and len(a.seen) >= 6
            b.health_status = 200
            _wait(lambda: gw.gateway.registry.get("b").healthy)  # type: ignore[union-attr]
            # Concurrent slow requests: a load-aware router must use both replicas again.
            a.chunk_delay_s = b.chunk_delay_s = 0.05
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        lambda _: list(
                            client.chat.completions.create(model="m", messages=MSG, stream=True)
                        ),
                        range(4),
                    )
                )  # type: ignore[arg-type]
            assert len(b.seen) > before
            states = {r["name"]: r["healthy"] for r in gw.replicas()}
            assert states == {"a": True, "b": True}


def test_models_union_and_metrics(gw_scripted: tuple[Script, RunningGateway]) -> None:
    _, gw = gw_scripted
    models = httpx.get(gw.url + "/v1/models", timeout=10).json()
    assert models["data"] == [{"id": "m", "object": "model", "max_model_len": 2048}]
    resp = gw.openai().chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    text = gw.metrics_text()
    assert 'gateway_requests_total{outcome="ok",task="default"} 1.0' in text
    assert "gateway_request_duration_seconds_bucket" in text
    # tokens by task, as the engine's usage reported them
    assert resp.usage is not None and resp.usage.prompt_tokens > 0
    for direction, n in (
        ("prompt", resp.usage.prompt_tokens),
        ("completion", resp.usage.completion_tokens),
    ):
        line = f'gateway_tokens_total{{direction="{direction}",task="default"}} {float(n)}'
        assert line in text, (line, [x for x in text.splitlines() if "tokens_total" in x])


def _wait(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_generated_request_ids_are_unique_within_and_across_instances() -> None:
    from gateway.app import create_app
    from gateway.config.schema import GatewayConfig, ReplicaConfig

    cfg = GatewayConfig(replicas=(ReplicaConfig(url="http://127.0.0.1:1", kind="vllm"),))
    a, b = create_app(cfg), create_app(cfg)
    ids = [a.new_request_id() for _ in range(1000)] + [b.new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 2000
    assert all(16 <= len(i) <= 128 and i.isalnum() for i in ids)
