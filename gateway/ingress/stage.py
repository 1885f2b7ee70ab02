"""Ingress: parse the body, pick the session key, read the deadline headers (`ctx.parsed`)."""

from __future__ import annotations

from gateway.config.schema import GatewayConfig
from gateway.deadlines.client import parse_headers
from gateway.ingress.protocol import Endpoint, ParsedRequest, parse_request
from gateway.pipeline.context import Parsed, RequestContext

# Defaults of `sessions.headers` / `sessions.body_fields` (gateway.config.SessionsConfig).
SESSION_HEADERS = ("x-session-id", "session_id", "x-session-affinity")
SESSION_BODY_FIELDS = ("prompt_cache_key", "user")


class Ingress:
    def __init__(self, cfg: GatewayConfig) -> None:
        self._cfg = cfg

    def process(self, ctx: RequestContext, raw: bytes) -> None:
        endpoint: Endpoint = "chat" if ctx.endpoint == "chat" else "completions"
        request = parse_request(endpoint, raw)
        ctx.parsed = Parsed(
            request, self._session_key(ctx, request), parse_headers(ctx.headers, ctx.received_at)
        )

    def _session_key(self, ctx: RequestContext, request: ParsedRequest) -> str | None:
        for name in self._cfg.sessions.headers:
            value = ctx.headers.get(name)
            if value:
                return value[:256]
        for name in self._cfg.sessions.body_fields:
            value = request.body.get(name)
            if isinstance(value, str) and value:
                return value[:256]
        return None
