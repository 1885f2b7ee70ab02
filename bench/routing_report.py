"""Markdown table, JSON and PNG plot of bench/routing.py results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.paths import repo_relative

_COLUMNS = (
    ("policy", "policy", "{}"),
    ("hit_rate", "hit rate", "{:.1%}"),
    ("hit_vs_oracle", "vs oracle", "{:.1%}"),
    ("hit_vs_pooled", "vs pooled LRU", "{:.1%}"),
    ("index_expected_hit_rate", "index expected", "{:.1%}"),
    ("ttft_p50_s", "TTFT p50 (s)", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.2f}"),
    ("itl_p50_s", "ITL p50 (ms)", "{:.1f}"),
    ("itl_p99_s", "ITL p99 (ms)", "{:.1f}"),
    ("throughput_tokens_per_s", "out tok/s", "{:.0f}"),
    ("preemptions", "preemptions", "{}"),
    ("max_mean_load", "max/mean requests", "{:.2f}"),
    ("max_mean_out_tokens", "max/mean out tokens", "{:.2f}"),
    ("max_mean_busy", "max/mean busy", "{:.2f}"),
    ("errors", "errors", "{}"),
)
_INSTANCE_COLUMNS = (("instances", "instances", "{}"), *_COLUMNS[:1], *_COLUMNS[1:])
_COLORS = ("#999", "#69c", "#c96", "#3a3", "#a6c", "#c66", "#6cc", "#cc6")
_MS = frozenset({"itl_p50_s", "itl_p99_s"})


_INTRO = (
    "Policies: the gateway's baselines and profiles run in the benchmark's process with "
    "admission off; `vllm-router:<policy>` rows run vllm-router (PyPI `vllm-router`, its own "
    "defaults, retries off) over the same replicas.",
    "",
    "Noise: the machine (2 cores) is shared, and CPU contention stretches simulated time "
    "between engine steps. Repeated runs moved a TTFT p99 by up to 2-3x; hit rates and load "
    "ratios are steadier. Compare the rows within one run.",
    "",
    "The oracle replays the same prompts, in the order they were sent, into one unbounded "
    "cache; the pooled-KV LRU oracle into one LRU cache of all replicas' KV summed (prompt "
    "blocks only; the KV that running requests hold is not subtracted). Both also learn each "
    "chat answer, which the next turn resends (engines cache generated tokens). They use "
    "64-byte (~16-token) blocks of the gateway's canonical rendering, while the simulator uses "
    "16-token blocks of its own chat template, so 'vs oracle' can exceed 100% by a point or two.",
    "",
    "Index expected: the hit rate the gateway's prefix indexes predicted for their own "
    "decisions (matched / prompt tokens routed); above the engines' hit rate, the index "
    "believed in cache the engines had evicted.",
    "",
    "ITL: a request's mean inter-token latency, (last token - first token) / (tokens - 1), in "
    "simulated ms; p50/p99 over requests. max/mean: the busiest replica's requests (output "
    "tokens, busy time) over the mean.",
)


def _cell(key: str, value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value * 1000 if key in _MS else value)


def _table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str, str], ...]) -> list[str]:
    lines = ["| " + " | ".join(c[1] for c in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(k, r.get(k), f) for k, _, f in columns) + " |")
    return [*lines, ""]


def _oracles(row: dict[str, Any]) -> str:
    pooled = row.get("pooled_hit_rate")
    text = f"Oracle (unbounded single cache) hit rate: {row['oracle_hit_rate']:.1%}"
    if pooled is not None:
        text += f"; pooled-KV LRU oracle (one LRU cache of all replicas' KV): {pooled:.1%}"
    return text + "."


def _instance_section(report: dict[str, Any]) -> list[str]:
    rows = [r for r in report["results"] if r.get("front") == "procs"]
    if not rows:
        return []
    lines = [
        "## 1 vs 2 vs 4 gateway instances",
        "",
        "Each instance is a `gateway serve` process; all share one private redis-server "
        "(`state.backend: redis`); the load generator sends each request to the next instance "
        "in turn. `vs 1 instance`: the hit rate relative to the same workload and policy with one "
        "instance (process) in this run.",
        "",
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        group = [r for r in rows if r["workload"] == workload]
        single = {r["policy"]: r["hit_rate"] for r in group if r["instances"] == 1}
        for r in group:
            base = single.get(r["policy"])
            r["hit_vs_one_instance"] = r["hit_rate"] / base if base else None
        lines += [f"### {workload}", "", _oracles(group[0]), ""]
        columns = (*_INSTANCE_COLUMNS[:5], ("hit_vs_one_instance", "vs 1 instance", "{:.1%}"))
        lines += _table(group, (*columns, *_INSTANCE_COLUMNS[5:]))
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = ["# Routing benchmark", "", f"Command: `{report['setup']['command']}`", ""]
    setup = report["setup"]
    lines.append(
        f"Cluster: {setup['replicas']} simulated vLLM replicas, KV "
        f"{setup['kv_tokens_per_replica']} tokens "
        f"each, prefill {setup['prefill_tokens_per_s_per_replica']} tokens/s each, simulator speed "
        f"x{setup['speed']:g}; admission {setup['admission']}. Times are simulated seconds. "
        f"One run per policy and workload, {setup.get('total_wall_s', '?')} s of wall time in all."
    )
    lines += ["", f"Gateway code: `{setup.get('gateway_package', '?')}`.", "", *_INTRO, ""]
    router = setup.get("vllm_router") or {}
    if router.get("version"):
        lines += [f"vllm-router: {router['package']} {router['version']}.", ""]
    used = {r["policy"] for r in report["results"]}
    variants = {k: v for k, v in (setup.get("variants") or {}).items() if k in used}
    if variants:
        lines += ["Config variants (merged into the `scheduling` section of the default profile):"]
        lines += ["", *(f"- `{k}`: `{json.dumps(v)}`" for k, v in variants.items()), ""]
    for workload, note in report["workloads"].items():
        rows = [
            r for r in report["results"] if r["workload"] == workload and r.get("front") != "procs"
        ]
        if not rows:
            continue
        lines += [f"## {workload}", "", note + ".", "", _oracles(rows[0]), ""]
        lines += _table(rows, _COLUMNS)
    lines += _instance_section(report)
    h = report["hashing"]
    lines += [
        "## Cost per request (400 KB prompt)",
        "",
        f"Prompt body {h['prompt_bytes']} bytes. Microseconds, min / median of repeated calls:",
        "",
        "| block bytes | hash (render + chain) |",
        "|---|---|",
    ]
    lines += [
        f"| {bs} | {v['min']} / {v['median']} |" for bs, v in h["hash_us_by_block_bytes"].items()
    ]
    rank = h["rank_us_4_replicas_incl_hashing"]
    lines += [
        "",
        (
            f"JSON parse of the body (ingress, not routing): {h['parse_json_us']['min']} / "
            f"{h['parse_json_us']['median']} us. Hashing + scoring 4 replicas with the default "
            "profile: "
            f"{rank['min']} / {rank['median']} us."
        ),
        "",
    ]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = {r["workload"] for r in report["results"] if r.get("front") != "procs"}
    workloads = [w for w in report["workloads"] if w in shown]
    if not workloads:
        return False
    metrics = (
        ("hit_vs_oracle", "hit rate / oracle"),
        ("ttft_p99_s", "TTFT p99 (sim s)"),
        ("max_mean_load", "max/mean requests"),
    )
    fallback = ("ttft_mean_s", "TTFT mean (sim s)")  # where there is no cache to hit
    fig, axes = plt.subplots(
        len(metrics), len(workloads), figsize=(4 * len(workloads), 9), squeeze=False
    )
    for col, workload in enumerate(workloads):
        rows = [
            r for r in report["results"] if r["workload"] == workload and r.get("front") != "procs"
        ]
        for row_i, (key, label) in enumerate(metrics):
            if all(r.get(key) is None for r in rows):
                key, label = fallback
            ax = axes[row_i][col]
            ax.bar(
                [r["policy"] for r in rows],
                [r.get(key) or 0 for r in rows],
                color=[_COLORS[i % len(_COLORS)] for i in range(len(rows))],
            )
            ax.set_title(f"{workload}: {label}", fontsize=9)
            ax.tick_params(axis="x", labelsize=6, labelrotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_reports(out: Path, name: str, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report.update(repo_relative(report))
    text = markdown(report)  # also adds each instance row's `hit_vs_one_instance`
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{name}.md").write_text(text)
    plot(report, out / f"{name}.png")
