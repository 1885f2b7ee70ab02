"""Start, probe and stop real vLLM 0.32.0 (CPU) OpenAI servers (no pytest dependency).

The vLLM venv and the HF model folder come from ``scripts/engines.py`` (``ensure_vllm``).
Servers run ``python -m vllm.entrypoints.openai.api_server`` (the wheel's ``vllm`` console
script looks up a distribution named ``vllm`` and fails) with ``--enforce-eager`` (ready in
~40 s; compiled mode recompiles at every start), offline, on a free loopback port, with a
small KV cache (``--num-gpu-blocks-override``: blocks of 128 tokens), chunked prefill of
256 tokens a step, prompt token details
and KV cache events published on an ``ipc://`` endpoint (vLLM binds it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..health import wait_health
from ..llamaserver import _PRCTL, _die_with_parent, free_port

MODEL = "smollm2"
MAX_MODEL_LEN = 2048
BLOCK_SIZE = 128  # vLLM's CPU backend default
MAX_BATCHED_TOKENS = 256
SHARED_BLOCKS = 24  # 3,072 tokens: one max-length request fits, two long ones do not
# ~40 s alone, ~65 s for two at once on 2 busy cores; below pytest's 300 s test timeout
STARTUP_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 20.0


@dataclass
class VLLMServer:
    """A running vLLM API server started by these fixtures."""

    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    kv_events_endpoint: str
    num_blocks: int
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * BLOCK_SIZE

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the server's process group, SIGKILL after ``timeout``; idempotent."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout)


def vllm_argv(python: Path, model_dir: Path, port: int, num_blocks: int, events: str) -> list[str]:
    kv_events = (
        '{"enable_kv_cache_events": true, "publisher": "zmq", '
        f'"endpoint": "{events}", "topic": "kv"}}'
    )
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", MODEL,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--num-gpu-blocks-override", str(num_blocks),
        "--max-num-seqs", "8",
        # chunked prefill in steps of 256 tokens: a long prompt is "running" for several
        # steps before its first token, as on a GPU with a long context
        "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS),
        "--enforce-eager",
        "--enable-prompt-tokens-details",
        "--kv-events-config", kv_events,
        "--disable-uvicorn-access-log",
    ]  # fmt: skip


def vllm_env(tmp_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    env.update(
        TMPDIR=str(tmp_dir),  # vLLM leaves a `vllm_dist_*` file there at every start
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; the block override then caps what is used
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_LOGGING_LEVEL="INFO",
    )
    return env


def spawn_vllm(
    python: Path, model_dir: Path, log_dir: Path, num_blocks: int = SHARED_BLOCKS
) -> VLLMServer:
    """Start one server (does not wait for it to be ready)."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"vllm-{port}.log"
    events = f"ipc://{log_dir}/kv-events-{port}.ipc"
    argv = vllm_argv(python, model_dir, port, num_blocks, events)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=vllm_env(log_dir),
            cwd=log_dir,
            start_new_session=True,  # its engine-core child goes with the group on stop
            preexec_fn=_die_with_parent if _PRCTL is not None else None,  # noqa: PLW1509
        )
    return VLLMServer(port, proc, log_path, events, num_blocks, argv)


def wait_ready(server: VLLMServer, deadline: float) -> None:
    """Poll ``/health`` until 200 (the port opens only once the engine is up)."""
    wait_health(
        f"vLLM (log {server.log_path})", server.proc, server.url, server.log_tail, deadline, 0.5
    )


def start_vllm_servers(
    python: Path, model_dir: Path, log_dir: Path, blocks: Sequence[int]
) -> list[VLLMServer]:
    """Start one server per entry of ``blocks`` at once and wait for all of them."""
    started: list[VLLMServer] = []
    try:
        for n in blocks:
            started.append(spawn_vllm(python, model_dir, log_dir, n))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for server in started:
            wait_ready(server, deadline)
    except BaseException:
        for server in started:
            server.stop()
        raise
    return started


def engine_metrics(url: str) -> dict[str, float]:
    """Sample name (labels dropped, summed) -> value from vLLM's ``/metrics``."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if not line or line[0] == "#":
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def wait_idle(urls: Sequence[str], timeout: float = 60.0) -> None:
    """Until no server runs or queues a request."""
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            m = engine_metrics(url)
            if (
                m.get("vllm:num_requests_running", 0) == 0
                and m.get("vllm:num_requests_waiting", 0) == 0
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: requests still running after {timeout} s")
            time.sleep(0.05)
