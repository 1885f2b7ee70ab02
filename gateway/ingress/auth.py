"""Client authentication: API keys → tenants. Disabled unless `auth.enabled`.

Keys come from `Authorization: Bearer <key>` (what the OpenAI SDKs send) or
`x-api-key`. Configured keys are kept only as SHA-256 digests (plaintext
keys, usually `${ENV}`, are hashed at startup); the presented key is hashed
and compared with every configured digest using `hmac.compare_digest`, so
timing reveals neither which key nor how much of it matched. Keys are never
logged.
"""

from __future__ import annotations

import hashlib
import hmac

from gateway.config.schema import AuthConfig, TenantConfig
from gateway.errors import Unauthorized
from gateway.request.context import RequestContext

_NO_KEY = (
    "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' "
    "(or the 'x-api-key' header)."
)
_BAD_KEY = "Incorrect API key provided."


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Authenticator:
    def __init__(self, cfg: AuthConfig) -> None:
        self._cfg = cfg
        self._digests: list[tuple[bytes, str]] = [
            (bytes.fromhex(k.sha256) if k.sha256 else key_digest(k.key), k.tenant) for k in cfg.keys
        ]

    @property
    def enabled(self) -> bool:
        return self._cfg.enabled

    def tenant_config(self, tenant: str | None) -> TenantConfig | None:
        return None if tenant is None else self._cfg.tenants.get(tenant)

    def authenticate(self, ctx: RequestContext) -> None:
        """Set `ctx.tenant` from the client's credentials, or raise Unauthorized."""
        if not self._cfg.enabled:
            ctx.tenant = None
            return
        presented = _presented_key(ctx)
        if not presented:
            raise Unauthorized(_NO_KEY, code="missing_api_key")
        ctx.tenant = self._match(key_digest(presented))
        if ctx.tenant is None:
            raise Unauthorized(_BAD_KEY)

    def _match(self, digest: bytes) -> str | None:
        found: str | None = None
        for stored, tenant in self._digests:  # no early exit: constant work per request
            if hmac.compare_digest(stored, digest) and found is None:
                found = tenant
        return found


def _presented_key(ctx: RequestContext) -> str:
    auth = ctx.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return ctx.headers.get("x-api-key", "").strip()
