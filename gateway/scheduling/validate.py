"""Scheduling config checked against the plugin registry.

The config (`gateway.config.scheduling`) is plain data; this is where its
plugin specs meet the registry. Checked in phases, each problem naming its
key path: unknown type, bad parameters, duplicate name, dangling or
wrong-kind reference, unknown policy. `build_router` calls `validate`, so no
router is built from an unchecked config; `gateway check-config` and
`gateway serve` call it right after loading, so a bad config fails at
startup with everything else that is wrong in the file.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config.decode import ConfigError, decode
from gateway.config.scheduling import BASELINES, PluginSpec, SchedulingConfig
from gateway.scheduling.registry import REGISTRY


def validate(cfg: SchedulingConfig, path: str = "scheduling") -> None:
    """Raise ConfigError (one problem under `path`, as decoding reports) unless `cfg` is valid."""
    problems = check(cfg)
    if problems:
        raise ConfigError([f"{path}.{p}" for p in problems])


def check(cfg: SchedulingConfig) -> list[str]:
    """Every problem of `cfg`'s plugins, profiles and policy, each `key.path: message`."""
    where = "plugins" if cfg.plugins else "plugins (built-in)"
    return check_plugins(cfg.effective_plugins(), where) + _builtin_profiles_collapsed(
        cfg, check_profiles(cfg)
    )


def _builtin_profiles_collapsed(cfg: SchedulingConfig, problems: list[str]) -> list[str]:
    """Own `plugins` without own `profiles`: the built-in profiles then name
    plugins the list lacks. One problem for that, not one per reference."""
    if cfg.profiles or not cfg.plugins:
        return problems
    missing = sorted({p.split("'")[1] for p in problems if "no plugin named" in p})
    if not missing:
        return problems
    rest = [p for p in problems if "no plugin named" not in p]
    return [
        "profiles: not set, so the built-in profiles apply, and they use plugins that "
        f"`plugins` does not define ({', '.join(missing)}): define `profiles` too, "
        "or add those plugins",
        *rest,
    ]


def check_plugins(plugins: tuple[PluginSpec, ...], where: str) -> list[str]:
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


def check_profiles(cfg: SchedulingConfig) -> list[str]:
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
        problems += [
            p
            for j, f in enumerate(profile.filters)
            for p in _check_ref(kinds, f"{path}.filters[{j}]", f, "filter")
        ]
        problems += [
            p
            for j, s in enumerate(profile.scorers)
            for p in _check_ref(kinds, f"{path}.scorers[{j}].plugin", s.plugin, "scorer")
        ]
    if cfg.policy not in names and cfg.policy not in BASELINES:
        choices = ", ".join(sorted(names | set(BASELINES)))
        problems.append(f"policy: unknown profile or baseline {cfg.policy!r} (choices: {choices})")
    return problems


def _check_ref(kinds: Mapping[str, str], path: str, name: str, want: str) -> list[str]:
    found = kinds.get(name)
    if found is None:
        return [f"{path}: no plugin named {name!r} is defined"]
    if found != want:
        return [f"{path}: plugin {name!r} is a {found}, expected a {want}"]
    return []
