"""Talk to a real llama-server (b11434) directly: the facts the gateway and simulator rely on.

Prompts are tiny and outputs short: on CPU the model does ~100-250 prompt tok/s and
~40-100 generated tok/s with one thread.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from .llamaserver import N_CTX_PER_SLOT, PARALLEL, LlamaServer

pytestmark = [pytest.mark.engine]

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi."}]
HI_PROMPT_TOKENS = 33  # ChatML + SmolLM's default system prompt + "Say hi."


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60.0)


def _sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-no-key-required", max_retries=0)


def _over_context_messages() -> list[ChatCompletionMessageParam]:
    # "hello " is one token each: ~2100 + 31 template tokens > 2048 per-slot context.
    return [{"role": "user", "content": "hello " * 2100}]


def test_health_ok_on_both(llama_servers: list[str]) -> None:
    assert len(llama_servers) == 2 and llama_servers[0] != llama_servers[1]
    for url in llama_servers:
        with _client(url) as c:
            r = c.get("/health")
        assert r.status_code == 200
        assert r.json() == {"status": "ok"}


def test_health_is_503_while_loading(
    start_llama_server: Callable[..., LlamaServer],
) -> None:
    server = start_llama_server(wait=False)
    seen: list[tuple[int, Any]] = []
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=2.0) as c:
        while time.monotonic() < deadline:
            assert server.proc.poll() is None, server.log_tail()
            try:
                r = c.get(f"{server.url}/health")
            except httpx.TransportError:
                time.sleep(0.01)  # not listening yet
                continue
            seen.append((r.status_code, r.json()))
            if r.status_code == 200:
                break
            time.sleep(0.01)
    assert seen and seen[-1] == (200, {"status": "ok"}), seen
    for status, body in seen[:-1]:
        assert status == 503
        assert body == {
            "error": {"message": "Loading model", "type": "unavailable_error", "code": 503}
        }


def test_props(llama_server: str) -> None:
    with _client(llama_server) as c:
        props = c.get("/props").json()
    assert props["total_slots"] == PARALLEL
    assert props["default_generation_settings"]["n_ctx"] == N_CTX_PER_SLOT == 2048
    assert props["build_info"].startswith("b11434")
    assert props["endpoint_slots"] is True and props["endpoint_metrics"] is True
    assert "<|im_start|>" in props["chat_template"]  # ChatML


def test_slots_shape(llama_servers: list[str], llama_reset: Callable[..., None]) -> None:
    for url in llama_servers:
        with _client(url) as c:
            slots = c.get("/slots").json()
        assert [s["id"] for s in slots] == list(range(PARALLEL))
        for s in slots:
            assert s["n_ctx"] == N_CTX_PER_SLOT
            assert s["is_processing"] is False
            assert isinstance(s["speculative"], bool)


def test_slot_busy_while_generating(llama_server: str, llama_reset: Callable[..., None]) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 256, "ignore_eos": True, "id_slot": 1}
    done: list[httpx.Response] = []

    def run() -> None:
        with _client(llama_server) as c:
            done.append(c.post("/completion", json=body))

    t = threading.Thread(target=run)
    t.start()
    try:
        busy: list[dict[str, Any]] = []
        with _client(llama_server) as c:
            for _ in range(200):
                slots = c.get("/slots").json()
                busy = [s for s in slots if s["is_processing"]]
                if busy:
                    break
                time.sleep(0.01)
        assert [s["id"] for s in busy] == [1]
        assert {"id_task", "n_prompt_tokens", "next_token", "params"} <= set(busy[0])
    finally:
        t.join(60)
    llama_reset()
    assert done and done[0].status_code == 200
    assert done[0].json()["tokens_predicted"] == 256


def test_tokenize_and_apply_template(llama_server: str) -> None:
    with _client(llama_server) as c:
        toks = c.post("/tokenize", json={"content": " hello hello hello"}).json()
        assert set(toks) == {"tokens"}
        assert len(toks["tokens"]) == 3 and len(set(toks["tokens"])) == 1
        prompt = c.post("/apply-template", json={"messages": HI}).json()["prompt"]
        # special tokens in the content are parsed by default: <|im_start|> is one token
        n_special = len(c.post("/tokenize", json={"content": prompt}).json()["tokens"])
        n_plain = len(
            c.post("/tokenize", json={"content": prompt, "parse_special": False}).json()["tokens"]
        )
    assert prompt.endswith("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.startswith("<|im_start|>system\n")  # SmolLM default system prompt
    assert n_special == HI_PROMPT_TOKENS < n_plain


def test_chat_non_streaming_sdk(llama_server: str, llama_reset: Callable[..., None]) -> None:
    with _sdk(llama_server) as sdk:
        resp = sdk.chat.completions.create(model="any", messages=HI, max_tokens=16)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage is not None
    # usage.prompt_tokens == len(tokenize(apply_template(messages)))
    assert resp.usage.prompt_tokens == HI_PROMPT_TOKENS
    assert 1 <= resp.usage.completion_tokens <= 16
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    extra = resp.model_extra or {}
    assert "timings" in extra and extra["timings"]["predicted_n"] == resp.usage.completion_tokens


def test_chat_streaming_sdk_include_usage(
    llama_server: str, llama_reset: Callable[..., None]
) -> None:
    with _sdk(llama_server) as sdk:
        stream = sdk.chat.completions.create(
            model="any",
            messages=HI,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    # The role arrives in a content-less first chunk - except when the first sampled token
    # is an incomplete UTF-8 sequence (e.g. half an emoji): then no chunk carries a role.
    roles = [c.choices[0].delta.role for c in chunks if c.choices]
    assert roles[0] == "assistant" and chunks[0].choices[0].delta.content is None
    assert roles.count("assistant") == 1
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens <= 8
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_chat_streaming_raw_sends_done(llama_server: str, llama_reset: Callable[..., None]) -> None:
    body = {"messages": HI, "max_tokens": 4, "stream": True}
    with _client(llama_server) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [ln[len("data: ") :] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    final = json.loads(data[-2])
    # without include_usage the finish chunk carries the timings (and no usage)
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    assert "timings" in final and "usage" not in final


def test_over_context_error(llama_server: str, llama_reset: Callable[..., None]) -> None:
    messages = _over_context_messages()
    body = {"messages": messages, "max_tokens": 4}
    with _client(llama_server) as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error"
    assert err["code"] == 400
    assert err["n_ctx"] == N_CTX_PER_SLOT
    assert err["n_prompt_tokens"] == 2131
    assert "param" not in err
    assert err["message"] == (
        "request (2131 tokens) exceeds the available context size (2048 tokens), try increasing it"
    )
    with _sdk(llama_server) as sdk, pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model="any", messages=messages, max_tokens=4)
    assert exc.value.status_code == 400


def test_over_context_error_when_streaming_is_plain_400(
    llama_server: str, llama_reset: Callable[..., None]
) -> None:
    body = {"messages": _over_context_messages(), "max_tokens": 4, "stream": True}
    with _client(llama_server) as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["type"] == "exceed_context_size_error"


def test_invalid_json_and_unknown_fields(
    llama_server: str, llama_reset: Callable[..., None]
) -> None:
    with _client(llama_server) as c:
        bad = c.post(
            "/v1/chat/completions",
            content=b'{"messages": [}',
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_request_error"
        ok = c.post(
            "/v1/chat/completions",
            json={"messages": HI, "max_tokens": 2, "frobnicate": {"x": 1}, "prompt_cache_key": "k"},
        )
        assert ok.status_code == 200  # unknown fields are ignored


def test_metrics_names(llama_server: str, llama_reset: Callable[..., None]) -> None:
    with _client(llama_server) as c:
        c.post("/completion", json={"prompt": "Hi", "n_predict": 2})
        text = c.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # prometheus_client strips the `_total` suffix from counter family names
    counters = {"llamacpp:prompt_tokens", "llamacpp:tokens_predicted"}
    gauges = {
        "llamacpp:prompt_tokens_seconds",
        "llamacpp:predicted_tokens_seconds",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:n_busy_slots_per_decode",
    }
    for name in counters:
        assert families[name].type == "counter", name
    for name in gauges:
        assert families[name].type == "gauge", name
    assert "llamacpp:kv_cache_usage_ratio" not in families
    assert "llamacpp:kv_cache_tokens" not in families
    for family in families.values():
        for sample in family.samples:
            assert sample.labels == {}, sample
    assert families["llamacpp:tokens_predicted"].samples[0].value >= 2


def test_server_closes_connection_after_each_stream(
    llama_server: str, llama_reset: Callable[..., None]
) -> None:
    """Streams end with a server-side close despite ``Keep-Alive`` (no ``Connection: close``).

    A pooled client connection reused after a stream fails with "Server disconnected without
    sending a response" about half the time. Non-streaming responses keep the connection.
    """
    host, port = llama_server.removeprefix("http://").split(":")
    results: dict[bool, tuple[str | None, str | None, bool]] = {}
    for stream in (True, False):
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        body = {"prompt": "Hi", "n_predict": 2, "stream": stream}
        conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        sock = conn.sock
        assert sock is not None  # http.client saw no reason to close
        readable, _, _ = select.select([sock], [], [], 1.0)
        closed = bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        results[stream] = (resp.getheader("Connection"), resp.getheader("Keep-Alive"), closed)
        conn.close()
    assert results[True] == (None, "timeout=5, max=100", True)
    assert results[False] == (None, "timeout=5, max=100", False)
