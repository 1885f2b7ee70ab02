"""The SGLang adapter, through the simulator's `sglang` flavour and a real gateway.

The gateway is configured with `kind: auto` and must find SGLang on its own
(`/get_server_info`), read its context from `/v1/models`, its KV pool and
queue from `sglang:` metrics, and turn its flat error bodies into the OpenAI
shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.config.schema import AdmissionConfig, ReplicaConfig
from gateway.engines import adapter_for
from gateway.engines.readings import parse_sglang
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, running_gateway
from tests.sim.helpers import wait_until
from tests.simkit import MSG, Sims, running_sims

KV_TOKENS = 65536
CONTEXT = 8192
ADMISSION = AdmissionConfig(poll_interval_s=0.05, stale_after_s=1.0)


@pytest.fixture
def sglang() -> Iterator[Sims]:
    cfg = SimConfig(flavor="sglang", kv_tokens=KV_TOKENS, max_model_len=CONTEXT, speed=50)
    with running_sims([cfg]) as sims:
        yield sims


@pytest.fixture
def gateway(sglang: Sims) -> Iterator[RunningGateway]:
    replica = ReplicaConfig(url=sglang.urls[0], kind="auto", name="sg")
    with running_gateway([replica], admission=ADMISSION) as gw:
        wait_until(lambda: _live(gw) is not None and _live(gw)["capacity_tokens"] is not None)
        yield gw


def _replica(gw: RunningGateway) -> dict[str, Any]:
    (only,) = gw.replicas()
    return only


def _live(gw: RunningGateway) -> dict[str, Any] | None:
    live = _replica(gw)["live"]
    assert live is None or isinstance(live, dict)
    return live


def test_the_flavour_speaks_sglang(sglang: Sims) -> None:
    url = sglang.urls[0]
    info = httpx.get(url + "/get_server_info", timeout=5).json()
    assert info["max_total_num_tokens"] == KV_TOKENS and info["context_length"] == CONTEXT
    metrics = httpx.get(url + "/metrics", timeout=5).text
    assert "sglang:max_total_num_tokens{" in metrics and "vllm:" not in metrics
    wrong = {"model": "nope", "messages": MSG}
    bad = httpx.post(url + "/v1/chat/completions", json=wrong, timeout=5)
    body = bad.json()
    assert bad.status_code >= 400 and body["object"] == "error" and "error" not in body
    assert httpx.get(url + "/tokenize", timeout=5).status_code == 404


def test_detected_and_read_through_its_own_routes(gateway: RunningGateway) -> None:
    replica = _replica(gateway)
    assert replica["kind"] == "sglang"
    assert replica["max_model_len"] == CONTEXT
    live = _live(gateway)
    assert live is not None
    assert live["capacity_tokens"] == KV_TOKENS
    assert live["max_in_flight"] == SimConfig().max_num_seqs


def test_a_chat_streams_through_and_is_counted(gateway: RunningGateway, sglang: Sims) -> None:
    client = gateway.openai()
    stream = client.chat.completions.create(
        model="sim-model",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8
    (record,) = sglang.records()
    assert record["output_tokens"] == 8 and record["finish_reason"] == "length"


def test_a_non_streaming_chat_goes_upstream_as_a_stream(
    gateway: RunningGateway, sglang: Sims
) -> None:
    answer = gateway.openai().chat.completions.create(
        model="sim-model",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=5,
    )
    assert answer.choices[0].message.content
    (record,) = sglang.records()
    assert record["stream"] is True  # abortable upstream (`stream_upstream`)


def test_its_flat_errors_reach_the_client_in_the_openai_shape(
    gateway: RunningGateway, sglang: Sims
) -> None:
    sglang.fault(0, error_status=400, error_message="The input is bad.", count=1)
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.openai().chat.completions.create(
            model="sim-model",
            messages=MSG,  # type: ignore[arg-type]
            max_tokens=5,
        )
    err = caught.value.body
    assert isinstance(err, dict)
    assert err["message"] == "The input is bad."
    assert isinstance(err["type"], str) and err["code"] is None


def test_context_overflow_from_a_flat_body() -> None:
    body = (
        b'{"object": "error", "message": "The input (9000 tokens) is longer than the '
        b'model\'s context length (8192 tokens).", "type": "BadRequestError", '
        b'"param": null, "code": 400}'
    )
    err = adapter_for("sglang").normalize_error(400, body)
    assert err.code == "context_length_exceeded"
    assert "9000 tokens" in err.message


def test_readings_sum_data_parallel_ranks() -> None:
    text = "\n".join(
        f'sglang:{name}{{model_name="m",dp_rank="{rank}"}} {value}'
        for rank in (0, 1)
        for name, value in (
            ("max_total_num_tokens", 1000),
            ("num_used_tokens", 250),
            ("num_running_reqs", 3),
            ("num_queue_reqs", 2),
        )
    )
    r = parse_sglang(text + "\n", {"max_running_requests": 64})
    assert (r.capacity_tokens, r.used_tokens, r.running, r.waiting) == (2000, 500, 6, 4)
    assert r.max_in_flight == 64 and r.engines == 2
    only_usage = parse_sglang(
        'sglang:token_usage{dp_rank="0"} 0.5\n', {"max_total_num_tokens": 800}
    )
    assert (only_usage.capacity_tokens, only_usage.used_tokens) == (800, 400)
