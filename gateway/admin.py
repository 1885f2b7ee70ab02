"""Admin listener (separate port, loopback by default): metrics and replica state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from gateway.app import Gateway


def build_admin_app(gw: Gateway) -> Starlette:
    async def metrics(request: Request) -> Response:
        for r in gw.registry:
            gw.metrics.replica_healthy.labels(r.name).set(1 if r.healthy else 0)
            gw.metrics.replica_in_flight.labels(r.name).set(r.in_flight)
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def replicas(request: Request) -> Response:
        return JSONResponse({"replicas": [r.describe() for r in gw.registry]})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/replicas", replicas, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    return Starlette(routes=routes)
