"""The CLI as a user runs it: `gateway demo` and `gateway serve --replica URL` in subprocesses."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from gateway import __version__
from gateway.http.serving import free_port
from gateway.sim.cluster import SimCluster


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


def test_demo_serves_openai_clients(tmp_path: Path) -> None:
    port, admin, sim = free_port(), free_port(), free_port()
    with _process(
        [
            "demo",
            "--port",
            str(port),
            "--admin-port",
            str(admin),
            "--sim-port",
            str(sim),
            "--replicas",
            "1",
        ],
        tmp_path / "demo.log",
    ):
        _wait_ready(f"http://127.0.0.1:{port}")
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="demo", max_retries=0
        )
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
        assert httpx.get(f"http://127.0.0.1:{admin}/metrics", timeout=5).status_code == 200
        # The printed snippets run as pasted: the shipped chat policy answers X-Task: chat.
        out = (tmp_path / "demo.log").read_text()
        assert "Task policies: " in out
        snippet = out[out.index("curl -s") : out.index("\nPY\n") + 4]
        if shutil.which("curl") is None:  # the SDK half alone
            snippet = snippet[snippet.index(sys.executable) :]
        ran = subprocess.run(
            ["bash", "-c", snippet], capture_output=True, text=True, timeout=60, check=False
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.count(" ") >= 32, ran.stdout  # the curl answer and the streamed text
        assert "error" not in ran.stdout
    log = (tmp_path / "demo.log").read_text()
    assert "Traceback" not in log  # Ctrl-C stops it cleanly


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
        parser.parse_args(
            ["serve", "--config", str(cfg_file), "--server", "lean", "--port", "8282"]
        )
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
    for extra in ([], ["--server", "uvicorn"]):
        out = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), *extra],
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
