"""Client authentication (API keys → tenants). Disabled when no keys are configured.

Filled in by the policies/budgets work; the seam exists so the pipeline does
not change when it lands.
"""

from __future__ import annotations

from gateway.config import AuthConfig
from gateway.context import RequestContext


class Authenticator:
    def __init__(self, cfg: AuthConfig) -> None:
        self._cfg = cfg

    def authenticate(self, ctx: RequestContext) -> None:
        """Set `ctx.tenant` from the client's credentials, or raise Unauthorized."""
        ctx.tenant = None
