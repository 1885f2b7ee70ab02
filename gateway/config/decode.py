"""Strict decoding of YAML/JSON data into frozen dataclasses.

Every config object in the gateway (gateway config, policies, scheduling
profiles, simulator knobs) goes through `decode`: unknown keys, missing
required keys and values of the wrong type fail with the dotted key path of
the offending value. Nothing is coerced: `"10"` is not an int and `1` is not
a bool. An int is accepted where a float is expected.

`${NAME}` in a string is replaced by the environment variable NAME (an
unset variable is an error naming both the key path and the variable).
A numeric field's declared range (`gateway.config.ranges`) is checked with
its value, under its key path. Dataclasses may validate further in
`__post_init__` by raising `ValueError` (the message is reported under the
object's path, or the field's when it starts with the field's name); they
are built even next to an unknown key, so every problem shows in one run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from gateway.config.ranges import RangeError, range_of, value_problems

T = TypeVar("T")

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(Exception):
    """One or more config problems, each `path: message`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def expand_env(value: str, path: str, env: Mapping[str, str] | None = None) -> str:
    environ = os.environ if env is None else env

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in environ:
            raise ConfigError([f"{path}: environment variable {name} is not set"])
        return environ[name]

    return _ENV_REF.sub(repl, value)


def decode(cls: type[T], data: Any, path: str = "", env: Mapping[str, str] | None = None) -> T:
    """Decode `data` into dataclass `cls`; raise ConfigError listing every problem."""
    problems: list[str] = []
    result = _decode_value(cls, data, path, problems, env)
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, result)


def _decode_value(tp: Any, value: Any, path: str, problems: list[str], env: Any) -> Any:
    origin = get_origin(tp)
    label = path or "<root>"
    if tp is Any:
        return value
    if origin is Union or origin is types.UnionType:
        return _decode_union(tp, value, path, problems, env)
    if origin is Literal:
        if value not in get_args(tp):
            choices = ", ".join(repr(a) for a in get_args(tp))
            problems.append(f"{label}: must be one of {choices}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_dataclass(tp, value, path, problems, env)
    if origin in (list, tuple) or tp in (list, tuple):
        return _decode_sequence(tp, value, path, problems, env)
    if origin is dict or tp is dict:
        return _decode_mapping(tp, value, path, problems, env)
    return _decode_scalar(tp, value, label, problems, env, path)


def _decode_union(tp: Any, value: Any, path: str, problems: list[str], env: Any) -> Any:
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    non_none = [a for a in args if a is not type(None)]
    if len(non_none) == 1:
        return _decode_value(non_none[0], value, path, problems, env)
    for arg in non_none:
        trial: list[str] = []
        result = _decode_value(arg, value, path, trial, env)
        if not trial:
            return result
    names = " or ".join(getattr(a, "__name__", str(a)) for a in non_none)
    problems.append(f"{path or '<root>'}: expected {names}, got {type(value).__name__}")
    return None


def _decode_scalar(
    tp: Any, value: Any, label: str, problems: list[str], env: Any, path: str
) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{label}: expected a boolean, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{label}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{label}: expected a number, got {value!r}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{label}: expected a string, got {value!r}")
            return value
        try:
            return expand_env(value, label, env)
        except ConfigError as exc:
            problems.extend(exc.problems)
            return value
    raise TypeError(f"configtools cannot decode type {tp!r} at {path}")


def _decode_sequence(tp: Any, value: Any, path: str, problems: list[str], env: Any) -> Any:
    if not isinstance(value, list):
        problems.append(f"{path or '<root>'}: expected a list, got {type(value).__name__}")
        return ()
    args = get_args(tp)
    item_tp = args[0] if args else Any
    items = [_decode_value(item_tp, v, _join(path, i), problems, env) for i, v in enumerate(value)]
    return tuple(items) if (get_origin(tp) is tuple or tp is tuple) else items


def _decode_mapping(tp: Any, value: Any, path: str, problems: list[str], env: Any) -> Any:
    if not isinstance(value, dict):
        problems.append(f"{path or '<root>'}: expected a mapping, got {type(value).__name__}")
        return {}
    args = get_args(tp)
    val_tp = args[1] if len(args) == 2 else Any
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            problems.append(f"{_join(path, str(k))}: keys must be strings")
            continue
        out[k] = _decode_value(val_tp, v, _join(path, k), problems, env)
    return out


def _decode_dataclass(cls: type, value: Any, path: str, problems: list[str], env: Any) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problems.append(f"{path or '<root>'}: expected a mapping, got {type(value).__name__}")
        return None
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [
        f"{_join(path, str(key))}: unknown key (known keys: {', '.join(sorted(fields))})"
        for key in value
        if key not in fields
    ]
    problems += unknown
    kwargs: dict[str, Any] = {}
    before = len(problems)
    for name, f in fields.items():
        if name in value:
            kwargs[name] = _decode_field(
                f, hints[name], value[name], _join(path, name), problems, env
            )
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.append(f"{_join(path, name)}: required key is missing")
    if len(problems) > before:
        return None
    # Built even next to an unknown key, so its own checks are reported in the same run.
    try:
        built = cls(**kwargs)
    except RangeError as exc:
        problems += [f"{_join(path, key)}: {message}" for key, message in exc.problems]
        return None
    except (ValueError, TypeError) as exc:
        problems.append(_located(path, str(exc), fields))
        return None
    return None if unknown else built


def _decode_field(
    f: dataclasses.Field[Any], tp: Any, value: Any, path: str, problems: list[str], env: Any
) -> Any:
    """One field's value, checked against the field's declared range (if any)."""
    before = len(problems)
    decoded = _decode_value(tp, value, path, problems, env)
    bounds = range_of(f)
    if bounds is not None and len(problems) == before:
        problems += [
            f"{path}{key[len(f.name) :]}: {m}" for key, m in value_problems(f.name, bounds, decoded)
        ]
    return decoded


_LEADING_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?:: | (?=must |is ))(.*)", re.DOTALL)


def _located(path: str, message: str, fields: Mapping[str, Any]) -> str:
    """A `__post_init__` message under its key path: "port must be ..." raised
    by `listen` reads `listen.port: must be ...` (a message that names no
    field of the object stays under the object's path)."""
    m = _LEADING_NAME.fullmatch(message)
    if m is not None:
        name, rest = m.groups()
        last = path.rsplit(".", 1)[-1]
        if name.startswith(last + "."):  # "limits.max_input_tokens" raised by `…limits`
            name = name[len(last) + 1 :]
        if name in fields:
            return f"{_join(path, name)}: {rest}"
    return f"{path or '<root>'}: {message}"


def replace_checked(obj: T, path: str, **changes: Any) -> T:
    """`dataclasses.replace(obj, **changes)` (command-line flags over the file),
    or ConfigError naming each bad key under `path`, as for the file."""
    try:
        return typing.cast(T, dataclasses.replace(typing.cast(Any, obj), **changes))
    except RangeError as exc:
        raise ConfigError(
            [f"{_join(path, key)}: {message}" for key, message in exc.problems]
        ) from None
    except ValueError as exc:
        fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, obj))}
        raise ConfigError([_located(path, str(exc), fields)]) from None


def to_plain(obj: Any, mask: frozenset[str] = frozenset()) -> Any:
    """Dataclass → plain data (for printing the effective config); masks secret fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name in mask and v:
                out[f.name] = "***"
            else:
                out[f.name] = to_plain(v, mask)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_plain(v, mask) for v in obj]
    if isinstance(obj, dict):
        return {k: ("***" if k in mask and v else to_plain(v, mask)) for k, v in obj.items()}
    return obj
