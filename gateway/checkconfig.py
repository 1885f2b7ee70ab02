"""Every problem of a config file in one run (`gateway check-config`, `gateway serve`).

Decoding reports every key of the file that is wrong; the scheduling plugin
specs and the task policies the file points at are checked as well, even when
other sections failed to decode, so that fixing one problem never reveals the
next. Each problem reads `key.path: problem`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml

from gateway.config.decode import ConfigError, decode
from gateway.config.scheduling import SchedulingConfig
from gateway.config.schema import AuthConfig, GatewayConfig, load_config
from gateway.policies.policyset import PolicySet
from gateway.policy.stage import check_policies
from gateway.scheduling.validate import validate as validate_scheduling


def check_file(path: str) -> tuple[GatewayConfig, PolicySet]:
    """The config and its policies, or ConfigError listing every problem found."""
    problems: list[str] = []
    cfg: GatewayConfig | None = None
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        problems += exc.problems
    if cfg is None:
        data = _raw(path)
        if data is None:  # unreadable, or not YAML: nothing more to check
            raise ConfigError(problems)
        partial = _partial(data, Path(path).parent)
    else:
        partial = cfg
    try:
        validate_scheduling(partial.scheduling)
    except ConfigError as exc:
        problems += exc.problems
    policies: PolicySet | None = None
    try:
        policies = check_policies(partial)
    except ConfigError as exc:
        problems += exc.problems
    if problems or cfg is None or policies is None:
        raise ConfigError(_unique(problems))
    return cfg, policies


def _raw(path: str) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _partial(data: dict[str, Any], base_dir: Path) -> GatewayConfig:
    """The sections the other checks need, each decoded on its own (a section
    that does not decode is left at its default: its problems are already
    reported)."""
    scheduling = _section(SchedulingConfig, data.get("scheduling"), "scheduling")
    auth = _section(AuthConfig, data.get("auth"), "auth")
    policies = data.get("policies")
    if not isinstance(policies, str):
        policies = None
    elif not Path(policies).is_absolute():
        policies = str((base_dir / policies).resolve())
    return GatewayConfig(
        scheduling=scheduling or SchedulingConfig(), auth=auth or AuthConfig(), policies=policies
    )


T = TypeVar("T")


def _section(cls: type[T], value: Any, path: str) -> T | None:
    try:
        return decode(cls, value, path)
    except ConfigError:
        return None


def _unique(problems: list[str]) -> list[str]:
    return list(dict.fromkeys(problems))
