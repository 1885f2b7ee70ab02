"""Declared ranges: every numeric key of the config and policy schemas has one,
and one checker enforces it (file, policy files, command-line flags), naming
the exact key path of every violation in one pass."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.checkconfig import check_file
from gateway.config.decode import ConfigError, decode
from gateway.config.discovery import DiscoveryConfig
from gateway.config.ranges import Range, range_of
from gateway.config.scheduling import ProfileSpec, ScorerRef
from gateway.config.schema import GatewayConfig, ReplicaConfig, load_config, parse_config
from gateway.config.state import RedisConfig, StateConfig
from gateway.policies.policyset import Policy, load_policy_set

#: The keys each object needs to decode at all (the fuzzed key is set on top).
_REQUIRED: dict[type, dict[str, Any]] = {
    ReplicaConfig: {"url": "http://127.0.0.1:1"},
    DiscoveryConfig: {"name": "d", "host": "engines.local", "port": 8000},
    RedisConfig: {"url": "redis://127.0.0.1:1/0"},
    StateConfig: {"backend": "redis"},
    Policy: {"name": "p"},
    ProfileSpec: {"name": "p", "picker": "max-score"},
    ScorerRef: {"plugin": "least-load"},
}
_PER_CLASS_KEY = "interactive"

Leaf = tuple[tuple[str | int, ...], dataclasses.Field[Any], type, tuple[type, ...]]


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _numeric(tp: Any) -> type | None:
    tp = _strip_optional(tp)
    if tp in (int, float):
        return typing.cast(type, tp)
    if typing.get_origin(tp) is dict:
        value = typing.get_args(tp)[1]
        return typing.cast(type, value) if value in (int, float) else None
    return None


def leaves(
    cls: type, path: tuple[str | int, ...] = (), owners: tuple[type, ...] = ()
) -> Iterator[Leaf]:
    """Every numeric field reachable from `cls`, with the path that sets it."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _strip_optional(hints[f.name])
        kind = _numeric(tp)
        here = (*path, f.name)
        if kind is not None:
            is_map = typing.get_origin(tp) is dict
            yield ((*here, _PER_CLASS_KEY) if is_map else here), f, kind, (*owners, cls)
        elif dataclasses.is_dataclass(tp):
            yield from leaves(typing.cast(type, tp), here, (*owners, cls))
        elif typing.get_origin(tp) in (tuple, list):
            item = typing.get_args(tp)[0]
            if dataclasses.is_dataclass(item):
                yield from leaves(typing.cast(type, item), (*here, 0), (*owners, cls))
        elif typing.get_origin(tp) is dict:
            item = typing.get_args(tp)[1]
            if dataclasses.is_dataclass(item):
                yield from leaves(typing.cast(type, item), (*here, "t"), (*owners, cls))


def build(root: type, path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """Data for `root` with `value` at `path`, each object on the way given its required keys."""
    data: dict[str, Any] = dict(_REQUIRED.get(root, {}))
    node: dict[str, Any] = data
    cls: Any = root
    i = 0
    while i < len(path) - 1:
        step = str(path[i])
        tp = _strip_optional(typing.get_type_hints(cls)[step])
        origin = typing.get_origin(tp)
        if origin is dict and not dataclasses.is_dataclass(typing.get_args(tp)[1]):
            node[step] = {}  # a per-class map: the last step is its key
            node = node[step]
            break
        if origin in (tuple, list, dict):
            cls = typing.get_args(tp)[-1 if origin is dict else 0]
            child: dict[str, Any] = dict(_REQUIRED.get(cls, {}))
            node[step] = [child] if origin is not dict else {path[i + 1]: child}
            i += 2
        else:
            cls = tp
            child = dict(_REQUIRED.get(cls, {}))
            node[step] = child
            i += 1
        node = child
    node[str(path[-1])] = value
    return data


def dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


SCHEMAS: list[tuple[type, Leaf]] = [
    (root, leaf) for root in (GatewayConfig, Policy) for leaf in leaves(root)
]

HOSTILE: tuple[Any, ...] = (math.nan, math.inf, -math.inf, -1, -0.5, 0, 0.0, 10**18, 1e300)


def test_the_walk_finds_the_keys_of_every_section() -> None:
    keys = {dotted(leaf[0]) for _, leaf in SCHEMAS}
    for key in (
        "health.interval_s",
        "upstream.keepalive_timeout_s",
        "replicas[0].weight",
        "discovery[0].port",
        "state.redis.lease_ttl_s",
        "admission.watermarks.interactive",
        "auth.tenants.t.max_concurrent",
        "scheduling.hotspot.kv_fraction",
        "scheduling.profiles[0].scorers[0].weight",
        "limits.max_n",
        "session.idle_ttl_s",
    ):
        assert key in keys
    assert len(keys) >= 90


@pytest.mark.parametrize(("root", "leaf"), SCHEMAS, ids=[dotted(x[1][0]) for x in SCHEMAS])
def test_every_numeric_key_declares_a_range_and_hostile_values_are_refused_by_key(
    root: type, leaf: Leaf
) -> None:
    path, f, kind, _ = leaf
    bounds = range_of(f)
    assert bounds is not None, (
        f"{dotted(path)} ({kind.__name__}) declares no range: use gateway.config.ranges.ranged"
    )
    key = dotted(path)
    for value in HOSTILE:
        data = build(root, path, value)
        try:
            decode(root, data)
        except ConfigError as exc:
            # refused with its key path (or, for a relation between two keys of one
            # object, under the other key naming this one), nothing else blamed
            owner = key.rsplit(".", 1)[0] + "."
            mine = [
                p
                for p in exc.problems
                if p.startswith(f"{key}: ") or (p.startswith(owner) and f" {f.name} " in p)
            ]
            assert mine and len(exc.problems) == len(mine), (key, value, exc.problems)
            continue
        # accepted: the declared range (documented in config/README.md) admits it
        assert isinstance(value, int) or kind is float, (key, value)
        assert bounds.admits(value), (key, value)


def test_nan_and_infinity_are_refused_where_they_disable_something() -> None:
    for key, value in (
        ("health.timeout_s", math.nan),
        ("listen.head_timeout_s", math.inf),
        ("listen.body_timeout_s", math.inf),
        ("state.redis.lease_ttl_s", math.inf),
        ("upstream.keepalive_timeout_s", -math.inf),
        ("replicas[0].weight", math.nan),
    ):
        leaf = next(x for _, x in SCHEMAS if dotted(x[0]) == key)
        with pytest.raises(ConfigError) as exc:
            decode(GatewayConfig, build(GatewayConfig, leaf[0], value))
        assert exc.value.problems[0].startswith(f"{key}: must be"), exc.value.problems


def test_a_negative_interval_names_only_its_key() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"health": {"interval_s": -5}})
    assert exc.value.problems == ["health.interval_s: must be > 0, got -5.0"]


def test_every_violation_of_every_section_in_one_pass() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(
            {
                "health": {"interval_s": -5, "timeout_s": math.nan, "eject_after": -1},
                "upstream": {"keepalive_timeout_s": 0},
                "listen": {"port": 70000, "head_timeout_s": math.inf},
                "timeouts": {"total_s": math.nan},
                "admission": {"watermarks": {"batch": 2.0}, "learned_quantile": 1.0},
                "bogus": 1,
            }
        )
    keys = sorted(p.split(": ", 1)[0] for p in exc.value.problems)
    assert keys == [
        "admission.learned_quantile",
        "admission.watermarks.batch",
        "bogus",
        "health.eject_after",
        "health.interval_s",
        "health.timeout_s",
        "listen.head_timeout_s",
        "listen.port",
        "timeouts.total_s",
        "upstream.keepalive_timeout_s",
    ]
    assert "listen.port: must be a TCP port (between 0 and 65535), got 70000" in exc.value.problems
    assert "listen.head_timeout_s: must be finite and > 0, got inf" in exc.value.problems
    assert "admission.learned_quantile: must be in [0.5, 1), got 1.0" in exc.value.problems


def test_range_descriptions() -> None:
    assert Range(gt=0).problem(math.nan) == "must be > 0, got nan"
    assert Range(gt=0, inf_ok=True).problem(math.inf) is None
    assert Range(gt=0, inf_ok=True).problem(-math.inf) is not None
    assert Range(ge=0, le=10).problem(11) == "must be between 0 and 10, got 11"
    assert Range(gt=0, le=1).problem(0) == "must be in (0, 1], got 0"


def test_duplicate_yaml_keys_are_refused_with_the_key_path(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        "health:\n  interval_s: 2\n  interval_s: 3\n"
        "replicas:\n  - url: http://127.0.0.1:1\n    weight: 1\n    weight: 2\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    assert exc.value.problems == [
        f"replicas[0].weight: duplicate key in {cfg} (lines 6 and 7; YAML keys must be unique)",
        f"health.interval_s: duplicate key in {cfg} (lines 2 and 3; YAML keys must be unique)",
    ]
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "a.yaml").write_text("name: a\nlimits: {max_n: 2, max_n: 3}\n")
    with pytest.raises(ConfigError) as exc:
        load_policy_set(str(policies))
    assert exc.value.problems[0].startswith("limits.max_n: duplicate key in a.yaml (lines 2 and 2")


def test_check_config_reports_every_problem_of_every_policy_file(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "a.yaml").write_text("name: a\nlimts: {max_n: 2}\npriority: urgent\n")
    (policies / "b.yaml").write_text("name: b\nsession: {idle_ttl_s: .nan}\ntokns: engine\n")
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("policies: policies\nhealth: {interval_s: -5}\n")
    with pytest.raises(ConfigError) as exc:
        check_file(str(cfg))
    found = exc.value.problems
    assert "health.interval_s: must be > 0, got -5.0" in found
    assert any(p.startswith("a.yaml.limts: unknown key") for p in found), found
    assert any(p.startswith("a.yaml: priority 'urgent' is not an admission class") for p in found)
    assert "b.yaml.session.idle_ttl_s: must be > 0, got nan" in found
    assert any(p.startswith("b.yaml.tokns: unknown key") for p in found), found


def test_a_command_line_flag_is_checked_by_the_same_ranges() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--port",
            "70000",
            "--replica",
            "http://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "listen.port: must be a TCP port (between 0 and 65535), got 70000" in out.stderr


def ranges_table() -> list[str]:
    """The `## Ranges` table of config/README.md, from the declared ranges."""
    rows = []
    for root, (path, f, kind, _) in SCHEMAS:
        bounds = range_of(f)
        assert bounds is not None
        where = "policy" if root is Policy else "config"
        key = dotted(path).replace("[0]", "[]").replace(".t.", ".<tenant>.")
        key = key.replace(f".{_PER_CLASS_KEY}", ".<class>")
        rows.append(f"| {where} | `{key}` | {kind.__name__} | {bounds.describe()} |")
    return rows


def test_config_readme_lists_every_range() -> None:
    readme = (Path(__file__).resolve().parents[2] / "config" / "README.md").read_text()
    missing = [row for row in ranges_table() if row not in readme]
    assert not missing, "config/README.md `## Ranges` is out of date:\n" + "\n".join(missing)
