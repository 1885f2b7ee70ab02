"""What a bench/routing.py run sends its requests to: the gateway in this
process, N gateway processes sharing a private redis-server, or vllm-router.

Each target is a context manager that yields the base URLs of its front
ends (the load generator round-robins requests over them) and stops every
process it started, by PID, on the way out. Gateway configs are plain dicts
decoded by `parse_config` (in process) or written as a YAML file (JSON is
YAML) for `gateway serve --config` (processes), so both are validated alike.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.procs import Proc, wait_http_ok
from gateway.config.schema import parse_config
from gateway.http.serving import BackgroundServers, free_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Front:
    """Where a row sends requests, and the gateways' admin URLs (metrics)."""

    urls: list[str]
    admin_urls: list[str] = field(default_factory=list)


def _admin(cfg: dict[str, Any]) -> str:
    return f"http://127.0.0.1:{cfg['listen']['admin_port']}"


def _public(cfg: dict[str, Any]) -> str:
    return f"http://127.0.0.1:{cfg['listen']['port']}"


VLLM_ROUTER_POLICIES = ("cache_aware", "round_robin")


def gateway_config(
    urls: list[str], scheduling: dict[str, Any], redis_url: str | None = None
) -> dict[str, Any]:
    """One gateway over the simulated replicas, admission off (only routing differs)."""
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": free_port(), "admin_port": free_port()},
        "replicas": [
            {"url": u, "name": f"replica-{i}", "kind": "vllm"} for i, u in enumerate(urls)
        ],
        "scheduling": copy.deepcopy(scheduling),
        "admission": {"enabled": False},
        # generous: a CPU-starved simulator must not look dead mid-run
        "health": {"interval_s": 1.0, "timeout_s": 10.0, "unhealthy_after": 10, "healthy_after": 1},
        "timeouts": {"total_s": 900.0},
        "log_level": "warning",
    }
    if redis_url is not None:
        cfg["state"] = {"backend": "redis", "redis": {"url": redis_url}}
    return cfg


@contextlib.contextmanager
def in_process_gateway(cfg: dict[str, Any]) -> Iterator[Front]:
    from gateway.app import create_app

    parsed = parse_config(cfg)
    gw = create_app(parsed)
    with BackgroundServers(gw.listeners()):
        end = time.monotonic() + 20
        while time.monotonic() < end and len(gw.registry.healthy()) < len(parsed.replicas):
            time.sleep(0.05)
        yield Front([_public(cfg)], [_admin(cfg)])


@contextlib.contextmanager
def started(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Stop every process appended to `procs`, whatever happens."""
    try:
        yield procs
    finally:
        for proc in reversed(procs):
            proc.stop()


@contextlib.contextmanager
def gateway_processes(
    urls: list[str], scheduling: dict[str, Any], n: int, redis_url: str, logs: Path
) -> Iterator[Front]:
    """`n` gateway processes (`gateway serve --config`), one redis-server state."""
    logs.mkdir(parents=True, exist_ok=True)
    with started([]) as procs:
        configs = []
        for i in range(n):
            cfg = gateway_config(urls, scheduling, redis_url)
            parse_config(cfg)  # fail here, with the key path, rather than in the child
            path = logs / f"gateway-{i}.yaml"
            path.write_text(json.dumps(cfg, indent=2) + "\n")
            argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path)]
            proc = Proc(f"gateway-{i}", argv, logs / f"gateway-{i}.log")
            procs.append(proc)
            proc.start(ROOT)
            configs.append(cfg)
        for cfg, proc in zip(configs, procs, strict=True):
            wait_http_ok(_public(cfg) + "/readyz", proc, 60)
        yield Front([_public(c) for c in configs], [_admin(c) for c in configs])


@contextlib.contextmanager
def redis_server(logs: Path) -> Iterator[str]:
    """A private redis-server (no persistence) on a free loopback port."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("multi-instance rows need redis-server on PATH")
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(logs)]
    with started([Proc("redis-server", argv, logs / "redis.log")]) as procs:
        _wait_ping(redis.Redis(port=port), procs[0].start(ROOT))
        yield f"redis://127.0.0.1:{port}/0"


def _wait_ping(client: redis.Redis, proc: Proc, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.alive():
        with contextlib.suppress(redis.ConnectionError):
            if client.ping():
                return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not answer PING:\n{proc.log_tail()}")


def flush_redis(url: str) -> None:
    redis.Redis.from_url(url).flushdb()


@contextlib.contextmanager
def vllm_router(binary: str, urls: list[str], policy: str, logs: Path) -> Iterator[Front]:
    """vllm-router over the simulated replicas, retries and circuit breaker off
    (as in bench/overhead.py), the policy's own defaults otherwise."""
    logs.mkdir(parents=True, exist_ok=True)
    port, prom = free_port(), free_port()
    argv = [binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls]
    argv += ["--policy", policy, "--disable-retries", "--disable-circuit-breaker"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)]
    argv += ["--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "30"]
    argv += ["--health-check-interval-secs", "60", "--request-timeout-secs", "900"]
    argv += ["--log-level", "warning"]
    with started([Proc(f"vllm-router-{policy}", argv, logs / f"vllm-router-{policy}.log")]) as ps:
        ps[0].start(ROOT)
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/health", ps[0], 60)
        yield Front([url])


def find_vllm_router(flag: str | None) -> str | None:
    if not flag:
        return None
    return flag if Path(flag).exists() or shutil.which(flag) else None
