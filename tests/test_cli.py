"""The CLI as a user runs it: `gateway demo` and `gateway serve --replica URL` in subprocesses."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway import __version__
from gateway.http.serving import free_port
from gateway.sim.cluster import SimCluster

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def _process(args: Sequence[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                raise AssertionError("no exit within 10 s of SIGINT") from None
        assert code == 0, f"exit status {code} after SIGINT"


def _wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready within {timeout}s")


@dataclass(frozen=True)
class Demo:
    port: int
    admin: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """`gateway demo` as a user starts it (the shipped policies), on free ports."""
    port, admin, sim = free_port(), free_port(), free_port()
    log = tmp_path_factory.mktemp("demo") / "demo.log"
    argv = ["demo", "--port", str(port), "--admin-port", str(admin), "--sim-port", str(sim)]
    with _process([*argv, "--replicas", "1"], log):
        _wait_ready(f"http://127.0.0.1:{port}")
        yield Demo(port, admin, log)
    assert "Traceback" not in log.read_text()  # Ctrl-C stops it cleanly


def test_demo_serves_openai_clients(demo: Demo) -> None:
    client = openai.OpenAI(base_url=demo.url + "/v1", api_key="demo", max_retries=0)
    resp = client.chat.completions.create(
        model="sim-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="sim-model",
            max_tokens=8,
            stream=True,
            messages=[{"role": "user", "content": "hi"}],
        )
        if c.choices
    )
    assert text.strip()
    assert httpx.get(f"http://127.0.0.1:{demo.admin}/metrics", timeout=5).status_code == 200


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )


def test_demo_prints_snippets_that_run_as_pasted(demo: Demo) -> None:
    out = demo.log.read_text()
    assert "Task policies: " in out
    snippet = out[out.index("curl -s") : out.index("\nPY\n") + 4]
    if shutil.which("curl") is None:  # the SDK half alone
        snippet = snippet[snippet.index(sys.executable) :]
    ran = _bash(snippet)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count(" ") >= 32, ran.stdout  # the curl answer and the streamed text
    assert "error" not in ran.stdout


def _readme_blocks(section: str, lang: str) -> list[str]:
    """The fenced `lang` code blocks of one `## section` of README.md."""
    text = (ROOT / "README.md").read_text()
    body = text[text.index(f"\n## {section}\n") :]
    body = body[: body.find("\n## ", 1)]
    return re.findall(rf"^```{lang}\n(.*?)^```$", body, re.M | re.S)


def test_readme_client_example_prints_what_it_promises(demo: Demo) -> None:
    (example,) = _readme_blocks("Use it from an OpenAI client", "python")
    code = example.replace("http://127.0.0.1:8080", demo.url)
    assert code != example, "the example no longer points at the demo's port"
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    answer, usage = ran.stdout.splitlines()
    assert len(answer.split()) >= 8, answer  # the simulated answer's words
    promised = re.search(r"# (\d+ tokens from \S+)$", example, re.M)
    assert promised and usage == promised.group(1)


def test_readme_quick_start_curl_answers(demo: Demo) -> None:
    if shutil.which("curl") is None:
        assert not os.environ.get("CI"), "curl is missing in CI"
        pytest.skip("NOT CHECKED: the README's curl example (curl is not installed)")
    blocks = _readme_blocks("Quick start (no GPU needed)", "sh")
    (example,) = [b for b in blocks if b.startswith("curl ")]
    ran = _bash(example.replace("http://127.0.0.1:8080", demo.url))
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert answer["usage"]["completion_tokens"] == 32, answer


def _shipped_policies() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "policies").glob("*.yaml"))]


def test_every_shipped_policy_answers_in_the_demo_by_task_and_by_alias(demo: Demo) -> None:
    client = openai.OpenAI(base_url=demo.url + "/v1", api_key="demo", max_retries=0)
    asked: list[tuple[str, str | None]] = []
    for policy in _shipped_policies():
        asked.append(("sim-model", policy["name"]))
        asked += [(alias, None) for alias in policy.get("match", {}).get("models", [])]
    assert ("chat", None) in asked, "the shipped chat policy has the alias `chat`"
    for model, task in asked:
        resp = client.chat.completions.with_raw_response.create(
            model=model,
            max_tokens=4,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Task": task} if task else {},
        )
        assert resp.status_code == 200, (model, task)
        assert resp.parse().model == "sim-model", (model, task)


def test_serve_detects_engine_kinds(tmp_path: Path) -> None:
    with (
        SimCluster.start(1, flavor="vllm", speed=50) as vllm,
        SimCluster.start(1, flavor="llamacpp", speed=50) as llama,
    ):
        port, admin = free_port(), free_port()
        with _process(
            [
                "serve",
                "--replica",
                vllm.urls[0],
                "--replica",
                llama.urls[0],
                "--port",
                str(port),
                "--admin-port",
                str(admin),
            ],
            tmp_path / "serve.log",
        ):
            _wait_ready(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + 15
            kinds: dict[str, str] = {}
            while time.monotonic() < deadline:
                reps = httpx.get(f"http://127.0.0.1:{admin}/admin/replicas", timeout=5).json()[
                    "replicas"
                ]
                kinds = {r["url"]: r["kind"] for r in reps if r["healthy"]}
                if len(kinds) == 2:
                    break
                time.sleep(0.2)
            assert kinds == {vllm.urls[0]: "vllm", llama.urls[0]: "llamacpp"}
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"]
            assert any(m["id"] == "sim-model" for m in models)


def test_serve_without_replicas_fails_with_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "replicas: at least one replica is required" in result.stderr


def test_serve_flags_override_the_config_file_and_keep_its_other_listen_keys(
    tmp_path: Path,
) -> None:
    from gateway.cli import _build_parser, _serve_config

    cfg_file = tmp_path / "gw.yaml"
    cfg_file.write_text(
        "listen:\n  port: 8181\n  admin_host: 127.0.0.2\nreplicas:\n  - url: http://127.0.0.1:9\n"
    )
    parser = _build_parser()
    from_file = _serve_config(parser.parse_args(["serve", "--config", str(cfg_file)]))
    assert (from_file.listen.port, from_file.listen.admin_host) == (8181, "127.0.0.2")
    flagged = _serve_config(
        parser.parse_args(["serve", "--config", str(cfg_file), "--port", "8282"])
    )
    assert (flagged.listen.server, flagged.listen.port, flagged.listen.admin_host) == (
        "lean",
        8282,
        "127.0.0.2",
    )
    assert (
        _serve_config(parser.parse_args(["serve", "--replica", "http://127.0.0.1:9"])).listen.server
        == "lean"
    )


def test_serve_refuses_plugin_specs_the_registry_does_not_know(tmp_path: Path) -> None:
    cfg_file = tmp_path / "gw.yaml"
    cfg_file.write_text(
        "replicas:\n  - url: http://127.0.0.1:9\n"
        "scheduling:\n  plugins: [{name: x, type: nope}]\n"
        "  profiles: [{name: p, picker: x}]\n  policy: p\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(cfg_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("config error:\n")
    assert "scheduling.plugins[0].type: unknown plugin type 'nope'" in result.stderr
    assert "scheduling.profiles[0].picker: no plugin named 'x' is defined" in result.stderr


def test_version_names_the_release_and_the_build() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    assert out.stdout.startswith(f"gateway {__version__} (")


def test_serve_refuses_uvicorn_for_the_public_listener(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("listen: {server: uvicorn}\nreplicas: [{url: 'http://127.0.0.1:1'}]\n")
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "server: uvicorn is refused for the public listener" in out.stderr
    assert "no request-head size or time limit" in out.stderr


@pytest.mark.parametrize("taken", ["--port", "--admin-port"])
def test_serve_with_a_port_taken_says_so_in_one_line_and_exits_2(taken: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports = {"--port": free_port(), "--admin-port": free_port(), taken: port}
        out = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--replica", "http://127.0.0.1:9"]
            + [str(a) for kv in ports.items() for a in kv],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines[-1] == f"gateway: cannot listen on 127.0.0.1:{port}: address already in use"
    assert "listening" not in out.stdout + out.stderr and "Traceback" not in out.stderr


def _help(*command: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "gateway", *command, "-h"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def test_top_level_help_reads_like_a_manual() -> None:
    text = _help()
    assert "admission gateway for self-hosted LLM serving" in text
    assert "`gateway serve |" not in text, "the module docstring is not the description"
    for command in ("serve", "check-config", "demo", "sim"):
        assert re.search(rf"^\s+{command}\s", text, re.M), f"{command} is not listed"
    assert "examples:" in text and "gateway COMMAND -h" in text


@pytest.mark.parametrize("command", ["serve", "check-config", "demo", "sim"])
def test_every_command_help_describes_every_flag_and_has_an_example(command: str) -> None:
    from gateway.cli import _build_parser

    text = _help(command)
    assert re.search(r"^examples?:$", text, re.M), f"{command} -h has no example"
    parser = _build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices[command]._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.dest
        assert "SimConfig." not in action.help, action.dest
        if action.choices is not None:
            assert all(str(c) in text for c in action.choices), action.dest
    if command == "check-config":
        assert "FILE" in text and "the gateway's YAML config file" in text


def test_serve_help_offers_no_value_that_is_refused() -> None:
    text = _help("serve")
    assert "uvicorn" not in text and "--server" not in text


def test_sim_help_lists_the_choices_of_flavor_and_scheduling_policy() -> None:
    text = _help("sim")
    assert "--flavor {vllm,llamacpp,sglang}" in text
    assert "--scheduling-policy {fcfs,priority}" in text


def test_check_config_into_a_closed_pipe_ends_without_a_traceback() -> None:
    """`gateway check-config FILE | head`: the reader leaves before the output is written."""
    env = {**os.environ, **{k: "x" for k in _CONFIG_ENV}}
    with subprocess.Popen(
        [sys.executable, "-m", "gateway", "check-config", str(ROOT / "config" / "gateway.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # long before the interpreter has started
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == 141, err


_CONFIG_ENV = (
    "GATEWAY_ADMIN_TOKEN",
    "GATEWAY_ISOLATION_SECRET",
    "REDIS_PASSWORD",
    "TEAM_A_API_KEY",
    "VLLM_API_KEY",
)


def test_readme_check_config_example_prints_the_config_with_secrets_masked() -> None:
    (block,) = [
        b for b in _readme_blocks("Put it in front of real engines", "sh") if "check-config" in b
    ]
    exports = {n: f"pasted-{n.lower()}" for n in re.findall(r"^export (\w+)=", block, re.M)}
    assert exports, "the example exports the key its config reads"
    (line,) = [ln for ln in block.splitlines() if ln.startswith("gateway check-config")]
    argv = line.split("#", 1)[0].split()
    env = {"PATH": os.environ["PATH"], **exports}  # only what the example exports
    out = subprocess.run(
        [sys.executable, "-m", "gateway", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    effective = yaml.safe_load(out.stdout)
    assert effective["replicas"] and "loaded_policies" in effective
    assert "'***'" in out.stdout
    assert not [v for v in exports.values() if v in out.stdout], "a secret is printed"


def test_demo_names_the_users_policy_file_in_a_policy_error(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text("name: default\npriority: urgent\n")
    port, admin, sim = free_port(), free_port(), free_port()
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "demo", "--policies", str(policies)]
        + ["--port", str(port), "--admin-port", str(admin), "--sim-port", str(sim)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "default.yaml: priority 'urgent' is not an admission class" in out.stderr
    assert "gateway-demo-policies-" not in out.stderr, "the demo's staged copy is not named"
