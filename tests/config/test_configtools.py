from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.decode import ConfigError
from gateway.config.schema import GatewayConfig, load_config, parse_config
from gateway.scheduling.validate import check


def problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    return exc.value.problems


def test_minimal_config_gets_defaults() -> None:
    cfg = parse_config({"replicas": [{"url": "http://127.0.0.1:8000/"}]})
    assert cfg.replicas[0].url == "http://127.0.0.1:8000"
    assert cfg.replicas[0].name == "127.0.0.1:8000"
    assert cfg.listen.port == 8080 and cfg.listen.admin_host == "127.0.0.1"
    assert cfg.limits.max_body_bytes == 32 * 1024 * 1024


def test_unknown_key_is_named_with_its_path() -> None:
    found = problems({"replicas": [{"url": "http://a:1", "wieght": 2}]})
    assert any(p.startswith("replicas[0].wieght: unknown key") for p in found), found


def test_wrong_types_are_not_coerced() -> None:
    found = problems({"listen": {"port": "8080"}, "health": {"interval_s": True}})
    assert "listen.port: expected an integer, got '8080'" in found
    assert any(p.startswith("health.interval_s: expected a number") for p in found)


def test_every_problem_is_reported_at_once() -> None:
    found = problems({"listen": {"port": -1}, "replicas": [{"url": "ftp://x"}], "bogus": 1})
    joined = "\n".join(found)
    assert "bogus: unknown key" in joined
    assert "replicas[0].url: must be http(s)" in joined
    assert "listen.port: must be a TCP port" in joined


def test_literal_choices_and_required_keys() -> None:
    found = problems({"replicas": [{"kind": "tgi"}]})
    assert "replicas[0].url: required key is missing" in found
    assert any("replicas[0].kind: must be one of" in p for p in found)
    assert any(
        p.startswith("listen.server: must be one of 'lean', 'uvicorn'")
        for p in problems(
            {"listen": {"server": "nginx"}, "replicas": [{"url": "http://127.0.0.1:1"}]}
        )
    )


def test_env_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_KEY", "s3cret")
    cfg = parse_config({"replicas": [{"url": "http://a:1", "api_key": "${ENGINE_KEY}"}]})
    assert cfg.replicas[0].api_key == "s3cret"
    monkeypatch.delenv("ENGINE_KEY")
    found = problems({"replicas": [{"url": "http://a:1", "api_key": "${ENGINE_KEY}"}]})
    assert found == ["replicas[0].api_key: environment variable ENGINE_KEY is not set"]


def test_duplicate_replica_names() -> None:
    found = problems(
        {"replicas": [{"url": "http://a:1", "name": "x"}, {"url": "http://b:1", "name": "x"}]}
    )
    assert any("duplicate replica names ['x']" in p for p in found)


def test_invalid_yaml_file(tmp_path: Path) -> None:
    bad = tmp_path / "g.yaml"
    bad.write_text("listen: [unclosed\n")
    with pytest.raises(ConfigError) as exc:
        load_config(bad)
    assert "invalid YAML" in exc.value.problems[0]


def _check_config(
    path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_check_config_cli_rejects_unknown_key(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "replicas:\n  - url: http://127.0.0.1:8000\n    colour: blue\nlisten:\n  prot: 1\n"
    )
    result = _check_config(cfg)
    assert result.returncode == 1
    assert "replicas[0].colour: unknown key" in result.stderr
    assert "listen.prot: unknown key" in result.stderr


def test_check_config_cli_prints_effective_config_with_secrets_masked(tmp_path: Path) -> None:
    import os

    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("replicas:\n  - url: http://127.0.0.1:8000\n    api_key: ${K}\n")
    result = _check_config(cfg, env={**os.environ, "K": "very-secret-key"})
    assert result.returncode == 0, result.stderr
    assert "very-secret-key" not in result.stdout
    assert "api_key: '***'" in result.stdout
    assert "first_byte_s: 600.0" in result.stdout


def test_check_config_cli_checks_plugin_specs_against_the_registry(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "scheduling:\n  policy: p\n  profiles:\n    - {name: p, picker: least-load}\n"
        "  plugins:\n    - {name: least-load, type: least-load, parameters: {bogus: 1}}\n"
    )
    result = _check_config(cfg)
    assert result.returncode == 1
    assert "scheduling.plugins[0].parameters.bogus: unknown key" in result.stderr
    assert "profiles[0].picker: plugin 'least-load' is a scorer, expected a picker" in result.stderr


def test_check_config_cli_reports_every_problem_of_a_file_in_one_run(tmp_path: Path) -> None:
    """Decoding, plugin and policy problems together, each `key.path: problem`
    (none of them appears only once another is fixed)."""
    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "chat.yaml").write_text(
        "name: chat\nlimits: {max_input_tokens: -5}\nbogus: 1\n"
    )
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "listen: {port: 99999}\n"
        "replicas:\n  - {url: 'http://127.0.0.1:8000', api_key: '${GW_TEST_UNSET_KEY}'}\n"
        "health: {interval_s: '2'}\n"
        "scheduling:\n  plugins: [{name: x, type: no-such-scorer}]\n"
        "policies: pol\n"
    )
    result = _check_config(cfg)
    assert result.returncode == 1
    lines = result.stderr.splitlines()[1:]
    assert [line.strip().split(":", 1)[0] for line in lines] == [
        "replicas[0].api_key",
        "listen.port",
        "health.interval_s",
        "scheduling.plugins[0].type",
        "scheduling.profiles",
        "chat.yaml.bogus",
        "chat.yaml.limits.max_input_tokens",
    ], result.stderr
    assert "GW_TEST_UNSET_KEY is not set" in result.stderr
    # one problem for built-in profiles that name plugins the own list lacks
    assert sum("no plugin named" in line for line in lines) == 0


def test_config_is_plain_data_and_imports_no_plugins() -> None:
    # Decoding checks the shape; the plugin registry checks the specs (at startup).
    cfg = parse_config({"scheduling": {"plugins": [{"name": "x", "type": "nope"}], "policy": "x"}})
    assert cfg.scheduling.plugins[0].type == "nope"
    code = (
        "import sys, gateway.config.schema; "
        "print(sorted(m for m in sys.modules if m.startswith('gateway.')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "gateway.config.schema" in loaded
    assert "gateway.scheduling" not in loaded


def test_shipped_example_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "x")
    cfg = load_config(Path(__file__).resolve().parents[2] / "config" / "gateway.yaml")
    assert isinstance(cfg, GatewayConfig)
    assert check(cfg.scheduling) == []
    assert [r.kind for r in cfg.replicas] == ["vllm", "vllm", "llamacpp"]


def _redis(**redis: object) -> dict[str, object]:
    return {"state": {"backend": "redis", "redis": redis}}


def test_state_redis_section_is_decoded() -> None:
    cfg = parse_config(
        _redis(url="rediss://:pw@cache:6380/2", pool_size=8, on_failure="closed")
    ).state
    assert cfg.redis is not None
    assert (cfg.redis.url, cfg.redis.pool_size, cfg.redis.on_failure) == (
        "rediss://:pw@cache:6380/2",
        8,
        "closed",
    )
    assert cfg.redis.command_timeout_s == 0.25 and cfg.redis.probe_interval_s == 1.0
    sentinel = parse_config(
        _redis(url="redis://:pw@/1", sentinel={"master": "m", "nodes": ["10.0.0.1:26379"]})
    ).state.redis
    assert sentinel is not None and sentinel.sentinel is not None
    assert sentinel.sentinel.addresses == (("10.0.0.1", 26379),)
    assert parse_config(_redis(url="unix:///run/redis.sock?db=3")).state.redis is not None
    assert parse_config({}).state.backend == "memory"


def test_state_redis_is_refused_when_unusable() -> None:
    assert problems({"state": {"backend": "redis"}}) == [
        "state: backend redis needs redis.url (or redis.sentinel)"
    ]
    assert problems(_redis()) == [
        "state.redis.url: is required (redis://, rediss:// or unix://), or sentinel"
    ]
    cases = {
        "http://cache:6379": "state.redis.url: must be redis://, rediss:// or unix://",
        "redis://cache:99999": "state.redis: url 'redis://cache:99999' cannot be parsed",
        "redis://[::1": "state.redis: url 'redis://[::1' cannot be parsed",
        "redis://cache/x": "state.redis: url names database 'x'",
        "redis://cache?ssl=1": "state.redis.url: must not have query parameters",
        "redis:///0": "state.redis: url needs a host",
        "unix://": "state.redis: url unix:// needs the socket path",
    }
    for url, expected in cases.items():
        found = problems(_redis(url=url))
        assert len(found) == 1 and found[0].startswith(expected), (url, found)


def test_state_redis_bad_keys_name_their_path() -> None:
    sentinel = {"master": "m", "nodes": ["s1:26379"]}
    assert problems(_redis(url="redis://:p@/0", sentinel=sentinel, cluster=True)) == [
        "state.redis: cluster and sentinel exclude each other: give one"
    ]
    assert problems(_redis(url="redis://c:1/2", cluster=True)) == [
        "state.redis: url names database 2, but Redis Cluster has only database 0"
    ]
    assert problems(_redis(url="redis://c:1", command_timeout_s=0)) == [
        "state.redis.command_timeout_s: must be > 0, got 0.0"
    ]
    assert problems(_redis(url="redis://c:1", on_failure="maybe")) == [
        "state.redis.on_failure: must be one of 'open', 'closed', got 'maybe'"
    ]
    found = problems(_redis(url="redis://c:1", pool=3))
    assert found[0].startswith("state.redis.pool: unknown key (known keys: cluster,")
    found = problems(_redis(sentinel={"master": "m", "nodes": ["s1"]}))
    assert found == ["state.redis.sentinel.nodes: must be host:port, got 's1'"]
    assert problems({"state": {"key_prefix": "gw:{a}"}}) == [
        "state.key_prefix: must not contain { or } (Redis Cluster hash tags), got 'gw:{a}'"
    ]
    assert problems({"state": {"redis": {"url": "redis://c:1"}}}) == [
        "state.redis: is set but backend is memory: set backend: redis or remove it"
    ]


def test_old_redis_url_key_points_to_its_replacement() -> None:
    found = problems({"state": {"backend": "redis", "redis_url": "redis://c:1"}})
    assert "state.redis_url: no longer supported, use state.redis.url (see config/README.md)" in (
        found
    )


def test_redis_url_env_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:pw@cache:6379/0")
    redis = parse_config(_redis(url="${REDIS_URL}")).state.redis
    assert redis is not None and redis.url == "redis://:pw@cache:6379/0"


def test_check_config_masks_the_redis_password(tmp_path: Path) -> None:
    import os

    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "state:\n  backend: redis\n  redis:\n    url: redis://gw:${REDIS_PASSWORD}@cache:6379/0\n"
    )
    result = _check_config(cfg, env={**os.environ, "REDIS_PASSWORD": "hunter2-secret"})
    assert result.returncode == 0, result.stderr
    assert "hunter2-secret" not in result.stdout
    assert "url: redis://gw:***@cache:6379/0" in result.stdout
    assert "on_failure: open" in result.stdout
