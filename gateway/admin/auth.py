"""The admin token: every admin route but `/metrics` and `/healthz`
(Prometheus and probes) needs `Authorization: Bearer <admin.token>` when the
token is configured. Checked before routing, so an unknown path answers 401
too, and in constant time (`hmac.compare_digest`)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import Unauthorized, error_response

OPEN_PATHS = frozenset({"/metrics", "/healthz"})


class AdminAuth:
    """ASGI middleware; with an empty token every request passes."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._refused(scope):
            err = Unauthorized(
                "The admin API needs the admin token: Authorization: Bearer <token>.",
                code="invalid_admin_token",
            )
            response = error_response(err)
            response.headers["www-authenticate"] = 'Bearer realm="gateway-admin"'
            await response(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _refused(self, scope: Scope) -> bool:
        guarded = scope["type"] == "http" and self._token and scope["path"] not in OPEN_PATHS
        return bool(guarded) and not self._allowed(scope)

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name.lower() == b"authorization":
                scheme, _, credential = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    credential.strip(), self._token
                )
        return False
