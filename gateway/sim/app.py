"""One simulated replica as a Starlette app: `create_sim_app(config)`.

Generation routes (both flavours): `POST /v1/chat/completions`,
`POST /v1/completions`; llama.cpp also `/chat/completions`, `/completions`
and its native `/completion` (`n_predict`, `content`). Simulator-only routes:
`GET /sim/stats` (`?records=0` leaves out the per-request records),
`POST /sim/reset` (optional `{"clear_cache": false}`),
`POST /sim/fault` (see `faults.py`). An unknown path is a 404: llama.cpp's
JSON `not_found_error`, vLLM's (FastAPI's) `{"detail": "Not Found"}`.

The engine loop starts in the lifespan and is cancelled on shutdown. During
`warmup_s` a vLLM replica does not listen yet (connection refused, as while
vLLM loads); a llama.cpp replica answers 503 "Loading model".

Request ids: vLLM names a request `chatcmpl-<X-Request-Id>` (or `cmpl-` for
completions) when the header is present, else a random id; llama.cpp always
generates one (random uuid hex, unique across replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.sim.batching import BatchScheduler
from gateway.sim.config import SimConfig
from gateway.sim.engine import Engine, EngineCore, Totals
from gateway.sim.exchange import Exchange
from gateway.sim.faults import Faults
from gateway.sim.formats import Formatter
from gateway.sim.info import guarded, llamacpp_routes, slot_json, vllm_routes
from gateway.sim.kvevents import KVEventPublisher
from gateway.sim.metrics import VllmMetrics
from gateway.sim.protocol import (
    RECORDED_FIELDS,
    Endpoint,
    Job,
    SimHTTPError,
    context_room,
    decode_body,
    error,
    error_body,
    parse_job,
)
from gateway.sim.request import RequestRecord, SimRequest
from gateway.sim.sglang import FlatErrors, sglang_routes
from gateway.sim.slots import SlotScheduler
from gateway.sim.tokens import OutputText, prompt_digest

ASGIResponse = Callable[[Scope, Receive, Send], Awaitable[None]]
HEADERS_SEEN = (
    "authorization",
    "x-request-id",
    "x-request-deadline",
    "x-request-timeout",
    "x-stainless-timeout",
    "x-stainless-retry-count",
    "x-session-id",
)
LLAMA_PUBLIC = ("/health", "/v1/health", "/models", "/v1/models")
_NEVER = 1 << 62


class _SimStarlette(Starlette):
    """Starlette that remembers uvicorn's transport, to drop it on a simulated crash."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            owner: Any = getattr(send, "__self__", None)
            scope["sim.transport"] = getattr(owner, "transport", None)
        await super().__call__(scope, receive, send)


class _Generate:
    """ASGI endpoint for one generation route."""

    def __init__(self, replica: SimReplica, endpoint: Endpoint) -> None:
        self._replica = replica
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        response: ASGIResponse
        try:
            response = await self._replica.generate(request, self._endpoint)
        except SimHTTPError as exc:
            response = JSONResponse(exc.body, status_code=exc.status)
        await response(scope, receive, send)


class SimReplica:
    """Engine, scheduler, metrics, faults and routes of one simulated replica."""

    def __init__(self, config: SimConfig) -> None:
        #: the engine a client sees; sglang runs vLLM's engine model (`sglang.py`)
        self.face = config.flavor
        if config.flavor == "sglang":
            config = dataclasses.replace(config, flavor="vllm")
        self.config = config
        self.core = EngineCore(config)
        self.scheduler: BatchScheduler | SlotScheduler
        self.metrics: VllmMetrics | None = None
        if config.flavor == "vllm":
            self.scheduler = BatchScheduler(config, self.core)
            self.metrics = VllmMetrics(config, self.snapshot)
            self.core.observer = self.metrics
        else:
            self.scheduler = SlotScheduler(config, self.core)
        self.engine = Engine(self.core, self.scheduler)
        self.faults = Faults()
        self._ready_at = config.warmup_s
        handlers = {404: _llama_not_found if config.flavor == "llamacpp" else _vllm_not_found}
        middleware = [Middleware(FlatErrors)] if self.face == "sglang" else []
        self.app = _SimStarlette(
            routes=self._routes(),
            lifespan=self._lifespan,
            exception_handlers=handlers,
            middleware=middleware,
        )

    # --- lifecycle -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        publisher = self._start_kv_events()
        task = asyncio.create_task(self.engine.run(), name=f"sim-engine-{self.config.model}")
        self._ready_at = self.core.clock.now() + self.config.warmup_s
        try:
            if self.config.flavor == "vllm" and self.config.warmup_s > 0:
                await self.core.clock.sleep(self.config.warmup_s)
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if publisher is not None:
                self._stop_kv_events(publisher)

    def _start_kv_events(self) -> KVEventPublisher | None:
        endpoint = self.config.kv_events_endpoint
        if endpoint is None or not isinstance(self.scheduler, BatchScheduler):
            return None
        publisher = KVEventPublisher(endpoint, self.config.block_size)
        self.scheduler.publisher = publisher
        self.scheduler.pool.sink = publisher
        return publisher

    def _stop_kv_events(self, publisher: KVEventPublisher) -> None:
        assert isinstance(self.scheduler, BatchScheduler)
        self.scheduler.publisher = None
        self.scheduler.pool.sink = None
        publisher.close()

    def _routes(self) -> list[Route]:
        gen: list[tuple[str, Endpoint]] = [
            ("/v1/chat/completions", "chat"),
            ("/v1/completions", "completion"),
        ]
        if self.config.flavor == "llamacpp":
            gen += [
                ("/chat/completions", "chat"),
                ("/completions", "completion"),
                ("/completion", "native"),
            ]
        routes = [Route(path, _Generate(self, kind), methods=["POST"]) for path, kind in gen]
        if self.face == "sglang":
            routes += sglang_routes(self)
        else:
            routes += vllm_routes(self) if self.config.flavor == "vllm" else llamacpp_routes(self)
        routes += [
            Route("/sim/stats", guarded(self._stats_route), methods=["GET"]),
            Route("/sim/reset", guarded(self._reset_route), methods=["POST"]),
            Route("/sim/fault", guarded(self._fault_route), methods=["POST"]),
        ]
        return routes

    # --- checks --------------------------------------------------------------------
    def check_auth(self, request: Request) -> None:
        key = self.config.api_key
        if key is None or request.headers.get("authorization") == f"Bearer {key}":
            return
        path = request.url.path
        if self.config.flavor == "vllm":
            if path.startswith("/v1"):
                raise SimHTTPError(401, {"error": "Unauthorized"})
        elif path not in LLAMA_PUBLIC:
            raise SimHTTPError(401, error_body("llamacpp", 401, "Invalid API Key"))

    def check_loading(self) -> None:
        if self.config.flavor == "llamacpp" and self.core.clock.now() < self._ready_at:
            raise SimHTTPError(503, error_body("llamacpp", 503, "Loading model"))

    # --- generation ------------------------------------------------------------------
    async def generate(self, request: Request, endpoint: Endpoint) -> ASGIResponse:
        self.check_loading()
        self.check_auth(request)
        body = decode_body(self.config, await request.body())
        record = self._new_record(request, body, endpoint)
        self.core.add_record(record)
        try:
            return self._accept(request, body, endpoint, record)
        except SimHTTPError as exc:
            record.finish_reason, record.error = "error", str(exc.body)
            record.finish, record.finish_wall = self.core.clock.now(), time.time()
            self.core.totals.errors += 1
            raise

    def _accept(
        self, request: Request, body: dict[str, Any], endpoint: Endpoint, record: RequestRecord
    ) -> ASGIResponse:
        fault = self.faults.take()
        if fault is not None and fault.error_status is not None:
            raise error(self.config, fault.error_status, fault.error_message)
        job = parse_job(self.config, endpoint, body)
        record.prompt_tokens, record.priority, record.stream = (
            len(job.prompt),
            job.priority,
            job.stream,
        )
        limit = self.config.max_num_queued_reqs
        busy = limit is not None and self.scheduler.gauges()["waiting"] >= limit
        if self.config.flavor == "vllm" and busy:
            raise error(
                self.config,
                503,
                (
                    f"The engine is currently busy: {limit} requests are already waiting "
                    "(max_num_queued_reqs). Please try again later."
                ),
            )
        req = self._new_request(job, record)
        die_after = fault.die_after_tokens if fault is not None else None
        return Exchange(
            self.engine,
            req,
            Formatter(self.config.flavor, job, record.id),
            die_after,
            request.scope.get("sim.transport"),
        )

    def _new_request(self, job: Job, record: RequestRecord) -> SimRequest:
        cfg = self.config
        room = context_room(cfg, len(job.prompt))
        max_output = room if job.cap is None else min(job.cap, room)
        output = OutputText(
            cfg.seed, prompt_digest(job.prompt), cfg.output_len_min, cfg.output_len_max
        )
        natural = _NEVER if job.ignore_eos else max(output.natural_len, job.min_tokens)
        return SimRequest(
            rid=record.id,
            prompt=job.prompt,
            max_output=max_output,
            natural_len=natural,
            output=output,
            record=record,
            priority=job.priority,
            cache_salt=job.cache_salt,
            id_slot=job.id_slot,
            cache_prompt=job.cache_prompt,
        )

    def _new_record(
        self, request: Request, body: dict[str, Any], endpoint: Endpoint
    ) -> RequestRecord:
        x_request_id = request.headers.get("x-request-id")
        prefix = "chatcmpl" if endpoint == "chat" or self.config.flavor == "llamacpp" else "cmpl"
        if self.config.flavor == "vllm" and x_request_id:
            rid = f"{prefix}-{x_request_id}"
        else:
            rid = f"{prefix}-{uuid.uuid4().hex}"
        seen = {k: v for k in HEADERS_SEEN if (v := request.headers.get(k)) is not None}
        return RequestRecord(
            id=rid,
            x_request_id=x_request_id,
            endpoint=request.url.path,
            arrival=self.core.clock.now(),
            arrival_wall=time.time(),
            headers_seen=seen,
            body={k: body.get(k) for k in RECORDED_FIELDS},
        )

    # --- observability and control -----------------------------------------------------
    def snapshot(self) -> tuple[Totals, dict[str, Any]]:
        return self.core.totals, self.scheduler.gauges()

    def stats(self, records: bool = True) -> dict[str, Any]:
        """`/sim/stats`: totals, gauges and (unless `records=False`) per-request records."""
        totals, gauges = self.snapshot()
        out: dict[str, Any] = {
            "flavor": self.face,
            "model": self.config.model,
            "now": self.core.clock.now(),
            "now_wall": time.time(),
            "speed": self.config.speed,
            "paused": self.engine.paused,
            "faults": self.faults.to_dict(),
            "totals": totals.to_dict() | gauges,
            "requests": [r.to_dict() for r in self.core.records] if records else [],
        }
        if isinstance(self.scheduler, SlotScheduler):
            out["slots"] = [slot_json(s) for s in self.scheduler.slots]
        return out

    def reset(self, clear_cache: bool = True) -> None:
        self.core.totals = Totals()
        self.core.records = []
        if self.metrics is not None:
            self.metrics.reset()
        if clear_cache:
            self.scheduler.clear_cache()

    def set_fault(self, **changes: Any) -> dict[str, Any]:
        self.faults.update(changes)
        self.engine.set_paused(self.faults.paused)
        return self.faults.to_dict()

    async def _stats_route(self, request: Request) -> Response:
        records = request.query_params.get("records", "1") not in ("0", "false")
        return JSONResponse(self.stats(records=records))

    async def _reset_route(self, request: Request) -> Response:
        raw = await request.body()
        body = decode_body(self.config, raw) if raw.strip() else {}
        clear = body.get("clear_cache", True)
        if not isinstance(clear, bool):
            raise error(self.config, 400, "clear_cache must be a bool")
        self.reset(clear_cache=clear)
        return JSONResponse({"reset": True, "clear_cache": clear})

    async def _fault_route(self, request: Request) -> Response:
        body = decode_body(self.config, await request.body())
        try:
            return JSONResponse(self.set_fault(**body))
        except ValueError as exc:
            raise error(self.config, 400, str(exc)) from exc


async def _llama_not_found(request: Request, exc: Exception) -> Response:
    """llama-server's answer to an unknown path."""
    body = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
    return JSONResponse(body, status_code=404)


async def _vllm_not_found(request: Request, exc: Exception) -> Response:
    """vLLM's (FastAPI's) answer to an unknown path."""
    return JSONResponse({"detail": "Not Found"}, status_code=404)


def create_sim_app(config: SimConfig) -> Starlette:
    """One simulated replica; its engine loop runs in the app's lifespan."""
    return SimReplica(config).app
