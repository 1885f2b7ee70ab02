"""Gateway configuration: YAML + CLI + environment → frozen dataclasses.

Loading is strict (see `gateway.config.decode`): unknown keys, wrong types and
bad values fail at startup with the dotted path of the offending key. Secrets
are given as `${ENV_VAR}` references and are masked when the effective config
is printed. The full reference is `config/README.md`.

Plain data: nothing here imports the plugins the config names; the
scheduling section's plugin specs are checked against the registry by
`gateway.scheduling.validate` (at startup and when the router is built).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from gateway.config.decode import ConfigError, decode, to_plain
from gateway.config.discovery import DiscoveryConfig, EngineKind
from gateway.config.masking import mask_secrets
from gateway.config.scheduling import SchedulingConfig
from gateway.config.state import StateConfig

_LEAN_TIMEOUTS = ("head_timeout_s", "body_timeout_s", "body_total_timeout_s", "keepalive_timeout_s")


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 9090
    # The public listener's HTTP server: only "lean" (uvicorn is refused, see below).
    server: Literal["lean", "uvicorn"] = "lean"
    # The lean server's timeouts, in seconds:
    head_timeout_s: float = 5.0  # a request head, from its first byte
    body_timeout_s: float = 30.0  # the longest gap between two request body bytes
    body_total_timeout_s: float = 300.0  # a whole request body, from its head
    keepalive_timeout_s: float = 5.0  # an idle keep-alive connection (or one never used)
    #: on SIGTERM/SIGINT, how long requests in flight get to finish before they
    #: are ended with a `shutting_down` error (gateway/pipeline/lifecycle.py);
    #: below Kubernetes' default terminationGracePeriodSeconds (30)
    graceful_timeout_s: float = 25.0

    def __post_init__(self) -> None:
        grace = self.graceful_timeout_s
        if not grace >= 0:  # (also refuses NaN)
            raise ValueError(f"graceful_timeout_s must be a number of seconds >= 0, got {grace!r}")
        for name in ("port", "admin_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ValueError(f"{name} must be a TCP port (0-65535), got {value}")
        for name in _LEAN_TIMEOUTS:
            value = getattr(self, name)
            if not value > 0:  # (also refuses NaN)
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.server == "uvicorn":  # one client can take it down (gateway/http/README.md)
            raise ValueError(
                "server: uvicorn is refused for the public listener: it has no request-head "
                "size or time limit and no request-body timeout, so one client can take it "
                "down; use server: lean (the default)"
            )


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    url: str
    name: str = ""
    kind: EngineKind = "auto"
    api_key: str = ""
    weight: float = 1.0
    capacity_tokens: int | None = None
    max_model_len: int | None = None
    upstream_streaming: Literal["auto", "always", "never"] = "auto"

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port], got {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if not self.name:
            object.__setattr__(self, "name", parts.netloc)
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")
        for name in ("capacity_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class TimeoutsConfig:
    """Default timeouts for upstream exchanges (policies may override per task)."""

    connect_s: float = 5.0
    first_byte_s: float = 600.0
    idle_s: float = 120.0
    total_s: float = 3600.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"{f.name} must be > 0")


@dataclass(frozen=True, slots=True)
class HealthConfig:
    interval_s: float = 2.0
    timeout_s: float = 2.0
    unhealthy_after: int = 2
    healthy_after: int = 1
    #: passive health (gateway/replicas/outliers.py): consecutive failed
    #: exchanges that eject a replica from routing (0: never), for how long at
    #: first, and at most (doubling while it keeps failing)
    eject_after: int = 5
    eject_base_s: float = 5.0
    eject_max_s: float = 300.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        if self.unhealthy_after < 1 or self.healthy_after < 1:
            raise ValueError("unhealthy_after and healthy_after must be >= 1")
        if self.eject_after < 0:
            raise ValueError(f"eject_after must be >= 0, got {self.eject_after}")
        if not 0 < self.eject_base_s <= self.eject_max_s:
            raise ValueError("eject_base_s must be > 0 and <= eject_max_s")


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = 32 * 1024 * 1024
    max_retries: int = 2
    #: per chat request: a 200k-token agent history at ~20 tokens for its shortest turns
    max_messages: int = 10_000
    #: content parts (text, image, ...) of all messages of one request together
    max_content_parts: int = 50_000
    #: the most UTF-8 bytes one token of any tokenizer behind the gateway covers
    #: (the longest token of the 19 vocabularies llama.cpp ships: 512 bytes of spaces)
    max_bytes_per_token: int = 512

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        if not 0 <= self.max_retries <= 10:
            raise ValueError("max_retries must be between 0 and 10")
        for name in ("max_messages", "max_content_parts", "max_bytes_per_token"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """The shared upstream HTTP/1.1 client's keep-alive pool (gateway.http.client)."""

    max_connections: int = 10000
    max_connections_per_replica: int = 0
    keepalive_timeout_s: float = 4.0  # below uvicorn's (and so vLLM's) 5 s idle close

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_connections_per_replica < 0:
            raise ValueError("max_connections must be >= 1 and max_connections_per_replica >= 0")


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
    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_min", "tokens_per_min", "max_concurrent"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
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
class SessionsConfig:
    """Where the session (agent chain) key is read from, in order: headers, then body fields."""

    headers: tuple[str, ...] = ("x-session-id", "session_id", "x-session-affinity")
    body_fields: tuple[str, ...] = ("prompt_cache_key", "user")

    def __post_init__(self) -> None:
        allowed = {"prompt_cache_key", "user", "safety_identifier", "session_id"}
        bad = sorted(set(self.body_fields) - allowed)
        if bad:
            raise ValueError(f"body_fields {bad} are not supported (use {sorted(allowed)})")


@dataclass(frozen=True, slots=True)
class TokensConfig:
    """Token counting (`tokens: engine` in policies): engine timeout and cache size."""

    engine_timeout_s: float = 2.0
    cache_entries: int = 4096

    def __post_init__(self) -> None:
        if self.engine_timeout_s <= 0 or self.cache_entries < 1:
            raise ValueError("engine_timeout_s must be > 0 and cache_entries >= 1")


PRIORITY_CLASSES = ("interactive", "standard", "batch")


def _per_class(
    name: str, given: dict[str, Any], defaults: dict[str, Any], lo: float, hi: float
) -> dict[str, Any]:
    unknown = sorted(set(given) - set(PRIORITY_CLASSES))
    if unknown:
        raise ValueError(
            f"{name}: unknown priority classes {unknown} (known: {list(PRIORITY_CLASSES)})"
        )
    merged = {**defaults, **given}
    for cls, value in merged.items():
        if not lo <= value <= hi:
            raise ValueError(f"{name}.{cls} must be between {lo} and {hi}, got {value}")
    return merged


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """KV-headroom admission and the gateway queue (see docs/admission.md).

    Per-class maps may name only some classes; the others keep their defaults.
    """

    enabled: bool = True
    watermarks: dict[str, float] = field(default_factory=dict)
    ttft_targets_s: dict[str, float] = field(default_factory=dict)
    queue_max_requests: dict[str, int] = field(default_factory=dict)
    queue_max_tokens: dict[str, int] = field(default_factory=dict)
    poll_interval_s: float = 0.25
    poll_timeout_s: float = 1.0
    stale_after_s: float = 2.0
    unhealthy_after_failures: int = 3
    max_engine_waiting: int | None = 4
    max_in_flight: int | None = None
    unknown_capacity_max_in_flight: int | None = None
    output_reservation: Literal["limit", "learned"] = "limit"
    learned_quantile: float = 0.95
    learned_min_samples: int = 50
    default_output_tokens: int = 1024
    default_prefill_tokens_per_s: float = 8000.0
    chars_per_token: float = 3.0
    lease_grace_s: float = 30.0

    def __post_init__(self) -> None:
        fix = object.__setattr__
        fix(
            self,
            "watermarks",
            _per_class(
                "watermarks",
                self.watermarks,
                {"interactive": 0.92, "standard": 0.85, "batch": 0.70},
                0.01,
                1.0,
            ),
        )
        fix(
            self,
            "ttft_targets_s",
            _per_class(
                "ttft_targets_s",
                self.ttft_targets_s,
                {"interactive": 2.0, "standard": 10.0, "batch": 60.0},
                0.001,
                86400,
            ),
        )
        fix(
            self,
            "queue_max_requests",
            _per_class(
                "queue_max_requests",
                self.queue_max_requests,
                {"interactive": 256, "standard": 512, "batch": 4096},
                0,
                10**7,
            ),
        )
        fix(
            self,
            "queue_max_tokens",
            _per_class(
                "queue_max_tokens",
                self.queue_max_tokens,
                {"interactive": 4_000_000, "standard": 8_000_000, "batch": 64_000_000},
                0,
                10**12,
            ),
        )
        positive = (
            "poll_interval_s",
            "poll_timeout_s",
            "stale_after_s",
            "default_prefill_tokens_per_s",
            "chars_per_token",
            "lease_grace_s",
            "default_output_tokens",
            "unhealthy_after_failures",
            "learned_min_samples",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name, low in (
            ("max_engine_waiting", 0),
            ("max_in_flight", 1),
            ("unknown_capacity_max_in_flight", 1),
        ):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if not 0.5 <= self.learned_quantile < 1.0:
            raise ValueError(f"learned_quantile must be in [0.5, 1), got {self.learned_quantile}")
        if self.stale_after_s < self.poll_interval_s:
            raise ValueError("stale_after_s must be >= poll_interval_s")

    def watermark(self, cls: str) -> float:
        return self.watermarks.get(cls, self.watermarks["standard"])

    def ttft_target(self, cls: str) -> float:
        return self.ttft_targets_s.get(cls, self.ttft_targets_s["standard"])


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin listener's `/admin/*` routes: `Authorization: Bearer <token>`
    when `token` is set (normally `${GATEWAY_ADMIN_TOKEN}`); `/metrics` and
    `/healthz` stay open."""

    token: str = ""

    def __post_init__(self) -> None:
        if self.token and len(self.token) < 16:
            raise ValueError("token must be at least 16 characters")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    replicas: tuple[ReplicaConfig, ...] = ()
    discovery: tuple[DiscoveryConfig, ...] = ()
    admin: AdminConfig = field(default_factory=AdminConfig)
    listen: ListenConfig = field(default_factory=ListenConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    policies: str | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    tokens: TokensConfig = field(default_factory=TokensConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    state: StateConfig = field(default_factory=StateConfig)
    expose_replica_header: bool = True
    access_log: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"

    def __post_init__(self) -> None:
        names = [r.name for r in self.replicas]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"replicas: duplicate replica names {dupes}")
        found = [d.name for d in self.discovery]
        dupes = sorted({n for n in found if found.count(n) > 1})
        if dupes:
            raise ValueError(f"discovery: duplicate names {dupes}")


#: Keys accepted once that now live elsewhere: refused with a pointer to the new key.
_MOVED_KEYS = {"state.redis_url": "state.redis.url"}


def _point_to_moved(problem: str) -> str:
    for old, new in _MOVED_KEYS.items():
        if problem.startswith(f"{old}: unknown key"):
            return f"{old}: no longer supported, use {new} (see config/README.md)"
    return problem


def parse_config(data: Any, base_dir: Path | None = None) -> GatewayConfig:
    try:
        cfg = decode(GatewayConfig, data)
    except ConfigError as exc:
        raise ConfigError([_point_to_moved(p) for p in exc.problems]) from None
    if cfg.policies and base_dir is not None and not Path(cfg.policies).is_absolute():
        cfg = dataclasses.replace(cfg, policies=str((base_dir / cfg.policies).resolve()))
    return cfg


def load_config(path: str | Path) -> GatewayConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read config file: {exc.strerror}"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{p}: invalid YAML: {exc}"]) from exc
    return parse_config(data, p.parent)


def effective_config(cfg: GatewayConfig) -> dict[str, Any]:
    """The config as plain data, every secret masked (`gateway.config.masking`)."""
    plain = mask_secrets(to_plain(cfg))
    assert isinstance(plain, dict)
    return plain
