"""`gateway sim`: serve N simulated replicas on consecutive ports.

    gateway sim --flavor llamacpp --replicas 4 --port 8001 --speed 10

Every `SimConfig` field is an option (`--kv-tokens`, `--max-num-seqs`, ...;
booleans also as `--no-...`), with engine-style aliases: `--ctx-size` for
`--kv-tokens`, `--kv-unified`, `--batch-size` for `--n-batch`, `--metrics`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
from typing import Any

from gateway.http.serving import Listener, serve_all
from gateway.sim.app import create_sim_app
from gateway.sim.config import SimConfig

_ALIASES = {
    "kv_tokens": ["--ctx-size"],
    "unified_kv": ["--kv-unified"],
    "n_batch": ["--batch-size"],
    "metrics_enabled": ["--metrics"],
    "model": ["--served-model-name"],
}
_CHOICES = {"flavor": ["vllm", "llamacpp"], "scheduling_policy": ["fcfs", "priority"]}
_OPTIONAL = {"max_num_queued_reqs": int, "api_key": str}


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `gateway sim` (every SimConfig field, plus where to listen)."""
    parser.add_argument("--replicas", type=int, default=1, help="number of replicas (default 1)")
    parser.add_argument("--host", default="127.0.0.1", help="listen host (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=8001,
        help="port of the first replica; the others follow (default 8001)",
    )
    parser.add_argument("--log-level", default="warning", help="uvicorn log level")
    defaults = SimConfig()
    for field in dataclasses.fields(SimConfig):
        _add_field(parser, field.name, getattr(defaults, field.name))


def _add_field(parser: argparse.ArgumentParser, name: str, default: Any) -> None:
    flags = ["--" + name.replace("_", "-"), *_ALIASES.get(name, [])]
    kw: dict[str, Any] = {
        "dest": f"sim_{name}",
        "default": default,
        "help": f"SimConfig.{name} (default {default!r})",
    }
    if isinstance(default, bool):
        kw["action"] = argparse.BooleanOptionalAction
    elif name in _OPTIONAL:
        kw["metavar"] = name.upper()
        kw["type"] = _OPTIONAL[name]
    else:
        kw["metavar"] = name.upper()
        kw["type"] = type(default)
        if name in _CHOICES:
            kw["choices"] = _CHOICES[name]
    parser.add_argument(*flags, **kw)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    values = {f.name: getattr(args, f"sim_{f.name}") for f in dataclasses.fields(SimConfig)}
    return SimConfig(**values)


def run_sim(args: argparse.Namespace) -> int:
    """Serve `--replicas` replicas on `--port`, `--port + 1`, ... until interrupted."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"gateway sim: {exc}", file=sys.stderr)
        return 2
    if args.replicas < 1:
        print("gateway sim: --replicas must be >= 1", file=sys.stderr)
        return 2
    listeners = [
        Listener(create_sim_app(config), args.host, args.port + i) for i in range(args.replicas)
    ]
    for lst in listeners:
        print(f"sim {config.flavor} replica on http://{lst.host}:{lst.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_all(listeners, log_level=args.log_level))
    return 0
