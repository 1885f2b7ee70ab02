"""Several simulated replicas in one background thread, for tests and benchmarks.

    with SimCluster.start(2, flavor="llamacpp", speed=100) as cluster:
        httpx.post(cluster.urls[0] + "/v1/chat/completions", json=...)
        cluster.stats(0)["totals"]["requests"]

All replicas run under one `gateway.serving.BackgroundServers` (one thread,
one event loop) on free loopback ports. `stats`, `reset` and `set_fault` run
on that loop, so they never race the engines.
"""

from __future__ import annotations

from typing import Any, Self

from gateway.serving import BackgroundServers, Listener, free_port
from gateway.sim.app import SimReplica
from gateway.sim.config import SimConfig


class SimCluster:
    """N simulated replicas on free loopback ports (see the module docstring)."""

    def __init__(self, configs: list[SimConfig], host: str = "127.0.0.1") -> None:
        if not configs:
            raise ValueError("SimCluster needs at least one SimConfig")
        self.configs = list(configs)
        self.replicas = [SimReplica(c) for c in self.configs]
        self.host = host
        self.ports = [free_port(host) for _ in self.replicas]
        self._servers = BackgroundServers(
            [Listener(r.app, host, port) for r, port in zip(self.replicas, self.ports, strict=True)]
        )
        self._running = False

    @classmethod
    def start(cls, n: int = 1, **overrides: Any) -> SimCluster:
        """Start `n` identical replicas of `SimConfig(**overrides)` (same model, same seed)."""
        if n < 1:
            raise ValueError("n must be >= 1")
        return cls([SimConfig(**overrides)] * n).run()

    def run(self) -> Self:
        if not self._running:
            self._servers.start()
            self._running = True
        return self

    def stop(self) -> None:
        if self._running:
            self._servers.stop()
            self._running = False

    def __enter__(self) -> Self:
        return self.run()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{port}" for port in self.ports]

    def stats(self, i: int) -> dict[str, Any]:
        replica = self.replicas[i]
        return self._on_loop(replica.stats)  # type: ignore[no-any-return]

    def reset(self, clear_cache: bool = True) -> None:
        for replica in self.replicas:
            self._on_loop(lambda r=replica: r.reset(clear_cache))

    def set_fault(self, i: int, **changes: Any) -> dict[str, Any]:
        replica = self.replicas[i]
        return self._on_loop(lambda: replica.set_fault(**changes))  # type: ignore[no-any-return]

    def _on_loop(self, fn: Any) -> Any:
        async def call() -> Any:
            return fn()

        return self._servers.call(call(), timeout=10.0)
