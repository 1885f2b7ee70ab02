"""The `discovery` section: replicas found in DNS (a Kubernetes headless
Service), re-resolved every `interval_s`. Validated here; the resolver loop
is `gateway.replicas.discovery`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gateway.config.ranges import check_ranges, ranged

EngineKind = Literal["auto", "vllm", "llamacpp", "sglang"]
UpstreamStreaming = Literal["auto", "always", "never"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """One DNS name: each of its A/AAAA addresses becomes a replica named
    `<name>-<address>:<port>` (IPv6 addresses in brackets) with these settings."""

    name: str
    host: str
    port: int = ranged(ge=1, le=65535, what="a TCP port")
    scheme: Literal["http", "https"] = "http"
    kind: EngineKind = "auto"
    api_key: str = ""
    interval_s: float = ranged(10.0, gt=0)
    resolve_timeout_s: float = ranged(2.0, gt=0)
    weight: float = ranged(1.0, gt=0)
    capacity_tokens: int | None = ranged(None, gt=0)
    max_model_len: int | None = ranged(None, gt=0)
    upstream_streaming: UpstreamStreaming = "auto"

    def __post_init__(self) -> None:
        check_ranges(self)
        if not _NAME.match(self.name):
            raise ValueError(
                f"name must start with a letter or digit and hold only letters, digits, "
                f"'_', '.', '-', got {self.name!r}"
            )
        if not self.host or any(c in self.host for c in "/:@ "):
            raise ValueError(
                f"host must be a DNS name (no scheme, port or path), got {self.host!r}"
            )
        if self.resolve_timeout_s > self.interval_s:
            raise ValueError(
                f"resolve_timeout_s must be <= interval_s ({self.interval_s}), "
                f"got {self.resolve_timeout_s}"
            )

    def replica_name(self, address: str) -> str:
        return f"{self.name}-{_host(address)}:{self.port}"

    def replica_url(self, address: str) -> str:
        return f"{self.scheme}://{_host(address)}:{self.port}"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
