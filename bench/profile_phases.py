"""A cProfile of the gateway's loop thread, split into pipeline phases
(`bench/profile_request.py`).

Every function's own time goes to one phase: by a rule on its file and name
when one matches, else (builtins, stdlib helpers) to its callers' phases in
proportion to the time each caller spent in it (cProfile's per-caller
records). So `bytes.decode` called by the JSON parse counts as parse, and a
`str.join` in the canonical renderer as rendering. A few builtins that copy
a body are a phase of their own wherever they run.
"""

from __future__ import annotations

import pstats
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Func = tuple[str, int, str]  # (file, line, name), as pstats keys functions

#: Builtins that copy request or response bytes, counted as `body copies` wherever they run.
_COPIES = (
    "<method 'join' of 'bytes' objects>",
    "<method 'tobytes' of 'memoryview' objects>",
    "<method 'extend' of 'bytearray' objects>",
    "<method 'copy' of 'dict' objects>",
)

#: (phase, file suffix, function names or None for every function), first match wins.
_RULES: tuple[tuple[str, str, frozenset[str] | None], ...] = (
    ("JSON parse", "gateway/ingress/jsonbody.py", frozenset({"parse_json_document", "__call__"})),
    (
        "validation walk (limits)",
        "gateway/ingress/jsonbody.py",
        frozenset(
            {"_check_json_value", "_check_container", "_check_scalar", "_has_surrogate_escape"}
        ),
    ),
    ("canonical rendering", "gateway/ingress/jsonbody.py", frozenset({"canonical"})),
    (
        "canonical rendering",
        "gateway/ingress/protocol.py",
        frozenset({"prompt_parts", "_render_parts", "_content_parts"}),
    ),
    ("field checks", "gateway/ingress/protocol.py", None),
    ("field checks", "gateway/ingress/fields.py", None),
    ("JSON parse", "json/decoder.py", None),
    ("JSON parse", "json/__init__.py", frozenset({"loads"})),
    ("re-serialisation / splicing", "gateway/forward/rawbody.py", None),
    ("re-serialisation / splicing", "json/encoder.py", None),
    ("re-serialisation / splicing", "json/__init__.py", frozenset({"dumps"})),
    ("prefix hashing", "gateway/scheduling/prefix.py", None),
    ("prefix hashing", "gateway/scheduling/conversation.py", None),
    ("token estimate", "gateway/policy/tokens.py", None),
    ("token estimate", "gateway/policy/estimate.py", None),
    ("logging", "logging/__init__.py", None),
    ("logging", "gateway/observability/logging.py", None),
    ("metrics", "gateway/observability/", None),
    ("metrics", "prometheus_client/", None),
    ("metrics", "/metrics.py", None),
    ("HTTP server", "gateway/http/server", None),
    ("HTTP server", "gateway/http/connection.py", None),
    ("HTTP server", "gateway/http/request_", None),
    ("HTTP server", "gateway/http/conn_timer.py", None),
    ("HTTP server", "gateway/http/asgi.py", None),
    ("HTTP server", "gateway/http/exchange.py", None),
    ("HTTP server", "gateway/http/responses.py", None),
    ("HTTP server", "gateway/http/serving.py", None),
    ("HTTP client", "gateway/http/client", None),
    ("HTTP client", "gateway/http/target.py", None),
    ("forwarding (relay)", "gateway/forward/", None),
    ("admission + state", "gateway/admission/", None),
    ("admission + state", "gateway/state/", None),
    ("admission + state", "redis/", None),
    ("routing", "gateway/scheduling/", None),
    ("routing", "gateway/replicas/", None),
    ("policy", "gateway/policy/", None),
    ("deadlines", "gateway/deadlines/", None),
    ("pipeline (other)", "gateway/", None),
    ("event loop + sockets", "asyncio/", None),
    ("event loop + sockets", "uvloop/", None),
)
_LOOP_BUILTINS = ("uvloop", "_asyncio", "socket", "httptools", "select")
#: Where a function with no rule and no profiled caller lands.
UNATTRIBUTED = "other"


def rule_phase(func: Func) -> str | None:
    path, _, name = func
    if path == "~":
        if name in _COPIES:
            return "body copies"
        if any(word in name for word in _LOOP_BUILTINS):
            return "event loop + sockets"
        return None
    path = path.replace("\\", "/")
    for phase, suffix, names in _RULES:
        if suffix in path and (names is None or name in names):
            return phase
    return None


class PhaseSplit:
    """Each profiled function's share of every phase (memoised, cycle-safe)."""

    def __init__(self, stats: Mapping[Func, Any]) -> None:
        self.stats = stats
        self._memo: dict[Func, dict[str, float]] = {}

    def shares(self, func: Func, depth: int = 0) -> dict[str, float]:
        if func in self._memo:
            return self._memo[func]
        own = rule_phase(func)
        if own is not None:
            result = {own: 1.0}
        elif depth > 50:
            result = {UNATTRIBUTED: 1.0}
        else:
            self._memo[func] = {UNATTRIBUTED: 1.0}  # a cycle back here stays unattributed
            result = self._inherited(func, depth)
        self._memo[func] = result
        return result

    def _inherited(self, func: Func, depth: int) -> dict[str, float]:
        callers: Mapping[Func, Any] = self.stats[func][4]
        weights = {c: float(v[2]) for c, v in callers.items() if c in self.stats}
        total = sum(weights.values())
        if total <= 0:
            return {UNATTRIBUTED: 1.0}
        out: dict[str, float] = {}
        for caller, weight in weights.items():
            for phase, share in self.shares(caller, depth + 1).items():
                out[phase] = out.get(phase, 0.0) + share * weight / total
        return out

    def phase_seconds(self) -> dict[str, float]:
        return self._sum(2)

    def phase_calls(self) -> dict[str, float]:
        return self._sum(1)

    def _sum(self, index: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for func, row in self.stats.items():
            for phase, share in self.shares(func).items():
                out[phase] = out.get(phase, 0.0) + share * float(row[index])
        return out

    def main_phase(self, func: Func) -> str:
        shares = self.shares(func)
        return max(shares, key=lambda p: shares[p])


#: The loop thread's CPU outside every profiled frame (uvloop's C code, the kernel).
UNSEEN = "event loop internals (outside Python frames)"


def corrected_phases(
    seconds: Mapping[str, float], calls: Mapping[str, float], profiled_cpu: float, cpu: float
) -> dict[str, float]:
    """Each phase's CPU without the profiler's cost, which is charged per call:
    with `profiled_cpu` the loop thread's CPU under the profile and `cpu` the
    same work's unprofiled CPU, the cost per call is their difference over the
    number of calls; a phase keeps its own time less its calls' cost (never
    below zero), and the thread's CPU outside profiled frames is `UNSEEN`."""
    total_calls = sum(calls.values())
    per_call = max(0.0, profiled_cpu - cpu) / total_calls if total_calls else 0.0
    out = {p: max(0.0, s - calls.get(p, 0.0) * per_call) for p, s in seconds.items()}
    out[UNSEEN] = max(0.0, profiled_cpu - sum(seconds.values()))
    return out


def measured_phases(
    corrected: Mapping[str, float], direct: Mapping[str, float], total: float
) -> dict[str, float]:
    """Per phase µs: the `direct` ones (the body work timed without a
    profiler) as they are; the rest of `total` split over the other phases
    in proportion to their `corrected` profiled time."""
    rest = {p: v for p, v in corrected.items() if p not in direct}
    remainder = max(0.0, total - sum(direct.values()))
    rest_total = sum(rest.values())
    out = dict(direct)
    for phase, value in rest.items():
        out[phase] = remainder * value / rest_total if rest_total else 0.0
    return out


@dataclass(frozen=True, slots=True)
class FuncRow:
    name: str
    phase: str
    calls_per_request: float
    own_us: float  # per request, as profiled
    cumulative_us: float


def load_stats(path: str) -> dict[Func, Any]:
    stats: dict[Func, Any] = pstats.Stats(path).stats  # type: ignore[attr-defined]
    return stats


def short_name(func: Func) -> str:
    path, line, name = func
    if path == "~":
        return name
    path = path.replace("\\", "/")
    if "/gateway/" in path:
        path = "gateway/" + path.rsplit("/gateway/", 1)[1]
    elif "/site-packages/" in path:
        path = path.split("/site-packages/", 1)[1]
    elif "/lib/python3" in path:  # the stdlib: lib/python3.X/<module>
        path = path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{path}:{line}({name})"


def top_rows(
    stats: Mapping[Func, Any], split: PhaseSplit, requests: int, key: str, n: int = 20
) -> list[FuncRow]:
    index = 2 if key == "own" else 3
    ranked = sorted(stats.items(), key=lambda kv: kv[1][index], reverse=True)[:n]
    return [
        FuncRow(
            short_name(func),
            split.main_phase(func),
            row[1] / requests,
            row[2] / requests * 1e6,
            row[3] / requests * 1e6,
        )
        for func, row in ranked
    ]


def top_by_phase(
    stats: Mapping[Func, Any], split: PhaseSplit, requests: int, per_phase: int = 5
) -> dict[str, list[FuncRow]]:
    """The functions with the most own time in each phase (their main phase)."""
    grouped: dict[str, list[tuple[Func, Any]]] = {}
    for func, row in stats.items():
        grouped.setdefault(split.main_phase(func), []).append((func, row))
    out: dict[str, list[FuncRow]] = {}
    for phase, items in grouped.items():
        items.sort(key=lambda kv: kv[1][2], reverse=True)
        out[phase] = [
            FuncRow(
                short_name(f),
                phase,
                r[1] / requests,
                r[2] / requests * 1e6,
                r[3] / requests * 1e6,
            )
            for f, r in items[:per_phase]
        ]
    return out
