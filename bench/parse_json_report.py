"""Markdown of `bench/parse_json.py`."""

from __future__ import annotations

from typing import Any

GATEWAY = "stdlib, gateway today (decode + pairs hook + surrogate scan + walk)"


def _us(value: float) -> str:
    return f"{value / 1000:,.1f} ms" if value >= 10_000 else f"{value:,.0f} µs"


def _timing_section(name: str, t: dict[str, Any]) -> list[str]:
    lines = [
        f"### {name} ({t['bytes']:,} bytes, median of {t['repeats']})",
        "",
        "| variant | CPU per parse | × gateway today |",
        "|---|---:|---:|",
    ]
    for variant, us in t["median_us"].items():
        lines.append(f"| {variant} | {_us(us)} | {t['vs_gateway_today'][variant]:.2f} |")
    return [*lines, ""]


def _problems(hostile: dict[str, Any], variant: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in hostile["cases"]:
        verdict = row[variant]["verdict"]
        if verdict != "ok":
            counts[verdict] = counts.get(verdict, 0) + 1
    return counts


def _hostile_section(hostile: dict[str, Any], variants: list[str]) -> list[str]:
    head = "| case | gateway must | " + " | ".join(variants) + " |"
    lines = [
        "## Hostile inputs (`tests/ingress/test_hostile_json.py`)",
        "",
        "Each cell: the variant's outcome, and the verdict against what the gateway must do "
        "(`ok`; `MISSED`: accepted a body the gateway refuses; `WRONGLY REFUSED`; `VALUE "
        "CHANGED`: accepted, but a value differs from the gateway's parse, e.g. an integer "
        "read as a float; `cannot tell the bytes are ambiguous`: the gateway would then "
        "forward bytes that parsers read differently).",
        "",
        head,
        "|---|---|" + "---|" * len(variants),
    ]
    for row in hostile["cases"]:
        cells = [f"{row[v]['outcome']}: **{row[v]['verdict']}**" for v in variants]
        lines.append(f"| {row['case']} | {row['expected']} | " + " | ".join(cells) + " |")
    fuzz = hostile["fuzz"]
    lines += [
        "",
        f"Fuzzed bodies (the test's strategy, {fuzz['bodies']} drawn, derandomised; the gateway "
        f"refuses {fuzz['gateway_refuses']}):",
        "",
        "| variant | accepts what the gateway refuses | refuses what the gateway accepts |",
        "|---|---:|---:|",
    ]
    for v in variants:
        f = fuzz[v]
        lines.append(
            f"| {v} | {f['accepts_what_gateway_refuses']} | {f['refuses_what_gateway_accepts']} |"
        )
    return [*lines, ""]


def _summary(data: dict[str, Any], variants: list[str]) -> list[str]:
    agent = data["timings"]["agent-400KB"]["median_us"]
    lines = [
        "## Summary",
        "",
        "| variant | agent 400 KB | problems on the hostile cases |",
        "|---|---:|---|",
    ]
    for v in variants:
        problems = _problems(data["hostile"], v)
        text = ", ".join(f"{n}× {k}" for k, n in problems.items()) or "none"
        lines.append(f"| {v} | {_us(agent[v])} | {text} |")
    return [*lines, ""]


def markdown(data: dict[str, Any]) -> str:
    m = data["manifest"]
    variants = list(data["hostile"]["cases"][0])[3:]
    lines = [
        "# JSON parsers for request bodies (`bench/parse_json.py`)",
        "",
        f"{m['date']}, Python {m['python']}, orjson {m['versions']['orjson']}, msgspec "
        f"{m['versions']['msgspec']}; {m['nproc']} CPUs shared with other work (load average "
        f"{m['loadavg_before']} before, {m['loadavg_after']} after: a loaded machine; every "
        "repeat runs all variants in rotating order, so ratios are side by side). CPU time of "
        "this thread, GC tuned as `gateway serve` tunes it.",
        "",
        f"Command: `{m['command']}`",
        "",
        *_summary(data, variants),
        "## Timings",
        "",
    ]
    for name, t in data["timings"].items():
        lines += _timing_section(name, t)
    lines += _hostile_section(data["hostile"], variants)
    return "\n".join(lines).rstrip() + "\n"
