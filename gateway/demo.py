"""`gateway demo`: simulated replicas plus the gateway on loopback, no GPU needed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gateway import buildinfo
from gateway.config.decode import ConfigError
from gateway.config.schema import GatewayConfig, ListenConfig, ReplicaConfig
from gateway.http.serving import Listener, serve_all

_EXAMPLE = """\
Gateway ready on http://127.0.0.1:{port} (admin: http://127.0.0.1:{admin}/metrics,
/admin/replicas) in front of {n} simulated vLLM replicas on ports {ports}; {build}.
{policies}
Try it (the model is "{model}"; X-Task picks the task policy):

curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\
  -H 'X-Task: chat' -d '{{"model": "{model}", "max_tokens": 32,
  "messages": [{{"role": "user", "content": "Hello!"}}]}}'

{python} - <<'PY'
from openai import OpenAI  # pip install openai
client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="demo")
stream = client.chat.completions.create(
    model="{model}", stream=True, max_tokens=32, extra_headers={{"X-Task": "chat"}},
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
#: the one model the simulated replicas serve
DEMO_MODEL = "sim-model"


def demo_policies(args: argparse.Namespace) -> str | None:
    """`--policies`, else the shipped `policies/` when this install has them."""
    if args.policies:
        return str(args.policies)
    return str(SHIPPED_POLICIES) if SHIPPED_POLICIES.is_dir() else None


def _forwarding_demo_model(data: Any) -> Any:
    """A policy document that forwards DEMO_MODEL instead of its own `model`."""
    if isinstance(data, dict) and "model" in data:
        return {**data, "model": DEMO_MODEL}
    return data


def stage_policies(source: str, into: Path) -> list[str]:
    """Copy the policy files of `source` into `into`, each policy's forwarded `model` replaced
    by DEMO_MODEL (the simulated replicas serve no other name), so that its model aliases
    answer in the demo. A file that does not parse is copied as it is, for the policy loader
    to report. Returns the aliases (`match.models`) of the copied policies."""
    aliases: list[str] = []
    for path in sorted(Path(source).iterdir()):
        if not path.is_file():
            continue
        target = into / path.name
        try:
            data = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError):
            data = None
        if path.suffix not in (".yaml", ".yml") or not isinstance(data, dict):
            target.write_bytes(path.read_bytes())
            continue
        target.write_text(yaml.safe_dump(_forwarding_demo_model(data), sort_keys=False))
        match = data.get("match")
        models = match.get("models") if isinstance(match, dict) else None
        aliases.extend(str(m) for m in models or [])
    return aliases


def _policies_line(source: str | None, aliases: list[str]) -> str:
    if source is None:
        return "No task policies (--policies DIR to load some).\n"
    names = ", ".join(repr(a) for a in aliases) or "none"
    return (
        f"Task policies: {source} (chat, agent, summarize, ...);\neach forwards the simulated "
        f"model {DEMO_MODEL!r} here, so the model aliases answer too: {names}.\n"
    )


def demo_config(
    args: argparse.Namespace, sim_ports: list[int], policies: str | None
) -> GatewayConfig:
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
        policies=policies,
    )


def run_demo(args: argparse.Namespace) -> int:
    source = demo_policies(args)
    if source is None or not Path(source).is_dir():
        return _run_demo(args, source, None, [])
    with tempfile.TemporaryDirectory(prefix="gateway-demo-policies-") as staged:
        aliases = stage_policies(source, Path(staged))
        return _run_demo(args, source, staged, aliases)


def _run_demo(
    args: argparse.Namespace, source: str | None, staged: str | None, aliases: list[str]
) -> int:
    from gateway.app import create_app
    from gateway.sim.app import create_sim_app
    from gateway.sim.config import SimConfig

    logging.basicConfig(level="WARNING")
    sim_ports = [args.sim_port + i for i in range(args.replicas)]
    sims = [
        Listener(create_sim_app(SimConfig(flavor="vllm", seed=i, model=DEMO_MODEL)), "127.0.0.1", p)
        for i, p in enumerate(sim_ports)
    ]
    cfg = demo_config(args, sim_ports, staged or source)
    try:
        gw = create_app(cfg)
    except ConfigError as exc:
        problems = [p.replace(staged, source) if staged and source else p for p in exc.problems]
        print("config error:\n  " + "\n  ".join(problems), file=sys.stderr)  # the user's files
        return 1
    listeners = sims + gw.listeners()
    print(
        _EXAMPLE.format(
            port=args.port,
            admin=args.admin_port,
            n=args.replicas,
            ports=", ".join(map(str, sim_ports)),
            build=buildinfo.describe(),
            policies=_policies_line(source, aliases),
            model=DEMO_MODEL,
            python=shlex.quote(sys.executable),
        ),
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_all(listeners, on_stop=gw.drain))
    return 0
