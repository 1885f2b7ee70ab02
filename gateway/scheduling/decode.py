"""Decode load: what the running sequences of a replica cost a request sent there.

On a GPU every engine step runs the running decodes (one token each, each
reading its whole context's KV) and a chunk of prefill in one token budget,
so a replica streaming many long answers is slow to start and slow to
generate even when nothing waits for prefill. In prefill-token equivalents
(the step time one prefill token takes; `DecodeConfig`):

    d      = D × seq_cost + K × kv_cost         decode work of one step
    P      = Q + U                              prefill ahead of the first token, own included
    steps  = ceil(P / max(B − D, B / 8))        the decodes take D of each step's B tokens
    wait   = O / 2 × d  if D ≥ S, else 0        no free sequence: one must finish first
    ttft   = (P + steps × d + wait) / R
    join   = O × d / R                          the running decodes slow its own O tokens
    cost   = ttft + join                        seconds

D running sequences, K KV tokens they attend to, B the step budget
(`max_num_batched_tokens`), S the sequences the engine runs at once
(`max_num_seqs`, llama.cpp: its slots), Q queued prefill, U this request's
uncached prompt tokens, O its output (its limit, at most
`decode.output_tokens`), R the replica's prefill rate (tokens/s).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from gateway.config.scheduling import DecodeConfig


class DecodeLoad(NamedTuple):
    """A replica's running sequences and its step budget (a NamedTuple: built per request)."""

    running: int = 0
    attended_tokens: int = 0
    step_budget: int = 8192
    max_seqs: int = 256
    #: sequences running or waiting there (the engine's count, else ours)
    sequences: int = 0


def step_work(load: DecodeLoad, cfg: DecodeConfig) -> float:
    """`d`: the decode work of one step, in prefill-token equivalents."""
    return load.running * cfg.seq_cost_tokens + load.attended_tokens * cfg.kv_cost_tokens


def cost_s(
    load: DecodeLoad,
    cfg: DecodeConfig,
    prefill_tokens: int,
    output_tokens: int,
    prefill_rate: float,
) -> float:
    """`ttft + join` in seconds for a request whose first token needs
    `prefill_tokens` of prefill on the replica (queued work included)."""
    d = step_work(load, cfg)
    chunk = max(load.step_budget - load.running, load.step_budget / 8)
    steps = math.ceil(prefill_tokens / chunk) if prefill_tokens > 0 else 1
    wait = output_tokens / 2 * d if load.running >= load.max_seqs else 0.0
    return (prefill_tokens + steps * d + wait + output_tokens * d) / prefill_rate


def crowded(loads: Iterable[tuple[str, DecodeLoad]], factor: float) -> frozenset[str]:
    """Replicas a new session must not be drawn to by a cached prefix: those
    whose sequences would exceed `factor` × the mean with the new one counted
    (bounded-load placement). Without this bound the replica holding a shared
    system prompt takes every new session, however many streams it runs."""
    items = [(name, load.sequences) for name, load in loads]
    if len(items) < 2:
        return frozenset()
    bound = math.ceil(factor * (sum(n for _, n in items) + 1) / len(items))
    return frozenset(name for name, n in items if n + 1 > bound)
