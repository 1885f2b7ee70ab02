"""The `discovery` section: replicas found in DNS (a Kubernetes headless
Service), re-resolved every `interval_s`. Validated here; the resolver loop
is `gateway.replicas.discovery`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

EngineKind = Literal["auto", "vllm", "llamacpp", "sglang"]
UpstreamStreaming = Literal["auto", "always", "never"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """One DNS name: each of its A/AAAA addresses becomes a replica named
    `<name>-<address>:<port>` (IPv6 addresses in brackets) with these settings."""

    name: str
    host: str
    port: int
    scheme: Literal["http", "https"] = "http"
    kind: EngineKind = "auto"
    api_key: str = ""
    interval_s: float = 10.0
    resolve_timeout_s: float = 2.0
    weight: float = 1.0
    capacity_tokens: int | None = None
    max_model_len: int | None = None
    upstream_streaming: UpstreamStreaming = "auto"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"name must start with a letter or digit and hold only letters, digits, "
                f"'_', '.', '-', got {self.name!r}"
            )
        if not self.host or any(c in self.host for c in "/:@ "):
            raise ValueError(
                f"host must be a DNS name (no scheme, port or path), got {self.host!r}"
            )
        if not 0 < self.port <= 65535:
            raise ValueError(f"port must be a TCP port (1-65535), got {self.port}")
        for name in ("interval_s", "resolve_timeout_s", "weight"):
            if not getattr(self, name) > 0:  # (also refuses NaN)
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.resolve_timeout_s > self.interval_s:
            raise ValueError(
                f"resolve_timeout_s ({self.resolve_timeout_s}) must not exceed interval_s "
                f"({self.interval_s})"
            )
        for name in ("capacity_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")

    def replica_name(self, address: str) -> str:
        return f"{self.name}-{_host(address)}:{self.port}"

    def replica_url(self, address: str) -> str:
        return f"{self.scheme}://{_host(address)}:{self.port}"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
