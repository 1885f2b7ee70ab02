"""Run a real gateway (public listener on the lean server, admin on uvicorn) on
loopback ports; `server="uvicorn"` runs the public app under uvicorn instead
(test-only: `gateway serve` refuses it, see `listen.server`), which exercises
the gateway's path for servers without the lean server's disconnect extension.

with running_gateway([url1, url2], health=HealthConfig(interval_s=0.2)) as gw:
    client = gw.openai()
    ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import openai

from gateway.app import Gateway, create_app
from gateway.config.schema import GatewayConfig, HealthConfig, ListenConfig, ReplicaConfig
from gateway.http.serving import BackgroundServers, free_port

FAST_HEALTH = HealthConfig(interval_s=0.2, timeout_s=1.0, unhealthy_after=1, healthy_after=1)


@dataclass
class RunningGateway:
    gateway: Gateway
    url: str
    admin_url: str
    servers: BackgroundServers

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def openai(self, **kw: Any) -> openai.OpenAI:
        kw.setdefault("api_key", "sk-test-client")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60.0)
        return openai.OpenAI(base_url=self.base_url, **kw)

    def async_openai(self, **kw: Any) -> openai.AsyncOpenAI:
        kw.setdefault("api_key", "sk-test-client")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60.0)
        return openai.AsyncOpenAI(base_url=self.base_url, **kw)

    def admin(self, path: str) -> Any:
        return httpx.get(self.admin_url + path, timeout=10).json()

    def replicas(self) -> list[dict[str, Any]]:
        data = self.admin("/admin/replicas")["replicas"]
        assert isinstance(data, list)
        return data

    def metrics_text(self) -> str:
        return httpx.get(self.admin_url + "/metrics", timeout=10).text


def make_config(
    replica_urls: Sequence[str | ReplicaConfig],
    **overrides: Any,
) -> GatewayConfig:
    replicas = tuple(
        r if isinstance(r, ReplicaConfig) else ReplicaConfig(url=r) for r in replica_urls
    )
    overrides.setdefault("health", FAST_HEALTH)
    listen = ListenConfig(port=free_port(), admin_port=free_port())
    return dataclasses.replace(GatewayConfig(), replicas=replicas, listen=listen, **overrides)


@contextmanager
def running_gateway(
    replica_urls: Sequence[str | ReplicaConfig] = (),
    *,
    config: GatewayConfig | None = None,
    server: Literal["lean", "uvicorn"] = "lean",
    **overrides: Any,
) -> Iterator[RunningGateway]:
    cfg = config if config is not None else make_config(replica_urls, **overrides)
    gw = create_app(cfg)
    host = cfg.listen.host
    listeners = gw.listeners()
    listeners[0] = dataclasses.replace(listeners[0], server=server)
    servers = BackgroundServers(listeners)
    with servers:
        yield RunningGateway(
            gw,
            f"http://{host}:{cfg.listen.port}",
            f"http://{cfg.listen.admin_host}:{cfg.listen.admin_port}",
            servers,
        )
