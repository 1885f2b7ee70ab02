"""Gateway configuration: YAML + CLI + environment → frozen dataclasses.

Loading is strict (see `gateway.configtools`): unknown keys, wrong types and
bad values fail at startup with the dotted path of the offending key. Secrets
are given as `${ENV_VAR}` references and are masked when the effective config
is printed. The full reference is `config/README.md`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from gateway.configtools import ConfigError, decode, to_plain
from gateway.scheduling.config import SchedulingConfig

EngineKind = Literal["auto", "vllm", "llamacpp"]

SECRET_FIELDS = frozenset({"api_key", "api_keys", "key", "secret", "password", "isolation_secret", "url_password"})


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 9090

    def __post_init__(self) -> None:
        for name in ("port", "admin_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ValueError(f"{name} must be a TCP port (0-65535), got {value}")


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    url: str
    name: str = ""
    kind: EngineKind = "auto"
    api_key: str = ""
    weight: float = 1.0
    capacity_tokens: int | None = None
    max_model_len: int | None = None

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

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        if self.unhealthy_after < 1 or self.healthy_after < 1:
            raise ValueError("unhealthy_after and healthy_after must be >= 1")


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = 32 * 1024 * 1024
    max_retries: int = 2

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        if not 0 <= self.max_retries <= 10:
            raise ValueError("max_retries must be between 0 and 10")


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """The shared upstream HTTP client (aiohttp) pool."""

    max_connections: int = 10000
    max_connections_per_replica: int = 0
    keepalive_timeout_s: float = 4.0  # below uvicorn's (and so vLLM's) 5 s idle close

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_connections_per_replica < 0:
            raise ValueError("max_connections must be >= 1 and max_connections_per_replica >= 0")


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Client API keys and tenants (see the policies/budgets docs)."""

    enabled: bool = False


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """KV-headroom admission and the gateway queue."""

    enabled: bool = False


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Where shared state lives: in-process (`memory`) or `redis`."""

    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = ""
    key_prefix: str = "gw:"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    replicas: tuple[ReplicaConfig, ...] = ()
    listen: ListenConfig = field(default_factory=ListenConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    policies: str | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    state: StateConfig = field(default_factory=StateConfig)
    expose_replica_header: bool = True
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def __post_init__(self) -> None:
        names = [r.name for r in self.replicas]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"replicas: duplicate replica names {dupes}")


def parse_config(data: Any, base_dir: Path | None = None) -> GatewayConfig:
    cfg = decode(GatewayConfig, data)
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
    plain = to_plain(cfg, SECRET_FIELDS)
    assert isinstance(plain, dict)
    return plain
