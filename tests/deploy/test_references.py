"""Compose and Kubernetes files reference only the ports the gateway config
listens on, services and paths that exist, and the config's own secrets.
(That the probe paths are served is checked on a live gateway: test_live.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.deploy.deployfiles import (
    COMPOSE_DIR,
    CONFIG_DIR,
    DEPLOY,
    K8S_BASE,
    K8S_VLLM,
    bind_mounts,
    compose,
    config_flag,
    env_refs,
    gateway_services,
    generator_files,
    image_cmd,
    image_env,
    k8s_object,
    kustomization,
    yaml_docs,
)


def _compose_config() -> dict[str, Any]:
    data = yaml.safe_load((COMPOSE_DIR / "gateway.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _k8s_config() -> dict[str, Any]:
    data = yaml.safe_load(generator_files("gateway-config")[0].read_text())
    assert isinstance(data, dict)
    return data


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port, url
    return parts.hostname, parts.port


def _prometheus_targets(path: Path, job: str) -> list[tuple[str, int]]:
    (doc,) = yaml_docs(path)
    (cfg,) = [c for c in doc["scrape_configs"] if c["job_name"] == job]
    targets = [t for sc in cfg["static_configs"] for t in sc["targets"]]
    return [(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in targets]


# --- compose -------------------------------------------------------------------------------


def test_compose_config_listens_where_compose_expects() -> None:
    listen = _compose_config()["listen"]
    assert listen["host"] == "0.0.0.0" and listen["admin_host"] == "0.0.0.0"
    doc = compose()
    gateways = gateway_services(doc)
    assert len(gateways) == 2
    upstreams = re.findall(
        r"^\s*server\s+([\w-]+):(\d+)", (COMPOSE_DIR / "nginx.conf").read_text(), re.M
    )
    assert {(h, int(p)) for h, p in upstreams} == {(g, listen["port"]) for g in gateways}
    scraped = _prometheus_targets(DEPLOY / "prometheus" / "prometheus.yml", "gateway")
    assert set(scraped) == {(g, listen["admin_port"]) for g in gateways}
    health_url = image_env()["GATEWAY_HEALTHCHECK_URL"]
    assert urlsplit(health_url).port == listen["port"], "the image's HEALTHCHECK port"
    for svc in gateways.values():
        assert "GATEWAY_HEALTHCHECK_URL" not in str(svc.get("environment", ""))
        assert not svc.get("ports"), "only the load balancer publishes the gateways"


def test_compose_replicas_and_redis_are_compose_services() -> None:
    services = compose()["services"]
    cfg = _compose_config()
    engines = {}
    for replica in cfg["replicas"]:
        host, port = _host_port(replica["url"])
        assert host in services, f"{replica['url']}: no compose service {host}"
        command = [str(a) for a in services[host]["command"]]
        assert int(_flag(command, "--port")) == port
        assert "--metrics" in command and services[host]["image"].startswith(
            "ghcr.io/ggml-org/llama.cpp:server"
        )
        engines[host] = port
    scraped = _prometheus_targets(DEPLOY / "prometheus" / "prometheus.yml", "llamacpp")
    assert set(scraped) == set(engines.items())
    assert urlsplit(cfg["state"]["redis"]["url"]).hostname in services


def test_compose_bind_mounts_exist_and_serve_their_readers() -> None:
    doc = compose()
    mounts = {name: bind_mounts(svc, COMPOSE_DIR) for name, svc in doc["services"].items()}
    for name, found in mounts.items():
        for dst, src in found.items():
            assert src.exists(), f"{name}: {src} (mounted at {dst}) does not exist"
    prometheus = mounts["prometheus"]
    (prom_cfg,) = yaml_docs(prometheus["/etc/prometheus/prometheus.yml"])
    for pattern in prom_cfg["rule_files"]:
        folder, glob = pattern.rsplit("/", 1)
        assert list(prometheus[folder].glob(glob)), f"rule_files {pattern} matches nothing"
    grafana = mounts["grafana"]
    (provider,) = yaml_docs(grafana["/etc/grafana/provisioning"] / "dashboards" / "gateway.yml")
    dash_dir = provider["providers"][0]["options"]["path"]
    assert list(grafana[dash_dir].glob("*.json"))
    home = doc["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (grafana[dash_dir] / Path(home).relative_to(dash_dir)).is_file()


# --- Kubernetes ----------------------------------------------------------------------------


def _gateway_pod() -> dict[str, Any]:
    spec: dict[str, Any] = k8s_object(K8S_BASE, "Deployment", "llm-gateway")["spec"]["template"]
    return spec


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return found


def test_kubernetes_ports_and_probes_match_the_config() -> None:
    listen = _k8s_config()["listen"]
    assert listen["host"] == "0.0.0.0" and listen["admin_host"] == "0.0.0.0"
    container = _container(_gateway_pod(), "gateway")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": listen["port"], "admin": listen["admin_port"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == "http", f"{probe} on the public listener"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = k8s_object(K8S_BASE, "Service", "llm-gateway")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_kubernetes_mounts_match_the_image_and_the_config() -> None:
    pod = _gateway_pod()
    container = _container(pod, "gateway")
    assert config_flag(container["args"]) == config_flag(image_cmd())
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    config_mount = mounts[config_flag(image_cmd())]
    assert config_mount["subPath"] == generator_files("gateway-config")[0].name
    policies_mount = mounts[f"{CONFIG_DIR}/{_k8s_config()['policies']}"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[config_mount["name"]]["configMap"]["name"] == "gateway-config"
    assert volumes[policies_mount["name"]]["configMap"]["name"] == "gateway-policies"
    generated = {g["name"] for g in kustomization(K8S_BASE)["configMapGenerator"]}
    assert generated == {"gateway-config", "gateway-policies"}


def test_kubernetes_secrets_are_references_for_exactly_the_config_env() -> None:
    container = _container(_gateway_pod(), "gateway")
    env = {e["name"]: e for e in container["env"]}
    source = generator_files("gateway-config")[0]
    assert set(env) == env_refs(source.read_text())
    for entry in env.values():
        assert (
            "value" not in entry and entry["valueFrom"]["secretKeyRef"]["name"] == "gateway-secrets"
        )


def test_kubernetes_availability_objects_select_the_gateway() -> None:
    deployment = k8s_object(K8S_BASE, "Deployment", "llm-gateway")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pdb = k8s_object(K8S_BASE, "PodDisruptionBudget", "llm-gateway")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    service = k8s_object(K8S_BASE, "Service", "llm-gateway")
    assert service["spec"]["selector"].items() <= labels.items()
    hpa = k8s_object(K8S_BASE, "HorizontalPodAutoscaler", "llm-gateway")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "llm-gateway",
    }
    assert hpa["minReplicas"] >= 2
    container = _container(deployment["spec"]["template"], "gateway")
    assert container["resources"]["requests"] and container["resources"]["limits"]


def test_kubernetes_discovery_and_redis_point_at_their_services() -> None:
    cfg = _k8s_config()
    (entry,) = cfg["discovery"]
    headless = k8s_object(K8S_BASE, "Service", "vllm-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert entry["host"].split(".")[0] == "vllm-headless"
    assert entry["port"] in [p["port"] for p in headless["ports"]]
    vllm = k8s_object(K8S_VLLM, "Deployment", "vllm")["spec"]["template"]
    assert headless["selector"].items() <= vllm["metadata"]["labels"].items()
    (port,) = _container(vllm, "vllm")["ports"]
    assert port["name"] == headless["ports"][0]["targetPort"]
    assert (
        port["containerPort"]
        == entry["port"]
        == int(_flag(_container(vllm, "vllm")["args"], "--port"))
    )
    redis = k8s_object(K8S_BASE, "Service", "redis")["spec"]
    host, redis_port = _host_port(cfg["state"]["redis"]["url"].replace("${REDIS_PASSWORD}", "x"))
    assert host == "redis" and redis_port == redis["ports"][0]["port"]


def test_kubernetes_prometheus_job_keeps_the_gateway_admin_port() -> None:
    (doc,) = yaml_docs(DEPLOY / "prometheus" / "prometheus-kubernetes.yml")
    (job,) = [c for c in doc["scrape_configs"] if c["job_name"] == "gateway"]
    regexes = {
        r["source_labels"][0]: r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    labels = _gateway_pod()["metadata"]["labels"]
    assert (
        regexes["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
        == labels["app.kubernetes.io/name"]
    )
    assert regexes["__meta_kubernetes_pod_container_port_name"] == "admin"
