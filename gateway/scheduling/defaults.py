"""The built-in plugin instances and the `default` profile (used when the config names none)."""

from __future__ import annotations

from gateway.scheduling.specs import PluginSpec, ProfileSpec, ScorerRef

DEFAULT_PROFILE = "default"

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
