"""The gateway as `gateway serve` runs it, with cProfile switched by signals:
the process `bench/profile_request.py` measures.

    python -m bench.profile_serve --replica URL --port P --admin-port A \
        --out DIR [--config FILE]

Same config path (`--config` checked like `gateway serve --config`), same
logging, GC and GIL tuning and serving code as `gateway serve`; the public
listener is the lean server. SIGUSR1 starts a fresh profile on the main
thread (the event loop: every stage of a request below the off-loop
threshold runs there); SIGUSR2 stops it and writes `DIR/profile-<n>.prof`
(n = 1, 2, ...) with the profiled thread's CPU seconds in
`DIR/profile-<n>.cpu`. Not a product: a measuring harness.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import signal
import time
from pathlib import Path

from gateway.app import create_app
from gateway.checkconfig import check_file
from gateway.config.schema import GatewayConfig, ListenConfig, ReplicaConfig
from gateway.http.serving import run, serve_all, tune_gc, tune_switch_interval
from gateway.observability.logging import configure_logging


class SignalProfiler:
    """One cProfile at a time on the loop's thread, started and stopped by signals."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.count = 0
        self.profile: cProfile.Profile | None = None
        self.cpu0 = 0.0

    def start(self) -> None:
        if self.profile is not None:
            self.profile.disable()
        # Thread CPU, not wall time: the machine is shared, a descheduled loop is not cost.
        self.profile = cProfile.Profile(time.thread_time)
        self.cpu0 = time.thread_time()
        self.profile.enable()

    def stop(self) -> None:
        profile, self.profile = self.profile, None
        if profile is None:
            return
        profile.disable()
        cpu = time.thread_time() - self.cpu0
        self.count += 1
        base = self.out / f"profile-{self.count}"
        profile.dump_stats(str(base) + ".prof")
        Path(str(base) + ".cpu").write_text(f"{cpu:.6f}\n")


def _config(args: argparse.Namespace) -> GatewayConfig:
    cfg = check_file(args.config)[0] if args.config else GatewayConfig()
    listen = dataclasses.replace(
        cfg.listen if args.config else ListenConfig(),
        port=args.port,
        admin_port=args.admin_port,
    )
    return dataclasses.replace(
        cfg, listen=listen, replicas=(ReplicaConfig(url=args.replica, kind="vllm"),)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replica", required=True, help="http://127.0.0.1:PORT (a vLLM-like upstream)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--admin-port", type=int, required=True)
    p.add_argument("--config", default=None, help="a gateway config file (YAML)")
    p.add_argument("--out", required=True, help="directory for the profiles")
    args = p.parse_args()
    cfg = _config(args)
    configure_logging(cfg.log_level, cfg.log_format)
    gw = create_app(cfg)
    listeners = gw.listeners()
    profiler = SignalProfiler(Path(args.out))

    async def main_coro() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, profiler.start)
        loop.add_signal_handler(signal.SIGUSR2, profiler.stop)
        tune_gc()
        tune_switch_interval()
        await serve_all(listeners, log_level=cfg.log_level, on_stop=gw.drain)

    run(main_coro())


if __name__ == "__main__":
    main()
