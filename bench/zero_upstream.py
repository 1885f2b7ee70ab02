"""A zero-delay OpenAI-style upstream for overhead benchmarks.

Raw ASGI (no framework) under uvicorn with uvloop + httptools, meant to run
in its own process so its CPU does not mix with the gateway's or the load
generator's:

    python bench/zero_upstream.py --port 8101 [--chunks 200] [--chunk-gap-ms 0]

POST /v1/chat/completions (and /v1/completions) reads the whole body, then
answers a canned small JSON, or for `"stream": true` N SSE chunks (one ASGI
send each), a usage chunk when `stream_options.include_usage` is set, and
`data: [DONE]`. GET /health → 200, GET /v1/models → one model with a large
`max_model_len`, GET /metrics → vLLM-shaped metrics of an idle, very fast
engine with a huge KV cache (for gateways that admit on live engine state);
any other GET → 200 `{}` (and the path is logged once to stderr, which shows
what a router probes at startup).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MODEL = "bench-model"
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_MAX_BODY = 64 * 1024 * 1024


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


COMPLETION = _json(
    {
        "id": "cmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    }
)
MODELS = _json(
    {
        "object": "list",
        "data": [{"id": MODEL, "object": "model", "owned_by": "bench", "max_model_len": 1_000_000}],
    }
)
CHUNK = (
    b"data: "
    + _json(
        {
            "id": "cmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}],
        }
    )
    + b"\n\n"
)
DONE = b"data: [DONE]\n\n"
# A vLLM-shaped /metrics: an idle engine with a huge KV cache whose prompt and
# generation counters advance with the work it is sent (one prompt token per 4
# body bytes), so a gateway that measures the prefill rate sees a very fast
# engine: admission never holds a request back because of this upstream.
_L = f'engine="0",model_name="{MODEL}"'
METRICS_HEAD = "".join(
    [
        "# TYPE vllm:cache_config_info gauge\n",
        f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="10000000",{_L}}} 1.0\n',
        "# TYPE vllm:kv_cache_usage_perc gauge\n",
        f"vllm:kv_cache_usage_perc{{{_L}}} 0.0\n",
        "# TYPE vllm:num_requests_running gauge\n",
        f"vllm:num_requests_running{{{_L}}} 0.0\n",
        "# TYPE vllm:num_requests_waiting gauge\n",
        f"vllm:num_requests_waiting{{{_L}}} 0.0\n",
        "# TYPE vllm:num_preemptions counter\n",
        f"vllm:num_preemptions_total{{{_L}}} 0.0\n",
    ]
)


def metrics(prompt_tokens: int, generation_tokens: int) -> bytes:
    return (
        METRICS_HEAD
        + f"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{{{_L}}} {prompt_tokens}.0\n"
        + f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{{{_L}}} "
        f"{generation_tokens}.0\n"
    ).encode()


_PROM = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


def usage_chunk(n: int) -> bytes:
    usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
    return (
        b"data: "
        + _json(
            {
                "id": "cmpl-bench",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": [],
                "usage": usage,
            }
        )
        + b"\n\n"
    )


class ZeroUpstream:
    def __init__(self, chunks: int, chunk_gap_s: float) -> None:
        self.chunks = chunks
        self.gap = chunk_gap_s
        self._seen_paths: set[str] = set()
        self.prompt_tokens = 0
        self.generation_tokens = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            await self._complete(receive, send)
        elif method == "GET" and path == "/health":
            await _answer(send, 200, b"", [])
        elif method == "GET" and path == "/v1/models":
            await _answer(send, 200, MODELS, _JSON)
        elif method == "GET" and path == "/metrics":
            await _answer(send, 200, metrics(self.prompt_tokens, self.generation_tokens), _PROM)
        elif method == "GET":
            if path not in self._seen_paths and len(self._seen_paths) < 100:
                self._seen_paths.add(path)
                print(f"zero_upstream: GET {path} (answered 200 {{}})", file=sys.stderr, flush=True)
            await _answer(send, 200, b"{}", _JSON)
        else:
            await _answer(send, 404, b'{"error":"not found"}', _JSON)

    async def _complete(self, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        if body is None:
            return
        self.prompt_tokens += len(body) // 4
        # Cheap flag detection: a full json parse of a 400 KB body would make the
        # upstream the bottleneck. The benchmark keeps the flags outside the big
        # message, so they sit in the first or last bytes whatever the key order
        # a proxy re-serializes with.
        ends = body[:512] + body[-512:]
        stream = b'"stream":true' in ends or b'"stream": true' in ends
        if not stream:
            self.generation_tokens += 1
            await _answer(send, 200, COMPLETION, _JSON)
            return
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        for _ in range(self.chunks):
            self.generation_tokens += 1
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            if self.gap:
                await asyncio.sleep(self.gap)
        tail = DONE
        if b'"include_usage":true' in ends or b'"include_usage": true' in ends:
            tail = usage_chunk(self.chunks) + DONE
        await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _read_body(receive: Receive) -> bytes | None:
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    hdrs = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--chunk-gap-ms", type=float, default=0.0)
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the benchmark upstream listens on loopback only")
    app = ZeroUpstream(args.chunks, args.chunk_gap_ms / 1000)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="on",
        backlog=4096,
    )


if __name__ == "__main__":
    main()
