"""Workloads for bench/routing.py, and the oracle prefix cache.

Text is made of words " xyz" (a space and three letters), each exactly one
token under the simulator's tokenizer, so a block of N words is N tokens and
token counts are known without tokenizing.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.ingress.protocol import parse_request, prompt_parts
from gateway.scheduling.prefix import chain_hashes, render, seed_of

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
ORACLE_BLOCK_BYTES = 64
#: Every word is " xyz": one token of the simulator's tokenizer, 4 bytes.
BYTES_PER_TOKEN = 4


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
    path: Path, limit: int, time_scale: float, max_prompt: int, max_output: int, chat: bool
) -> TraceWorkload:
    """The last `limit` usable requests of a Mooncake trace (where its prefix reuse
    is representative; the start of the trace is nearly cold), arrival times
    shifted to start at 0; block id → 512 deterministic tokens; sent as a
    completions prompt, or (`chat`) as the one user message of a chat request."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    usable = [r for r in rows if r["input_length"] <= max_prompt]
    window = usable[-limit:]
    blocks: dict[int, str] = {}
    out: list[OpenRequest] = []
    t0 = window[0]["timestamp"] if window else 0
    for row in window:
        text = "".join(blocks.setdefault(h, words(f"block-{h}", 512)) for h in row["hash_ids"])
        prompt = text[: 4 * row["input_length"]]
        body: dict[str, Any] = {
            "model": "sim-model",
            "max_tokens": max(1, min(row["output_length"], max_output)),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        out.append(OpenRequest((row["timestamp"] - t0) / 1000.0 * time_scale, body))
    span = out[-1].at_s if out else 0.0
    scaling = (
        f"last {len(out)} of the trace's {len(rows)} requests (those with input <= {max_prompt} "
        "tokens; "
        f"{len(rows) - len(usable)} longer ones skipped), arrival times x{time_scale:g} from the "
        "first "
        f"({span:.0f} simulated s), output capped at {max_output} tokens; sent as "
        + ("one user message of a chat request" if chat else "a completions prompt")
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
    #: Role of the message appended after each answer ("tool": agent loop; "user": chat).
    followup_role: str = "tool"
    #: Send the session key (x-session-id) with each request.
    keyed: bool = True


def fleet_spec(sessions: int, turns: int, keyed: bool) -> AgentSpec:
    """Agent sessions of one harness: one long shared system prompt, short
    per-session messages, long streamed answers (decode-heavy)."""
    return AgentSpec(
        sessions=sessions,
        turns=turns,
        system_tokens=6000,
        task_tokens=300,
        tool_min=50,
        tool_max=200,
        output_tokens=1024,
        start_spread_s=4.0,
        seed=11,
        followup_role="user",
        keyed=keyed,
    )


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
        self.messages.append({"role": self.spec.followup_role, "content": tool})


class Oracle:
    """Prefix caches replayed over the prompts in arrival order (byte blocks of
    the canonical rendering; hits are full blocks): one unbounded cache (the
    oracle), and one LRU cache of `pooled_tokens` (all replicas' KV pooled;
    tokens are converted at `BYTES_PER_TOKEN`, exact for these workloads)."""

    def __init__(self, pooled_tokens: int | None = None) -> None:
        self._seen: set[int] = set()
        cap = None if pooled_tokens is None else pooled_tokens * BYTES_PER_TOKEN
        self._pooled = LRUBlocks(cap // ORACLE_BLOCK_BYTES) if cap else None
        self.hit_bytes = 0
        self.pooled_hit_bytes = 0
        self.total_bytes = 0

    def learn_answer(self, body: dict[str, Any], answer: str) -> None:
        """An engine caches what it generated too: a chat's next turn, which
        resends the answer, hits it. Inserted without counting."""
        messages = [*body["messages"], {"role": "assistant", "content": answer}]
        hashes = self._hashes("chat", {**body, "messages": messages})
        self._seen.update(hashes)
        if self._pooled is not None:
            self._pooled.touch(hashes)

    def _hashes(self, endpoint: str, body: dict[str, Any]) -> tuple[int, ...]:
        data = self._render(endpoint, body)
        return chain_hashes(data, ORACLE_BLOCK_BYTES, seed_of(body.get("model"), None))

    @staticmethod
    def _render(endpoint: str, body: dict[str, Any]) -> bytes:
        req = parse_request(
            "chat" if endpoint == "chat" else "completions", json.dumps(body).encode()
        )
        return render(prompt_parts(req))

    def observe(self, endpoint: str, body: dict[str, Any]) -> None:
        data = self._render(endpoint, body)
        hashes = chain_hashes(data, ORACLE_BLOCK_BYTES, seed_of(body.get("model"), None))
        hit = 0
        for h in hashes:
            if h not in self._seen:
                break
            hit += 1
        self._seen.update(hashes)
        self.hit_bytes += hit * ORACLE_BLOCK_BYTES
        if self._pooled is not None:
            self.pooled_hit_bytes += self._pooled.touch(hashes) * ORACLE_BLOCK_BYTES
        self.total_bytes += len(data)

    @property
    def hit_rate(self) -> float:
        return self.hit_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def pooled_hit_rate(self) -> float | None:
        if self._pooled is None:
            return None
        return self.pooled_hit_bytes / self.total_bytes if self.total_bytes else 0.0


class LRUBlocks:
    """A block LRU like an engine's prefix cache: the longest cached leading
    run hits; the chain is then inserted tail first (head evicted last)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = max(1, capacity_blocks)
        self._entries: OrderedDict[int, None] = OrderedDict()

    def touch(self, hashes: Sequence[int]) -> int:
        entries = self._entries
        hit = 0
        for h in hashes:
            if h not in entries:
                break
            hit += 1
        for h in reversed(hashes[: self.capacity]):
            entries[h] = None
            entries.move_to_end(h)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
        return hit


@dataclass(frozen=True, slots=True)
class Workload:
    """A named workload: agent-like sessions (`sessions`) or open-loop requests."""

    note: str
    sessions: AgentSpec | None = None
    requests: tuple[OpenRequest, ...] = ()
    #: endpoint of the open-loop requests: "chat" or "completions"
    endpoint: str = "completions"

    @property
    def keyed(self) -> bool | None:
        return None if self.sessions is None else self.sessions.keyed

    def session(self, index: int) -> AgentSession:
        assert self.sessions is not None
        return AgentSession(self.sessions, index)


def _sessions_note(spec: AgentSpec) -> str:
    return (
        f"{spec.sessions} concurrent sessions x {spec.turns} turns; shared system prompt of "
        f"{spec.system_tokens} tokens, first message {spec.task_tokens}, then per turn the "
        f"answer and a {spec.followup_role} message of {spec.tool_min}-{spec.tool_max} tokens; "
        f"{spec.output_tokens} output tokens per request (streamed); starts spread over "
        f"{spec.start_spread_s:g} simulated s; session key "
        + ("sent (x-session-id)" if spec.keyed else "not sent")
    )


def build_workloads(args: argparse.Namespace, wanted: set[str]) -> dict[str, Workload]:
    specs = {
        "agent": AgentSpec(sessions=args.agent_sessions, turns=args.agent_turns),
        "agent-nokey": AgentSpec(sessions=args.agent_sessions, turns=args.agent_turns, keyed=False),
        "fleet": fleet_spec(args.fleet_sessions, args.fleet_turns, keyed=False),
        "fleet-key": fleet_spec(args.fleet_sessions, args.fleet_turns, keyed=True),
    }
    out = {name: Workload(_sessions_note(s), s) for name, s in specs.items() if name in wanted}
    if "trace" in wanted:
        chat = args.trace_endpoint == "chat"
        trace = load_trace(
            args.trace, args.trace_requests, args.trace_time_scale, 120000, 512, chat
        )
        out["trace"] = Workload(
            trace.scaling, requests=tuple(trace.requests), endpoint=args.trace_endpoint
        )
    if "unique" in wanted:
        reqs = unique_workload(args.unique_requests, args.unique_rate, 2000, 16000, 64, seed=3)
        note = (
            f"{args.unique_requests} prompts of 2000-16000 unique tokens, Poisson "
            f"{args.unique_rate:g}/simulated s, 64 output tokens"
        )
        out["unique"] = Workload(note, requests=tuple(reqs))
    unknown = wanted - set(specs) - {"trace", "unique"}
    if unknown:
        raise SystemExit(f"unknown workloads: {sorted(unknown)}")
    return out
