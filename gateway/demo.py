"""`gateway demo`: simulated replicas plus the gateway on loopback, no GPU needed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import shlex
import sys
from pathlib import Path

from gateway import buildinfo
from gateway.config.decode import ConfigError
from gateway.config.schema import GatewayConfig, ListenConfig, ReplicaConfig
from gateway.http.serving import Listener, serve_all

_EXAMPLE = """\
Gateway ready on http://127.0.0.1:{port} (admin: http://127.0.0.1:{admin}/metrics,
/admin/replicas) in front of {n} simulated vLLM replicas on ports {ports}; {build}.
{policies}
Try it (the model is "sim-model"; X-Task picks the task policy):

curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\
  -H 'X-Task: chat' -d '{{"model": "sim-model", "max_tokens": 32,
  "messages": [{{"role": "user", "content": "Hello!"}}]}}'

{python} - <<'PY'
from openai import OpenAI  # pip install openai
client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="demo")
stream = client.chat.completions.create(
    model="sim-model", stream=True, max_tokens=32, extra_headers={{"X-Task": "chat"}},
    messages=[{{"role": "user", "content": "Stream me something"}}])
for chunk in stream:
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY

Press Ctrl-C to stop.
"""

#: the task policies shipped with the sources (an install from a checkout)
SHIPPED_POLICIES = Path(__file__).resolve().parent.parent / "policies"


def demo_policies(args: argparse.Namespace) -> str | None:
    """`--policies`, else the shipped `policies/` when this install has them."""
    if args.policies:
        return str(args.policies)
    return str(SHIPPED_POLICIES) if SHIPPED_POLICIES.is_dir() else None


def demo_config(args: argparse.Namespace, sim_ports: list[int]) -> GatewayConfig:
    replicas = tuple(
        ReplicaConfig(url=f"http://127.0.0.1:{p}", kind="vllm", name=f"sim-{i}")
        for i, p in enumerate(sim_ports)
    )
    listen = ListenConfig(port=args.port, admin_port=args.admin_port)
    return dataclasses.replace(
        GatewayConfig(),
        replicas=replicas,
        listen=listen,
        log_level="warning",
        policies=demo_policies(args),
    )


def run_demo(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.sim.app import create_sim_app
    from gateway.sim.config import SimConfig

    logging.basicConfig(level="WARNING")
    sim_ports = [args.sim_port + i for i in range(args.replicas)]
    sims = [
        Listener(create_sim_app(SimConfig(flavor="vllm", seed=i)), "127.0.0.1", p)
        for i, p in enumerate(sim_ports)
    ]
    cfg = demo_config(args, sim_ports)
    try:
        gw = create_app(cfg)
    except ConfigError as exc:
        print("config error:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 1
    listeners = sims + gw.listeners()
    print(
        _EXAMPLE.format(
            port=args.port,
            admin=args.admin_port,
            n=args.replicas,
            ports=", ".join(map(str, sim_ports)),
            build=buildinfo.describe(),
            policies=(
                f"Task policies: {cfg.policies} (chat, agent, summarize, ...).\n"
                if cfg.policies
                else "No task policies (--policies DIR to load some).\n"
            ),
            python=shlex.quote(sys.executable),
        ),
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_all(listeners, on_stop=gw.drain))
    return 0
