"""Request bodies as JSON: decoded strictly, with limits checked before
anything else reads them (nesting depth, integer length, finite numbers,
valid Unicode), and the canonical JSON the prompt parts are rendered with."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable
from typing import Any

from gateway.errors import BadRequest, InvalidJSON


class _PairsHook(threading.local):
    """`object_pairs_hook` noting whether any object repeated a key (parsers
    disagree on which value wins, so such bytes are never forwarded as is)."""

    repeated = False
    #: objects left before the body holds too many (decoding stops there)
    left = 0

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            self.repeated = True
        self.left -= 1
        if self.left < 0:
            raise _TooManyObjects
        return obj


class _TooManyObjects(Exception):
    """Raised by the hook to stop decoding a body of too many objects."""


#: Limits on the JSON of every body, checked right after decoding and before
#: anything else reads it; a body over one is refused with 400 `invalid_json`
#: naming the limit (and, below the top level, the top-level key as `param`).
#: Nesting depth counts containers, the body's own object being 1: OpenAI
#: bodies rarely exceed ~20 (tool schemas), and the JSON decoder itself (and
#: any recursive code after it) fails near 1,000.
MAX_JSON_DEPTH = 64
#: Digits in an integer literal (int64 seeds have 19): Python refuses to read
#: more than 4,300 (`sys.int_max_str_digits`) and engines refuse far fewer.
MAX_INT_DIGITS = 100
_INT_BOUND = 10**MAX_INT_DIGITS


def _refuse_constant(name: str) -> Any:
    raise InvalidJSON(f"Request body is not valid JSON: {name} is not a JSON number.")


_HOOK = _PairsHook()
#: `parse_constant` refuses the NaN/Infinity literals `json` accepts by default.
_DECODER = json.JSONDecoder(object_pairs_hook=_HOOK, parse_constant=_refuse_constant)
_BOM = b"\xef\xbb\xbf"
#: A surrogate escape anywhere (an escaped backslash may precede it: a superset);
#: only then are strings searched for lone surrogates (pairs decode to one char).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[" + chr(0xD800) + "-" + chr(0xDFFF) + "]")


def _canonical_encoder() -> Callable[[Any], str]:
    """Canonical JSON of structured prompt parts (tools, tool calls): sorted keys,
    no spaces, ASCII, as `json.dumps(o, sort_keys=True, separators=(",", ":"))`.

    `JSONEncoder.encode` builds a new C encoder (and a closure) on every call,
    ~2 µs; an agent history renders one part per tool call. Parsed JSON has no
    cycles, so one C encoder without the circular check serves every call."""
    fallback = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (other Pythons)
        return fallback
    encode_chunks = make(
        None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True
    )

    def canonical(obj: Any) -> str:
        return "".join(encode_chunks(obj, 0))

    return canonical


def _not_json(obj: Any) -> Any:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


canonical_json = _canonical_encoder()


def parse_json_object(raw: bytes) -> dict[str, Any]:
    return parse_json_document(raw)[0]


def parse_json_document(raw: bytes, max_objects: int = 1 << 62) -> tuple[dict[str, Any], bool]:
    """The JSON object in `raw`, and whether `raw` is plain UTF-8 whose objects
    repeat no key (so the bytes mean exactly the parsed object). A body of
    more than `max_objects` JSON objects is refused as soon as decoding gets
    there (its objects are never all built)."""
    if not raw.strip():
        raise InvalidJSON("Request body is empty; expected a JSON object.")
    bom = raw.startswith(_BOM)
    _HOOK.repeated = False
    _HOOK.left = max_objects
    try:
        data = _DECODER.decode(raw[3:].decode("utf-8") if bom else raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"Request body is not valid UTF-8: {exc.reason}.") from exc
    except json.JSONDecodeError as exc:
        raise InvalidJSON(
            f"Request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from exc
    except RecursionError as exc:
        raise _too_deep(None) from exc
    except _TooManyObjects:
        raise BadRequest(
            f"Request body has more than {max_objects} JSON objects, more than its messages "
            "and content parts could need.",
            code="array_above_max_length",
        ) from None
    except ValueError as exc:  # an integer over `sys.int_max_str_digits`
        raise _too_long(None) from exc
    if not isinstance(data, dict):
        raise InvalidJSON(f"Request body must be a JSON object, got {type(data).__name__}.")
    surrogates = _has_surrogate_escape(raw)
    for key, value in data.items():
        _check_json_value(key, value, 2, surrogates)
    return data, not (bom or _HOOK.repeated)


def _has_surrogate_escape(raw: bytes) -> bool:
    """Searched in 1 MiB windows (overlapping by the pattern's length less one):
    one search over a 30 MB body holds the GIL for ~40-70 ms, a window ~2 ms,
    so a worker thread parsing a large body lets the loop run in between."""
    window = 1 << 20
    return any(
        _SURROGATE_ESCAPE.search(raw, start, start + window + 3) is not None
        for start in range(0, len(raw), window)
    )


def _too_deep(param: str | None) -> InvalidJSON:
    return InvalidJSON(
        f"Request body nests arrays and objects deeper than the limit of {MAX_JSON_DEPTH} levels.",
        param=param,
    )


def _check_json_value(param: str, value: Any, depth: int, surrogates: bool) -> None:
    """Refuse what no engine should see inside the top-level key `param`: nesting
    over `MAX_JSON_DEPTH`, integers over `MAX_INT_DIGITS` digits, non-finite
    numbers and (when `surrogates`) lone surrogates in strings or keys."""
    if surrogates and _SURROGATE.search(param) is not None:
        raise _lone_surrogate(None)
    kind = type(value)
    if kind is dict or kind is list:
        _check_container(param, value, depth, surrogates)
    else:
        _check_scalar(param, value, surrogates)


def _check_container(param: str, node: Any, depth: int, surrogates: bool) -> None:
    """Runs on every body: strings are skipped at once, and a list is first
    classified by type in C (`set(map(type, ...))`), so a list of strings or of
    token ids costs a pass or two in C, not a Python loop. Recursion is bounded
    by `MAX_JSON_DEPTH`."""
    if type(node) is dict:
        if surrogates:
            for key in node:
                if _SURROGATE.search(key) is not None:
                    raise _lone_surrogate(param)
        values: Any = node.values()
        if not surrogates and set(map(type, values)) == _STR_ONLY:
            return  # e.g. a message with text content: nothing to look into
    else:
        values = node
        types = set(map(type, node))
        if not surrogates and types == _STR_ONLY:
            return
        if types <= _NUMBERS:  # token ids, embeddings: bounds in C
            if node and (max(node) >= _INT_BOUND or min(node) <= -_INT_BOUND):
                raise _too_long(param)
            if float in types and not all(map(math.isfinite, node)):
                raise _not_finite(param)
            return
    for item in values:
        kind = type(item)
        if kind is str:
            if surrogates and _SURROGATE.search(item) is not None:
                raise _lone_surrogate(param)
        elif kind is dict or kind is list:
            if depth >= MAX_JSON_DEPTH:
                raise _too_deep(param)
            _check_container(param, item, depth + 1, surrogates)
        elif kind is int or kind is float:
            _check_scalar(param, item, surrogates)


_STR_ONLY = {str}
_NUMBERS = {int, float}


def _check_scalar(param: str, value: Any, surrogates: bool) -> None:
    kind = type(value)
    if kind is int:
        if value >= _INT_BOUND or value <= -_INT_BOUND:
            raise _too_long(param)
    elif kind is float:
        if not math.isfinite(value):
            raise _not_finite(param)
    elif kind is str and surrogates and _SURROGATE.search(value) is not None:
        raise _lone_surrogate(param)


def _too_long(param: str | None) -> InvalidJSON:
    return InvalidJSON(
        f"Request body has an integer longer than the limit of {MAX_INT_DIGITS} digits.",
        param=param,
    )


def _not_finite(param: str) -> InvalidJSON:
    return InvalidJSON(
        "Request body has a number too large to be finite; numbers must be finite.", param=param
    )


def _lone_surrogate(param: str | None) -> InvalidJSON:
    return InvalidJSON(
        "Request body has a string with a lone surrogate escape (\\ud800-\\udfff without "
        "its pair); strings must be valid Unicode.",
        param=param,
    )
