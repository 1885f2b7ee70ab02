"""`gateway serve | check-config | demo | sim`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from gateway import __version__, buildinfo
from gateway.config.decode import ConfigError
from gateway.config.schema import GatewayConfig, ReplicaConfig, effective_config
from gateway.http.serving import (
    CannotListen,
    Listener,
    bind_listeners,
    run,
    serve_all,
    tune_gc,
    tune_switch_interval,
)
from gateway.observability.logging import configure_logging


def _replica_arg(value: str) -> ReplicaConfig:
    kind = "auto"
    if "=" in value.split("://", 1)[0]:
        kind, value = value.split("=", 1)
    if kind not in ("auto", "vllm", "llamacpp"):
        raise argparse.ArgumentTypeError(f"unknown engine kind {kind!r} (use vllm= or llamacpp=)")
    try:
        return ReplicaConfig(url=value, kind=kind)  # type: ignore[arg-type]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=f"gateway {__version__} ({buildinfo.describe()})"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="gateway YAML config file")
    serve.add_argument(
        "--replica",
        action="append",
        type=_replica_arg,
        default=[],
        help="engine URL, optionally prefixed with its kind: vllm=http://... or llamacpp=http://...",
    )
    serve.add_argument("--host", help="public listener host (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="public listener port (default 8080)")
    serve.add_argument("--admin-port", type=int, help="admin listener port (default 9090)")
    serve.add_argument("--policies", help="directory of task policy YAML files")
    serve.add_argument(
        "--server",
        choices=("lean", "uvicorn"),
        help="HTTP server of the public listener (config key listen.server; default lean)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        default=None,
        help="log one line per finished request (config key access_log; default off)",
    )
    check = sub.add_parser("check-config", help="validate a config and print the effective config")
    check.add_argument("file")
    demo = sub.add_parser(
        "demo",
        help="simulated replicas + gateway on loopback, no GPU needed",
        description="Run simulated vLLM replicas and the gateway in front of them, on loopback.",
    )
    demo.add_argument("--port", type=int, default=8080, help="gateway public port (default 8080)")
    demo.add_argument(
        "--admin-port", type=int, default=9090, help="gateway admin port: /metrics (default 9090)"
    )
    demo.add_argument("--replicas", type=int, default=2, help="simulated replicas (default 2)")
    demo.add_argument(
        "--policies",
        help="directory of task policy YAML files (default: the sources' policies/)",
    )
    demo.add_argument(
        "--sim-port",
        type=int,
        default=8101,
        help="port of the first simulated replica; the others follow (default 8101)",
    )
    sim = sub.add_parser("sim", help="run simulated vLLM / llama.cpp replicas")
    from gateway.sim.cli import add_sim_arguments

    add_sim_arguments(sim)
    return parser


def _load_config(path: str) -> GatewayConfig:
    """The config file decoded and checked, plugin specs and policies included
    (ConfigError listing every problem if not valid)."""
    from gateway.checkconfig import check_file

    return check_file(path)[0]


def _serve_config(args: argparse.Namespace) -> GatewayConfig:
    cfg = _load_config(args.config) if args.config else GatewayConfig()
    listen = cfg.listen
    try:
        listen = dataclasses.replace(
            listen,
            host=args.host or listen.host,
            port=listen.port if args.port is None else args.port,
            admin_port=listen.admin_port if args.admin_port is None else args.admin_port,
            server=args.server or listen.server,
        )
    except ValueError as exc:  # e.g. --server uvicorn with the lean server's timeouts set
        raise ConfigError([f"listen: {exc}"]) from None
    replicas = cfg.replicas + tuple(args.replica)
    if not replicas and not cfg.discovery:
        raise ConfigError(
            [
                "replicas: at least one replica is required (--replica URL, or replicas: "
                "or discovery: in a config file)"
            ]
        )
    access_log = cfg.access_log if args.access_log is None else args.access_log
    return dataclasses.replace(
        cfg,
        listen=listen,
        replicas=replicas,
        policies=args.policies or cfg.policies,
        access_log=access_log,
    )


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.app import create_app

    try:
        cfg = _serve_config(args)
    except ConfigError as exc:
        print("config error:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 1
    configure_logging(cfg.log_level, cfg.log_format)
    try:
        gw = create_app(cfg)
    except ConfigError as exc:
        print("config error:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 1
    listeners = gw.listeners()
    try:
        sockets = bind_listeners(listeners)  # a taken port fails here, before "listening"
    except CannotListen as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    print(
        f"gateway listening on http://{cfg.listen.host}:{cfg.listen.port} "
        f"(admin http://{cfg.listen.admin_host}:{cfg.listen.admin_port}); {buildinfo.describe()}",
        flush=True,
    )
    try:
        run(_serve_reloading(gw, listeners, sockets, cfg.log_level))
    except KeyboardInterrupt:  # Ctrl-C before the servers handle signals themselves
        return 130
    finally:
        for sock in sockets:
            sock.close()
    return 0


async def _serve_reloading(
    gw: Any, listeners: list[Listener], sockets: list[socket.socket], log_level: str
) -> None:
    """Serve; SIGHUP reloads the task policies (an invalid set is refused and logged)."""

    def reload() -> None:
        with contextlib.suppress(ConfigError):  # refused: logged by PolicyStage.reload
            gw.policy.reload()

    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, AttributeError):  # no SIGHUP on Windows
        loop.add_signal_handler(signal.SIGHUP, reload)
    tune_gc()
    tune_switch_interval()
    await serve_all(listeners, log_level=log_level, on_stop=gw.drain, sockets=sockets)


def _cmd_check(args: argparse.Namespace) -> int:
    from gateway.checkconfig import check_file

    try:
        cfg, policies = check_file(args.file)
    except ConfigError as exc:
        print(f"{args.file}: invalid config:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(yaml.safe_dump(effective_config(cfg), sort_keys=False), end="")
    print(yaml.safe_dump({"loaded_policies": policies.describe()}, sort_keys=False), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        return _cmd_serve(args)
    if args.command == "check-config":
        return _cmd_check(args)
    if args.command == "demo":
        from gateway.demo import run_demo

        return run_demo(args)
    from gateway.sim.cli import run_sim

    return int(run_sim(args))


if __name__ == "__main__":
    raise SystemExit(main())
