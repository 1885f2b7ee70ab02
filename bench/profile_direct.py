"""The gateway's per-request body work called directly, without a profiler
(`bench/profile_request.py`): the body-work phases of the phase table.

Each step runs on the same body as the profiled requests, repeatedly, timed
in this thread's CPU time (a descheduled thread costs nothing), every step
once per repeat in rotating order, median of the repeats. Steps, in the
order the pipeline runs them: the JSON decode, the limits walk and the
surrogate-escape scan, the field checks, `parse_request` (all of those: a
check of their sum), the prompt's canonical rendering, the token estimate
(cold: no part cached; warm: every part cached, as for a resent history),
the prefix block hashes, the conversation key, and the splice of an added
top-level key into the raw body.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from gateway.config.schema import LimitsConfig
from gateway.forward.rawbody import spliced
from gateway.http.serving import tune_gc
from gateway.ingress import jsonbody, protocol
from gateway.ingress.protocol import parse_request, prompt_parts
from gateway.policy.tokens import LRU, estimate_request
from gateway.scheduling.conversation import opening
from gateway.scheduling.prefix import prefix_blocks

BLOCK_BYTES = 1024  # scheduling.block_bytes default
CACHE_ENTRIES = 65536
LIMITS = LimitsConfig()


def _medians_us(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Every step once per repeat, in rotating order (a burst of other work on
    the machine lands on all alike); the median of each step's repeats."""
    names = list(steps)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = time.thread_time()
            steps[name]()
            samples[name].append(time.thread_time() - t0)
    return {name: statistics.median(v) * 1e6 for name, v in samples.items()}


def _field_checks(data: dict[str, Any]) -> None:
    """What `parse_request` checks after the decode and the limits walk."""
    protocol._check_messages(data.get("messages"), LIMITS)
    protocol._output_limit(data)
    protocol.ParsedRequest("chat", data, None, False, False, None, None, None, dict(data))


def _walk(data: dict[str, Any]) -> None:
    for key, value in data.items():
        jsonbody._check_json_value(key, value, 2, False)


def direct_timings(body: bytes, repeats: int) -> dict[str, float]:
    """µs per call of each step on `body` (a chat request), with the garbage
    collector tuned as `gateway serve` tunes it."""
    tune_gc()
    req = parse_request("chat", body)
    text = body.decode()
    data = jsonbody._DECODER.decode(text)

    def render() -> None:
        req.parts = None
        prompt_parts(req)

    cache = LRU(CACHE_ENTRIES)
    estimate_request(req, cache)
    parts = prompt_parts(req)
    final = {**(req.original or {}), "stream_options": {"include_usage": True}}
    steps: dict[str, Callable[[], object]] = {
        "utf-8 decode": body.decode,
        "JSON decode (stdlib, gateway's decoder)": lambda: jsonbody._DECODER.decode(text),
        "limits walk": lambda: _walk(data),
        "surrogate-escape scan": lambda: jsonbody._has_surrogate_escape(body),
        "field checks": lambda: _field_checks(data),
        "parse_request (all ingress)": lambda: parse_request("chat", body),
        "canonical rendering": render,
        "token estimate, parts cached": lambda: estimate_request(req, cache),
        "prefix block hashes": lambda: prefix_blocks(parts, req.model, None, BLOCK_BYTES),
        "conversation key": lambda: opening(req),
        "splice one added top-level key": lambda: spliced(req.raw, req.original, final),
    }
    out = _medians_us(steps, repeats)
    # apart: its ~60 ms of allocations would disturb the short steps around it
    cold = _medians_us({"cold": lambda: estimate_request(req)}, max(1, repeats // 8))
    out["token estimate, cold (no part cached)"] = cold["cold"]
    return out


def median_timings(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Per step, the median over rounds (each round's value a median itself)."""
    return {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}


def direct_phases(direct: dict[str, float]) -> dict[str, float]:
    """The direct timings as the profile's phases (`bench/profile_phases.py`);
    `parse_request` as a whole is a check of their sum."""
    parse = direct["utf-8 decode"] + direct["JSON decode (stdlib, gateway's decoder)"]
    walk = direct["limits walk"] + direct["surrogate-escape scan"]
    return {
        "JSON parse": parse,
        "validation walk (limits)": walk,
        "field checks": direct["field checks"],
        "canonical rendering": direct["canonical rendering"],
        "token estimate": direct["token estimate, parts cached"],
        "prefix hashing": direct["prefix block hashes"] + direct["conversation key"],
    }
