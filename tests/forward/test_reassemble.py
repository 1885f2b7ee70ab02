"""Non-streaming answers rebuilt from upstream streams (llama.cpp replicas)."""

from __future__ import annotations

import json

import httpx

from gateway.config.schema import ReplicaConfig
from gateway.forward.reassemble import StreamAssembler
from gateway.sim.cluster import SimCluster
from tests.gwharness import running_gateway


def _sse(*objs: object) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"
    )


def test_chat_chunks_merge_content_tool_calls_and_usage() -> None:
    stream = _sse(
        {
            "id": "c1",
            "created": 5,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        },
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {
            "id": "c1",
            "choices": [{"index": 0, "delta": {"content": "lo", "reasoning_content": "hm"}}],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "t1",
                                "type": "function",
                                "function": {"name": "get", "arguments": '{"a"'},
                            }
                        ]
                    },
                }
            ],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                    "finish_reason": "tool_calls",
                }
            ],
        },
        {
            "id": "c1",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            "timings": {"cache_n": 2},
        },
    )
    asm = StreamAssembler("chat")
    for i in range(0, len(stream), 7):  # arbitrary network splits
        asm.feed(stream[i : i + 7])
    body = asm.body()
    assert body["object"] == "chat.completion" and body["id"] == "c1" and body["created"] == 5
    msg = body["choices"][0]["message"]
    assert msg["content"] == "Hello" and msg["reasoning_content"] == "hm"
    assert msg["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}}
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"]["total_tokens"] == 7 and body["timings"] == {"cache_n": 2}


def test_completions_and_error_event() -> None:
    asm = StreamAssembler("completions")
    asm.feed(
        _sse(
            {"id": "x", "choices": [{"index": 0, "text": "a"}]},
            {"id": "x", "choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]},
        )
    )
    assert asm.body()["choices"] == [
        {"index": 0, "text": "ab", "logprobs": None, "finish_reason": "stop"}
    ]
    err = StreamAssembler("chat")
    err.feed(_sse({"error": {"code": 500, "message": "boom", "type": "server_error"}}))
    assert err.error == {"code": 500, "message": "boom", "type": "server_error"}


def test_llamacpp_non_streaming_goes_upstream_as_a_stream_and_comes_back_whole() -> None:
    body = {
        "model": "sim-model",
        "max_tokens": 6,
        "messages": [{"role": "user", "content": "hello there"}],
    }
    with SimCluster.start(1, flavor="llamacpp", speed=50) as sim:
        direct = httpx.post(sim.urls[0] + "/v1/chat/completions", json=body, timeout=30).json()
        with running_gateway([ReplicaConfig(url=sim.urls[0], kind="llamacpp")]) as gw:
            via = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
            assert via.status_code == 200 and via.headers["content-type"] == "application/json"
            rebuilt = via.json()
            never = running_gateway(
                [ReplicaConfig(url=sim.urls[0], kind="llamacpp", upstream_streaming="never")]
            )
            with never as gw2:
                passthrough = httpx.post(
                    gw2.url + "/v1/chat/completions", json=body, timeout=30
                ).json()
        records = sim.stats(0)["requests"]
    assert set(rebuilt) == set(direct)
    assert set(rebuilt["choices"][0]["message"]) >= {"role", "content"}
    assert rebuilt["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == 6
    assert rebuilt["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert set(passthrough) == set(direct)
    streamed = [r.get("stream") for r in records]
    assert streamed[1] is True and streamed[2] is not True, streamed
