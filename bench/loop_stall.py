"""Does one request stall the others? `/healthz` latency while huge prompts arrive.

The gateway (`gateway serve`, the repository's `policies/`) runs in its own
process in front of one simulated vLLM replica (`gateway.sim`, another
process). This process probes the gateway's `/healthz` every `--probe-ms`
and sends a stream of normal chat requests (`--normal-rps`) throughout;
in each of `--rounds` rounds it sends `--big` huge bodies at once, each
about `--mb` MB, and waits for their answers. Three shapes of huge body
(issue 19 item 2): one user message of ~30 MB of text (`prompt`), ~1M tiny
messages (`messages`) and ~1M tiny text parts in one message (`parts`).
The huge bodies go out from worker threads (blocking sockets release the
GIL), so sending them does not delay this process's own probes.

Reports, per shape, the probes' latency p50 / p99 / max during the rounds,
the huge requests' statuses and times, and the normal requests' statuses and
latency, and the gateway's RSS before the rounds and `--settle-s` after each
shape. Writes `bench/results/loop_stall.{json,md}`.

    .venv/bin/python -m bench.loop_stall            # ~1 min
    .venv/bin/python -m bench.loop_stall --shapes prompt --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.manifest import ROOT, _cpu_model, _git
from bench.paths import repo_relative
from bench.procs import Proc, wait_http_ok
from gateway.http.serving import free_port

SHAPES = ("prompt", "messages", "parts")
WORDS = ("alpha", "Beta", "gamma", "delta,", "eps123", "zeta.", "the", "of", "lighthouse")
NORMAL = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Tell me about lighthouses."}],
    "max_tokens": 8,
}


def huge_body(shape: str, size: int) -> bytes:
    """A chat body of about `size` bytes in the given shape."""
    if shape == "prompt":
        text = " ".join(WORDS[i % len(WORDS)] for i in range(size // 6))[:size]
        messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    elif shape == "messages":
        messages = [{"role": "user", "content": "hi"}] * (size // 34)
    else:
        parts = [{"type": "text", "text": "hi"}] * (size // 32)
        messages = [{"role": "user", "content": parts}]
    return json.dumps({"model": "sim-model", "messages": messages, "max_tokens": 8}).encode()


@dataclass
class Round:
    probes: list[float] = field(default_factory=list)
    big: list[tuple[int, float]] = field(default_factory=list)
    normal: list[tuple[int, float]] = field(default_factory=list)


def _post_blocking(port: int, body: bytes, timeout: float) -> tuple[int, float]:
    """POST a huge body from a worker thread; (status, seconds) (status 0: no answer)."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.monotonic() - t0
    except OSError:
        return 0, time.monotonic() - t0
    finally:
        conn.close()


async def _probe(
    client: httpx.AsyncClient, out: list[float], stop: asyncio.Event, gap: float
) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            resp = await client.get("/healthz", timeout=30)
            ok = resp.status_code == 200
        except httpx.HTTPError:
            ok = False
        out.append(time.monotonic() - t0 if ok else float("inf"))
        await asyncio.sleep(gap)


async def _normal_one(client: httpx.AsyncClient, out: list[tuple[int, float]]) -> None:
    t0 = time.monotonic()
    try:
        resp = await client.post("/v1/chat/completions", json=NORMAL, timeout=30)
        out.append((resp.status_code, time.monotonic() - t0))
    except httpx.HTTPError:
        out.append((0, time.monotonic() - t0))


async def _normals(
    client: httpx.AsyncClient, out: list[tuple[int, float]], stop: asyncio.Event, rps: float
) -> None:
    tasks: list[asyncio.Task[None]] = []
    while not stop.is_set() and len(tasks) < 100_000:
        tasks.append(asyncio.create_task(_normal_one(client, out)))
        await asyncio.sleep(1.0 / rps)
    await asyncio.gather(*tasks)


async def run_round(url: str, port: int, body: bytes, args: argparse.Namespace) -> Round:
    rnd = Round()
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=200)
    async with (
        httpx.AsyncClient(base_url=url, limits=limits) as probes,
        httpx.AsyncClient(base_url=url, limits=limits) as normals,
    ):
        background = [
            asyncio.create_task(_probe(probes, rnd.probes, stop, args.probe_ms / 1000)),
            asyncio.create_task(_normals(normals, rnd.normal, stop, args.normal_rps)),
        ]
        await asyncio.sleep(0.5)
        sends = [asyncio.to_thread(_post_blocking, port, body, 120.0) for _ in range(args.big)]
        rnd.big = list(await asyncio.gather(*sends))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*background)
    return rnd


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarise(shape: str, rounds: list[Round], size: int) -> dict[str, Any]:
    probes = [p for r in rounds for p in r.probes]
    big = [b for r in rounds for b in r.big]
    normal = [n for r in rounds for n in r.normal]
    answered = [p for p in probes if p != float("inf")]
    ok_normal = [t for s, t in normal if s == 200]
    return {
        "shape": shape,
        "body_bytes": size,
        "probes": len(probes),
        "probes_failed": len(probes) - len(answered),
        "healthz_p50_ms": round(_pct(answered, 0.50) * 1000, 1),
        "healthz_p99_ms": round(_pct(answered, 0.99) * 1000, 1),
        "healthz_max_ms": round(max(answered, default=float("nan")) * 1000, 1),
        "big_statuses": sorted({s for s, _ in big}),
        "big_max_s": round(max((t for _, t in big), default=float("nan")), 2),
        "normal_requests": len(normal),
        "normal_statuses": {str(s): sum(1 for x, _ in normal if x == s) for s, _ in normal},
        "normal_p50_ms": round(statistics.median(ok_normal) * 1000, 1) if ok_normal else None,
        "normal_max_ms": round(max(ok_normal) * 1000, 1) if ok_normal else None,
    }


@contextmanager
def servers(logs: Path, tree: Path) -> Iterator[tuple[str, int, int]]:
    sim_port, port, admin = free_port(), free_port(), free_port()
    py = sys.executable
    sim = Proc(
        "sim",
        [
            py,
            "-m",
            "gateway.sim",
            "--port",
            str(sim_port),
            "--speed",
            "50",
            "--log-level",
            "warning",
        ],
        logs / "sim.log",
    )
    gw = Proc(
        "gateway",
        [
            py,
            "-m",
            "gateway",
            "serve",
            "--replica",
            f"vllm=http://127.0.0.1:{sim_port}",
            "--port",
            str(port),
            "--admin-port",
            str(admin),
            "--policies",
            str(ROOT / "policies"),
        ],
        logs / "gateway.log",
    )
    with ExitStack() as stack:
        sim.start(ROOT)
        stack.callback(sim.stop)
        gw.start(tree)  # `python -m gateway` imports the gateway from its working directory
        stack.callback(gw.stop)
        wait_http_ok(f"http://127.0.0.1:{sim_port}/health", sim, 30)
        wait_http_ok(f"http://127.0.0.1:{port}/readyz", gw, 30)
        yield f"http://127.0.0.1:{port}", port, gw.pid


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid`, MB (Linux `/proc`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# /healthz under huge prompts (bench/loop_stall.py)",
        "",
        f"{meta['date']}, commit {meta['git_commit']} ({meta['git_dirty_files']} files changed), "
        f"{meta['cpu_model']}, load before {meta['loadavg_before']}. {meta['big']} huge bodies "
        f"of ~{meta['mb']} MB at once, {meta['rounds']} rounds per shape; `/healthz` probed every "
        f"{meta['probe_ms']} ms; {meta['normal_rps']} normal requests/s throughout.",
        "",
        "| shape | probes (failed) | healthz p50 ms | p99 ms | max ms | huge: statuses, slowest s "
        "| normal: count, statuses, p50 ms, max ms | RSS MB: baseline, after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['shape']} | {r['probes']} ({r['probes_failed']}) | {r['healthz_p50_ms']} | "
            f"{r['healthz_p99_ms']} | {r['healthz_max_ms']} | "
            f"{r['big_statuses']}, {r['big_max_s']} | "
            f"{r['normal_requests']}, {r['normal_statuses']}, {r['normal_p50_ms']}, "
            f"{r['normal_max_ms']} | {r.get('rss_baseline_mb')}, {r.get('rss_after_mb')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=30.0, help="size of each huge body, MB")
    p.add_argument("--big", type=int, default=4, help="huge bodies sent at once")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--probe-ms", type=float, default=10.0)
    p.add_argument("--normal-rps", type=float, default=20.0)
    p.add_argument(
        "--settle-s", type=float, default=3.0, help="wait after each shape before reading RSS"
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--name", default="loop_stall", help="file name of the results")
    p.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="source tree the gateway runs from (e.g. `git archive` of an older commit)",
    )
    args = p.parse_args()
    import datetime
    import os

    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": _git(ROOT, "rev-parse", "--short", "HEAD"),
        "git_dirty_files": len((_git(ROOT, "status", "--porcelain") or "").splitlines()),
        "cpu_model": _cpu_model(),
        "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    results = []
    with (
        tempfile.TemporaryDirectory() as logs,
        servers(Path(logs), args.tree) as (url, port, pid),
    ):
        asyncio.run(run_round(url, port, huge_body("prompt", 1000), args))  # warm up
        baseline = rss_mb(pid)
        for shape in args.shapes.split(","):
            body = huge_body(shape, int(args.mb * 1_000_000))
            rounds = [asyncio.run(run_round(url, port, body, args)) for _ in range(args.rounds)]
            results.append(summarise(shape, rounds, len(body)))
            time.sleep(args.settle_s)  # the gateway gives memory back a little after
            results[-1].update(rss_baseline_mb=baseline, rss_after_mb=rss_mb(pid))
            print(json.dumps(results[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta, results = repo_relative(meta), repo_relative(results)
    (args.out / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n"
    )
    (args.out / f"{args.name}.md").write_text(markdown(results, meta))


if __name__ == "__main__":
    main()
