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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from gateway.config.access import AdminConfig, ApiKeyConfig, AuthConfig, TenantConfig
from gateway.config.admission import PRIORITY_CLASSES, AdmissionConfig
from gateway.config.decode import ConfigError, decode, to_plain
from gateway.config.discovery import DiscoveryConfig, EngineKind
from gateway.config.masking import mask_secrets
from gateway.config.ranges import check_ranges, ranged
from gateway.config.scheduling import SchedulingConfig
from gateway.config.state import StateConfig
from gateway.config.yamlload import load_yaml

__all__ = [
    "PRIORITY_CLASSES",
    "AdminConfig",
    "AdmissionConfig",
    "ApiKeyConfig",
    "AuthConfig",
    "GatewayConfig",
    "HealthConfig",
    "LimitsConfig",
    "ListenConfig",
    "ReplicaConfig",
    "SessionsConfig",
    "TenantConfig",
    "TimeoutsConfig",
    "TokensConfig",
    "UpstreamConfig",
    "effective_config",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = ranged(8080, ge=0, le=65535, what="a TCP port")
    admin_host: str = "127.0.0.1"
    admin_port: int = ranged(9090, ge=0, le=65535, what="a TCP port")
    # The public listener's HTTP server: only "lean" (uvicorn is refused, see below).
    server: Literal["lean", "uvicorn"] = "lean"
    # The lean server's timeouts, in seconds (finite: they are the slow-client protection):
    head_timeout_s: float = ranged(5.0, gt=0)  # a request head, from its first byte
    body_timeout_s: float = ranged(30.0, gt=0)  # the longest gap between two request body bytes
    body_total_timeout_s: float = ranged(300.0, gt=0)  # a whole request body, from its head
    #: an idle keep-alive connection: longer than the clients' own (httpx 5 s) and
    #: load balancers' (60 s), so the client closes first: a server closing one
    #: races the request a client may be sending on it (a connection never used
    #: closes after `head_timeout_s` if shorter)
    keepalive_timeout_s: float = ranged(75.0, gt=0)
    #: on SIGTERM/SIGINT, how long requests in flight get to finish before they
    #: are ended with a `shutting_down` error (gateway/pipeline/lifecycle.py);
    #: below Kubernetes' default terminationGracePeriodSeconds (30)
    graceful_timeout_s: float = ranged(25.0, ge=0)

    def __post_init__(self) -> None:
        check_ranges(self)
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
    weight: float = ranged(1.0, gt=0)
    capacity_tokens: int | None = ranged(None, gt=0)
    max_model_len: int | None = ranged(None, gt=0)
    upstream_streaming: Literal["auto", "always", "never"] = "auto"

    def __post_init__(self) -> None:
        check_ranges(self)
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port], got {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if not self.name:
            object.__setattr__(self, "name", parts.netloc)


@dataclass(frozen=True, slots=True)
class TimeoutsConfig:
    """Default timeouts for upstream exchanges (policies may override per task)."""

    connect_s: float = ranged(5.0, gt=0)
    first_byte_s: float = ranged(600.0, gt=0)
    idle_s: float = ranged(120.0, gt=0)
    total_s: float = ranged(3600.0, gt=0)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, slots=True)
class HealthConfig:
    interval_s: float = ranged(2.0, gt=0)
    timeout_s: float = ranged(2.0, gt=0)
    unhealthy_after: int = ranged(2, ge=1)
    healthy_after: int = ranged(1, ge=1)
    #: passive health (gateway/replicas/outliers.py): consecutive failed
    #: exchanges that eject a replica from routing (0: never), for how long at
    #: first, and at most (doubling while it keeps failing)
    eject_after: int = ranged(5, ge=0)
    eject_base_s: float = ranged(5.0, gt=0)
    eject_max_s: float = ranged(300.0, gt=0)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.eject_base_s > self.eject_max_s:
            raise ValueError(
                f"eject_base_s must be <= eject_max_s ({self.eject_max_s}), got {self.eject_base_s}"
            )


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = ranged(32 * 1024 * 1024, ge=1024)
    max_retries: int = ranged(2, ge=0, le=10)
    #: per chat request: a 200k-token agent history at ~20 tokens for its shortest turns
    max_messages: int = ranged(10_000, ge=1)
    #: content parts (text, image, ...) of all messages of one request together
    max_content_parts: int = ranged(50_000, ge=1)
    #: the most UTF-8 bytes one token of any tokenizer behind the gateway covers
    #: (the longest token of the 19 vocabularies llama.cpp ships: 512 bytes of spaces)
    max_bytes_per_token: int = ranged(512, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """The shared upstream HTTP/1.1 client's keep-alive pool (gateway.http.client)."""

    max_connections: int = ranged(10000, ge=1)
    max_connections_per_replica: int = ranged(0, ge=0)
    keepalive_timeout_s: float = ranged(4.0, gt=0)  # below uvicorn's (and vLLM's) 5 s idle close

    def __post_init__(self) -> None:
        check_ranges(self)


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

    engine_timeout_s: float = ranged(2.0, gt=0)
    cache_entries: int = ranged(4096, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


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
    data = load_yaml(text, str(p))
    return parse_config(data, p.parent)


def effective_config(cfg: GatewayConfig) -> dict[str, Any]:
    """The config as plain data, every secret masked (`gateway.config.masking`)."""
    plain = mask_secrets(to_plain(cfg))
    assert isinstance(plain, dict)
    return plain
