"""Who may call the gateway: client API keys, tenants, the admin token."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gateway.config.ranges import check_ranges, ranged

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class ApiKeyConfig:
    """One client API key: plaintext (normally `${ENV}`) or its SHA-256 hex digest."""

    tenant: str
    key: str = ""
    sha256: str = ""

    def __post_init__(self) -> None:
        if bool(self.key) == bool(self.sha256):
            raise ValueError("give exactly one of key (plaintext or ${ENV}) and sha256")
        if self.sha256 and not _SHA256_HEX.match(self.sha256):
            raise ValueError("sha256 must be 64 lowercase hex digits")


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """What a tenant may do: tasks, default task, rate and concurrency limits (None: unlimited)."""

    allowed_tasks: tuple[str, ...] = ()
    default_task: str | None = None
    requests_per_min: int | None = ranged(None, ge=1)
    tokens_per_min: int | None = ranged(None, ge=1)
    max_concurrent: int | None = ranged(None, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.default_task and self.allowed_tasks and self.default_task not in self.allowed_tasks:
            raise ValueError(f"default_task {self.default_task!r} is not in allowed_tasks")


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Client API keys and tenants (docs/policies.md). Off unless `enabled`."""

    enabled: bool = False
    keys: tuple[ApiKeyConfig, ...] = ()
    tenants: dict[str, TenantConfig] = field(default_factory=dict)
    isolation_secret: str = ""

    def __post_init__(self) -> None:
        if self.enabled and not self.keys:
            raise ValueError("enabled: true needs at least one entry in keys")
        unknown = sorted({k.tenant for k in self.keys if k.tenant not in self.tenants})
        if unknown:
            raise ValueError(
                f"keys refer to undefined tenants {unknown} (define them under tenants)"
            )
        if self.isolation_secret and len(self.isolation_secret) < 16:
            raise ValueError("isolation_secret must be at least 16 characters")


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin listener's `/admin/*` routes: `Authorization: Bearer <token>`
    when `token` is set (normally `${GATEWAY_ADMIN_TOKEN}`); `/metrics` and
    `/healthz` stay open."""

    token: str = ""

    def __post_init__(self) -> None:
        if self.token and len(self.token) < 16:
            raise ValueError("token must be at least 16 characters")
