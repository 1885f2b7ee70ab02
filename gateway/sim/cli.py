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

DESCRIPTION = """\
Serve simulated vLLM or llama.cpp replicas on consecutive ports of one host, for tests,
benchmarks and trying the gateway without a GPU. Each replica imitates the engine's HTTP
endpoints, metric names and error bodies, a paged KV pool with prefix caching, continuous
batching and preemption (llama.cpp: slots). Times are simulated seconds: --speed divides them.
Every knob below is a field of gateway/sim/config.py (gateway/sim/README.md)."""

EPILOG = """\
examples:
  gateway sim --replicas 2 --port 8001                   two vLLM replicas on 8001, 8002
  gateway sim --flavor llamacpp --ctx-size 8192 --parallel 4 --speed 10
  gateway serve --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002"""

_ALIASES = {
    "kv_tokens": ["--ctx-size"],
    "unified_kv": ["--kv-unified"],
    "n_batch": ["--batch-size"],
    "metrics_enabled": ["--metrics"],
    "model": ["--served-model-name"],
}
_CHOICES = {"flavor": ["vllm", "llamacpp", "sglang"], "scheduling_policy": ["fcfs", "priority"]}
#: What each SimConfig field means, as `gateway sim -h` shows it (times in simulated seconds).
_HELP = {
    "flavor": "which engine to imitate: its endpoints, metric names and error bodies "
    "(sglang: the vllm engine model behind SGLang's routes)",
    "model": "the model name served (vLLM answers 404 for any other; llama.cpp takes any)",
    "max_model_len": "longest context per request (vLLM --max-model-len; llama.cpp n_ctx_train)",
    "kv_tokens": "KV cache pool in tokens (vLLM blocks x block size; llama.cpp --ctx-size)",
    "block_size": "tokens per KV block (the prefix cache's unit)",
    "enable_prefix_caching": "reuse the KV blocks of a prompt prefix already computed",
    "max_num_seqs": "vLLM: most sequences running at once",
    "max_num_batched_tokens": "vLLM: most tokens scheduled in one step",
    "scheduling_policy": "vLLM: waiting-queue order (priority: the request's `priority` field)",
    "max_num_queued_reqs": "vLLM: most waiting requests; beyond it 503 'engine is busy' "
    "(default: no limit)",
    "reject_overlong_output": "vLLM <= 0.31: 400 when prompt + max_tokens > max-model-len "
    "(else clamp)",
    "legacy_metrics": "also export vLLM <= 0.10's vllm:gpu_cache_usage_perc gauge",
    "kv_events_endpoint": "vLLM: publish KV cache events on this ZMQ endpoint, bound "
    "(ipc://PATH or tcp://127.0.0.1:PORT; default: off)",
    "parallel": "llama.cpp --parallel: slots, each kv-tokens / parallel tokens",
    "unified_kv": "llama.cpp --kv-unified: every slot may use the whole context",
    "n_batch": "llama.cpp --batch-size: prompt tokens per decode call",
    "slot_prompt_similarity": "llama.cpp: least prefix overlap (0-1) to prefer a slot",
    "metrics_enabled": "llama.cpp --metrics: serve /metrics (vLLM always does)",
    "disconnect_poll_s": "llama.cpp: how often a closed client connection is noticed (s)",
    "api_key": "require this bearer key on the inference routes (default: none)",
    "warmup_s": "loading time before /health answers 200 (s)",
    "speed": "wall-clock speed-up: every simulated duration is divided by it",
    "seed": "random seed of the generated text and output lengths",
    "step_base_s": "time model: fixed cost of one engine step (s)",
    "prefill_token_s": "time model: cost per uncached prompt token (s)",
    "decode_seq_s": "time model: cost per sequence decoding in a step (s)",
    "attention_token_s": "time model: cost per KV token a sequence attends to (s; 0: off)",
    "output_len_min": "shortest natural answer when the request sets no max_tokens",
    "output_len_max": "longest natural answer when the request sets no max_tokens",
}
_OPTIONAL = {"max_num_queued_reqs": int, "api_key": str, "kv_events_endpoint": str}


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `gateway sim` (every SimConfig field, plus where to listen)."""
    parser.add_argument(
        "--replicas", type=int, default=1, help="how many replicas to serve (default 1)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen host (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=8001,
        help="port of the first replica; the others follow (default 8001)",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="the HTTP server's log level (default warning)",
    )
    defaults = SimConfig()
    for field in dataclasses.fields(SimConfig):
        _add_field(parser, field.name, getattr(defaults, field.name))


def _add_field(parser: argparse.ArgumentParser, name: str, default: Any) -> None:
    flags = ["--" + name.replace("_", "-"), *_ALIASES.get(name, [])]
    kw: dict[str, Any] = {
        "dest": f"sim_{name}",
        "default": default,
        "help": f"{_HELP[name]} (default {_shown(default)})",
    }
    if isinstance(default, bool):
        kw["action"] = argparse.BooleanOptionalAction
    elif name in _OPTIONAL:
        kw["metavar"] = name.upper()
        kw["type"] = _OPTIONAL[name]
    elif name in _CHOICES:
        kw["choices"] = _CHOICES[name]
    else:
        kw["metavar"] = name.upper()
        kw["type"] = type(default)
    parser.add_argument(*flags, **kw)


def _shown(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


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
