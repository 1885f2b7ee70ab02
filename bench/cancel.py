"""Cancellation latency: client close → engine abort, per stage and engine flavour.

A raw socket client closes its connection at a known wall instant; the
simulator records the engine-side abort (`abort_wall`). Stages:

- `streaming`: after a few SSE chunks;
- `generating_whole`: a non-streaming request while the engine generates;
- `waiting_first_byte`: a stream whose engine is paused (no first token yet);
- `queued`: a request held in the gateway's admission queue — the engine must
  never see it; the latency is to the gateway's cancellation counter.

Also records the KV blocks freed (pinned before the close minus after).
Writes bench/results/cancel.json and cancel.md. Loopback only; ~1 minute.

    python -m bench.cancel [--samples 20] [--speed 20]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config.schema import AdmissionConfig, ReplicaConfig
from gateway.sim.config import Flavor, SimConfig
from tests.gwharness import RunningGateway, running_gateway
from tests.rawhttp import RawRequest
from tests.simkit import Sims, chat_body, metric, metrics_when, running_sims, wait_for

RESULTS = Path(__file__).parent / "results"
URL = "/v1/chat/completions"
MAX_TOKENS = 8000
FLAVORS: tuple[Flavor, ...] = ("vllm", "llamacpp")


def _pinned(sims: Sims) -> int:
    return int(sims.stats()["totals"]["kv_blocks_pinned"])


def _abort_after(sims: Sims, req: RawRequest, before: int) -> tuple[float, int]:
    closed = req.close()
    rec = wait_for(lambda: [r for r in sims.records() if r["aborted"]], timeout=10)[0]
    wait_for(lambda: _pinned(sims) == 0, timeout=10)
    return rec["abort_wall"] - closed, before


def _streaming(gw: RunningGateway, sims: Sims) -> tuple[float, int]:
    req = RawRequest(gw.url + URL, chat_body(stream=True, max_tokens=MAX_TOKENS))
    req.read_until(b"data: ", count=5)
    return _abort_after(sims, req, _pinned(sims))


def _generating_whole(gw: RunningGateway, sims: Sims) -> tuple[float, int]:
    req = RawRequest(gw.url + URL, chat_body(stream=False, max_tokens=MAX_TOKENS))
    wait_for(lambda: [r for r in sims.records() if r["output_tokens"] >= 5])
    return _abort_after(sims, req, _pinned(sims))


def _waiting_first_byte(gw: RunningGateway, sims: Sims) -> tuple[float, int]:
    sims.fault(0, paused=True)  # accepted by the engine, no first token yet
    req = RawRequest(gw.url + URL, chat_body(stream=True, max_tokens=MAX_TOKENS))
    wait_for(lambda: sims.records())
    closed = req.close()
    rec = wait_for(lambda: [r for r in sims.records() if r["aborted"]], timeout=10)[0]
    sims.fault(0, clear=True)
    wait_for(lambda: _pinned(sims) == 0, timeout=10)
    return rec["abort_wall"] - closed, 0


def _queued(gw: RunningGateway, sims: Sims) -> tuple[float, int]:
    holder = RawRequest(gw.url + URL, chat_body(stream=True, max_tokens=MAX_TOKENS))
    holder.read_until(b"data: ", count=2)
    queued = RawRequest(gw.url + URL, chat_body(stream=False, max_tokens=10))
    metrics_when(gw, "gateway_in_flight_requests", 2)
    base = metric(gw.metrics_text(), "gateway_cancellations_total", stage="queued")
    closed = queued.close()
    metrics_when(gw, "gateway_cancellations_total", base + 1, timeout=10, stage="queued")
    latency = time.time() - closed  # upper bound: includes one metrics scrape
    if len(sims.records()) != 1:
        raise RuntimeError("the queued request reached the engine")
    holder.close()
    wait_for(lambda: _pinned(sims) == 0, timeout=10)
    return latency, 0


STAGES: dict[str, Callable[[RunningGateway, Sims], tuple[float, int]]] = {
    "streaming": _streaming,
    "generating_whole": _generating_whole,
    "waiting_first_byte": _waiting_first_byte,
    "queued": _queued,
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(flavor: Flavor, stage: str, samples: int, speed: float) -> dict[str, Any]:
    cfg = SimConfig(flavor=flavor, speed=speed, kv_tokens=65536, parallel=4)
    admission = AdmissionConfig(max_in_flight=1) if stage == "queued" else AdmissionConfig()
    latencies: list[float] = []
    freed: list[int] = []
    with (
        running_sims([cfg]) as sims,
        running_gateway([ReplicaConfig(url=sims.urls[0], kind=flavor)], admission=admission) as gw,
    ):
        for _ in range(samples):
            sims.reset()
            latency, blocks = STAGES[stage](gw, sims)
            latencies.append(latency)
            freed.append(blocks)
    ms = [x * 1000 for x in latencies]
    return {
        "flavor": flavor,
        "stage": stage,
        "n": samples,
        "p50_ms": round(_pct(ms, 0.5), 2),
        "p99_ms": round(_pct(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "kv_blocks_freed_mean": statistics.fmean(freed),
    }


def markdown(rows: list[dict[str, Any]], speed: float) -> str:
    lines = [
        "# Cancellation latency: client close → engine abort",
        "",
        (
            f"Simulator speed {speed:g}x (llama.cpp's 1 s disconnect poll is {1000 / speed:.0f} "
            "ms here). "
            "`queued`: time until the gateway counted the cancellation; the engine never saw the "
            "request."
        ),
        "",
        "| flavour | stage | n | p50 ms | p99 ms | max ms | KV blocks freed (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['flavor']} | {r['stage']} | {r['n']} | {r['p50_ms']} | {r['p99_ms']} | "
        f"{r['max_ms']} | "
        f"{r['kv_blocks_freed_mean']:.1f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def _manifest(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "samples": args.samples,
        "speed": args.speed,
        "max_tokens": MAX_TOKENS,
        "versions": {p: importlib.metadata.version(p) for p in ("aiohttp", "uvicorn", "starlette")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--speed", type=float, default=20.0)
    args = parser.parse_args()
    rows = [run(flavor, stage, args.samples, args.speed) for flavor in FLAVORS for stage in STAGES]
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"manifest": _manifest(args), "rows": rows}
    (RESULTS / "cancel.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "cancel.md").write_text(markdown(rows, args.speed))
    print(markdown(rows, args.speed))


if __name__ == "__main__":
    main()
