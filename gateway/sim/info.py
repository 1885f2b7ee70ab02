"""Non-generation endpoints of each flavour: health, models, tokenize, metrics, slots.

vLLM: `/health` (200, empty body; 503 empty when the engine is dead),
`/v1/models` (`data[].id`, `data[].max_model_len`), `/version`, `/tokenize`
(`count`, `max_model_len`, `tokens`), `/metrics`. Only `/v1/*` is behind
`--api-key`.

llama.cpp: `/health` (`{"status": "ok"}`, 503 "Loading model" while warming
up), `/slots`, `/props`, `/metrics` (501 without `--metrics`), `/tokenize`
(`{"content"}` -> `{"tokens"}`), `/apply-template`, `/v1/models`. Everything
but `/health` and `/models` is behind `--api-key`, and every route answers 503
"Loading model" during warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway.sim.batching import BatchScheduler
from gateway.sim.config import SimConfig
from gateway.sim.engine import Totals
from gateway.sim.faults import Faults
from gateway.sim.llamabodies import generation_params, models_body, props_body
from gateway.sim.metrics import VllmMetrics, llamacpp_metrics_text
from gateway.sim.protocol import SimHTTPError, decode_body, error, error_body
from gateway.sim.slots import Slot, SlotScheduler
from gateway.sim.tokens import render_chat, token_pieces, tokenize
from gateway.sim.vllmbodies import model_permission


class SimReplica(Protocol):
    """What these routes read of a simulated replica (`gateway.sim.app.SimReplica`)."""

    config: SimConfig
    faults: Faults
    metrics: VllmMetrics | None
    scheduler: BatchScheduler | SlotScheduler

    def check_auth(self, request: Request) -> None: ...

    def check_loading(self) -> None: ...

    def snapshot(self) -> tuple[Totals, dict[str, Any]]: ...


Handler = Callable[[Request], Awaitable[Response]]
VLLM_VERSION = "0.11.0"


def guarded(handler: Handler) -> Handler:
    """Turn `SimHTTPError` into the engine-shaped JSON response."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except SimHTTPError as exc:
            return JSONResponse(exc.body, status_code=exc.status)

    return endpoint


def vllm_routes(replica: SimReplica) -> list[Route]:
    cfg = replica.config

    async def health(request: Request) -> Response:
        return Response(status_code=replica.faults.health_status or 200)

    async def models(request: Request) -> Response:
        replica.check_auth(request)
        created = int(time.time())
        card = {
            "id": cfg.model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [model_permission(created)],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    async def tokenize_route(request: Request) -> Response:
        body = decode_body(cfg, await request.body())
        model = body.get("model")
        if model is not None and model != cfg.model:
            raise error(cfg, 404, f"The model `{model}` does not exist.", param="model")
        tokens = tokenize(_vllm_tokenize_text(replica, body))
        return JSONResponse(
            {
                "count": len(tokens),
                "max_model_len": cfg.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    async def metrics(request: Request) -> Response:
        assert replica.metrics is not None
        return Response(
            replica.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return [
        Route("/health", guarded(health), methods=["GET"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/version", guarded(version), methods=["GET"]),
        Route("/tokenize", guarded(tokenize_route), methods=["POST"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
    ]


def _vllm_tokenize_text(replica: SimReplica, body: dict[str, Any]) -> str:
    cfg = replica.config
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list):
            raise error(cfg, 400, "'messages' must be a list", param="messages")
        add = body.get("add_generation_prompt", True)
        try:
            return render_chat(messages, body.get("tools"), add_generation_prompt=add is True)
        except (TypeError, ValueError) as exc:
            raise error(cfg, 400, str(exc), param="messages") from exc
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise error(cfg, 400, "'prompt' or 'messages' is required", param="prompt")
    return prompt


def llamacpp_routes(replica: SimReplica) -> list[Route]:
    cfg = replica.config
    scheduler = replica.scheduler
    assert isinstance(scheduler, SlotScheduler)

    def llama(handler: Handler, public: bool = False) -> Handler:
        async def endpoint(request: Request) -> Response:
            replica.check_loading()
            if not public:
                replica.check_auth(request)
            return await handler(request)

        return guarded(endpoint)

    async def health(request: Request) -> Response:
        status = replica.faults.health_status or 200
        if status == 200:
            return JSONResponse({"status": "ok"})
        return JSONResponse(
            error_body("llamacpp", status, _LOADING if status == 503 else "unavailable"),
            status_code=status,
        )

    async def slots(request: Request) -> Response:
        if request.query_params.get("fail_on_no_slot") and all(s.req for s in scheduler.slots):
            raise error(cfg, 503, "no slot available")
        return JSONResponse([slot_json(s) for s in scheduler.slots])

    async def props(request: Request) -> Response:
        return JSONResponse(props_body(cfg))

    async def metrics(request: Request) -> Response:
        if not cfg.metrics_enabled:
            raise error(
                cfg, 501, "This server does not support metrics endpoint. Start it with `--metrics`"
            )
        totals, gauges = replica.snapshot()
        return PlainTextResponse(
            llamacpp_metrics_text(totals, gauges), media_type="text/plain; version=0.0.4"
        )

    async def tokenize_route(request: Request) -> Response:
        body = decode_body(cfg, await request.body())
        content = body.get("content", "")
        if not isinstance(content, str):
            raise error(cfg, 400, "'content' must be a string")
        tokens = tokenize(content)
        if body.get("with_pieces") is True:
            pieces = token_pieces(content)
            return JSONResponse(
                {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces, strict=True)]}
            )
        return JSONResponse({"tokens": tokens})

    async def apply_template(request: Request) -> Response:
        body = decode_body(cfg, await request.body())
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise error(cfg, 400, "'messages' is required and must be a list")
        try:
            return JSONResponse({"prompt": render_chat(messages, body.get("tools"))})
        except (TypeError, ValueError) as exc:
            raise error(cfg, 400, str(exc)) from exc

    async def models(request: Request) -> Response:
        return JSONResponse(models_body(cfg))

    return [
        Route("/health", llama(health, public=True), methods=["GET"]),
        Route("/v1/health", llama(health, public=True), methods=["GET"]),
        Route("/slots", llama(slots), methods=["GET"]),
        Route("/props", llama(props), methods=["GET"]),
        Route("/metrics", llama(metrics), methods=["GET"]),
        Route("/tokenize", llama(tokenize_route), methods=["POST"]),
        Route("/apply-template", llama(apply_template), methods=["POST"]),
        Route("/v1/models", llama(models, public=True), methods=["GET"]),
        Route("/models", llama(models, public=True), methods=["GET"]),
    ]


_LOADING = "Loading model"


def slot_json(slot: Slot) -> dict[str, Any]:
    """One entry of llama.cpp's `/slots`."""
    out: dict[str, Any] = {
        "id": slot.id,
        "n_ctx": slot.n_ctx,
        "speculative": False,
        "is_processing": slot.req is not None,
    }
    if slot.id_task is None:
        return out
    req = slot.req
    decoded = len(req.output_ids) if req is not None else slot.last_decoded
    remain = (slot.last_n_predict - decoded) if req is not None else 0
    out.update(
        id_task=slot.id_task,
        # b11434: the tokens in the slot's context now (prompt + generated so far)
        n_prompt_tokens=len(slot.cache),
        n_prompt_tokens_processed=slot.last_prompt_tokens - slot.last_cached,
        n_prompt_tokens_cache=slot.last_cached,
        params=generation_params(slot.last_n_predict),
        next_token=[
            {
                "has_next_token": req is not None,
                "has_new_line": False,
                "n_remain": remain,
                "n_decoded": decoded,
            }
        ],
    )
    return out
