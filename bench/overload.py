"""Overload benchmark: KV-headroom admission on vs off, offered load 0.5x to 3x capacity.

    .venv/bin/python -m bench.overload [--quick] [--speed 5] [--seconds 8]

Two simulated vLLM replicas (`gateway.sim` in its own process, accelerated
`--speed` times) behind a real gateway on loopback (gateway and load
generator share this process). Open-loop Poisson arrivals of three task classes
(selected with `X-Task`, policies written to a temp dir):

    class        share  prompt  output  TTFT target (simulated s)
    interactive   40 %    1000     128    2
    standard      40 %    3000     256   10
    batch         20 %    6000     512   60

Every request carries a deadline (`X-Request-Timeout`, 60 simulated s) and
streams, so TTFT is measured at the client (first SSE chunk). Times are
reported in *simulated* seconds (wall x speed) so they read like a real GPU.
Capacity (requests/s) is estimated from the simulator's time model: the
requests that fit in the KV pools at the standard watermark, divided by the
mean service time. Each (mode, load) run uses a fresh gateway and a reset
simulator (cold prefix cache: prompts are all distinct).

Output: bench/results/overload.json, overload.md, overload.png (needs
matplotlib: `pip install -e '.[bench]'`; skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.loadgen import percentile
from bench.procs import Proc, wait_http_ok
from gateway.config.schema import AdmissionConfig, TimeoutsConfig
from gateway.http.serving import free_port
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, running_gateway

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Cls:
    name: str
    share: float
    prompt: int
    output: int
    ttft_target: float  # simulated seconds


CLASSES = (
    Cls("interactive", 0.4, 1000, 128, 2.0),
    Cls("standard", 0.4, 3000, 256, 10.0),
    Cls("batch", 0.2, 6000, 512, 60.0),
)
DEADLINE_SIM_S = 60.0
REPLICAS = 2


@dataclass
class Outcome:
    cls: str
    status: int
    reason: str | None
    ttft: float | None  # wall seconds
    done: bool


def _sim(speed: float) -> SimConfig:
    return SimConfig(speed=speed, kv_tokens=32768, max_model_len=16384, max_num_seqs=64)


def capacity_rps(sim: SimConfig) -> float:
    """Requests per simulated second the replicas sustain (KV-bound), from the time model."""
    mean_kv = sum(c.share * (c.prompt + c.output) for c in CLASSES)
    fit = REPLICAS * 0.85 * sim.kv_tokens / mean_kv
    batch = fit / REPLICAS
    step = sim.step_base_s + sim.decode_seq_s * batch
    service = sum(c.share * (c.prompt * sim.prefill_token_s + c.output * step) for c in CLASSES)
    return fit / service


def _words(n: int, rng: random.Random) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=3)) for _ in range(n))


async def _one(
    session: aiohttp.ClientSession, url: str, cls: Cls, rng: random.Random, speed: float
) -> Outcome:
    body = {
        "model": "sim-model",
        "stream": True,
        "max_tokens": cls.output,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": _words(cls.prompt, rng)}],
    }
    headers = {"x-task": cls.name, "x-request-timeout": f"{DEADLINE_SIM_S / speed:.3f}"}
    t0 = time.monotonic()
    ttft = None
    async with session.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            await resp.read()
            return Outcome(
                cls.name, resp.status, resp.headers.get("x-gateway-reject-reason"), None, False
            )
        done = False
        async for chunk in resp.content.iter_any():
            if ttft is None and b'"content"' in chunk:
                ttft = time.monotonic() - t0
            done = done or b"[DONE]" in chunk
        errored = ttft is None or not done
        return Outcome(cls.name, 200, "stream_error" if errored else None, ttft, not errored)


async def _drive(
    gw: RunningGateway, rate_wall: float, seconds: float, speed: float, seed: int
) -> list[Outcome]:
    rng = random.Random(seed)
    url = gw.url + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=DEADLINE_SIM_S / speed + 30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks: list[asyncio.Task[Outcome]] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            cls = rng.choices(CLASSES, weights=[c.share for c in CLASSES])[0]
            tasks.append(
                asyncio.ensure_future(_one(session, url, cls, random.Random(rng.random()), speed))
            )
            await asyncio.sleep(rng.expovariate(rate_wall))
        return list(await asyncio.gather(*tasks))


def _policies(directory: Path) -> None:
    lines = [f"- {{name: {c.name}, priority: {c.name}}}" for c in CLASSES]
    (directory / "tasks.yaml").write_text("\n".join(lines) + "\n")


class SimProcess:
    """`python -m gateway.sim` with REPLICAS replicas on consecutive loopback ports."""

    def __init__(self, sim: SimConfig, log_dir: Path) -> None:
        self.port = free_port()
        while free_port() == self.port + 1:  # the next port must be free too (best effort)
            self.port = free_port()
        argv = [
            sys.executable,
            "-m",
            "gateway.sim",
            "--replicas",
            str(REPLICAS),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--speed",
            str(sim.speed),
            "--kv-tokens",
            str(sim.kv_tokens),
            "--max-model-len",
            str(sim.max_model_len),
            "--max-num-seqs",
            str(sim.max_num_seqs),
            "--log-level",
            "warning",
        ]
        self.proc = Proc("sim", argv, log_dir / "sim.log")
        self.urls = [f"http://127.0.0.1:{self.port + i}" for i in range(REPLICAS)]

    def stats(self, i: int) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.urls[i] + "/sim/stats", timeout=30).json()
        return data

    def reset(self) -> None:
        for url in self.urls:
            httpx.post(url + "/sim/reset", json={}, timeout=30).raise_for_status()


@contextmanager
def sim_process(sim: SimConfig, log_dir: Path) -> Iterator[SimProcess]:
    sp = SimProcess(sim, log_dir)
    sp.proc.start(Path(__file__).resolve().parent.parent)
    try:
        for url in sp.urls:
            wait_http_ok(url + "/health", sp.proc, 30.0)
        yield sp
    finally:
        sp.proc.stop()


def run_one(
    cluster: SimProcess,
    policies: str,
    enabled: bool,
    load: float,
    cap_sim: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    speed = args.speed
    cluster.reset()
    adm = AdmissionConfig(
        enabled=enabled,
        poll_interval_s=0.05,
        stale_after_s=1.0,
        ttft_targets_s={c.name: c.ttft_target / speed for c in CLASSES},
        default_prefill_tokens_per_s=16000.0 * speed,
    )
    timeouts = TimeoutsConfig(
        first_byte_s=DEADLINE_SIM_S / speed + 5, total_s=DEADLINE_SIM_S / speed + 5
    )
    with running_gateway(cluster.urls, admission=adm, policies=policies, timeouts=timeouts) as gw:
        _wait_ready(gw)
        t0 = time.monotonic()
        outcomes = asyncio.run(
            _drive(gw, load * cap_sim * speed, args.seconds, speed, seed=int(load * 100))
        )
        wall = time.monotonic() - t0
    preemptions = sum(cluster.stats(i)["totals"]["preemptions"] for i in range(REPLICAS))
    return _summarise(outcomes, enabled, load, args.seconds, wall, speed, preemptions)


def _wait_ready(gw: RunningGateway) -> None:
    for _ in range(500):
        if all(r["healthy"] and r["live"] and r["live"]["capacity_tokens"] for r in gw.replicas()):
            return
        time.sleep(0.02)
    raise RuntimeError("replicas did not become ready")


def _summarise(
    outcomes: list[Outcome],
    enabled: bool,
    load: float,
    seconds: float,
    wall: float,
    speed: float,
    preemptions: int,
) -> dict[str, Any]:
    targets = {c.name: c.ttft_target for c in CLASSES}
    good = [
        o for o in outcomes if o.done and o.ttft is not None and o.ttft * speed <= targets[o.cls]
    ]
    reasons: dict[str, int] = {}
    for o in outcomes:
        if not o.done:
            key = o.reason or f"http_{o.status}"
            reasons[key] = reasons.get(key, 0) + 1
    by_class = {}
    for c in CLASSES:
        ttfts = sorted(
            o.ttft * speed for o in outcomes if o.cls == c.name and o.done and o.ttft is not None
        )
        n = sum(1 for o in outcomes if o.cls == c.name)
        by_class[c.name] = {
            "offered": n,
            "completed": len(ttfts),
            "met_target": sum(1 for o in good if o.cls == c.name),
            "ttft_p50_s": _round(percentile(ttfts, 50)),
            "ttft_p99_s": _round(percentile(ttfts, 99)),
        }
    sim_seconds = seconds * speed
    return {
        "admission": "on" if enabled else "off",
        "load": load,
        "offered": len(outcomes),
        "completed": sum(1 for o in outcomes if o.done),
        "goodput_per_sim_s": round(len(good) / sim_seconds, 3),
        "preemptions": preemptions,
        "rejections": reasons,
        "by_class": by_class,
        "wall_s": round(wall, 1),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [
        f"# Overload: admission on vs off ({meta['replicas']} simulated vLLM replicas, speed "
        f"{meta['speed']})",
        "",
        (
            f"Capacity estimate: {meta['capacity_rps_sim']:.2f} requests per simulated second. "
            "TTFT in simulated seconds; goodput = requests meeting their class TTFT target per "
            "simulated second."
        ),
        "",
        "| load | admission | offered | completed | goodput/s | preemptions | rejections | "
        + " | ".join(f"{c.name} p50/p99 TTFT" for c in CLASSES)
        + " |",
        "|---:|:---:|---:|---:|---:|---:|:---|" + "---:|" * len(CLASSES),
    ]
    for r in rows:
        rej = ", ".join(f"{k}: {v}" for k, v in sorted(r["rejections"].items())) or "-"
        ttft = " | ".join(
            f"{r['by_class'][c.name]['ttft_p50_s']} / {r['by_class'][c.name]['ttft_p99_s']}"
            for c in CLASSES
        )
        out.append(
            f"| {r['load']}x | {r['admission']} | {r['offered']} | {r['completed']} | "
            f"{r['goodput_per_sim_s']} | {r['preemptions']} | {rej} | {ttft} |"
        )
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib  # bench-only optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for mode in ("off", "on"):
        sel = [r for r in rows if r["admission"] == mode]
        loads = [r["load"] for r in sel]
        axes[0].plot(
            loads, [r["goodput_per_sim_s"] for r in sel], marker="o", label=f"admission {mode}"
        )
        axes[1].plot(loads, [r["preemptions"] for r in sel], marker="o", label=f"admission {mode}")
        p99 = [r["by_class"]["interactive"]["ttft_p99_s"] or float("nan") for r in sel]
        axes[2].plot(loads, p99, marker="o", label=f"admission {mode}")
    for ax, title in zip(
        axes, ("goodput (req/sim s)", "preemptions", "interactive p99 TTFT (sim s)"), strict=True
    ):
        ax.set_title(title)
        ax.set_xlabel("offered load (x capacity)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--speed", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=8.0, help="wall seconds of arrivals per run")
    ap.add_argument("--quick", action="store_true", help="loads 1x and 3x only, 4 s each")
    args = ap.parse_args()
    loads = [1.0, 3.0] if args.quick else [0.5, 1.0, 1.5, 2.0, 3.0]
    if args.quick:
        args.seconds = 4.0
    sim = _sim(args.speed)
    cap = capacity_rps(sim)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, sim_process(sim, Path(tmp)) as cluster:
        _policies(Path(tmp))
        for load in loads:
            for enabled in (False, True):
                row = run_one(cluster, tmp, enabled, load, cap, args)
                print(json.dumps(row))
                rows.append(row)
    meta = {
        "replicas": REPLICAS,
        "speed": args.speed,
        "seconds": args.seconds,
        "capacity_rps_sim": cap,
        "classes": [c.__dict__ for c in CLASSES],
        "sim": {"kv_tokens": sim.kv_tokens, "max_num_seqs": sim.max_num_seqs},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "overload.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (RESULTS / "overload.md").write_text(markdown(rows, meta))
    if not plot(rows, RESULTS / "overload.png"):
        print("matplotlib not installed: no PNG (pip install -e '.[bench]')")
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
