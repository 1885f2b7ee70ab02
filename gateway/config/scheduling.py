"""Scheduling (routing) configuration: plugins, profiles, and the active policy.

    scheduling:
      policy: default   # a profile, or a baseline: round-robin | least-load | session-hash
      plugins:          # omit for the built-in set (one instance per type, named by type)
        - {name: ttft, type: estimated-ttft, parameters: {smoothing_tokens: 4096}}
      profiles:         # omit for the built-in `default` profile
        - name: default
          filters: [healthy, admissible]
          scorers: [{plugin: ttft, weight: 1.0}]
          picker: max-score

Plain data: decoding checks the scalars and the shape (a missing weight is a
required key). What needs the plugin registry (unknown type, bad parameters,
duplicate names, dangling or wrong-kind references, unknown policy) is
checked by `gateway.scheduling.validate`, at startup and whenever a router
is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.config.ranges import check_ranges, ranged

BASELINES = ("round-robin", "least-load", "session-hash")

DEFAULT_PROFILE = "default"


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One configured plugin instance: a unique name, a registered type, its parameters."""

    name: str
    type: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScorerRef:
    """A scorer used by a profile, with its weight (required: no silent default)."""

    plugin: str
    weight: float = ranged(ge=0)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """Filters narrow the candidates, weighted scorers rank them, one picker orders them."""

    name: str
    picker: str
    filters: tuple[str, ...] = ()
    scorers: tuple[ScorerRef, ...] = ()


#: The built-in plugin instances (used when the config names none): one per type, named by type.
BUILTIN_PLUGINS: tuple[PluginSpec, ...] = (
    PluginSpec("healthy", "healthy"),
    PluginSpec("admissible", "admissible"),
    PluginSpec("estimated-ttft", "estimated-ttft"),
    PluginSpec("prefix-affinity", "prefix-affinity"),
    PluginSpec("session-affinity", "session-affinity"),
    PluginSpec("kv-headroom", "kv-headroom"),
    PluginSpec("queue-depth", "queue-depth"),
    PluginSpec("least-load", "least-load"),
    PluginSpec("max-score", "max-score"),
    PluginSpec("random-weighted", "random-weighted"),
)

#: The `default` profile (used when the config names none).
BUILTIN_PROFILES: tuple[ProfileSpec, ...] = (
    ProfileSpec(
        name=DEFAULT_PROFILE,
        picker="max-score",
        filters=("healthy", "admissible"),
        scorers=(
            ScorerRef("estimated-ttft", 1.0),
            ScorerRef("prefix-affinity", 1.0),
            ScorerRef("session-affinity", 1.0),
            ScorerRef("kv-headroom", 0.2),
            ScorerRef("least-load", 0.2),
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class HotspotConfig:
    """A replica is hot (loses prefix and session affinity: it competes as if
    it cached nothing) when its queued prefill work is at least
    `backlog_tokens` AND `backlog_ratio` × the others' mean, or its requests in
    flight at least `in_flight` AND `in_flight_ratio` × the others' mean, or
    its KV use at least `kv_fraction` AND `kv_ratio` × the others' mean."""

    backlog_tokens: int = ranged(65536, ge=0)
    backlog_ratio: float = ranged(2.0, ge=1)
    in_flight: int = ranged(12, ge=0)
    in_flight_ratio: float = ranged(2.0, ge=1)
    kv_fraction: float = ranged(0.9, gt=0, le=1)
    kv_ratio: float = ranged(1.3, ge=1)
    #: Decode work per engine step (`DecodeConfig`, prefill-token equivalents).
    #: Moving a session re-prefills its history, so only an extreme imbalance counts.
    decode_tokens: float = ranged(1024.0, ge=0)
    decode_ratio: float = ranged(3.0, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """The decode load a request joins (see docs/routing.md, "Decode load").

    Costs are in prefill-token equivalents: the step time one prefill token
    takes. The step budget is the engine's (vLLM `--max-num-batched-tokens`,
    `--max-num-seqs`; a llama.cpp replica's slots come from the engine)."""

    #: vLLM `--max-num-batched-tokens`: tokens per engine step, decodes first.
    max_num_batched_tokens: int = ranged(8192, ge=1)
    #: vLLM `--max-num-seqs`: sequences running at once; beyond it a request waits.
    max_num_seqs: int = ranged(256, ge=1)
    #: Step time one decoding sequence adds (~0.3 ms next to 62.5 us per prefill token).
    seq_cost_tokens: float = ranged(5.0, ge=0)
    #: Step time per KV token a decoding sequence attends to (~50 ns on an
    #: H100-class GPU for an 8B model with GQA: 128 KiB of K and V per token).
    kv_cost_tokens: float = ranged(0.0008, ge=0)
    #: A request's own output counted at most this many tokens (its decode
    #: joins the replica's running sequences for that long).
    output_tokens: int = ranged(256, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    policy: str = DEFAULT_PROFILE
    #: Prefix block size in bytes of the canonical prompt (~256 tokens of English).
    block_bytes: int = ranged(1024, gt=0)
    #: Bytes per token, used when the policy stage has not counted the prompt.
    chars_per_token: float = ranged(4.0, gt=0)
    #: Prefix index / session memory entries expire after this long.
    index_ttl_s: float = ranged(600.0, gt=0)
    #: KV capacity of a replica when neither the engine nor the replica config says.
    default_capacity_tokens: int = ranged(262144, gt=0)
    #: Prefill rate (tokens/s) of a replica until the engine's is measured.
    default_prefill_rate: float = ranged(10000.0, gt=0)
    #: A replica's prefill rate counts at most this many times above/below the candidates' median.
    max_rate_spread: float = ranged(2.0, ge=1)
    #: Bounded-load hashing: a new session's replica holds at most this × the mean sessions.
    session_load_factor: float = ranged(1.15, ge=1)
    max_sessions: int = ranged(100000, gt=0)
    #: llama.cpp slots per replica when the engine state does not list them (None: no pinning).
    llamacpp_slots: int | None = ranged(None, ge=1)
    #: Chat requests without a session key: their first messages (up to the
    #: first user message) act as the session key, so a conversation's turns
    #: stay together even when its prompt is shorter than one prefix block.
    implicit_sessions: bool = True
    hotspot: HotspotConfig = field(default_factory=HotspotConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    plugins: tuple[PluginSpec, ...] = ()
    profiles: tuple[ProfileSpec, ...] = ()

    def __post_init__(self) -> None:
        check_ranges(self)

    def effective_plugins(self) -> tuple[PluginSpec, ...]:
        return self.plugins or BUILTIN_PLUGINS

    def effective_profiles(self) -> tuple[ProfileSpec, ...]:
        return self.profiles or BUILTIN_PROFILES
