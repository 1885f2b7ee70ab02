"""Simulator fidelity: the same requests to a real llama-server and to the simulator's
llama.cpp flavour, compared by shape.

Compared per probe: status code, media type (the `charset` parameter is ignored), the JSON
shape of bodies (keys and value types, recursively; see `capture_golden.shape`) and a few
values the gateway relies on (`facts`: error type and code, `object`, slots), for SSE
the shape of each kind of chunk (role, content, finish, usage), the order of chunk kinds,
`[DONE]`, non-`data:` lines; for `/metrics` each family's name, type and help text.

Every difference fails the test unless `fidelity_allowlist.ALLOWED` lists it with a
reason; an allow-list entry that no longer matches a difference fails it too, so the list
stays true. Both sides run `--parallel 2 --ctx-size 4096` (n_ctx 2048 per slot).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gateway.sim.cluster import SimCluster
from gateway.sim.config import SimConfig

from .capture_golden import _merge as merge_shapes
from .capture_golden import capture_metrics, shape
from .fidelity_allowlist import ALLOWED
from .llamaserver import CTX_SIZE, PARALLEL, LlamaServer

pytestmark = [pytest.mark.engine]

HI = [{"role": "user", "content": "Say hi."}]
CHAT = {"messages": HI, "max_tokens": 8, "temperature": 0, "seed": 42}
BIG = [{"role": "user", "content": "hello " * 2100}]  # > 2048 tokens on both sides


@dataclass(frozen=True, slots=True)
class Probe:
    name: str
    method: str
    path: str
    body: Any = None
    raw: bytes | None = None
    sse: bool = False
    metrics: bool = False


PROBES = (
    Probe("health", "GET", "/health"),
    Probe("props", "GET", "/props"),
    Probe("slots_fresh", "GET", "/slots"),
    Probe("models", "GET", "/v1/models"),
    Probe("tokenize", "POST", "/tokenize", {"content": " hello world"}),
    Probe("tokenize_pieces", "POST", "/tokenize", {"content": " hello world", "with_pieces": True}),
    Probe("apply_template", "POST", "/apply-template", {"messages": HI}),
    Probe("chat", "POST", "/v1/chat/completions", CHAT),
    Probe(
        "chat_stream_usage",
        "POST",
        "/v1/chat/completions",
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        sse=True,
    ),
    Probe("chat_stream", "POST", "/v1/chat/completions", {**CHAT, "stream": True}, sse=True),
    Probe("chat_unknown_field", "POST", "/v1/chat/completions", {**CHAT, "frobnicate": {"x": 1}}),
    Probe("chat_id_slot_99", "POST", "/v1/chat/completions", {**CHAT, "id_slot": 99}),
    Probe(
        "completions",
        "POST",
        "/v1/completions",
        {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0},
    ),
    Probe("native", "POST", "/completion", {"prompt": "Once upon a time", "n_predict": 4}),
    Probe(
        "native_stream",
        "POST",
        "/completion",
        {"prompt": "Once upon a time", "n_predict": 4, "stream": True},
        sse=True,
    ),
    Probe("over_context", "POST", "/v1/chat/completions", {"messages": BIG, "max_tokens": 4}),
    Probe(
        "over_context_stream",
        "POST",
        "/v1/chat/completions",
        {"messages": BIG, "max_tokens": 4, "stream": True},
    ),
    Probe("bad_json", "POST", "/v1/chat/completions", raw=b'{"messages": [}'),
    Probe("messages_not_array", "POST", "/v1/chat/completions", {"messages": "nope"}),
    Probe("not_found", "GET", "/no/such/path"),
    Probe("slots_used", "GET", "/slots"),
    Probe("metrics", "GET", "/metrics", metrics=True),
)


# --------------------------------------------------------------------------- observe


def _media_type(r: httpx.Response) -> str:
    return str(r.headers.get("content-type", "")).split(";")[0].strip()


def _chunk_kind(chunk: dict[str, Any]) -> str:
    if "stop" in chunk and "choices" not in chunk:  # native /completion
        return "native_final" if chunk["stop"] else "native"
    if chunk.get("usage") is not None and not chunk.get("choices"):
        return "usage"
    choice = (chunk.get("choices") or [{}])[0]
    if choice.get("finish_reason") is not None:
        return "finish"
    if "role" in (choice.get("delta") or {}):
        return "role"
    return "content"


def _merge_shapes(a: Any, b: Any) -> Any:
    """Union of two shapes (as `shape()` merges list items)."""
    return b if a is None else merge_shapes(a, b)


def _observe_sse(r: httpx.Response) -> dict[str, Any]:
    data: list[str] = []
    other = 0
    for line in r.iter_lines():
        if line.startswith("data: "):
            data.append(line[len("data: ") :])
        elif line:
            other += 1
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    kinds: list[str] = []
    shapes: dict[str, Any] = {}
    for chunk in chunks:
        kind = _chunk_kind(chunk)
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
        shapes[kind] = _merge_shapes(shapes.get(kind), shape(chunk))
    return {
        "done_sent": "[DONE]" in data,
        "done_is_last": bool(data) and data[-1] == "[DONE]",
        "non_data_lines": other,
        "kinds": ",".join(kinds),
        "chunks": shapes,
    }


def facts(body: Any) -> dict[str, Any]:
    """Values the gateway relies on (error type and code, object, slot count and size)."""
    out: dict[str, Any] = {}
    if isinstance(body, list):
        return {"n_ctx": sorted({s.get("n_ctx") for s in body if isinstance(s, dict)})}
    if not isinstance(body, dict):
        return out
    err = body.get("error")
    if isinstance(err, dict):
        out.update(error_type=err.get("type"), error_code=err.get("code"))
    for key in ("object", "total_slots"):
        if key in body:
            out[key] = body[key]
    settings = body.get("default_generation_settings")
    if isinstance(settings, dict):
        out["n_ctx"] = settings.get("n_ctx")
    return out


def observe(url: str) -> dict[str, dict[str, Any]]:
    """Every probe against ``url``, in order (each SSE probe on a connection of its own)."""
    out: dict[str, dict[str, Any]] = {}
    with httpx.Client(base_url=url, timeout=60) as c:
        for p in PROBES:
            if p.sse:
                with (
                    httpx.Client(base_url=url, timeout=60) as own,
                    own.stream(p.method, p.path, json=p.body) as r,
                ):
                    obs = {"status": r.status_code, "media_type": _media_type(r)}
                    obs.update(_observe_sse(r))
            else:
                kw: dict[str, Any] = {}
                if p.raw is not None:
                    kw = {"content": p.raw, "headers": {"content-type": "application/json"}}
                elif p.body is not None:
                    kw = {"json": p.body}
                r = c.request(p.method, p.path, **kw)
                obs = {"status": r.status_code, "media_type": _media_type(r)}
                if p.metrics:
                    obs["families"] = {
                        f["name"]: f"{f.get('type')}: {f.get('help')}"
                        for f in capture_metrics(r.text)
                    }
                else:
                    try:
                        body = r.json()
                    except ValueError:
                        obs["shape"] = f"not JSON: {r.text[:60]!r}"
                    else:
                        obs["shape"] = shape(body)
                        obs["facts"] = facts(body)
            out[p.name] = obs
    return out


# --------------------------------------------------------------------------- compare


def differences(real: Any, sim: Any, where: str) -> Iterator[str]:
    """Stable, value-free descriptions of where ``sim`` differs from ``real``."""
    if isinstance(real, dict) and isinstance(sim, dict):
        for key in real.keys() - sim.keys():
            yield f"{where}.{key}: only in real"
        for key in sim.keys() - real.keys():
            yield f"{where}.{key}: only in sim"
        for key in sorted(real.keys() & sim.keys()):
            yield from differences(real[key], sim[key], f"{where}.{key}")
    elif isinstance(real, list) and isinstance(sim, list) and len(real) == len(sim) == 1:
        yield from differences(real[0], sim[0], f"{where}[]")
    elif real != sim:
        yield f"{where}: real {json.dumps(real)[:120]} != sim {json.dumps(sim)[:120]}"


@dataclass
class Comparison:
    found: list[str] = field(default_factory=list)

    def unexplained(self) -> list[str]:
        return [d for d in self.found if d not in ALLOWED]

    def stale(self) -> list[str]:
        return [d for d in ALLOWED if d not in self.found]


@pytest.fixture()
def sim_url() -> Iterator[str]:
    cfg = SimConfig(
        flavor="llamacpp", parallel=PARALLEL, kv_tokens=CTX_SIZE, max_model_len=8192, speed=50.0
    )
    with SimCluster([cfg]) as cluster:
        yield cluster.urls[0]


def test_simulator_matches_real_llama_server(
    start_llama_server: Callable[..., LlamaServer], sim_url: str
) -> None:
    real = observe(start_llama_server().url)  # private: fresh slots, no other traffic
    sim = observe(sim_url)
    cmp = Comparison(list(differences(real, sim, "")))
    unexplained, stale = cmp.unexplained(), cmp.stale()
    assert not unexplained and not stale, (
        "simulator (llama.cpp flavour) differs from llama-server b11434; fix gateway/sim or "
        "list the difference with a reason in tests/engine/fidelity_allowlist.py\n"
        + "".join(f"  unexplained: {d!r}\n" for d in unexplained)
        + "".join(f"  stale allow-list entry: {d!r}\n" for d in stale)
    )
