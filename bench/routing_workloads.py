"""Workloads for bench/routing.py, and the oracle prefix cache.

Text is made of words " xyz" (a space and three letters), each exactly one
token under the simulator's tokenizer, so a block of N words is N tokens and
token counts are known without tokenizing.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.ingress.protocol import parse_request, prompt_parts
from gateway.scheduling.prefix import chain_hashes, render, seed_of

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
ORACLE_BLOCK_BYTES = 64


def words(seed: int | str, n: int) -> str:
    rng = random.Random(seed)
    return "".join(" " + "".join(rng.choices(_LETTERS, k=3)) for _ in range(n))


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """One request of an open-loop workload: sent at `at_s` simulated seconds."""

    at_s: float
    body: dict[str, Any]


@dataclass(slots=True)
class TraceWorkload:
    requests: list[OpenRequest]
    scaling: str


def load_trace(
    path: Path, limit: int, time_scale: float, max_prompt: int, max_output: int
) -> TraceWorkload:
    """The last `limit` usable requests of a Mooncake trace (where its prefix reuse
    is representative; the start of the trace is nearly cold), arrival times
    shifted to start at 0; block id → 512 deterministic tokens."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    usable = [r for r in rows if r["input_length"] <= max_prompt]
    window = usable[-limit:]
    blocks: dict[int, str] = {}
    out: list[OpenRequest] = []
    t0 = window[0]["timestamp"] if window else 0
    for row in window:
        text = "".join(blocks.setdefault(h, words(f"block-{h}", 512)) for h in row["hash_ids"])
        body = {
            "model": "sim-model",
            "prompt": text[: 4 * row["input_length"]],
            "max_tokens": max(1, min(row["output_length"], max_output)),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out.append(OpenRequest((row["timestamp"] - t0) / 1000.0 * time_scale, body))
    span = out[-1].at_s if out else 0.0
    scaling = (
        f"last {len(out)} of the trace's {len(rows)} requests (those with input <= {max_prompt} "
        "tokens; "
        f"{len(rows) - len(usable)} longer ones skipped), arrival times x{time_scale:g} from the "
        "first "
        f"({span:.0f} simulated s), output capped at {max_output} tokens"
    )
    return TraceWorkload(out, scaling)


def unique_workload(
    n: int, rate_per_s: float, min_tokens: int, max_tokens: int, output: int, seed: int
) -> list[OpenRequest]:
    """Poisson arrivals of prompts that share nothing (not even a first word)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate_per_s)
        prompt = f"req{i:05d}" + words(f"unique-{seed}-{i}", rng.randint(min_tokens, max_tokens))
        out.append(
            OpenRequest(
                t,
                {
                    "model": "sim-model",
                    "prompt": prompt,
                    "max_tokens": output,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class AgentSpec:
    sessions: int = 24
    turns: int = 14
    system_tokens: int = 2000
    task_tokens: int = 6000
    tool_min: int = 5000
    tool_max: int = 9000
    output_tokens: int = 128
    start_spread_s: float = 20.0
    seed: int = 7


@dataclass(slots=True)
class AgentSession:
    """One agent loop: prompt = previous prompt + answer + tool result."""

    spec: AgentSpec
    index: int
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.spec
        self.messages = [
            {"role": "system", "content": words(f"system-{s.seed}", s.system_tokens)},
            {"role": "user", "content": words(f"task-{s.seed}-{self.index}", s.task_tokens)},
        ]

    @property
    def key(self) -> str:
        return f"agent-{self.spec.seed}-{self.index}"

    def body(self) -> dict[str, Any]:
        return {
            "model": "sim-model",
            "messages": list(self.messages),
            "max_tokens": self.spec.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def advance(self, answer: str, turn: int) -> None:
        rng = random.Random(f"{self.key}-{turn}")
        tool = words(f"tool-{self.key}-{turn}", rng.randint(self.spec.tool_min, self.spec.tool_max))
        self.messages.append({"role": "assistant", "content": answer})
        self.messages.append({"role": "tool", "content": tool})


class Oracle:
    """An unbounded single prefix cache over the prompts in arrival order
    (byte blocks of the canonical rendering; hits are full blocks)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self.hit_fraction_sum = 0.0
        self.hit_bytes = 0
        self.total_bytes = 0

    def observe(self, endpoint: str, body: dict[str, Any]) -> float:
        req = parse_request(
            "chat" if endpoint == "chat" else "completions", json.dumps(body).encode()
        )
        data = render(prompt_parts(req))
        hashes = chain_hashes(data, ORACLE_BLOCK_BYTES, seed_of(req.model, None))
        hit = 0
        for h in hashes:
            if h not in self._seen:
                break
            hit += 1
        self._seen.update(hashes)
        self.hit_bytes += hit * ORACLE_BLOCK_BYTES
        self.total_bytes += len(data)
        return hit * ORACLE_BLOCK_BYTES / max(1, len(data))

    @property
    def hit_rate(self) -> float:
        return self.hit_bytes / self.total_bytes if self.total_bytes else 0.0
