"""Ingress: parse the body, pick the session key, set the default deadline."""

from __future__ import annotations

from gateway.config.schema import GatewayConfig
from gateway.pipeline.context import RequestContext
from gateway.deadlines.deadline import parse_headers
from gateway.ingress.protocol import Endpoint, parse_request

# Defaults of `sessions.headers` / `sessions.body_fields` (gateway.config.SessionsConfig).
SESSION_HEADERS = ("x-session-id", "session_id", "x-session-affinity")
SESSION_BODY_FIELDS = ("prompt_cache_key", "user")


class Ingress:
    def __init__(self, cfg: GatewayConfig) -> None:
        self._cfg = cfg

    def process(self, ctx: RequestContext, raw: bytes) -> None:
        endpoint: Endpoint = "chat" if ctx.endpoint == "chat" else "completions"
        ctx.request = parse_request(endpoint, raw)
        ctx.session_key = self._session_key(ctx)
        ctx.client_deadlines = parse_headers(ctx.headers, ctx.received_at)
        ctx.deadline = ctx.received_at + self._cfg.timeouts.total_s
        ctx.deadline_source = "config"

    def _session_key(self, ctx: RequestContext) -> str | None:
        for name in self._cfg.sessions.headers:
            value = ctx.headers.get(name)
            if value:
                return value[:256]
        assert ctx.request is not None
        for name in self._cfg.sessions.body_fields:
            value = ctx.request.body.get(name)
            if isinstance(value, str) and value:
                return value[:256]
        return None
