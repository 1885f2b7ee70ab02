"""Policy schema, set validation and task resolution (pure), plus `gateway check-config`."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.config.decode import ConfigError
from gateway.config.schema import AuthConfig
from gateway.policies.policyset import DEFAULT_POLICY, load_policy_set

REPO = Path(__file__).resolve().parents[2]


def write(d: Path, **files: str) -> Path:
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def problems(d: Path, auth: AuthConfig | None = None) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_policy_set(str(d), auth)
    return exc.value.problems


def test_shipped_policies_are_valid_and_complete() -> None:
    policies = load_policy_set(str(REPO / "policies"))
    names = {p.name for p in policies.policies}
    assert {"chat", "agent", "summarize", "extract", "batch", DEFAULT_POLICY} <= names
    assert policies.get("agent").session is not None  # type: ignore[union-attr]
    assert policies.get("extract").limits.on_excess == "reject"  # type: ignore[union-attr]
    assert policies.get("batch").priority == "batch"  # type: ignore[union-attr]
    assert "agent-coder" in policies.by_alias
    readme = (REPO / "policies" / "README.md").read_text()
    for key in (
        "max_input_tokens",
        "max_output_tokens",
        "default_output_tokens",
        "on_excess",
        "priority",
        "default_s",
        "max_s",
        "max_requests",
        "max_total_tokens",
        "max_duration_s",
        "idle_ttl_s",
        "tokens",
        "isolation",
        "match",
        "model",
        "timeouts",
        "output_reservation",
    ):
        assert re.search(rf"`([a-z_]+\.)?{key}`", readme), key


def test_strict_schema_errors_name_file_and_key(tmp_path: Path) -> None:
    write(
        tmp_path,
        **{
            "a.yaml": "name: a\nlimits: {max_output: 3}\n",
            "b.yaml": "name: b\nlimits: {max_output_tokens: 10, default_output_tokens: 20}\n",
            "c.yaml": "name: c\npriority: urgent\n",
            "d.yaml": "- name: d\n  tokens: magic\n- name: e\n  match: {models: [x]}\n",
        },
    )
    found = "\n".join(problems(tmp_path))
    assert "a.yaml.limits.max_output: unknown key" in found
    assert "b.yaml.limits.default_output_tokens: must be <= max_output_tokens (10), got 20" in found
    assert "priority 'urgent' is not an admission class" in found
    assert "d.yaml[0.0].tokens: must be one of" in found
    assert "match.models (aliases) needs `model`" in found


def test_duplicates_and_dangling_tenant_references(tmp_path: Path) -> None:
    write(
        tmp_path,
        **{
            "a.yaml": "name: a\nmatch: {tasks: [x], models: [m]}\nmodel: real\n",
            "b.yaml": "name: b\nmatch: {tasks: [x], models: [m]}\nmodel: real\nisolation: tenant\n",
        },
    )
    found = "\n".join(problems(tmp_path))
    assert "X-Task value 'x' is already used by policy 'a'" in found
    assert "model alias 'm' is already used by policy 'a'" in found


def test_auth_references_checked(tmp_path: Path) -> None:
    write(tmp_path, **{"a.yaml": "name: a\nisolation: tenant\n"})
    key = {"tenant": "t", "sha256": hashlib.sha256(b"k").hexdigest()}
    from gateway.config.decode import decode

    auth = decode(
        AuthConfig,
        {
            "enabled": True,
            "keys": [key],
            "tenants": {"t": {"default_task": "nope", "allowed_tasks": ["nope", "a"]}},
        },
    )
    found = "\n".join(problems(tmp_path, auth))
    assert "auth.tenants.t.default_task: no policy named 'nope'" in found
    assert "auth.tenants.t.allowed_tasks: no policy named 'nope'" in found
    assert "auth.isolation_secret: required" in found


def test_builtin_default_when_none_is_defined(tmp_path: Path) -> None:
    write(tmp_path, **{"a.yaml": "name: a\n"})
    policies = load_policy_set(str(tmp_path))
    assert policies.default.name == DEFAULT_POLICY
    assert policies.default.limits.default_output_tokens == 4096
    assert policies.known_tasks == ["a", "default"]


def _check(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(config)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **env},
    )


def test_check_config_validates_and_prints_policies_with_secrets_masked(tmp_path: Path) -> None:
    pol = tmp_path / "pol"
    pol.mkdir()
    write(pol, **{"a.yaml": "name: a\nisolation: tenant\n"})
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "replicas: [{url: 'http://127.0.0.1:8000'}]\npolicies: pol\n"
        "auth:\n  enabled: true\n  isolation_secret: ${SECRET}\n"
        "  keys: [{tenant: t, key: '${CLIENT_KEY}'}]\n  tenants: "
        "{t: {default_task: a, requests_per_min: 5}}\n"
    )
    env = {"SECRET": "s3cr3t-isolation-value", "CLIENT_KEY": "sk-very-private-key"}
    ok = _check(cfg, env)
    assert ok.returncode == 0, ok.stderr
    assert "s3cr3t-isolation-value" not in ok.stdout and "sk-very-private-key" not in ok.stdout
    assert "loaded_policies:" in ok.stdout and "name: a" in ok.stdout
    write(pol, **{"b.yaml": "name: b\nlimits: {max_input_tokens: 0}\n"})
    bad = _check(cfg, env)
    assert bad.returncode == 1
    assert "b.yaml.limits.max_input_tokens: must be >= 1, got 0" in bad.stderr


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="SIGHUP is POSIX-only")
def test_sighup_reloads_policies_in_serve(tmp_path: Path) -> None:
    from gateway.http.serving import free_port
    from gateway.sim.cluster import SimCluster

    write(tmp_path, **{"a.yaml": "name: a\n"})
    port, admin = free_port(), free_port()
    with SimCluster.start(1, speed=50) as sim:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--replica",
                sim.urls[0],
                "--port",
                str(port),
                "--admin-port",
                str(admin),
                "--policies",
                str(tmp_path),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            names = _wait_policies(admin, lambda n: "a" in n)
            assert "b" not in names
            write(tmp_path, **{"b.yaml": "name: b\n"})
            proc.send_signal(signal.SIGHUP)
            assert "b" in _wait_policies(admin, lambda n: "b" in n)
            write(tmp_path, **{"c.yaml": "name: c\nbogus: 1\n"})
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.5)
            assert _wait_policies(admin, lambda n: True) == [
                "a",
                "b",
                "default",
            ]  # refused, old set kept
            assert proc.poll() is None
        finally:
            proc.terminate()
            proc.communicate(timeout=30)


def _wait_policies(admin_port: int, ok: Callable[[list[str]], bool]) -> list[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            data = httpx.get(f"http://127.0.0.1:{admin_port}/admin/policies", timeout=2).json()
            names = sorted(p["name"] for p in data["policies"])
            if ok(names):
                return names
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the gateway did not serve the expected policies in time")
