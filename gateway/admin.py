"""Admin listener (separate port, loopback by default): metrics and replica state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.config.decode import ConfigError

if TYPE_CHECKING:
    from gateway.app import Gateway


def build_admin_app(gw: Gateway) -> Starlette:
    async def metrics(request: Request) -> Response:
        for r in gw.registry:
            gw.metrics.replica_healthy.labels(r.name).set(1 if r.healthy else 0)
            gw.metrics.replica_in_flight.labels(r.name).set(r.in_flight)
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def replicas(request: Request) -> Response:
        return JSONResponse({"replicas": [r.describe() for r in gw.registry],
                             "admission": gw.admission.describe()})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def policies(request: Request) -> Response:
        return JSONResponse({"policies": gw.policy.policies.describe()})

    async def reload_policies(request: Request) -> Response:
        try:
            loaded = gw.policy.reload()
        except ConfigError as exc:
            return JSONResponse({"status": "refused", "errors": exc.problems}, status_code=400)
        return JSONResponse({"status": "reloaded", "policies": [p.name for p in loaded.policies]})

    routes = [
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/replicas", replicas, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/admin/policies", policies, methods=["GET"]),
        Route("/admin/policies/reload", reload_policies, methods=["POST"]),
    ]
    return Starlette(routes=routes)
