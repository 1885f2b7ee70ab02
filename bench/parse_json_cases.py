"""The ingress limits orjson and msgspec leave to the caller (`walked`), and
the hostile inputs of `tests/ingress/test_hostile_json.py` run through each
parser variant of `bench/parse_json.py`: what each refuses on its own, what
it accepts but changes, and how often it disagrees with the gateway on the
test's fuzzed bodies (same strategy, drawn here).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import HealthCheck, given, settings

from gateway.ingress.protocol import MAX_INT_DIGITS, MAX_JSON_DEPTH, parse_json_document
from tests.ingress.test_hostile_json import hostile_bodies

Parse = Callable[[bytes], object]
MSG = b'[{"role":"user","content":"x"}]'
DEEP = b"[" * 980 + b"]" * 980
FUZZ_EXAMPLES = 300


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    raw: bytes
    #: what the gateway must do: refuse, accept, or accept without forwarding the bytes as is
    expected: Literal["refuse", "accept", "accept, not forwardable"]


def _with(field: bytes, value: bytes) -> bytes:
    return b'{"messages":' + MSG + b',"' + field + b'":' + value + b"}"


def _content(value: bytes) -> bytes:
    return b'{"messages":[{"role":"user","content":' + value + b"}]}"


def _nested(levels: int) -> bytes:
    inner = levels - 1  # the body's object is level 1
    return _with(b"x", b"[" * inner + b"]" * inner)


HOSTILE: list[Case] = [
    Case("980 levels in messages", b'{"messages":' + DEEP + b"}", "refuse"),
    Case(f"depth {MAX_JSON_DEPTH} (the limit)", _nested(MAX_JSON_DEPTH), "accept"),
    Case(f"depth {MAX_JSON_DEPTH + 1}", _nested(MAX_JSON_DEPTH + 1), "refuse"),
    Case("integer of 5,000 digits", _with(b"seed", b"9" * 5000), "refuse"),
    Case(
        f"integer of {MAX_INT_DIGITS + 1} digits in a list",
        _with(b"seed", b"[-" + b"9" * (MAX_INT_DIGITS + 1) + b"]"),
        "refuse",
    ),
    Case(f"integer of {MAX_INT_DIGITS} digits", _with(b"seed", b"9" * MAX_INT_DIGITS), "accept"),
    Case("integer of 20 digits (past 64 bits)", _with(b"seed", b"9" * 20), "accept"),
    Case("NaN", _with(b"temperature", b"NaN"), "refuse"),
    Case("Infinity", _with(b"temperature", b"Infinity"), "refuse"),
    Case("-Infinity", _with(b"temperature", b"-Infinity"), "refuse"),
    Case("1e999", _with(b"temperature", b"1e999"), "refuse"),
    Case("[1.5,-1e400]", _with(b"temperature", b"[1.5,-1e400]"), "refuse"),
    Case("lone high surrogate", _content(rb'"a\ud800b"'), "refuse"),
    Case("lone low surrogate", _content(rb'"\udc00"'), "refuse"),
    Case("high, then a pair", _content(rb'"\ud800\ud800\udc00"'), "refuse"),
    Case("lone surrogate in a part", _content(rb'[{"type":"text","text":"\uDBFF"}]'), "refuse"),
    Case("lone surrogate in a key", _with(b"x", rb'{"\ud800":1}'), "refuse"),
    Case("surrogate pair", _content(rb'"a\ud83d\ude00b"'), "accept"),
    Case("escaped backslash, then ud800", _content(rb'"a\\ud800"'), "accept"),
    Case("escaped backslash, then a pair", _content(rb'"\\\ud83d\ude00"'), "accept"),
    Case("invalid UTF-8 byte", _content(b'"a\xffb"'), "refuse"),
    Case("a surrogate encoded in UTF-8 bytes", _content(b'"a\xed\xa0\x80b"'), "refuse"),
    Case("truncated", b'{"messages":[{"role":"user","content":"x"', "refuse"),
    Case("UTF-8 BOM", b"\xef\xbb\xbf" + _content(b'"x"'), "accept, not forwardable"),
    Case(
        "repeated key",
        _content(b'"x"')[:-1] + b',"model":"a","model":"b"}',
        "accept, not forwardable",
    ),
]


def no_bom(raw: bytes) -> bytes | memoryview:
    """orjson and msgspec refuse a UTF-8 BOM, which the gateway accepts."""
    return memoryview(raw)[3:] if raw.startswith(b"\xef\xbb\xbf") else raw


class LimitError(ValueError):
    pass


_INT_BOUND = 10**MAX_INT_DIGITS


def walked(data: object, ints: bool) -> object:
    """The limits neither parser enforces: depth ≤ `MAX_JSON_DEPTH` (and with
    `ints`, integers ≤ `MAX_INT_DIGITS` digits: msgspec reads up to 4,300;
    orjson turns integers past 64 bits into floats, so has none to check)."""
    if type(data) is dict or type(data) is list:
        _walk(data.values() if type(data) is dict else data, 1, ints)
    return data


def _walk(values: Any, depth: int, ints: bool) -> None:
    """`values` of a container at level `depth` (the body's object is level 1)."""
    for item in values:
        kind = type(item)
        if kind is dict or kind is list:
            if depth >= MAX_JSON_DEPTH:
                raise LimitError("too deep")
            _walk(item.values() if kind is dict else item, depth + 1, ints)
        elif ints and kind is int and (item >= _INT_BOUND or item <= -_INT_BOUND):
            raise LimitError("integer too long")


def _outcome(parse: Parse, raw: bytes) -> tuple[str, object]:
    try:
        result = parse(raw)
    except RecursionError:
        return "refused (RecursionError)", None
    except Exception as exc:  # every parser's own error types  # noqa: BLE001
        return f"refused ({type(exc).__name__})", None
    if isinstance(result, tuple):  # the gateway's (object, forwardable)
        data, forwardable = result
        return ("accepted" if forwardable else "accepted, not forwardable"), data
    return "accepted", result


def _same_value(a: object, b: object) -> bool:
    """Equal including number types (an integer read as a float differs)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _judge(case: Case, outcome: str, data: object, reference: object) -> str:
    refused = outcome.startswith("refused")
    if case.expected == "refuse":
        return "ok" if refused else "MISSED"
    if refused:
        return "WRONGLY REFUSED"
    if not _same_value(data, reference):
        return "VALUE CHANGED"
    if case.expected == "accept, not forwardable" and outcome != "accepted, not forwardable":
        return "cannot tell the bytes are ambiguous"
    return "ok"


def _fuzz_bodies() -> list[bytes]:
    bodies: list[bytes] = []

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(hostile_bodies())
    def collect(raw: bytes) -> None:
        bodies.append(raw)

    collect()
    return bodies


def _fuzz(parsers: Mapping[str, Parse]) -> dict[str, Any]:
    """Per variant: fuzzed bodies it refuses / accepts differently from the gateway."""
    bodies = _fuzz_bodies()
    gateway = [_outcome(parse_json_document, raw)[0].startswith("refused") for raw in bodies]
    out: dict[str, Any] = {"bodies": len(bodies), "gateway_refuses": sum(gateway)}
    for name, parse in parsers.items():
        missed = wrong = 0
        for raw, refused in zip(bodies, gateway, strict=True):
            mine = _outcome(parse, raw)[0].startswith("refused")
            missed += refused and not mine
            wrong += mine and not refused
        out[name] = {"accepts_what_gateway_refuses": missed, "refuses_what_gateway_accepts": wrong}
    return out


def run_cases(parsers: Mapping[str, Parse], cases: list[Case]) -> dict[str, Any]:
    rows = []
    for case in cases:
        ref_outcome, reference = _outcome(parse_json_document, case.raw)
        results = {}
        for name, parse in parsers.items():
            outcome, data = _outcome(parse, case.raw)
            results[name] = {"outcome": outcome, "verdict": _judge(case, outcome, data, reference)}
        rows.append(
            {"case": case.name, "expected": case.expected, "gateway": ref_outcome, **results}
        )
    return {"cases": rows, "fuzz": _fuzz(parsers)}
