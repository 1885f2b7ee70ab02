"""The scheduling config, re-exported where the router's users look for it.

It is plain data and lives in `gateway.config.scheduling`; its plugin specs
are checked against the registry by `gateway.scheduling.validate`.
"""

from __future__ import annotations

from gateway.config.scheduling import (
    BASELINES,
    BUILTIN_PLUGINS,
    BUILTIN_PROFILES,
    DEFAULT_PROFILE,
    HotspotConfig,
    PluginSpec,
    ProfileSpec,
    SchedulingConfig,
    ScorerRef,
)

__all__ = [
    "BASELINES",
    "BUILTIN_PLUGINS",
    "BUILTIN_PROFILES",
    "DEFAULT_PROFILE",
    "HotspotConfig",
    "PluginSpec",
    "ProfileSpec",
    "SchedulingConfig",
    "ScorerRef",
]
