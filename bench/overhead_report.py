"""Rows, summary (added latency, CPU ratios, the issue's targets) and the
Markdown rendering for bench/overhead.py."""

from __future__ import annotations

from typing import Any

from bench.loadgen import LoadResult, percentile

# Targets from the core gateway issue.
MAX_CPU_RATIO_SMALL = 2.0
MAX_CPU_RATIO_CHUNK = 1.5
MAX_ADDED_P50_MS_C1 = 1.0


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 3)


def row_from(
    target: str,
    scenario: str,
    concurrency: int,
    stream: bool,
    res: LoadResult,
    cpu: dict[str, float],
) -> dict[str, Any]:
    ok = max(res.ok, 1)
    events = res.events
    row: dict[str, Any] = {
        "target": target,
        "scenario": scenario,
        "concurrency": concurrency,
        "stream": stream,
        "requests": res.ok,
        "errors": res.errors,
        "unfinished": res.unfinished,
        "error_samples": res.error_samples,
        "wall_s": round(res.wall_s, 3),
        "rps": round(res.ok / res.wall_s, 1) if res.wall_s else 0.0,
        "p50_ms": _ms(percentile(res.latencies_s, 50)),
        "p99_ms": _ms(percentile(res.latencies_s, 99)),
        "proxy_cpu_s": round(cpu["proxy"], 3),
        "proxy_cores": _r(cpu["proxy"] / res.wall_s if res.wall_s else None),
        "proxy_cpu_us_per_req": _r(cpu["proxy"] / ok * 1e6, 1) if cpu["proxy"] else None,
        # Including requests the proxy answered with an error (e.g. admission 503s).
        "proxy_cpu_us_per_answer": _r(cpu["proxy"] / max(res.ok + res.errors, 1) * 1e6, 1)
        if cpu["proxy"]
        else None,
        "upstream_cpu_us_per_req": _r(cpu["upstream"] / ok * 1e6, 1),
        "client_cpu_us_per_req": _r(cpu["client"] / ok * 1e6, 1),
    }
    if stream:
        row.update(
            {
                "events": events,
                "events_per_req": _r(events / ok, 1),
                "chunks_per_s": round(events / res.wall_s, 1) if res.wall_s else 0.0,
                "first_event_p50_ms": _ms(percentile(res.first_event_s, 50)),
                "proxy_cpu_us_per_chunk": _r(cpu["proxy"] / events * 1e6, 2)
                if events and cpu["proxy"]
                else None,
            }
        )
    return row


def _index(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(r["scenario"], r["concurrency"], r["target"]): r for r in rows}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 2)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    idx = _index(rows)
    added: list[dict[str, Any]] = []
    for (scenario, conc, target), row in idx.items():
        direct = idx.get((scenario, conc, "direct"))
        if target == "direct" or direct is None:
            continue
        small = idx.get(("small", conc, target))
        entry = {
            "scenario": scenario,
            "concurrency": conc,
            "target": target,
            "added_p50_ms": _diff(row["p50_ms"], direct["p50_ms"]),
            "added_p99_ms": _diff(row["p99_ms"], direct["p99_ms"]),
            "rps_vs_direct": _ratio(row["rps"], direct["rps"]),
        }
        if row["stream"] and small is not None and row.get("events_per_req"):
            per_req = row["proxy_cpu_us_per_req"]
            base = small["proxy_cpu_us_per_req"]
            if per_req is not None and base is not None:
                # CPU of a stream beyond a small non-streaming request, per chunk.
                entry["marginal_cpu_us_per_chunk"] = round(
                    (per_req - base) / row["events_per_req"], 2
                )
        added.append(entry)
    return {
        "vs_direct": added,
        "vs_router": _vs_router(rows, added),
        "targets": _targets(idx, added),
    }


def _vs_router(rows: list[dict[str, Any]], added: list[dict[str, Any]]) -> list[dict[str, Any]]:
    idx = _index(rows)
    marg = {
        (a["scenario"], a["concurrency"], a["target"]): a.get("marginal_cpu_us_per_chunk")
        for a in added
    }
    out = []
    for (scenario, conc, target), row in idx.items():
        ref = idx.get((scenario, conc, "vllm-router"))
        if target in ("direct", "vllm-router") or ref is None:
            continue
        entry = {
            "scenario": scenario,
            "concurrency": conc,
            "target": target,
            "cpu_per_req_ratio": _ratio(row["proxy_cpu_us_per_req"], ref["proxy_cpu_us_per_req"]),
            "rps_ratio": _ratio(row["rps"], ref["rps"]),
        }
        if row["stream"]:
            entry["cpu_per_chunk_ratio"] = _ratio(
                row.get("proxy_cpu_us_per_chunk"), ref.get("proxy_cpu_us_per_chunk")
            )
            entry["marginal_cpu_per_chunk_ratio"] = _ratio(
                marg.get((scenario, conc, target)), marg.get((scenario, conc, "vllm-router"))
            )
        out.append(entry)
    return out


#: The rows the issue's targets are checked on: the gateway as installed, and
#: (with `--gateway-compiled`) its compiled build.
TARGET_ROWS = ("gateway", "gateway-compiled")


def _targets(
    idx: dict[tuple[str, int, str], dict[str, Any]], added: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    for a in added:
        if a["target"] in TARGET_ROWS and a["scenario"] == "small" and a["concurrency"] == 1:
            v = a["added_p50_ms"]
            checks.append(
                {
                    "target": f"added p50 <= {MAX_ADDED_P50_MS_C1} ms (small, c=1)",
                    "row": a["target"],
                    "value": v,
                    "met": v is not None and v <= MAX_ADDED_P50_MS_C1,
                }
            )
    concs = sorted({k[1] for k in idx})
    for name in TARGET_ROWS:
        for conc in concs:
            checks += _ratio_checks(idx, name, conc)
    return checks


def _ratio_checks(
    idx: dict[tuple[str, int, str], dict[str, Any]], name: str, conc: int
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    gw, ref = idx.get(("small", conc, name)), idx.get(("small", conc, "vllm-router"))
    if gw and ref:
        r = _ratio(gw["proxy_cpu_us_per_req"], ref["proxy_cpu_us_per_req"])
        checks.append(
            {
                "target": f"CPU/request <= {MAX_CPU_RATIO_SMALL}x vllm-router (small, c={conc})",
                "row": name,
                "value": r,
                "met": r is not None and r <= MAX_CPU_RATIO_SMALL,
            }
        )
    gw, ref = idx.get(("stream200", conc, name)), idx.get(("stream200", conc, "vllm-router"))
    if gw and ref:
        r = _ratio(gw.get("proxy_cpu_us_per_chunk"), ref.get("proxy_cpu_us_per_chunk"))
        checks.append(
            {
                "target": f"CPU/chunk <= {MAX_CPU_RATIO_CHUNK}x vllm-router (stream200, c={conc})",
                "row": name,
                "value": r,
                "met": r is not None and r <= MAX_CPU_RATIO_CHUNK,
            }
        )
    return checks


def _f(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.2f}"
    return str(x)


def _cpu_by_target(rows: list[dict[str, Any]]) -> list[str]:
    """Proxy CPU per request (streams: also per chunk), one column per target: the
    builds of one run side by side (e.g. `--gateway-tree` rows of an older commit)."""
    targets = list(dict.fromkeys(r["target"] for r in rows if r["target"] != "direct"))
    cells = list(dict.fromkeys((r["scenario"], r["concurrency"]) for r in rows))
    idx = _index(rows)
    lines = [
        "",
        "## Proxy CPU per request by target (µs; streams: µs/req / µs/chunk)",
        "",
        "| scenario | c | " + " | ".join(targets) + " |",
        "|---|---:|" + "---:|" * len(targets),
    ]
    for scenario, conc in cells:
        values = []
        for target in targets:
            row = idx.get((scenario, conc, target), {})
            value = _f(row.get("proxy_cpu_us_per_req"))
            if row.get("stream"):
                value += f" / {_f(row.get('proxy_cpu_us_per_chunk'))}"
            values.append(value)
        lines.append(f"| {scenario} | {conc} | " + " | ".join(values) + " |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    m = result["manifest"]
    lines = [
        f"# Gateway overhead ({m['date']})",
        "",
        (
            f"{m['cpu_model']}, {m['nproc']} CPUs, Python {m['python']}, load "
            f"{m['loadavg_before']}; "
            f"{m['budget']}. Proxy CPU = utime+stime of the proxy's process tree over the window."
        ),
        "",
        (
            "| scenario | c | target | req/s | p50 ms | p99 ms | +p50 ms | +p99 ms | chunks/s "
            "| proxy CPU µs/req | µs/chunk | proxy cores | errors | unfinished |"
        ),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if m.get("builds"):
        builds = "; ".join(
            f"{name}: compiled={b['compiled']}, {b['tree']} ({b['commit'] or 'no git'})"
            for name, b in m["builds"].items()
        )
        lines[4:4] = [f"Gateway builds: {builds}.", ""]
    added = {
        (a["scenario"], a["concurrency"], a["target"]): a for a in result["summary"]["vs_direct"]
    }
    for r in result["rows"]:
        a = added.get((r["scenario"], r["concurrency"], r["target"]), {})
        cells = [
            r["scenario"],
            r["concurrency"],
            r["target"],
            r["rps"],
            r["p50_ms"],
            r["p99_ms"],
            a.get("added_p50_ms"),
            a.get("added_p99_ms"),
            r.get("chunks_per_s"),
            r["proxy_cpu_us_per_req"],
            r.get("proxy_cpu_us_per_chunk"),
            r["proxy_cores"],
            r["errors"],
            r["unfinished"],
        ]
        lines.append("| " + " | ".join(_f(c) for c in cells) + " |")
    lines += [
        "",
        "## Gateway vs vllm-router (same run)",
        "",
        "| scenario | c | target | CPU/req ratio | CPU/chunk ratio | marginal CPU/chunk ratio | "
        "req/s ratio |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for v in result["summary"]["vs_router"]:
        cells = [
            v["scenario"],
            v["concurrency"],
            v["target"],
            v["cpu_per_req_ratio"],
            v.get("cpu_per_chunk_ratio"),
            v.get("marginal_cpu_per_chunk_ratio"),
            v["rps_ratio"],
        ]
        lines.append("| " + " | ".join(_f(c) for c in cells) + " |")
    lines += _cpu_by_target(result["rows"])
    lines += _redis_section(result["rows"])
    lines += ["", "## Targets", ""]
    for t in result["summary"]["targets"]:
        lines.append(
            f"- {'MET' if t['met'] else 'MISSED'}: {t['target']}, {t['row']} — measured "
            f"{_f(t['value'])}"
        )
    if not result["summary"]["targets"]:
        lines.append("- (no targets evaluable in this run)")
    return "\n".join(lines) + "\n"


def _redis_section(rows: list[dict[str, Any]]) -> list[str]:
    """gateway-redis against gateway (in-process state), cell by cell."""
    local = {(r["scenario"], r["concurrency"]): r for r in rows if r["target"] == "gateway"}
    shared = [r for r in rows if r["target"] == "gateway-redis"]
    if not shared:
        return []
    lines = [
        "",
        "## Shared state in Redis vs in-process (same run)",
        "",
        "| scenario | c | +p50 ms | +p99 ms | Redis round trips/req | CPU/req ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in shared:
        base = local.get((r["scenario"], r["concurrency"]))
        if base is None:
            continue
        cells = [
            r["scenario"],
            r["concurrency"],
            _diff(r["p50_ms"], base["p50_ms"]),
            _diff(r["p99_ms"], base["p99_ms"]),
            r.get("redis_round_trips_per_req"),
            _ratio(r["proxy_cpu_us_per_req"], base["proxy_cpu_us_per_req"]),
        ]
        lines.append("| " + " | ".join(_f(c) for c in cells) + " |")
    return lines


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)
