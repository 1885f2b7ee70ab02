"""The gateway configs under deploy/ pass `gateway check-config` as the
container sees them: the file and the policies laid out at /etc/gateway the
way compose mounts them or the Kubernetes ConfigMaps project them, every
`${ENV}` they reference set to a dummy value. The policies are the
repository's policies/."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main as gateway_cli
from tests.deploy.deployfiles import (
    COMPOSE_DIR,
    CONFIG_DIR,
    PENDING_KEYS,
    POLICIES,
    bind_mounts,
    compose,
    config_flag,
    env_refs,
    gateway_services,
    generator_files,
    image_cmd,
    pending,
    without_pending_keys,
)

REPO_POLICIES = sorted(p.name for p in POLICIES.glob("*.yaml"))


def _stage(tmp: Path, mounts: dict[str, Path]) -> Path:
    """Lay out `mounts` (container path → host path) under tmp; the staged --config file."""
    for dst, src in mounts.items():
        target = tmp / dst.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target)
        else:
            shutil.copyfile(src, target)
    staged = tmp / config_flag(image_cmd()).lstrip("/")
    assert staged.is_file(), f"nothing is mounted at {config_flag(image_cmd())}"
    data = yaml.safe_load(staged.read_text())
    staged.write_text(yaml.safe_dump(without_pending_keys(data)))
    return staged


def _check_config(path: Path, source: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for name in env_refs(source.read_text()):
        monkeypatch.setenv(name, f"dummy-{name.lower()}-value")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gateway_cli(["check-config", str(path)])
    assert code == 0, err.getvalue()
    result = yaml.safe_load(out.getvalue())
    assert isinstance(result, dict)
    return result


def _loaded_policy_files(result: dict[str, Any]) -> list[str]:
    return sorted(Path(p["source"]).name for p in result["loaded_policies"])


@pytest.mark.parametrize("service", sorted(gateway_services(compose())))
def test_compose_config_passes_check_config(
    service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = gateway_services(compose())[service]
    assert "command" not in svc, "the image's CMD names the config path"
    mounts = bind_mounts(svc, COMPOSE_DIR)
    assert all(dst.startswith(CONFIG_DIR + "/") for dst in mounts)
    assert mounts[CONFIG_DIR + "/policies"] == POLICIES, "compose mounts the repo's policies/"
    staged = _stage(tmp_path, mounts)
    result = _check_config(staged, mounts[config_flag(image_cmd())], monkeypatch)
    assert _loaded_policy_files(result) == REPO_POLICIES
    assert result["state"]["backend"] == "redis"
    assert result["replicas"], "compose lists its replicas"


def _k8s_mounts() -> dict[str, Path]:
    (config,) = generator_files("gateway-config")
    mounts = {f"{CONFIG_DIR}/{config.name}": config}
    for policy in generator_files("gateway-policies"):
        mounts[f"{CONFIG_DIR}/policies/{policy.name}"] = policy
    return mounts


def test_kubernetes_config_passes_check_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged = _stage(tmp_path, _k8s_mounts())
    source = generator_files("gateway-config")[0]
    result = _check_config(staged, source, monkeypatch)
    assert _loaded_policy_files(result) == REPO_POLICIES
    assert result["state"]["backend"] == "redis"
    assert "***" in result["state"]["redis"]["url"], "the Redis password is masked"


def test_kubernetes_policies_are_the_repository_policies() -> None:
    files = generator_files("gateway-policies")
    assert sorted(f.name for f in files) == REPO_POLICIES
    for f in files:
        assert f.read_bytes() == (POLICIES / f.name).read_bytes(), (
            f"{f} differs from policies/{f.name}: copy policies/*.yaml to "
            "deploy/kubernetes/base/policies/"
        )


def test_kubernetes_config_discovers_vllm_and_compose_lists_replicas() -> None:
    (k8s_source,) = generator_files("gateway-config")
    k8s = yaml.safe_load(k8s_source.read_text())
    assert [d["kind"] for d in k8s["discovery"]] == ["vllm"]
    assert "replicas" not in k8s
    compose_cfg = yaml.safe_load((COMPOSE_DIR / "gateway.yaml").read_text())
    assert "discovery" not in compose_cfg and len(compose_cfg["replicas"]) == 2


def test_pending_keys_allow_list_is_only_used_while_needed() -> None:
    """Every pending key is used by a deploy config; once the schema has it, it is checked
    for real (without_pending_keys keeps it) and this list should lose it."""
    (k8s_source,) = generator_files("gateway-config")
    k8s = yaml.safe_load(k8s_source.read_text())
    for section, key in PENDING_KEYS:
        holder = k8s if not section else k8s[section]
        assert key in holder, f"{section}.{key} is not used: drop it from PENDING_KEYS"
        kept = without_pending_keys(k8s)
        kept_holder = kept if not section else kept[section]
        assert (key in kept_holder) == (not pending(section, key))
