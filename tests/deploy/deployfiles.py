"""Reading deploy/: its files, the gateway configs they carry, the metric names
their queries use, and the config keys other changes are still adding."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gateway.config.schema import GatewayConfig, ListenConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
POLICIES = ROOT / "policies"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE_DIR = DEPLOY / "compose"
K8S_BASE = DEPLOY / "kubernetes" / "base"
K8S_VLLM = DEPLOY / "kubernetes" / "overlays" / "vllm"
ALERT_RULES = DEPLOY / "prometheus" / "rules" / "gateway-alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gateway.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"

#: Where the image reads its config (the Dockerfile's CMD) and looks for policies.
CONFIG_DIR = "/etc/gateway"

#: Config keys being added by changes that land with this one (issue 18): known here only while
#: the schema lacks them, so these tests tighten by themselves once they exist. (section, key).
PENDING_KEYS = (
    ("", "admin"),
    ("", "log_format"),
    ("", "discovery"),
    ("listen", "graceful_timeout_s"),
)

_SECTIONS: dict[str, type] = {"": GatewayConfig, "listen": ListenConfig}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_METRIC = re.compile(r"(?<![\w:])((?:gateway_|vllm:|llamacpp:)[A-Za-z0-9_:]*)")


def files(*suffixes: str) -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix in suffixes)


def yaml_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def env_refs(text: str) -> set[str]:
    return set(_ENV_REF.findall(text))


def pending(section: str, key: str) -> bool:
    """Whether the schema still lacks this key (one of PENDING_KEYS)."""
    return key not in {f.name for f in dataclasses.fields(_SECTIONS[section])}


def without_pending_keys(data: dict[str, Any]) -> dict[str, Any]:
    """The config with the pending keys the schema does not have yet left out."""
    out = dict(data)
    for section, key in PENDING_KEYS:
        if not pending(section, key):
            continue
        if not section:
            out.pop(key, None)
        elif isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


# --- the Dockerfile -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def dockerfile_instructions(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    out: list[Instruction] = []
    pending_line = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending_line += line[:-1] + " "
            continue
        full = pending_line + line
        pending_line = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    assert not pending_line, "the Dockerfile ends inside a continued line"
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[starts[-1] :]


def exec_form(args: str) -> list[str]:
    """A CMD / HEALTHCHECK CMD argument list (JSON exec form, else shell words)."""
    args = args.strip()
    if args.startswith("["):
        value = yaml.safe_load(args)
        assert isinstance(value, list)
        return [str(v) for v in value]
    return shlex.split(args)


def image_cmd() -> list[str]:
    cmds = [
        i
        for i in final_stage(dockerfile_instructions(DOCKERFILE.read_text()))
        if i.keyword == "CMD"
    ]
    assert len(cmds) == 1, "the runtime stage has exactly one CMD"
    return exec_form(cmds[0].args)


def image_env() -> dict[str, str]:
    """ENV of the runtime stage (`ENV A=1 B=2` form)."""
    env: dict[str, str] = {}
    for ins in final_stage(dockerfile_instructions(DOCKERFILE.read_text())):
        if ins.keyword == "ENV":
            for word in shlex.split(ins.args):
                name, _, value = word.partition("=")
                env[name] = value
    return env


def config_flag(argv: list[str]) -> str:
    """The `--config` path of a `gateway serve` command line."""
    assert argv[:2] == ["gateway", "serve"], argv
    return argv[argv.index("--config") + 1]


# --- compose and Kubernetes ------------------------------------------------------------------


def compose() -> dict[str, Any]:
    (doc,) = yaml_docs(COMPOSE_DIR / "compose.yaml")
    assert isinstance(doc, dict)
    return doc


def gateway_services(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Compose services that run the gateway image (built from deploy/docker/Dockerfile)."""
    return {
        name: svc
        for name, svc in doc["services"].items()
        if isinstance(svc.get("build"), dict)
        and svc["build"].get("dockerfile") == "deploy/docker/Dockerfile"
    }


def bind_mounts(svc: dict[str, Any], base: Path) -> dict[str, Path]:
    """Container path → host path of a compose service's bind mounts."""
    out: dict[str, Path] = {}
    for spec in svc.get("volumes", []):
        src, dst = spec.split(":")[:2]
        if src.startswith((".", "/")):
            out[dst] = (base / src).resolve()
    return out


def kustomization(path: Path) -> dict[str, Any]:
    (doc,) = yaml_docs(path / "kustomization.yaml")
    assert isinstance(doc, dict)
    return doc


def k8s_objects(path: Path) -> Iterator[dict[str, Any]]:
    """Every object of a kustomization's own resource files (not its bases)."""
    for res in kustomization(path)["resources"]:
        file = path / res
        if file.is_file():
            yield from yaml_docs(file)


def k8s_object(path: Path, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects(path) if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} in {path}"
    return found[0]


def generator_files(name: str) -> list[Path]:
    gens = [g for g in kustomization(K8S_BASE)["configMapGenerator"] if g["name"] == name]
    assert len(gens) == 1, name
    return [K8S_BASE / f for f in gens[0]["files"]]


# --- metric names in queries -----------------------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """gateway_*, vllm:* and llamacpp:* names in a PromQL expression."""
    return set(_METRIC.findall(expr))


def dashboard() -> dict[str, Any]:
    dash = json.loads(DASHBOARD.read_text())
    assert isinstance(dash, dict)
    return dash


def panels(holder: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows (a collapsed row holds its own `panels`) included."""
    for panel in holder.get("panels", []):
        yield panel
        yield from panels(panel)


def dashboard_exprs(dash: dict[str, Any] | None = None) -> list[str]:
    dash = dashboard() if dash is None else dash
    exprs = [t["expr"] for p in panels(dash) for t in p.get("targets", [])]
    for var in dash.get("templating", {}).get("list", []):
        query = var.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else str(query or ""))
    return exprs


def alert_exprs() -> list[str]:
    (doc,) = yaml_docs(ALERT_RULES)
    return [str(rule["expr"]) for group in doc["groups"] for rule in group["rules"]]
