"""A small scripted OpenAI-style upstream for tests that need exact control
(chunk timing, exact engine error bodies, captured headers). Runs as a real
uvicorn server on loopback, like every other server in the tests."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

VLLM_CONTEXT_ERROR = {
    "error": {
        "message": "This model's maximum context length is 2048 tokens. However, your prompt "
        "contains "
        "3000 input tokens. Please reduce the length of the input messages.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
LLAMACPP_CONTEXT_ERROR = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 4096,
    }
}


@dataclass
class Script:
    chunks: int = 5
    chunk_delay_s: float = 0.0
    status: int = 200
    error_body: dict[str, Any] | None = None
    health_status: int = 200
    seen: list[dict[str, Any]] = field(default_factory=list)


def _chunk(content: str) -> str:
    obj = {
        "id": "cmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return "data: " + json.dumps(obj) + "\n\n"


def scripted_app(script: Script) -> Starlette:
    async def health(request: Request) -> Response:
        return Response(status_code=script.health_status)

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 2048}]}
        )

    async def chat(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        script.seen.append({"headers": dict(request.headers), "body": body, "raw": raw})
        if script.status != 200:
            return JSONResponse(script.error_body, status_code=script.status)
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": "cmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "x " * script.chunks},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": 7,
                        "completion_tokens": script.chunks,
                        "total_tokens": 7 + script.chunks,
                    },
                }
            )

        async def gen() -> Any:
            for _ in range(script.chunks):
                yield _chunk("x ")
                if script.chunk_delay_s:
                    await asyncio.sleep(script.chunk_delay_s)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": 7,
                    "completion_tokens": script.chunks,
                    "total_tokens": 7 + script.chunks,
                }
                yield (
                    "data: "
                    + json.dumps(
                        {
                            "id": "cmpl-1",
                            "object": "chat.completion.chunk",
                            "created": 0,
                            "model": "m",
                            "choices": [],
                            "usage": usage,
                        }
                    )
                    + "\n\n"
                )
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )
