"""Real vLLM 0.32.0 (CPU) servers for the tests in this package (``vllmserver.py``).

Package scope: the servers start with the first test here and stop after the last one, so
they hold no memory or cores while the rest of the suite runs.

``vllm_servers``  two :class:`VLLMServer` handles started at once (24 blocks of 128 tokens
                  each, prompt token details, KV events on ``ipc://``)
``vllm_server``   the first of them
``vllm_idle``     function: both alive, neither running nor queueing a request
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .vllmserver import SHARED_BLOCKS, VLLMServer, start_vllm_servers, wait_idle


@pytest.fixture(scope="package")
def vllm_servers(
    vllm_paths: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[VLLMServer]]:
    base = tmp_path_factory.mktemp("vllm-servers")
    servers = start_vllm_servers(*vllm_paths, base, [SHARED_BLOCKS, SHARED_BLOCKS])
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="package")
def vllm_server(vllm_servers: list[VLLMServer]) -> VLLMServer:
    return vllm_servers[0]


@pytest.fixture()
def vllm_idle(vllm_servers: list[VLLMServer]) -> list[VLLMServer]:
    for server in vllm_servers:
        if server.proc.poll() is not None:
            pytest.fail(
                f"shared vLLM pid {server.proc.pid} died ({server.proc.returncode}):\n"
                f"{server.log_tail()}"
            )
    wait_idle([s.url for s in vllm_servers])
    return vllm_servers
