"""During a drain (SIGTERM to a real `gateway serve` process) the admin
listener keeps answering: `/metrics` is scrapeable until the public side
has drained; then the process exits 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.sim import SimCluster, SimConfig
from tests.fleet import GatewayProcess

GRACE_S = 2.0


def _stream(url: str, seen: threading.Event, out: dict[str, Any]) -> None:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "drain " * 20}],
        "max_tokens": 2000,  # ~60 s at half speed: still running when the grace ends
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            for chunk in r.iter_text():
                out["text"] = out.get("text", "") + chunk
                seen.set()
    except httpx.HTTPError as exc:
        out["error"] = exc
    finally:
        seen.set()


def test_metrics_stay_scrapeable_until_the_public_side_has_drained(tmp_path: Path) -> None:
    with (
        SimCluster([SimConfig(speed=0.5)]) as sims,
        GatewayProcess(
            {
                "replicas": [{"name": "sim-0", "url": sims.urls[0], "kind": "vllm"}],
                "listen": {"graceful_timeout_s": GRACE_S},
            },
            tmp_path,
        ) as gw,
    ):
        seen, out = threading.Event(), {}
        caller = threading.Thread(target=_stream, args=(gw.url, seen, out), daemon=True)
        caller.start()
        assert seen.wait(20)
        assert gw.proc is not None
        sent = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        scrapes: list[tuple[float, int]] = []
        for _ in range(200):  # bounded: ~0.1 s apart, the grace is 2 s
            if gw.proc.poll() is not None:
                break
            try:
                metrics = httpx.get(gw.admin_url + "/metrics", timeout=2).status_code
            except httpx.TransportError:
                metrics = 0
            scrapes.append((time.monotonic() - sent, metrics))
            time.sleep(0.1)
        assert gw.proc.wait(timeout=20) == 0
        caller.join(10)
        # the stream ran through the whole grace period, and the admin side answered
        # throughout it: every scrape before the grace ended got its metrics
        during = [s for s in scrapes if s[0] < GRACE_S]
        assert len(during) >= 5, scrapes
        assert all(m == 200 for _, m in during), scrapes
        assert "shutting_down" in out.get("text", ""), out
        assert "Traceback" not in gw.log()
