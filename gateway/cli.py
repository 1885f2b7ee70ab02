"""The `gateway` command: `serve`, `check-config`, `demo`, `sim` (`gateway -h`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any, TypeAlias, get_args

import yaml

from gateway import __version__, buildinfo
from gateway.config.decode import ConfigError, replace_checked
from gateway.config.discovery import EngineKind
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
    kinds = get_args(EngineKind)
    if kind not in kinds:
        named = " or ".join(f"{k}=" for k in kinds if k != "auto")
        raise argparse.ArgumentTypeError(f"unknown engine kind {kind!r} (use {named})")
    try:
        return ReplicaConfig(url=value, kind=kind)  # type: ignore[arg-type]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


_DESCRIPTION = """\
An admission gateway for self-hosted LLM serving: an OpenAI-compatible reverse proxy in front
of vLLM and llama.cpp replicas, with per-task token budgets, prefix-affinity routing,
cancellation and deadlines, and admission on the engines' live KV headroom."""

_EPILOG = """\
examples:
  gateway demo                                   simulated replicas + the gateway, no GPU
  gateway serve --replica vllm=http://10.0.0.11:8000 --policies policies/
  gateway check-config config/gateway.yaml       validate a config, print the effective one
  gateway serve --config config/gateway.yaml
  gateway sim --flavor llamacpp --replicas 2     simulated engines for tests and benchmarks

Each command has its own help: gateway COMMAND -h. Config keys: config/README.md;
task policies: policies/README.md."""

_SERVE = """\
Run the gateway: the public listener (the OpenAI API: /v1/chat/completions, /v1/completions,
/v1/models, /healthz, /readyz) and the admin listener (/metrics, /admin/...). The config file is
checked first (as check-config does); the flags override its keys. SIGHUP reloads the task
policies; SIGTERM or Ctrl-C stops accepting, finishes the requests in flight within
listen.graceful_timeout_s, then exits."""

_SERVE_EPILOG = """\
examples:
  gateway serve --config config/gateway.yaml
  gateway serve --replica vllm=http://10.0.0.11:8000 --replica llamacpp=http://10.0.0.12:8081 \\
    --port 8080 --admin-port 9090 --policies policies/

exit status: 0 stopped, 1 config error, 2 a port cannot be bound."""

_CHECK = """\
Validate a gateway config file without serving it: unknown keys, wrong types, values out of
range, unset ${ENV} variables, the scheduling plugin specs and the task policies the file points
at. Every problem is reported in one run, one `key.path: problem` line each, on stderr. A valid
file prints the effective config (defaults filled in, secrets masked) and the policies loaded,
as YAML on stdout."""

_CHECK_EPILOG = """\
example:
  VLLM_API_KEY=x gateway check-config config/gateway.yaml

exit status: 0 valid, 1 invalid, 141 the reader of the output went away (`| head`)."""

_DEMO = """\
Run simulated vLLM replicas and the gateway in front of them, on loopback, with the task
policies shipped in policies/. Every policy forwards the simulated model, sim-model, so the
policies' model aliases (e.g. model "chat") answer too. Prints a curl command and an openai
SDK snippet to paste; Ctrl-C stops it."""


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32, width=100)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_formatter
    )
    parser.add_argument(
        "--version", action="version", version=f"gateway {__version__} ({buildinfo.describe()})"
    )
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    _add_serve(sub)
    check = sub.add_parser(
        "check-config",
        help="validate a config file and print the effective config",
        description=_CHECK,
        epilog=_CHECK_EPILOG,
        formatter_class=_formatter,
    )
    check.add_argument("file", metavar="FILE", help="the gateway's YAML config file")
    _add_demo(sub)
    from gateway.sim.cli import DESCRIPTION, EPILOG, add_sim_arguments

    sim = sub.add_parser(
        "sim",
        help="serve simulated vLLM / llama.cpp replicas (tests, benchmarks)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_formatter,
    )
    add_sim_arguments(sim)
    return parser


_Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_serve(sub: _Sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the gateway in front of vLLM / llama.cpp replicas",
        description=_SERVE,
        epilog=_SERVE_EPILOG,
        formatter_class=_formatter,
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="the gateway's YAML config (keys: config/README.md); without it the defaults, "
        "and at least one --replica",
    )
    serve.add_argument(
        "--replica",
        action="append",
        type=_replica_arg,
        default=[],
        metavar="[KIND=]URL",
        help="an engine to send requests to, added to the config's replicas; repeat for more. "
        "KIND: vllm or llamacpp (detected from the engine when left out), e.g. "
        "vllm=http://10.0.0.11:8000",
    )
    serve.add_argument(
        "--host", help="address of the public listener (default: listen.host, 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=int, help="port of the public listener (default: listen.port, 8080)"
    )
    serve.add_argument(
        "--admin-port",
        type=int,
        metavar="PORT",
        help="port of the admin listener: /metrics, /admin/... (default: listen.admin_port, 9090)",
    )
    serve.add_argument(
        "--policies",
        metavar="DIR",
        help="directory of task policy YAML files (policies/README.md; default: the config's "
        "policies, else none: every request gets the built-in default policy)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        default=None,
        help="log one line per finished request (default: the config's access_log, off)",
    )


def _add_demo(sub: _Sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="simulated replicas + the gateway on loopback, no GPU needed",
        description=_DEMO,
        epilog="example:\n  gateway demo --port 8080 --replicas 2",
        formatter_class=_formatter,
    )
    demo.add_argument("--port", type=int, default=8080, help="gateway public port (default 8080)")
    demo.add_argument(
        "--admin-port",
        type=int,
        default=9090,
        metavar="PORT",
        help="gateway admin port: /metrics, /admin/replicas (default 9090)",
    )
    demo.add_argument(
        "--replicas", type=int, default=2, metavar="N", help="simulated replicas (default 2)"
    )
    demo.add_argument(
        "--policies",
        metavar="DIR",
        help="directory of task policy YAML files (default: the sources' policies/)",
    )
    demo.add_argument(
        "--sim-port",
        type=int,
        default=8101,
        metavar="PORT",
        help="port of the first simulated replica; the others follow (default 8101)",
    )


def _load_config(path: str) -> GatewayConfig:
    """The config file decoded and checked, plugin specs and policies included
    (ConfigError listing every problem if not valid)."""
    from gateway.checkconfig import check_file

    return check_file(path)[0]


def _serve_config(args: argparse.Namespace) -> GatewayConfig:
    cfg = _load_config(args.config) if args.config else GatewayConfig()
    listen = cfg.listen
    listen = replace_checked(  # a bad flag is reported as its key: `listen.port: ...`
        listen,
        "listen",
        host=args.host or listen.host,
        port=listen.port if args.port is None else args.port,
        admin_port=listen.admin_port if args.admin_port is None else args.admin_port,
    )
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
    sys.stdout.flush()  # a reader gone away shows here, inside main's BrokenPipeError handler
    return 0


#: The exit status of a command whose output reader went away (128 + SIGPIPE, as the shell's).
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:  # `gateway check-config ... | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit fails no more
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _run(args: argparse.Namespace) -> int:
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
