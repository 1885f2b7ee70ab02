"""Engine simulator: vLLM, llama.cpp and SGLang flavours without a GPU.

Public surface: `SimConfig` (every knob), `create_sim_app` (one replica as a
Starlette app), `SimReplica` (the same with direct access to its state), and
`SimCluster` (N replicas on loopback ports in a background thread). Modules:

- `config`   knobs and their defaults
- `tokens`   pseudo-tokenizer, chat template, generated text
- `kv`       paged KV pool with prefix cache (vLLM)
- `batching` continuous batching scheduler (vLLM)
- `slots`    slot scheduler with per-slot prompt cache (llama.cpp)
- `engine`   step loop, time model, token emission
- `protocol` request parsing, engine-shaped errors
- `formats`  response bodies and SSE chunks
- `exchange` one HTTP exchange raced against disconnect; crash injection
- `info`     health, models, tokenize, slots, props, metrics routes
- `metrics`  Prometheus exposition in each engine's names
- `faults`   fault injection state
- `app`, `cluster`, `cli`
"""

from __future__ import annotations

from gateway.sim.app import SimReplica, create_sim_app
from gateway.sim.cluster import SimCluster
from gateway.sim.config import SimConfig

__all__ = ["SimCluster", "SimConfig", "SimReplica", "create_sim_app"]
