"""Against a real gateway (the repo's policies, a simulated vLLM upstream) that
has served an ok, a streamed, a rejected, a deadline-expired and a cancelled
request: every metric the dashboard and the alert rules query is one the
gateway exports, docs/metrics.md lists exactly the exported metrics with their
types and labels, and the probe paths of deploy/ are served."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.config.schema import ReplicaConfig
from gateway.sim.config import SimConfig
from tests.deploy.deployfiles import (
    DEPLOY,
    K8S_BASE,
    METRICS_DOC,
    POLICIES,
    alert_exprs,
    dashboard_exprs,
    image_env,
    k8s_object,
    metric_names,
    yaml_docs,
)
from tests.deploy.enginemetrics import engine_families, engine_family
from tests.deploy.exposition import Family, doc_label_values, doc_rows, exported, families
from tests.deploy.promql import (
    TARGET_LABELS,
    grouping_labels,
    label_values_label,
    promql,
    selectors,
)
from tests.gwharness import RunningGateway, running_gateway
from tests.simkit import chat_body, metric, running_sims, settled, wait_for

SCRAPE_CONFIGS = (
    DEPLOY / "prometheus" / "prometheus.yml",
    DEPLOY / "prometheus" / "prometheus-kubernetes.yml",
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


def _queries() -> list[str]:
    return [promql(e) for e in dashboard_exprs()] + alert_exprs()


def test_engine_metrics_queried_are_engine_families_of_the_repository() -> None:
    """Engine names and labels come from the repository (tests/deploy/enginemetrics.py):
    llama.cpp's real server capture, vLLM's families."""
    fams = engine_families()
    engine = {
        s.metric
        for e in _queries()
        for s in selectors(e)
        if s.metric.startswith(("vllm:", "llamacpp:"))
    }
    assert {n.split(":")[0] for n in engine} == {"vllm", "llamacpp"}, "panels for both engines"
    for name in sorted(engine):
        family = engine_family(name, fams)
        assert family is not None, (
            f"{name} is not a {sorted({f.split(':')[0] for f in fams})} family"
        )
        for sel in (s for e in _queries() for s in selectors(e) if s.metric == name):
            for m in sel.matchers:
                assert m.label in family.labels | TARGET_LABELS, f"{name}: no label {m.label}"


@pytest.fixture(scope="module")
def engine_scrapes() -> Iterator[dict[str, str]]:
    """/metrics of a simulated vLLM and a simulated llama.cpp (they copy the real engines')."""
    flavors = ("vllm", "llamacpp")
    with running_sims([SimConfig(flavor=f, speed=50.0) for f in flavors]) as sims:
        urls = dict(zip(flavors, sims.urls, strict=True))
        yield {f: httpx.get(u + "/metrics", timeout=10).text for f, u in urls.items()}


def test_simulated_engines_export_the_engine_families_queried(
    engine_scrapes: dict[str, str],
) -> None:
    fams = engine_families()
    queried = {s.metric for e in _queries() for s in selectors(e)}
    for name in sorted(n for n in queried if n.startswith(("vllm:", "llamacpp:"))):
        family = engine_family(name, fams)
        assert family is not None, name
        live = families(engine_scrapes[name.split(":")[0]])
        assert exported(name, live), f"the simulated engine does not export {name}"
        base = family.name if family.name in live else name
        assert live[base].labels == set(family.labels), f"{name}: labels {live[base].labels}"


def _known_labels(name: str, scraped: Scraped) -> tuple[set[str], dict[str, set[str]]]:
    """A queried series' labels and their values: exported (live), else documented."""
    if name == "up":
        return {"instance", "job"}, {"job": _scrape_jobs()}
    engine = engine_family(name, engine_families())
    if engine is not None:
        return set(engine.labels), {}
    base = next(f for f in (name, name.removesuffix("_bucket")) if f in scraped.families)
    family = scraped.families[base]
    documented = doc_rows(METRICS_DOC)[base].labels
    values = {label: set(v) for label, v in family.values.items()}
    for label, vals in doc_label_values(METRICS_DOC).items():
        values.setdefault(label, set()).update(vals)
    return (family.labels if family.samples else set(documented)), values


def _scrape_jobs() -> set[str]:
    jobs: set[str] = set()
    for path in SCRAPE_CONFIGS:
        (doc,) = yaml_docs(path)
        jobs |= {c["job_name"] for c in doc["scrape_configs"]}
    text = (SCRAPE_CONFIGS[0]).read_text()  # the compose config's commented vLLM job
    jobs |= set(re.findall(r"^\s*#\s*- job_name: (\w+)", text, re.M))
    return jobs


def test_label_matchers_name_exported_labels_and_values(scraped: Scraped) -> None:
    """`outcome="ok"`, `direction="cached"`, `reason!="client_gone"`, `job=~"vllm|llamacpp"`:
    each label is one the series has, each literal value one it takes."""
    checked = 0
    for expr in _queries():
        for sel in selectors(expr):
            labels, values = _known_labels(sel.metric, scraped)
            for m in sel.matchers:
                assert m.label in labels | TARGET_LABELS, f"{sel.metric} has no label {m.label}"
                if m.value == ".*":
                    continue
                literal = m.value.split("|") if m.op in ("=~", "!~") else [m.value]
                assert set(literal) <= values.get(m.label, set()), (
                    f"{sel.metric}{{{m.label}{m.op}{m.value!r}}}: not a value of {m.label} "
                    f"(exported or documented: {sorted(values.get(m.label, set()))})"
                )
                checked += 1
    assert checked >= 5, "the label matchers were not found"


def test_grouping_labels_are_labels_of_the_queried_series(scraped: Scraped) -> None:
    for expr in _queries():
        labels = set(TARGET_LABELS)
        for sel in selectors(expr):
            labels |= _known_labels(sel.metric, scraped)[0]
        missing = grouping_labels(expr) - labels
        assert not missing, f"{expr}: groups by {sorted(missing)}, which its series lack"


def test_dashboard_variable_label_is_exported(scraped: Scraped) -> None:
    var_queries = [e for e in dashboard_exprs() if label_values_label(e)]
    assert var_queries, "the dashboard's `task` variable"
    for expr in var_queries:
        (sel,) = selectors(promql(expr))
        assert label_values_label(expr) in _known_labels(sel.metric, scraped)[0]


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
