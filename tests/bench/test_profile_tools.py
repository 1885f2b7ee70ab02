"""The measuring tools of bench/profile_request.py and bench/parse_json.py:
phase attribution of a real profile, the profiler-cost correction, Redis
counting against a real redis-server, and the hostile-input verdicts."""

from __future__ import annotations

import cProfile
import hashlib
import json
import pstats
import time
from typing import Any

import pytest
import redis

from bench.parse_json_cases import HOSTILE, LimitError, run_cases, walked
from bench.profile_phases import (
    UNSEEN,
    PhaseSplit,
    corrected_phases,
    measured_phases,
    rule_phase,
)
from bench.profile_pyspy import phase_shares, relative_paths
from bench.profile_redis import Monitor, read_counters, script_names
from gateway.ingress.protocol import (
    MAX_JSON_DEPTH,
    parse_json_document,
    parse_request,
    prompt_parts,
)
from gateway.state import redis as redis_store
from tests.redisserver import redis_server

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
BODY = json.dumps(
    {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "hi " * 200}]}
).encode()


def _profile_of_ingress() -> dict[Any, Any]:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        prompt_parts(parse_request("chat", BODY))
    profile.disable()
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return stats


def test_every_second_of_a_real_profile_lands_in_one_phase() -> None:
    stats = _profile_of_ingress()
    split = PhaseSplit(stats)
    seconds = split.phase_seconds()
    assert sum(seconds.values()) == pytest.approx(sum(row[2] for row in stats.values()))
    for phase in ("JSON parse", "validation walk (limits)", "canonical rendering"):
        assert seconds.get(phase, 0.0) > 0, (phase, seconds)
    # a builtin takes its caller's phase: bytes.decode is called by the JSON parse only
    decode = next(f for f in stats if f[2] == "<method 'decode' of 'bytes' objects>")
    assert split.shares(decode) == {"JSON parse": 1.0}


def test_rules_by_file_and_function() -> None:
    protocol = "/x/gateway/ingress/protocol.py"
    jsonbody = "/x/gateway/ingress/jsonbody.py"
    assert rule_phase((jsonbody, 1, "_check_container")) == "validation walk (limits)"
    assert rule_phase((protocol, 1, "_render_parts")) == "canonical rendering"
    assert rule_phase((protocol, 1, "_check_messages")) == "field checks"
    assert rule_phase(("~", 0, "<method 'join' of 'bytes' objects>")) == "body copies"
    assert rule_phase(("~", 0, "<built-in method builtins.len>")) is None


def test_profiler_cost_is_taken_per_call_and_the_total_is_kept() -> None:
    seconds = {"a": 10.0, "b": 2.0}
    calls = {"a": 4.0, "b": 0.0}
    out = corrected_phases(seconds, calls, profiled_cpu=13.0, cpu=9.0)
    assert out == {"a": 6.0, "b": 2.0, UNSEEN: 1.0}
    assert sum(out.values()) == pytest.approx(9.0)


def test_direct_timings_replace_their_phases_and_the_rest_is_shared() -> None:
    out = measured_phases({"a": 5.0, "b": 1.0, "c": 3.0}, {"a": 3.0}, total=7.0)
    assert out == {"a": 3.0, "b": 1.0, "c": 3.0}
    assert sum(out.values()) == pytest.approx(7.0)


def test_pyspy_samples_go_to_their_innermost_ruled_frame() -> None:
    root = "run (/r/gateway/http/exchange.py:3)"
    collapsed = "\n".join(
        [
            f"{root};parse_json_document (/r/gateway/ingress/jsonbody.py:9);raw_decode "
            "(/usr/lib/python3.11/json/decoder.py:353) 6",
            f"{root};_PairsHook.__call__ (/r/gateway/ingress/jsonbody.py:62) 2",
            f"{root};helper (/usr/lib/python3.11/functools.py:1) 2",
        ]
    )
    shares, samples = phase_shares(collapsed)
    assert samples == 10
    assert shares == {"JSON parse": 0.8, "HTTP server": 0.2}
    assert "/usr/lib" not in relative_paths(collapsed)


SCRIPT = "redis.call('SET', KEYS[1], 'v'); return redis.call('GET', KEYS[1])"


@pytest.mark.redis
def test_redis_round_trips_and_script_commands_are_told_apart() -> None:
    with redis_server() as server:
        client = redis.Redis(port=server.port)
        script = client.register_script(SCRIPT)
        client.script_load(SCRIPT)
        before = read_counters(client)
        monitor = Monitor(server.port, scripts={script.sha: "mine"})
        script(keys=["k"])
        client.get("k")
        time.sleep(0.1)
        top, lua = monitor.stop()
        delta = read_counters(client).minus(before)
    assert top == {"evalsha mine": 1, "get": 1}
    assert lua == {"set": 1, "get": 1}
    assert monitor.by_script == {"mine": {"set": 1, "get": 1}}
    assert delta.commands == {"evalsha": 1, "set": 1, "get": 2}
    assert delta.cpu_s >= 0


def test_script_names_are_the_shas_the_gateway_registers() -> None:
    names = script_names()
    for name in ("reserve", "settle", "get", "renew"):
        assert names[hashlib.sha1(redis_store._script(name).encode()).hexdigest()] == name


def test_the_hostile_cases_match_the_gateway_and_plain_json_misses_them() -> None:
    result = run_cases({"gateway": parse_json_document, "plain": json.loads}, HOSTILE)
    verdicts = {row["case"]: row for row in result["cases"]}
    assert all(row["gateway"]["verdict"] == "ok" for row in result["cases"]), verdicts
    assert verdicts["NaN"]["plain"]["verdict"] == "MISSED"
    assert verdicts["repeated key"]["plain"]["verdict"] == "cannot tell the bytes are ambiguous"
    fuzz = result["fuzz"]
    assert fuzz["gateway"] == {"accepts_what_gateway_refuses": 0, "refuses_what_gateway_accepts": 0}
    assert fuzz["plain"]["accepts_what_gateway_refuses"] > 0


def test_the_depth_walk_has_the_gateways_exact_limit() -> None:
    def body(levels: int) -> Any:
        inner = levels - 1
        return json.loads(b'{"x":' + b"[" * inner + b"]" * inner + b"}")

    walked(body(MAX_JSON_DEPTH), ints=False)
    with pytest.raises(LimitError):
        walked(body(MAX_JSON_DEPTH + 1), ints=False)
    with pytest.raises(LimitError):
        walked({"seed": [-(10**100)]}, ints=True)
    walked({"seed": [10**100 - 1]}, ints=True)
