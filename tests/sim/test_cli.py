"""`gateway sim` options and `python -m gateway.sim` serving several replicas."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.http.serving import free_port
from gateway.sim.cli import add_sim_arguments, config_from_args, run_sim

ROOT = Path(__file__).resolve().parents[2]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_knob_is_an_option() -> None:
    args = _parse(
        "--flavor",
        "llamacpp",
        "--ctx-size",
        "8192",
        "--parallel",
        "2",
        "--kv-unified",
        "--no-metrics",
        "--speed",
        "10",
        "--api-key",
        "k",
        "--max-num-queued-reqs",
        "5",
        "--replicas",
        "3",
        "--port",
        "9000",
    )
    cfg = config_from_args(args)
    assert (cfg.flavor, cfg.kv_tokens, cfg.parallel, cfg.unified_kv) == ("llamacpp", 8192, 2, True)
    assert (cfg.metrics_enabled, cfg.speed, cfg.api_key, cfg.max_num_queued_reqs) == (
        False,
        10.0,
        "k",
        5,
    )
    assert (args.replicas, args.port, args.host) == (3, 9000, "127.0.0.1")
    assert config_from_args(_parse()) == config_from_args(_parse("--flavor", "vllm"))


def test_invalid_config_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_sim(_parse("--speed", "0")) == 2
    assert "speed" in capsys.readouterr().err
    assert run_sim(_parse("--replicas", "0")) == 2


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def test_module_serves_consecutive_ports() -> None:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gateway.sim",
        "--replicas",
        "2",
        "--port",
        str(port),
        "--flavor",
        "llamacpp",
        "--speed",
        "50",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        urls = [f"http://127.0.0.1:{port + i}" for i in range(2)]
        deadline = time.monotonic() + 20.0
        while not all(_healthy(u) for u in urls):
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "replicas did not come up"
            time.sleep(0.05)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for u in urls:
            assert httpx.post(u + "/v1/chat/completions", json=body, timeout=5.0).status_code == 200
            assert httpx.get(u + "/slots", timeout=5.0).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err.decode()
    assert out.decode().count("sim llamacpp replica on http://127.0.0.1:") == 2
