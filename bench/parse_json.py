"""JSON parsers for request bodies: stdlib `json` (as the gateway uses it),
orjson and msgspec, each with what it takes to enforce the gateway's ingress
limits, side by side in one process.

    .venv/bin/pip install orjson msgspec     # benchmark-only, not dependencies
    .venv/bin/python -m bench.parse_json [--quick] [--out bench/results]

Bodies: the ~400 KB agent request of `bench/loadgen.py`, and two 30 MB bodies
of `bench/loop_stall.py` (one long user message; ~900k tiny messages).
Timed in this thread's CPU time; each repeat runs every variant once, in
rotating order, and the median of the repeats is reported, so a burst of
other work on the machine lands on every variant alike.

The limits (`gateway/ingress/jsonbody.py`): nesting depth ≤ 64, integers ≤ 100
digits, finite numbers, valid UTF-8 and no lone surrogates; and whether the
bytes mean exactly the parsed object (no repeated key, no BOM), which decides
whether the client's bytes may be forwarded as they are. The hostile inputs
of `tests/ingress/test_hostile_json.py` are run through every variant: which
refuses what on its own, and which variant agrees with the gateway on all.

Writes `parse-json.{json,md}` to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.loadgen import agent_body
from bench.loop_stall import huge_body
from bench.parse_json_cases import HOSTILE, Case, no_bom, run_cases, walked
from bench.parse_json_report import markdown
from gateway.http.serving import tune_gc
from gateway.ingress import jsonbody, protocol

ROOT = Path(__file__).resolve().parent.parent
Parse = Callable[[bytes], object]


def _parsers() -> dict[str, Parse]:
    """Every variant: bytes → the parsed object, raising on a refused body."""
    try:
        import msgspec
        import orjson
    except ImportError as exc:
        raise SystemExit(
            "bench.parse_json needs orjson and msgspec: "
            f".venv/bin/pip install orjson msgspec ({exc})"
        ) from None
    decoder = msgspec.json.Decoder()
    return {
        "stdlib json.loads (no limits)": json.loads,
        "stdlib, gateway today (decode + pairs hook + surrogate scan + walk)": (
            protocol.parse_json_document
        ),
        "orjson.loads (no limits)": orjson.loads,
        "orjson + depth walk": lambda raw: _marked(raw, walked(orjson.loads(no_bom(raw)), False)),
        "msgspec decode (no limits)": decoder.decode,
        "msgspec + depth/int walk": lambda raw: _marked(
            raw, walked(decoder.decode(no_bom(raw)), True)
        ),
    }


def _marked(raw: bytes, data: object) -> tuple[object, bool]:
    """(object, forwardable) as the gateway's parse returns it: a BOM is seen in
    the bytes; a repeated key is not (neither parser reports one)."""
    return data, not raw.startswith(b"\xef\xbb\xbf")


def _limits_walk_only() -> dict[str, Callable[[object], object]]:
    """The walks alone, and re-encoding, on an already parsed body."""
    import msgspec
    import orjson

    def gateway_walk(data: object) -> object:
        assert isinstance(data, dict)
        for key, value in data.items():
            jsonbody._check_json_value(key, value, 2, False)
        return data

    return {
        "gateway walk (depth, ints, finite; no surrogates)": gateway_walk,
        "depth walk": lambda d: walked(d, False),
        "depth + int walk": lambda d: walked(d, True),
        "re-encode: json.dumps (the gateway's rawbody.encode)": _stdlib_encode,
        "re-encode: orjson.dumps": orjson.dumps,
        "re-encode: msgspec.json.encode": msgspec.json.encode,
    }


def _stdlib_encode(data: object) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _bound(fn: Callable[[Any], object], arg: Any) -> Callable[[], object]:
    return lambda: fn(arg)


def _cpu_us(fn: Callable[[], object]) -> float:
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1e6


def time_body(raw: bytes, repeats: int) -> dict[str, Any]:
    parsers = _parsers()
    walks = _limits_walk_only()
    parsed = json.loads(raw)
    samples: dict[str, list[float]] = {name: [] for name in [*parsers, *walks]}
    names = list(samples)
    calls: dict[str, Callable[[], object]] = {
        **{name: _bound(p, raw) for name, p in parsers.items()},
        **{name: _bound(w, parsed) for name, w in walks.items()},
    }
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_cpu_us(calls[name]))
    medians = {name: statistics.median(v) for name, v in samples.items()}
    base = medians["stdlib, gateway today (decode + pairs hook + surrogate scan + walk)"]
    return {
        "bytes": len(raw),
        "repeats": repeats,
        "median_us": medians,
        "samples_us": samples,
        "vs_gateway_today": {name: us / base for name, us in medians.items()},
    }


def _bodies(quick: bool) -> dict[str, tuple[bytes, int]]:
    big = 30_000_000
    return {
        "agent-400KB": (agent_body(), 9 if quick else 31),
        "prompt-30MB (one long message)": (huge_body("prompt", big), 1 if quick else 3),
        "messages-30MB (~900k tiny messages)": (huge_body("messages", big), 1 if quick else 3),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    args = p.parse_args(argv)
    tune_gc()  # as `gateway serve` runs
    parsers = _parsers()
    cases: list[Case] = HOSTILE
    data: dict[str, Any] = {
        "manifest": {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(),
            "nproc": os.cpu_count(),
            "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "versions": _versions(),
            "command": "python -m bench.parse_json" + (" --quick" if args.quick else ""),
        },
        "hostile": run_cases(parsers, cases),
        "timings": {name: time_body(raw, n) for name, (raw, n) in _bodies(args.quick).items()},
    }
    data["manifest"]["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parse-json.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "parse-json.md").write_text(markdown(data))
    print((out / "parse-json.md").read_text())


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    return {name: md.version(name) for name in ("orjson", "msgspec")}


if __name__ == "__main__":
    main()
