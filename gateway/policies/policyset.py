"""Task policies: the schema of `policies/*.yaml` and the validated, immutable set.

A file holds one policy (a mapping), several (a list, or `---` separated
documents). Every policy is decoded strictly (`gateway.config.decode`), then
the set is checked as a whole: unique names, unique `X-Task` values and
model aliases, and references from the auth config (tenant default and
allowed tasks, the isolation secret). `load_policy_set` returns a new
`PolicySet` or raises `ConfigError` listing every problem with its file and
key path; a reload swaps the whole set in one assignment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gateway.config.decode import ConfigError, decode, to_plain
from gateway.config.ranges import check_ranges, ranged
from gateway.config.schema import PRIORITY_CLASSES, AuthConfig
from gateway.config.yamlload import load_yaml_all

DEFAULT_POLICY = "default"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-]{0,63}$")

TokenMode = Literal["estimate", "engine", "tokenizer"]


@dataclass(frozen=True, slots=True)
class MatchSpec:
    tasks: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LimitsSpec:
    max_input_tokens: int | None = ranged(None, ge=1)
    max_output_tokens: int | None = ranged(None, ge=1)
    default_output_tokens: int | None = ranged(None, ge=1)
    on_excess: Literal["reject", "clamp"] = "clamp"
    #: most sequences one request may ask for (`n`, `best_of`): each is reserved in full
    max_n: int = ranged(8, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)
        top, default = self.max_output_tokens, self.default_output_tokens
        if top is not None and default is not None and default > top:
            raise ValueError(
                f"default_output_tokens must be <= max_output_tokens ({top}), got {default}"
            )


@dataclass(frozen=True, slots=True)
class DeadlineSpec:
    default_s: float | None = ranged(None, gt=0)
    max_s: float | None = ranged(None, gt=0)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.default_s is not None and self.max_s is not None and self.default_s > self.max_s:
            raise ValueError(f"default_s must be <= max_s ({self.max_s}), got {self.default_s}")


@dataclass(frozen=True, slots=True)
class TimeoutsSpec:
    """Per-task overrides of the config's `timeouts` (read by gateway.deadlines.deadline)."""

    connect_s: float | None = ranged(None, gt=0)
    first_byte_s: float | None = ranged(None, gt=0)
    idle_s: float | None = ranged(None, gt=0)
    total_s: float | None = ranged(None, gt=0)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, slots=True)
class SessionSpec:
    max_requests: int | None = ranged(None, gt=0)
    max_total_tokens: int | None = ranged(None, gt=0)
    max_duration_s: float | None = ranged(None, gt=0)
    idle_ttl_s: float = ranged(1800.0, gt=0)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str = ""
    match: MatchSpec = field(default_factory=MatchSpec)
    model: str | None = None
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    priority: str = "standard"
    deadline: DeadlineSpec = field(default_factory=DeadlineSpec)
    timeouts: TimeoutsSpec = field(default_factory=TimeoutsSpec)
    session: SessionSpec | None = None
    tokens: TokenMode = "estimate"
    tokenizer: str | None = None
    isolation: Literal["none", "tenant"] = "none"
    #: KV reserved for the output at admission: the output limit, or the task's
    #: learned quantile (`admission.output_reservation` when not set)
    output_reservation: Literal["limit", "learned"] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must match {_NAME.pattern}")
        if self.priority not in PRIORITY_CLASSES:
            raise ValueError(
                f"priority {self.priority!r} is not an admission class "
                f"({', '.join(PRIORITY_CLASSES)})"
            )
        if self.match.models and not self.model:
            raise ValueError("match.models (aliases) needs `model`, the real model name to forward")
        if self.tokens == "tokenizer" and not self.tokenizer:
            raise ValueError("tokens: tokenizer needs `tokenizer` (path to a tokenizer.json)")

    @property
    def task_names(self) -> tuple[str, ...]:
        """`X-Task` values that select this policy: its name and `match.tasks`."""
        return (self.name, *(t for t in self.match.tasks if t != self.name))


BUILTIN_DEFAULT = Policy(
    name=DEFAULT_POLICY,
    description="Built-in default: no input limit, 4096 output tokens.",
    limits=LimitsSpec(default_output_tokens=4096),
)


@dataclass(frozen=True, slots=True)
class PolicySet:
    policies: tuple[Policy, ...]
    sources: Mapping[str, str]
    by_task: Mapping[str, Policy]
    by_alias: Mapping[str, Policy]
    default: Policy

    def get(self, name: str) -> Policy | None:
        return next((p for p in self.policies if p.name == name), None)

    @property
    def known_tasks(self) -> list[str]:
        return sorted(self.by_task)

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for p in self.policies:
            plain = to_plain(p)
            assert isinstance(plain, dict)
            plain["source"] = self.sources.get(p.name, "<built-in>")
            out.append(plain)
        return out


def build_policy_set(
    policies: Iterable[Policy],
    sources: Mapping[str, str] | None = None,
    auth: AuthConfig | None = None,
) -> PolicySet:
    """Cross-check policies (and the auth config's references to them) into a set."""
    items = list(policies)
    src = dict(sources or {})
    problems: list[str] = []
    by_name: dict[str, Policy] = {}
    by_task: dict[str, Policy] = {}
    by_alias: dict[str, Policy] = {}
    for p in items:
        where = src.get(p.name, p.name)
        if p.name in by_name:
            problems.append(f"{where}: duplicate policy name {p.name!r}")
        by_name[p.name] = p
        _index(by_task, p.task_names, p, where, "X-Task value", problems)
        _index(by_alias, p.match.models, p, where, "model alias", problems)
    default = by_name.get(DEFAULT_POLICY, BUILTIN_DEFAULT)
    if DEFAULT_POLICY not in by_name:
        items.append(default)
        by_task.setdefault(DEFAULT_POLICY, default)
    if auth is not None:
        problems += _check_auth(auth, by_name.keys() | {DEFAULT_POLICY}, items)
    if problems:
        raise ConfigError(problems)
    return PolicySet(tuple(items), src, by_task, by_alias, default)


def _index(
    table: dict[str, Policy],
    keys: Iterable[str],
    p: Policy,
    where: str,
    what: str,
    problems: list[str],
) -> None:
    for key in keys:
        other = table.get(key)
        if other is not None and other is not p:
            problems.append(f"{where}: {what} {key!r} is already used by policy {other.name!r}")
        table[key] = p


def _check_auth(auth: AuthConfig, names: set[str], policies: list[Policy]) -> list[str]:
    problems = []
    for tenant, t in sorted(auth.tenants.items()):
        refs = [("default_task", t.default_task)] if t.default_task else []
        refs += [("allowed_tasks", name) for name in t.allowed_tasks]
        for key, name in refs:
            if name not in names:
                problems.append(
                    f"auth.tenants.{tenant}.{key}: no policy named {name!r} "
                    f"(known: {', '.join(sorted(names))})"
                )
    isolated = [p.name for p in policies if p.isolation == "tenant"]
    if isolated and auth.enabled and not auth.isolation_secret:
        problems.append(
            f"auth.isolation_secret: required with auth enabled by policies with "
            f"isolation: tenant ({', '.join(isolated)})"
        )
    return problems


def load_policy_set(directory: str | None, auth: AuthConfig | None = None) -> PolicySet:
    """Load every `*.yaml` / `*.yml` file of `directory` (None: built-in default only)."""
    if directory is None:
        return build_policy_set((), auth=auth)
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError([f"policies: {root} is not a directory"])
    problems: list[str] = []
    policies: list[Policy] = []
    sources: dict[str, str] = {}
    files = sorted([*root.glob("*.yaml"), *root.glob("*.yml")])
    for path in files:
        for label, data in _documents(path, problems):
            try:
                p = decode(Policy, data, label)
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            sources.setdefault(p.name, f"{path.name}")
            policies.append(p)
    if problems:  # the set's own checks too, over the policies that decoded
        try:
            build_policy_set(policies, sources, auth)
        except ConfigError as exc:
            problems.extend(exc.problems)
        raise ConfigError(problems)
    return build_policy_set(policies, sources, auth)


def _documents(path: Path, problems: list[str]) -> list[tuple[str, Any]]:
    try:
        docs = [d for d in load_yaml_all(path.read_text(), path.name) if d is not None]
    except OSError as exc:
        problems.append(f"{path.name}: cannot load: {exc.strerror}")
        return []
    except ConfigError as exc:
        problems.extend(exc.problems)
        return []
    out: list[tuple[str, Any]] = []
    for i, doc in enumerate(docs):
        items = doc if isinstance(doc, list) else [doc]
        for j, item in enumerate(items):
            label = path.name if len(docs) == 1 and len(items) == 1 else f"{path.name}[{i}.{j}]"
            out.append((label, item))
    return out
