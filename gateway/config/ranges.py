"""Declared ranges of numeric config fields, and the one checker that enforces them.

A numeric field of a config dataclass declares its range once, in its field
metadata:

    interval_s: float = ranged(2.0, gt=0)
    port: int = ranged(8080, ge=0, le=65535, what="a TCP port")
    watermarks: dict[str, float] = ranged(factory=dict, ge=0.01, le=1.0)

`check_ranges(obj)` (called first by the dataclass's `__post_init__`, so a
config built by `decode`, by `dataclasses.replace` from a CLI flag or in code
is checked alike) raises `RangeError` listing every field out of its range;
`decode` reports each under its dotted key path. NaN is never in a range and
infinity only where a field says `inf_ok=True`. `None` (an optional field
left unset) is not checked; the values of a mapping field are checked each,
under `field.key`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

RANGE_KEY = "gateway.range"


@dataclass(frozen=True, slots=True)
class Range:
    """Bounds of a number: `gt`/`ge` below, `lt`/`le` above (each optional)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    #: +inf is a valid value (e.g. "no limit"); NaN never is
    inf_ok: bool = False
    #: what the number is, for the message ("a TCP port")
    what: str = ""

    def admits(self, value: float) -> bool:
        if math.isnan(value) or (math.isinf(value) and not (self.inf_ok and value > 0)):
            return False
        return (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )

    def describe(self) -> str:
        """The range in words: `> 0`, `between 0 and 10`, `in [0.5, 1)`."""
        lo, hi = _first(self.gt, self.ge), _first(self.lt, self.le)
        if self.ge is not None and self.le is not None:
            text = f"between {_num(self.ge)} and {_num(self.le)}"
        elif lo is not None and hi is not None:
            left, right = "(" if self.gt is not None else "[", ")" if self.lt is not None else "]"
            text = f"in {left}{_num(lo)}, {_num(hi)}{right}"
        else:
            low = _bound(">", self.gt) or _bound(">=", self.ge)
            high = _bound("<", self.lt) or _bound("<=", self.le)
            text = " and ".join(b for b in (low, high) if b) or "a number"
        return f"{text} (.inf: no limit)" if self.inf_ok else text

    def problem(self, value: float) -> str | None:
        """`must be ..., got ...` for a value out of range, else None."""
        if self.admits(value):
            return None
        text = self.describe()
        if math.isinf(value) and self.lt is None and self.le is None:
            text = f"finite and {text}"
        if self.what:
            text = f"{self.what} ({text})"
        return f"must be {text}, got {value!r}"


def _first(a: float | None, b: float | None) -> float | None:
    return a if a is not None else b


def _bound(op: str, value: float | None) -> str:
    return "" if value is None else f"{op} {_num(value)}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else str(value)


class RangeError(ValueError):
    """Fields out of their declared range: (key relative to the object, message) each."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{key}: {message}" for key, message in problems))


def ranged(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    inf_ok: bool = False,
    what: str = "",
) -> Any:
    """A dataclass field with a declared range (see the module docstring)."""
    bounds = Range(gt=gt, ge=ge, lt=lt, le=le, inf_ok=inf_ok, what=what)
    return dataclasses.field(default=default, default_factory=factory, metadata={RANGE_KEY: bounds})


def range_of(f: dataclasses.Field[Any]) -> Range | None:
    found = f.metadata.get(RANGE_KEY)
    return found if isinstance(found, Range) else None


def value_problems(name: str, bounds: Range, value: Any) -> list[tuple[str, str]]:
    """The problems of one field's value: a number, None, or a mapping of numbers."""
    if isinstance(value, dict):
        items = [(f"{name}.{k}", v) for k, v in value.items()]
    else:
        items = [(name, value)]
    out: list[tuple[str, str]] = []
    for key, v in items:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            message = bounds.problem(v)
            if message is not None:
                out.append((key, message))
    return out


def range_problems(obj: Any) -> list[tuple[str, str]]:
    """Every field of dataclass instance `obj` outside its declared range."""
    out: list[tuple[str, str]] = []
    for f in dataclasses.fields(obj):
        bounds = range_of(f)
        if bounds is not None:
            out += value_problems(f.name, bounds, getattr(obj, f.name))
    return out


def check_ranges(obj: Any) -> None:
    """Raise RangeError listing every field of `obj` outside its declared range."""
    problems = range_problems(obj)
    if problems:
        raise RangeError(problems)
