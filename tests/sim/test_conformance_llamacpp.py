"""llama.cpp flavour: each endpoint's shape, as a client of llama-server sees it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim import SimCluster
from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import chat, sse_data, sse_json, wait_until

LLAMA_METRICS = {
    "llamacpp:prompt_tokens_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:prompt_tokens_seconds",
    "llamacpp:predicted_tokens_seconds",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:n_busy_slots_per_decode",
}


@pytest.fixture(scope="module")
def llama() -> Iterator[SimCluster]:
    with SimCluster.start(
        1, flavor="llamacpp", speed=200.0, kv_tokens=16384, parallel=4
    ) as cluster:
        yield cluster


@pytest.fixture
def url(llama: SimCluster) -> str:
    llama.reset()
    return llama.urls[0]


def test_health_ok(client: httpx.Client, url: str) -> None:
    r = client.get(url + "/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_slots_and_props(client: httpx.Client, url: str) -> None:
    slots = client.get(url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 4096 and s["is_processing"] is False for s in slots)
    assert "id_task" not in slots[0]
    client.post(url + "/v1/chat/completions", json=chat("hi", max_tokens=2, id_slot=2))
    used = client.get(url + "/slots").json()[2]
    assert {"id_task", "n_prompt_tokens", "next_token"} <= set(used)
    assert used["next_token"][0]["n_decoded"] == 2
    props = client.get(url + "/props").json()
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 4096


def test_unified_kv_gives_each_slot_the_whole_context(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    u = make_cluster(flavor="llamacpp", kv_tokens=8192, parallel=4, unified_kv=True).urls[0]
    assert {s["n_ctx"] for s in client.get(u + "/slots").json()} == {8192}


def test_tokenize_and_apply_template(client: httpx.Client, url: str) -> None:
    assert (
        len(client.post(url + "/tokenize", json={"content": "hello world"}).json()["tokens"]) == 4
    )
    pieces = client.post(
        url + "/tokenize", json={"content": "hello world", "with_pieces": True}
    ).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["hell", "o", " wor", "ld"]
    prompt = client.post(
        url + "/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}
    ).json()["prompt"]
    assert prompt == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    n = len(client.post(url + "/tokenize", json={"content": prompt}).json()["tokens"])
    body = client.post(url + "/v1/chat/completions", json=chat("hi", max_tokens=1)).json()
    assert body["usage"]["prompt_tokens"] == n


def test_chat_non_streaming_shape_with_timings(client: httpx.Client, url: str) -> None:
    body = client.post(url + "/v1/chat/completions", json=chat("hello", max_tokens=3)).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 3
    assert "prompt_tokens_details" in body["usage"]
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"} <= set(body["timings"])


def test_chat_stream_shape(client: httpx.Client, url: str) -> None:
    req = chat(
        "hello", max_tokens=3, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    with client.stream("POST", url + "/v1/chat/completions", json=req) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    assert sse_data(lines)[-1] == "[DONE]"
    chunks = sse_json(lines)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:4]] != [None] * 3
    finish = chunks[4]
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    usage = chunks[5]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert "timings" in usage and all("timings" not in c for c in chunks[:-1])


def test_native_completion_stream_has_no_done(client: httpx.Client, url: str) -> None:
    req = {"prompt": "once upon a time", "n_predict": 2, "stream": True, "ignore_eos": True}
    with client.stream("POST", url + "/completion", json=req) as r:
        lines = list(r.iter_lines())
    data = sse_data(lines)
    assert "[DONE]" not in data
    chunks = sse_json(lines)
    assert [c["stop"] for c in chunks] == [False, False, True]
    assert chunks[-1]["tokens_predicted"] == 2 and "timings" in chunks[-1]
    assert isinstance(chunks[-1]["id_slot"], int)


def test_openai_sdk(url: str) -> None:
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10.0) as oai:
        resp = oai.chat.completions.create(
            model="anything",
            max_tokens=4,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"ignore_eos": True},
        )
        assert resp.usage is not None and resp.usage.completion_tokens == 4
        stream = oai.chat.completions.create(
            model="anything",
            max_tokens=2,
            stream=True,
            messages=[{"role": "user", "content": "hi"}],
        )
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_metrics_names_and_parse(client: httpx.Client, url: str) -> None:
    client.post(url + "/v1/chat/completions", json=chat("hello", max_tokens=2))
    text = client.get(url + "/metrics").text
    families = list(text_string_to_metric_families(text))
    samples = {s.name: s for f in families for s in f.samples}
    # llama-server types n_busy_slots_per_decode as a counter without `_total`;
    # the parser then names its sample `..._total`, the family keeps the name.
    assert set(samples) | {f.name for f in families} >= LLAMA_METRICS
    assert all(not s.labels for s in samples.values())
    assert samples["llamacpp:tokens_predicted_total"].value >= 1
    assert "_created" not in text


def test_metrics_need_the_flag(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    u = make_cluster(flavor="llamacpp", metrics_enabled=False).urls[0]
    r = client.get(u + "/metrics")
    assert r.status_code == 501
    assert r.json()["error"]["type"] == "not_supported_error"


def test_context_overflow_after_queueing(client: httpx.Client, url: str) -> None:
    r = client.post(url + "/v1/chat/completions", json=chat("word " * 5000, stream=True))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 4096 and err["n_prompt_tokens"] > 4096
    assert set(err) == {"code", "message", "type", "n_prompt_tokens", "n_ctx"}


def test_warmup_answers_loading(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    u = make_cluster(flavor="llamacpp", warmup_s=20.0, speed=100.0).urls[0]
    r = client.get(u + "/health")
    assert r.status_code == 503
    assert r.json() == {
        "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    }
    assert client.post(u + "/v1/chat/completions", json=chat("hi")).status_code == 503
    wait_until(lambda: client.get(u + "/health").status_code == 200, timeout=3.0)


def test_vllm_warmup_refuses_connections() -> None:
    cluster = SimCluster.start(1, flavor="vllm", warmup_s=0.5, speed=1.0)
    try:
        t0 = time.monotonic()
        assert httpx.get(cluster.urls[0] + "/health").status_code == 200
        assert time.monotonic() - t0 < 1.0
    finally:
        cluster.stop()


def test_api_key(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    u = make_cluster(flavor="llamacpp", api_key="k").urls[0]
    r = client.post(u + "/v1/chat/completions", json=chat("hi"))
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert client.get(u + "/health").status_code == 200
    assert client.get(u + "/v1/models").status_code == 200
    assert client.get(u + "/slots").status_code == 401
    ok = client.get(u + "/slots", headers={"Authorization": "Bearer k"})
    assert ok.status_code == 200
