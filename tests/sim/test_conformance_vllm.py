"""vLLM flavour: each endpoint's shape, as a client of the real engine sees it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim import SimCluster
from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import TIMEOUT, chat, sse_data, sse_json, totals

VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:inter_token_latency_seconds",
}


@pytest.fixture(scope="module")
def vllm() -> Iterator[SimCluster]:
    with SimCluster.start(
        1, flavor="vllm", speed=200.0, max_model_len=4096, kv_tokens=65536
    ) as cluster:
        yield cluster


@pytest.fixture
def url(vllm: SimCluster) -> str:
    vllm.reset()
    return vllm.urls[0]


def test_health_is_empty_200(client: httpx.Client, url: str) -> None:
    r = client.get(url + "/health")
    assert r.status_code == 200
    assert r.content == b""


def test_models_and_version(client: httpx.Client, url: str) -> None:
    data = client.get(url + "/v1/models").json()
    assert data["object"] == "list"
    assert data["data"][0]["id"] == "sim-model"
    assert data["data"][0]["max_model_len"] == 4096
    assert isinstance(client.get(url + "/version").json()["version"], str)


def test_tokenize_prompt_and_messages(client: httpx.Client, url: str) -> None:
    r = client.post(url + "/tokenize", json={"model": "sim-model", "prompt": "hello world"}).json()
    assert r["count"] == 4 == len(r["tokens"])
    assert r["max_model_len"] == 4096
    msgs = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hi"}],
        "add_generation_prompt": True,
    }
    r2 = client.post(url + "/tokenize", json=msgs).json()
    assert r2["count"] == len(r2["tokens"]) > 4


def test_chat_non_streaming_shape(client: httpx.Client, url: str) -> None:
    r = client.post(url + "/v1/chat/completions", json=chat("hello", max_tokens=5))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    assert "stop_reason" in choice
    usage = body["usage"]
    assert usage["completion_tokens"] <= 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    check = client.post(url + "/tokenize", json={"prompt": choice["message"]["content"]}).json()
    assert check["count"] == usage["completion_tokens"]


def test_chat_stream_shape(client: httpx.Client, url: str) -> None:
    body = chat(
        "hello", max_tokens=4, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    data = sse_data(lines)
    assert data[-1] == "[DONE]"
    chunks = sse_json(lines)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-1]
    assert len(tokens) == 4
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert len({c["id"] for c in chunks}) == 1


def test_completions_stream_and_body(client: httpx.Client, url: str) -> None:
    r = client.post(
        url + "/v1/completions",
        json={"model": "sim-model", "prompt": "once upon", "max_tokens": 3, "ignore_eos": True},
    )
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["usage"]["completion_tokens"] == 3
    stream = {"model": "sim-model", "prompt": "once upon", "max_tokens": 2, "stream": True}
    with client.stream("POST", url + "/v1/completions", json=stream) as s:
        lines = list(s.iter_lines())
    chunks = sse_json(lines)
    assert all(c["object"] == "text_completion" and "text" in c["choices"][0] for c in chunks)
    assert sse_data(lines)[-1] == "[DONE]"


def test_openai_sdk_non_streaming_and_streaming(url: str) -> None:
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=10.0) as oai:
        resp = oai.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hi"}],
            max_completion_tokens=6,
            extra_body={"ignore_eos": True},
        )
        assert resp.usage is not None and resp.usage.completion_tokens == 6
        assert resp.choices[0].finish_reason == "length"
        stream = oai.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == len(text.split())


def test_metrics_names_and_parse(client: httpx.Client, url: str) -> None:
    client.post(url + "/v1/chat/completions", json=chat("hello", max_tokens=2))
    text = client.get(url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= VLLM_METRICS
    assert "vllm:gpu_cache_usage_perc" not in families
    info = families["vllm:cache_config_info"].samples[0]
    assert info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == str(65536 // 16)
    for name in VLLM_METRICS:
        for sample in families[name].samples:
            assert sample.labels["model_name"] == "sim-model"
            assert sample.labels["engine"] == "0"
    success = {
        s.labels["finished_reason"]: s.value
        for s in families["vllm:request_success"].samples
        if s.name.endswith("_total")
    }
    assert sum(success.values()) == 1
    assert "vllm:generation_tokens_total" in text


def test_legacy_metric_behind_flag(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="vllm", legacy_metrics=True)
    text = client.get(cluster.urls[0] + "/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"} <= names


def test_prompt_over_max_model_len_is_400(client: httpx.Client, url: str) -> None:
    r = client.post(url + "/v1/chat/completions", json=chat("word " * 5000))
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert "maximum context length is 4096 tokens" in err["message"]


def test_overlong_output_is_clamped_or_refused(
    make_cluster: ClusterFactory, client: httpx.Client, url: str
) -> None:
    # vLLM 0.32: prompt + max_tokens over the window is clamped, max_tokens over it refused
    ok = client.post(url + "/v1/chat/completions", json=chat("hi", max_tokens=4090))
    assert ok.status_code == 200
    over = client.post(url + "/v1/chat/completions", json=chat("hi", max_tokens=4097))
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    assert "max_tokens=4097 cannot be greater than max_model_len=4096" in over.text
    strict = make_cluster(flavor="vllm", max_model_len=4096, reject_overlong_output=True)
    r = client.post(strict.urls[0] + "/v1/chat/completions", json=chat("hi", max_tokens=100000))
    assert r.status_code == 400
    assert "'max_tokens' or 'max_completion_tokens' is too large" in r.json()["error"]["message"]


def test_unknown_model_and_bad_fields(client: httpx.Client, url: str) -> None:
    r = client.post(url + "/v1/chat/completions", json={**chat("hi"), "model": "other"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == 404
    assert (
        client.post(url + "/v1/chat/completions", json=chat("hi", max_tokens=0)).status_code == 400
    )
    assert client.post(url + "/v1/chat/completions", content=b"{nope").status_code == 400
    assert client.post(url + "/v1/chat/completions", json=chat("hi", n=2)).status_code == 400
    assert client.post(url + "/v1/chat/completions", json=chat("hi", priority=3)).status_code == 400


def test_api_key_protects_only_v1(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    u = make_cluster(flavor="vllm", api_key="sekret").urls[0]
    r = client.post(u + "/v1/chat/completions", json=chat("hi", max_tokens=1))
    assert r.status_code == 401
    assert r.json() == {"error": "Unauthorized"}
    assert client.get(u + "/v1/models").status_code == 401
    assert client.get(u + "/health").status_code == 200
    assert client.get(u + "/metrics").status_code == 200
    assert client.post(u + "/tokenize", json={"prompt": "x"}).status_code == 200
    good = client.post(
        u + "/v1/chat/completions",
        json=chat("hi", max_tokens=1),
        headers={"Authorization": "Bearer sekret"},
    )
    assert good.status_code == 200


def test_queue_bound_answers_503_busy(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="vllm", max_num_queued_reqs=1)
    cluster.set_fault(0, paused=True)
    u = cluster.urls[0]
    with (
        httpx.Client(timeout=TIMEOUT) as other,
        other.stream("POST", u + "/v1/chat/completions", json=chat("a", max_tokens=1, stream=True)),
    ):
        r = client.post(u + "/v1/chat/completions", json=chat("b", max_tokens=1))
        assert r.status_code == 503
        assert "engine is currently busy" in r.json()["error"]["message"]
        assert "retry-after" not in r.headers
        cluster.set_fault(0, paused=False)
    assert totals(cluster)["errors"] == 1
