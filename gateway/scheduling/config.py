"""Scheduling (routing) configuration: plugins, profiles, and the active policy.

    scheduling:
      policy: default              # a profile name, or a baseline: round-robin | least-load | session-hash
      plugins:                     # omit for the built-in set (one instance per type, named by type)
        - {name: ttft, type: estimated-ttft, parameters: {smoothing_tokens: 4096}}
      profiles:                    # omit for the built-in `default` profile
        - name: default
          filters: [healthy, admissible]
          scorers: [{plugin: ttft, weight: 1.0}]
          picker: max-score

Validated in phases at startup; each problem names its key path: unknown
type, bad parameters, duplicate name, dangling or wrong-kind reference,
missing weight (a required key), unknown policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config.decode import ConfigError, decode
from gateway.scheduling.defaults import BUILTIN_PLUGINS, BUILTIN_PROFILES, DEFAULT_PROFILE
from gateway.scheduling.registry import REGISTRY
from gateway.scheduling.specs import PluginSpec, ProfileSpec

BASELINES = ("round-robin", "least-load", "session-hash")


@dataclass(frozen=True, slots=True)
class HotspotConfig:
    """A replica is hot (loses prefix and session affinity: it competes as if
    it cached nothing) when its queued prefill work is at least
    `backlog_tokens` AND `backlog_ratio` × the others' mean, or its requests in
    flight at least `in_flight` AND `in_flight_ratio` × the others' mean, or
    its KV use at least `kv_fraction` AND `kv_ratio` × the others' mean."""

    backlog_tokens: int = 65536
    backlog_ratio: float = 2.0
    in_flight: int = 12
    in_flight_ratio: float = 2.0
    kv_fraction: float = 0.9
    kv_ratio: float = 1.3

    def __post_init__(self) -> None:
        if self.backlog_tokens < 0 or self.in_flight < 0:
            raise ValueError("backlog_tokens and in_flight must be >= 0")
        if self.backlog_ratio < 1 or self.kv_ratio < 1 or self.in_flight_ratio < 1:
            raise ValueError("backlog_ratio, in_flight_ratio and kv_ratio must be >= 1")
        if not 0 < self.kv_fraction <= 1:
            raise ValueError(f"kv_fraction must be in (0, 1], got {self.kv_fraction}")


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    policy: str = DEFAULT_PROFILE
    #: Prefix block size in bytes of the canonical prompt (~256 tokens of English).
    block_bytes: int = 1024
    #: Bytes per token, used when the policy stage has not counted the prompt.
    chars_per_token: float = 4.0
    #: Prefix index / session memory entries expire after this long.
    index_ttl_s: float = 600.0
    #: KV capacity of a replica when neither the engine nor the replica config says.
    default_capacity_tokens: int = 262144
    #: Prefill rate (tokens/s) of a replica until the engine's is measured.
    default_prefill_rate: float = 10000.0
    #: A replica's prefill rate counts at most this many times above/below the candidates' median.
    max_rate_spread: float = 2.0
    #: Bounded-load hashing: a new session's replica holds at most this × the mean sessions.
    session_load_factor: float = 1.15
    max_sessions: int = 100000
    #: llama.cpp slots per replica when the engine state does not list them (None: no pinning).
    llamacpp_slots: int | None = None
    hotspot: HotspotConfig = field(default_factory=HotspotConfig)
    plugins: tuple[PluginSpec, ...] = ()
    profiles: tuple[ProfileSpec, ...] = ()

    def __post_init__(self) -> None:
        problems = _check_scalars(self)
        problems += validate_plugins(self.effective_plugins(), "plugins" if self.plugins else "plugins (built-in)")
        problems += validate_profiles(self)
        if problems:
            raise ValueError("; ".join(problems))

    def effective_plugins(self) -> tuple[PluginSpec, ...]:
        return self.plugins or BUILTIN_PLUGINS

    def effective_profiles(self) -> tuple[ProfileSpec, ...]:
        return self.profiles or BUILTIN_PROFILES


def _check_scalars(cfg: SchedulingConfig) -> list[str]:
    problems: list[str] = []
    positive = {"block_bytes": cfg.block_bytes, "chars_per_token": cfg.chars_per_token,
                "index_ttl_s": cfg.index_ttl_s, "default_capacity_tokens": cfg.default_capacity_tokens,
                "default_prefill_rate": cfg.default_prefill_rate, "max_sessions": cfg.max_sessions}
    problems += [f"{k}: must be > 0, got {v}" for k, v in positive.items() if not v > 0]
    if cfg.max_rate_spread < 1:
        problems.append(f"max_rate_spread: must be >= 1, got {cfg.max_rate_spread}")
    if cfg.session_load_factor < 1:
        problems.append(f"session_load_factor: must be >= 1, got {cfg.session_load_factor}")
    if cfg.llamacpp_slots is not None and cfg.llamacpp_slots < 1:
        problems.append(f"llamacpp_slots: must be >= 1, got {cfg.llamacpp_slots}")
    return problems


def validate_plugins(plugins: tuple[PluginSpec, ...], where: str) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    for i, spec in enumerate(plugins):
        path = f"{where}[{i}]"
        if not spec.name:
            problems.append(f"{path}.name: must not be empty")
        elif spec.name in seen:
            problems.append(f"{path}.name: duplicate plugin name {spec.name!r}")
        seen.add(spec.name)
        ptype = REGISTRY.get(spec.type)
        if ptype is None:
            known = ", ".join(sorted(REGISTRY))
            problems.append(f"{path}.type: unknown plugin type {spec.type!r} (known: {known})")
            continue
        try:
            decode(ptype.params, spec.parameters, f"{path}.parameters")
        except ConfigError as exc:
            problems.extend(exc.problems)
    return problems


def validate_profiles(cfg: SchedulingConfig) -> list[str]:
    kinds = {p.name: REGISTRY[p.type].kind for p in cfg.effective_plugins() if p.type in REGISTRY}
    where = "profiles" if cfg.profiles else "profiles (built-in)"
    problems: list[str] = []
    names: set[str] = set()
    for i, profile in enumerate(cfg.effective_profiles()):
        path = f"{where}[{i}]"
        if profile.name in names:
            problems.append(f"{path}.name: duplicate profile name {profile.name!r}")
        if profile.name in BASELINES:
            problems.append(f"{path}.name: {profile.name!r} is the name of a built-in baseline")
        names.add(profile.name)
        problems += _check_ref(kinds, f"{path}.picker", profile.picker, "picker")
        problems += [p for j, f in enumerate(profile.filters)
                     for p in _check_ref(kinds, f"{path}.filters[{j}]", f, "filter")]
        problems += [p for j, s in enumerate(profile.scorers)
                     for p in _check_ref(kinds, f"{path}.scorers[{j}].plugin", s.plugin, "scorer")]
    if cfg.policy not in names and cfg.policy not in BASELINES:
        choices = ", ".join(sorted(names | set(BASELINES)))
        problems.append(f"policy: unknown profile or baseline {cfg.policy!r} (choices: {choices})")
    return problems


def _check_ref(kinds: Mapping[str, str], path: str, name: str, want: str) -> list[str]:
    kind = kinds.get(name)
    if kind is None:
        return [f"{path}: no plugin named {name!r} is defined"]
    if kind != want:
        return [f"{path}: plugin {name!r} is a {kind}, expected a {want}"]
    return []
