"""The committed golden file still matches the real server, and queueing facts hold.

``golden/llamacpp_b11434.json`` is what the simulator copies; if this test fails after an
engine upgrade, regenerate it (``python -m tests.engine.capture_golden``), review the
diff and update ``golden/NOTES.md``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from .capture_golden import GOLDEN_PATH, capture
from .llamaserver import PARALLEL

pytestmark = [pytest.mark.engine]

# Entries that depend on server flags, history or timing rather than on the engine build.
NOT_COMPARED = {
    "_meta",
    "health_loading",  # only when the capture starts its own server
    "slots_fresh_or_idle",  # a used slot keeps id_task, n_prompt_tokens, params, next_token
    "slots_erase_action",  # 501 without --slot-save-path; the fixtures pass one
    "saturated",
    "metrics_values_after_capture",
}
COMPARED_FIELDS = ("status", "content_type", "shape", "done_sent", "done_is_last")


def _diff(golden: Any, live: Any, where: str, problems: list[str]) -> None:
    """Leaf-level differences between two JSON values."""
    if isinstance(golden, dict) and isinstance(live, dict):
        for key in golden.keys() - live.keys():
            problems.append(f"{where}.{key}: only in golden")
        for key in live.keys() - golden.keys():
            problems.append(f"{where}.{key}: only in live ({json.dumps(live[key])[:80]})")
        for key in golden.keys() & live.keys():
            _diff(golden[key], live[key], f"{where}.{key}", problems)
    elif isinstance(golden, list) and isinstance(live, list) and len(golden) == len(live):
        for i, (g, v) in enumerate(zip(golden, live, strict=True)):
            _diff(g, v, f"{where}[{i}]", problems)
    elif golden != live:
        problems.append(
            f"{where}: golden {json.dumps(golden)[:80]} != live {json.dumps(live)[:80]}"
        )


def _compare(golden: Any, live: Any, where: str, problems: list[str]) -> None:
    if not isinstance(golden, dict):
        return
    for key, g in golden.items():
        path = f"{where}.{key}"
        if key in ("request", "example"):
            continue
        if key not in live:
            problems.append(f"{path}: missing in live capture")
        elif key in COMPARED_FIELDS:
            _diff(g, live[key], path, problems)
        elif key == "families":
            want = {(f["name"], f.get("type")) for f in g}
            have = {(f["name"], f.get("type")) for f in live[key]}
            if want != have:
                problems.append(f"{path}: golden-only {want - have}, live-only {have - want}")
        else:
            _compare(g, live[key], path, problems)


def test_golden_file_matches_live_server(
    llama_server: str, llama_reset: Callable[..., None]
) -> None:
    golden = json.loads(GOLDEN_PATH.read_text())
    live = capture(llama_server, saturation=False)
    problems: list[str] = []
    for name, entry in golden.items():
        if name in NOT_COMPARED:
            continue
        if name not in live:
            problems.append(f"{name}: not captured live")
            continue
        _compare(entry, live[name], name, problems)
    assert not problems, (
        "llama-server responses differ from golden/llamacpp_b11434.json "
        "(regenerate with `python -m tests.engine.capture_golden` and review):\n"
        + "\n".join(problems)
    )


def test_queueing_when_all_slots_busy(
    llama_servers: list[str], llama_reset: Callable[..., None]
) -> None:
    """Busy slots: extra requests are deferred (never 429/503) and the over-context check
    only happens once a slot picks the task up."""
    url = llama_servers[1]
    long = {"prompt": "Once upon a time", "n_predict": 96, "ignore_eos": True}
    big = {"messages": [{"role": "user", "content": "hello " * 2100}], "max_tokens": 4}
    results: dict[str, tuple[int, float]] = {}

    def post(name: str, path: str, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            t0 = time.monotonic()
            r = c.post(path, json=body)
            results[name] = (r.status_code, time.monotonic() - t0)

    busy = [
        threading.Thread(target=post, args=(f"long{i}", "/completion", long))
        for i in range(PARALLEL)
    ]
    for t in busy:
        t.start()
    extra: list[threading.Thread] = []
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            for _ in range(500):
                if all(s["is_processing"] for s in c.get("/slots").json()):
                    break
                time.sleep(0.01)
            else:
                pytest.fail("slots never all busy")
            extra = [
                threading.Thread(target=post, args=("over", "/v1/chat/completions", big)),
                threading.Thread(
                    target=post, args=("small", "/completion", {"prompt": "Hi", "n_predict": 1})
                ),
            ]
            for t in extra:
                t.start()
            metrics: dict[str, float] = {}
            for _ in range(200):
                metrics = {
                    line.split(" ")[0]: float(line.split(" ")[1])
                    for line in c.get("/metrics").text.splitlines()
                    if line.startswith("llamacpp:requests_")
                }
                if metrics["llamacpp:requests_deferred"] >= 2:
                    break
                time.sleep(0.01)
            health = c.get("/health")
    finally:
        for t in [*busy, *extra]:
            t.join(120)
    assert metrics["llamacpp:requests_processing"] == PARALLEL
    assert metrics["llamacpp:requests_deferred"] == 2
    assert health.status_code == 200  # /health says nothing about load
    slot_busy_s = min(results[f"long{i}"][1] for i in range(PARALLEL))
    assert results["small"][0] == 200
    assert results["over"][0] == 400
    assert results["over"][1] > 0.5 * slot_busy_s, (results, slot_busy_s)
