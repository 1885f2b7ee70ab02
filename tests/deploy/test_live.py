"""Against a real gateway (the repo's policies, a simulated vLLM upstream) that
has served an ok, a streamed, a rejected, a deadline-expired and a cancelled
request: every metric the dashboard and the alert rules query is one the
gateway exports, docs/metrics.md lists exactly the exported metrics with their
types and labels, and the probe paths of deploy/ are served."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.config.schema import ReplicaConfig
from gateway.sim.config import SimConfig
from tests.deploy.deployfiles import (
    K8S_BASE,
    METRICS_DOC,
    POLICIES,
    ROOT,
    alert_exprs,
    dashboard_exprs,
    image_env,
    k8s_object,
    metric_names,
)
from tests.deploy.exposition import Family, doc_rows, exported, families
from tests.gwharness import RunningGateway, running_gateway
from tests.simkit import chat_body, metric, running_sims, settled, wait_for

ENGINES_DOC_PLACES = (
    ROOT.parent / "shared" / "docs" / "ENGINES.md",
    Path("/work/shared/docs/ENGINES.md"),
)
#: The replica's KV capacity (a config override): a clamped chat request cannot fit.
KV_TOKENS = 4096


@dataclass
class Scraped:
    gw: RunningGateway
    text: str
    families: dict[str, Family]


def _exercise(gw: RunningGateway) -> None:
    client = gw.openai()
    messages = [{"role": "user", "content": "Hello"}]
    client.chat.completions.create(model="sim-model", messages=messages, max_tokens=8)  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model="sim-model",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
    )
    assert list(stream)
    url = gw.base_url + "/chat/completions"
    rejected = httpx.post(url, json=chat_body(False, 5000), headers={"x-task": "chat"}, timeout=30)
    assert rejected.status_code == 400, rejected.text
    assert rejected.headers["x-gateway-reject-reason"] == "exceeds_capacity"
    late = httpx.post(
        url, json=chat_body(True, 1000), headers={"x-request-timeout": "0.3"}, timeout=30
    )
    assert late.status_code in (200, 504), late.text
    with httpx.stream("POST", url, json=chat_body(True, 1000), timeout=30) as gone:
        assert gone.status_code == 200
        next(gone.iter_lines())
    wait_for(lambda: metric(gw.metrics_text(), "gateway_cancellations_total") >= 1)
    settled(gw)


@pytest.fixture(scope="module")
def scraped() -> Iterator[Scraped]:
    with (
        running_sims([SimConfig(speed=1.0)]) as sims,
        running_gateway(
            [ReplicaConfig(url=sims.urls[0], kind="vllm", capacity_tokens=KV_TOKENS)],
            policies=str(POLICIES),
        ) as gw,
    ):
        _exercise(gw)
        text = gw.metrics_text()
        yield Scraped(gw, text, families(text))


def test_requests_left_labelled_samples(scraped: Scraped) -> None:
    text = scraped.text
    assert metric(text, "gateway_requests_total", outcome="ok") >= 2
    assert metric(text, "gateway_time_to_first_byte_seconds_count") >= 2
    assert metric(text, "gateway_admission_rejected_total", reason="exceeds_capacity") == 1
    assert metric(text, "gateway_output_clamped_total", task="chat") == 1
    assert metric(text, "gateway_deadline_exceeded_total") == 1
    assert metric(text, "gateway_cancellations_total") >= 1


def _gateway_names(exprs: list[str]) -> set[str]:
    names = {n for e in exprs for n in metric_names(e) if n.startswith("gateway_")}
    assert names, "no gateway metric found in the queries"
    return names


def test_dashboard_queries_only_exported_metrics(scraped: Scraped) -> None:
    names = _gateway_names(dashboard_exprs())
    missing = sorted(n for n in names if not exported(n, scraped.families))
    assert not missing, f"the dashboard queries metrics the gateway does not export: {missing}"


def test_alert_rules_query_only_exported_metrics(scraped: Scraped) -> None:
    names = _gateway_names(alert_exprs())
    missing = sorted(n for n in names if not exported(n, scraped.families))
    assert not missing, f"the alert rules query metrics the gateway does not export: {missing}"


def _engines_doc() -> str:
    for place in ENGINES_DOC_PLACES:
        if place.is_file():
            return place.read_text()
    pytest.skip("shared/docs/ENGINES.md is not beside the repository")


def test_engine_metrics_queried_are_documented_engine_metrics() -> None:
    doc = _engines_doc()
    names = {n for e in dashboard_exprs() + alert_exprs() for n in metric_names(e)}
    engine = sorted(n for n in names if not n.startswith("gateway_"))
    assert engine, "the dashboard shows engine metrics too"
    for name in engine:
        candidates = {name, re.sub(r"(_total|_bucket|_sum|_count)$", "", name)}
        assert any(re.search(re.escape(c) + r"(?![\w:])", doc) for c in candidates), (
            f"{name} is not an engine metric listed in ENGINES.md"
        )


def test_metrics_doc_lists_exactly_the_exported_metrics(scraped: Scraped) -> None:
    rows = doc_rows(METRICS_DOC)
    live = {n for n in scraped.families if n.startswith("gateway_")}
    assert sorted(live - set(rows)) == [], "exported but not in docs/metrics.md"
    assert sorted(set(rows) - live) == [], "in docs/metrics.md but not exported"


def test_metrics_doc_types_and_labels_match(scraped: Scraped) -> None:
    for name, row in doc_rows(METRICS_DOC).items():
        family = scraped.families[name]
        assert row.type == family.type, f"{name}: documented {row.type}, exported {family.type}"
        if family.samples:
            assert row.labels == family.labels, f"{name}: labels {sorted(family.labels)}"


def test_probe_paths_of_deploy_are_served(scraped: Scraped) -> None:
    container = k8s_object(K8S_BASE, "Deployment", "llm-gateway")["spec"]["template"]["spec"][
        "containers"
    ][0]
    paths = {
        container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    paths.add(urlsplit(image_env()["GATEWAY_HEALTHCHECK_URL"]).path)
    assert paths == {"/healthz", "/readyz"}
    for path in sorted(paths):
        resp = httpx.get(scraped.gw.url + path, timeout=10)
        assert resp.status_code == 200, f"{path}: {resp.status_code} {resp.text}"
