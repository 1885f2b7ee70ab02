"""Admin listener (separate port, loopback by default): metrics and replica state.

It reads the gateway through the narrow view below (`gateway.app.Gateway`
satisfies it), so this module knows nothing of how the gateway is wired.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.config.decode import ConfigError
from gateway.observability.metrics import GatewayMetrics


class ReplicaView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    def describe(self) -> dict[str, Any]: ...


class Named(Protocol):
    @property
    def name(self) -> str: ...


class PolicySetView(Protocol):
    @property
    def policies(self) -> Sequence[Named]: ...
    def describe(self) -> list[dict[str, Any]]: ...


class PolicyView(Protocol):
    @property
    def policies(self) -> PolicySetView: ...
    def reload(self) -> PolicySetView:
        """The new set; ConfigError (the current set stays) when it is invalid."""
        ...


class AdmissionView(Protocol):
    def describe(self) -> dict[str, Any]: ...


class AdminView(Protocol):
    """What the admin routes read of a running gateway."""

    @property
    def registry(self) -> Iterable[ReplicaView]: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def admission(self) -> AdmissionView: ...
    @property
    def policy(self) -> PolicyView: ...


def build_admin_app(gw: AdminView) -> Starlette:
    async def metrics(request: Request) -> Response:
        for r in gw.registry:
            gw.metrics.replica_healthy.labels(r.name).set(1 if r.healthy else 0)
            gw.metrics.replica_in_flight.labels(r.name).set(r.in_flight)
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def replicas(request: Request) -> Response:
        return JSONResponse(
            {"replicas": [r.describe() for r in gw.registry], "admission": gw.admission.describe()}
        )

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
