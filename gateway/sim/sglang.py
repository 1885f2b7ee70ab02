"""The SGLang flavour: vLLM's engine model behind SGLang's routes and shapes.

SGLang batches continuously over a paged (radix) KV pool, as the vLLM
flavour's scheduler does (`batching.py`), so this flavour runs that model
and changes what a client sees (names checked against sglang's
`srt/entrypoints/http_server.py`, `srt/entrypoints/openai/protocol.py`,
`srt/metrics/collector.py`):

- `GET /health` (200, empty), `GET /v1/models` (`owned_by: sglang`,
  `max_model_len`), `GET /get_model_info`, `GET /get_server_info` (server
  arguments, `max_total_num_tokens`, `internal_states`, `version`);
- `GET /metrics`: `sglang:` gauges and counters, labels `model_name`,
  `engine_type`, `tp_rank`, `pp_rank` (a subset of the real label set);
- errors flat, not under `error`: `{"object": "error", "message", "type",
  "param", "code": <int>}` (`FlatErrors`, an ASGI middleware).

Approximations: no `/generate` native route, no tokenize route.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.sim.engine import Totals
from gateway.sim.info import SimReplica, guarded

SGLANG_VERSION = "0.5.4"
_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank")


def sglang_routes(replica: SimReplica) -> list[Route]:
    cfg = replica.config

    async def health(request: Request) -> Response:
        return Response(status_code=replica.faults.health_status or 200)

    async def models(request: Request) -> Response:
        replica.check_auth(request)
        card = {
            "id": cfg.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def model_info(request: Request) -> Response:
        return JSONResponse(
            {"model_path": cfg.model, "tokenizer_path": cfg.model, "is_generation": True}
        )

    async def server_info(request: Request) -> Response:
        return JSONResponse(server_info_body(replica))

    async def metrics(request: Request) -> Response:
        totals, gauges = replica.snapshot()
        text = sglang_metrics_text(cfg.model, cfg.block_size, totals, gauges)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return [
        Route("/health", guarded(health), methods=["GET"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/get_model_info", guarded(model_info), methods=["GET"]),
        Route("/get_server_info", guarded(server_info), methods=["GET"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
    ]


def server_info_body(replica: SimReplica) -> dict[str, Any]:
    cfg = replica.config
    _, gauges = replica.snapshot()
    return {
        "model_path": cfg.model,
        "served_model_name": cfg.model,
        "context_length": cfg.max_model_len,
        "max_running_requests": cfg.max_num_seqs,
        "chunked_prefill_size": cfg.max_num_batched_tokens,
        "page_size": cfg.block_size,
        "schedule_policy": "fcfs" if cfg.scheduling_policy == "fcfs" else "priority",
        "max_total_num_tokens": gauges["kv_blocks_total"] * cfg.block_size,
        "max_req_input_len": cfg.max_model_len - 1,
        "internal_states": [{"last_gen_throughput": 0.0, "load": gauges["running"]}],
        "version": SGLANG_VERSION,
    }


_DOCS = {
    "num_running_reqs": ("gauge", "The number of running requests."),
    "num_used_tokens": ("gauge", "The number of used tokens."),
    "token_usage": ("gauge", "The token usage."),
    "num_queue_reqs": ("gauge", "The number of requests in the waiting queue."),
    "max_total_num_tokens": ("gauge", "Maximum total number of tokens in the KV cache pool."),
    "cache_hit_rate": ("gauge", "The prefix cache hit rate."),
    "gen_throughput": ("gauge", "The generation throughput (token/s)."),
    "prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "cached_tokens_total": ("counter", "Number of cached prompt tokens."),
    "num_requests_total": ("counter", "Number of requests processed."),
    "num_retracted_requests_total": ("counter", "Total number of retracted requests."),
}


def sglang_metrics_text(model: str, block_size: int, totals: Totals, gauges: dict[str, Any]) -> str:
    queries = totals.prefix_queries_tokens
    values: dict[str, float] = {
        "num_running_reqs": gauges["running"],
        "num_used_tokens": gauges["kv_blocks_pinned"] * block_size,
        "token_usage": gauges["kv_usage"],
        "num_queue_reqs": gauges["waiting"],
        "max_total_num_tokens": gauges["kv_blocks_total"] * block_size,
        "cache_hit_rate": totals.prefix_hits_tokens / queries if queries else 0.0,
        "gen_throughput": (
            totals.generation_tokens / totals.generation_time if totals.generation_time else 0.0
        ),
        "prompt_tokens_total": totals.prompt_tokens,
        "generation_tokens_total": totals.generation_tokens,
        "cached_tokens_total": totals.prefix_hits_tokens,
        "num_requests_total": totals.finished,
        "num_retracted_requests_total": totals.preemptions,
    }
    values_of_labels = (model, "unified", "0", "0")
    labels = ",".join(f'{k}="{v}"' for k, v in zip(_LABELS, values_of_labels, strict=True))
    lines: list[str] = []
    for name, (kind, doc) in _DOCS.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        lines += [
            f"# HELP sglang:{family} {doc}",
            f"# TYPE sglang:{family} {kind}",
            f"sglang:{name}{{{labels}}} {float(values[name])}",
        ]
    return "\n".join(lines) + "\n"


class FlatErrors:
    """SGLang's error shape (ASGI middleware): an error answer's `{"error": {...}}`
    body flattened to `{"object": "error", ...}` (a bare `{"error": "Unauthorized"}`
    stays as it is)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        start: Message | None = None

        async def relay(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is known
                return
            if start is not None and message["type"] == "http.response.body":
                held, start = start, None
                await _send_flat(send, held, message)
                return
            await send(message)

        await self._app(scope, receive, relay)


async def _send_flat(send: Send, start: Message, body: Message) -> None:
    raw = body.get("body", b"")
    try:
        data = json.loads(raw) if not body.get("more_body") else None
    except ValueError:
        data = None
    inner = data.get("error") if isinstance(data, dict) else None
    if isinstance(inner, dict):
        raw = json.dumps({"object": "error", **inner}).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        start = {**start, "headers": [*headers, (b"content-length", str(len(raw)).encode())]}
        body = {"type": "http.response.body", "body": raw}
    await send(start)
    await send(body)
