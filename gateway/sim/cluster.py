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

from gateway.http.serving import BackgroundServers, Listener, free_port
from gateway.sim.app import SimReplica
from gateway.sim.config import SimConfig

_START_ATTEMPTS = 3


class SimCluster:
    """N simulated replicas on free loopback ports (see the module docstring)."""

    def __init__(self, configs: list[SimConfig], host: str = "127.0.0.1") -> None:
        if not configs:
            raise ValueError("SimCluster needs at least one SimConfig")
        self.configs = list(configs)
        self.host = host
        self._running = False
        self._prepare()

    def _prepare(self) -> None:
        """Fresh replicas on fresh free ports (an engine is bound to its event loop)."""
        self.replicas = [SimReplica(c) for c in self.configs]
        self.ports = [free_port(self.host) for _ in self.replicas]
        listeners = [
            Listener(r.app, self.host, port)
            for r, port in zip(self.replicas, self.ports, strict=True)
        ]
        self._servers = BackgroundServers(listeners)

    @classmethod
    def start(cls, n: int = 1, **overrides: Any) -> SimCluster:
        """Start `n` identical replicas of `SimConfig(**overrides)` (same model, same seed)."""
        if n < 1:
            raise ValueError("n must be >= 1")
        return cls([SimConfig(**overrides)] * n).run()

    def run(self) -> Self:
        """Start serving; retries on new ports if another process took one meanwhile."""
        for attempt in range(_START_ATTEMPTS):
            if self._running:
                break
            try:
                self._servers.start()
                self._running = True
            except RuntimeError:
                self._servers.stop()
                if attempt == _START_ATTEMPTS - 1:
                    raise
                self._prepare()
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

    def stats(self, i: int, records: bool = True) -> dict[str, Any]:
        """`/sim/stats` of replica `i` (records left out when `records=False`)."""
        replica = self.replicas[i]
        return self._on_loop(lambda: replica.stats(records))  # type: ignore[no-any-return]

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
