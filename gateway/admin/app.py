"""The admin app's routes (reference: config/README.md, `admin`).

    GET  /metrics                          Prometheus (open)
    GET  /healthz                          liveness (open)
    GET  /admin/replicas                   health, ledger, draining
    POST /admin/replicas/{name}/drain      no new requests; in flight finish
    POST /admin/replicas/{name}/undrain
    GET  /admin/policies, POST /admin/policies/reload
    GET  /admin/config                     the effective config, secrets masked
    GET  /admin/sessions                   how many sessions are tracked
    GET  /admin/sessions/{key}?tenant=     one session's counters and replica

Session keys are user data: nothing here logs them.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin.auth import AdminAuth
from gateway.admin.views import AdminView
from gateway.config.decode import ConfigError
from gateway.config.schema import effective_config
from gateway.errors import GatewayError, NotFound, error_response


def build_admin_app(gw: AdminView) -> AdminAuth:
    h = _Handlers(gw)
    routes = [
        Route("/metrics", h.metrics, methods=["GET"]),
        Route("/healthz", _healthz, methods=["GET"]),
        *_admin_routes(h),
    ]
    handlers = {HTTPException: _http_error, GatewayError: _gateway_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    return AdminAuth(app, gw.config.admin.token)


def _admin_routes(h: _Handlers) -> list[Route]:
    return [
        Route("/admin/replicas", h.replicas, methods=["GET"]),
        Route("/admin/replicas/{name}/drain", h.drain, methods=["POST"]),
        Route("/admin/replicas/{name}/undrain", h.undrain, methods=["POST"]),
        Route("/admin/policies", h.policies, methods=["GET"]),
        Route("/admin/policies/reload", h.reload_policies, methods=["POST"]),
        Route("/admin/config", h.config, methods=["GET"]),
        Route("/admin/sessions", h.sessions, methods=["GET"]),
        Route("/admin/sessions/{key:path}", h.session, methods=["GET"]),
    ]


class _Handlers:
    def __init__(self, gw: AdminView) -> None:
        self._gw = gw

    async def metrics(self, request: Request) -> Response:
        m = self._gw.metrics
        for r in self._gw.registry:
            m.replica_healthy.labels(r.name).set(1 if r.healthy else 0)
            m.replica_in_flight.labels(r.name).set(r.in_flight)
            m.replica_draining.labels(r.name).set(1 if r.draining or r.leaving else 0)
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    async def replicas(self, request: Request) -> Response:
        gw = self._gw
        return JSONResponse(
            {"replicas": [r.describe() for r in gw.registry], "admission": gw.admission.describe()}
        )

    async def drain(self, request: Request) -> Response:
        return self._set_draining(request, True)

    async def undrain(self, request: Request) -> Response:
        return self._set_draining(request, False)

    def _set_draining(self, request: Request, draining: bool) -> Response:
        name = request.path_params["name"]
        replica = self._gw.registry.set_draining(name, draining)
        if replica is None:
            raise NotFound(f"No replica is named {name!r}.", code="unknown_replica")
        return JSONResponse({"replica": replica.describe()})

    async def policies(self, request: Request) -> Response:
        return JSONResponse({"policies": self._gw.policy.policies.describe()})

    async def reload_policies(self, request: Request) -> Response:
        try:
            loaded = self._gw.policy.reload()
        except ConfigError as exc:
            return JSONResponse({"status": "refused", "errors": exc.problems}, status_code=400)
        return JSONResponse({"status": "reloaded", "policies": [p.name for p in loaded.policies]})

    async def config(self, request: Request) -> Response:
        return JSONResponse(effective_config(self._gw.config))

    async def sessions(self, request: Request) -> Response:
        return JSONResponse(await self._gw.sessions.count())

    async def session(self, request: Request) -> Response:
        found = await self._gw.sessions.lookup(
            request.path_params["key"], request.query_params.get("tenant")
        )
        if found is None:
            raise NotFound("No session with this key is tracked.", code="unknown_session")
        return JSONResponse(found)


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    err = NotFound(f"{exc.detail}: {request.method} {request.url.path}.", status=exc.status_code)
    return error_response(err)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc)
