"""Fixtures that run a real llama.cpp ``llama-server`` (build b11434) for the engine tests.

The binary and the model are prepared once, into a cache outside the checkout, by
``scripts/engines.py`` (``python scripts/engines.py``; a cold build takes minutes). When
this test session selects engine tests and the engine is not cached yet, the preparation
runs at the end of collection, i.e. *before* any per-test timeout starts.

Fixtures (all servers listen on free loopback ports, ``--parallel 2 --ctx-size 4096``,
so every slot has ``n_ctx == 2048``):

``llama_servers``        session: list of 2 base URLs (``http://127.0.0.1:PORT``), two processes
``llama_server``         session: the first of those URLs
``llama_server_procs``   session: the two :class:`LlamaServer` handles (pid, port, log file)
``llama_reset``          function: waits until every slot of both servers is idle before the
                         test and returns ``reset(erase=False)`` to call again in the test
``start_llama_server``   function: factory ``start(*extra_args, parallel=2, ctx_size=4096)``
                         for tests that need their own server (stopped after the test)
``llama_server_binary`` / ``llama_model``  session: the cached paths

vLLM 0.32.0 (CPU) for the tests in ``vllm/`` (their servers: ``vllm/conftest.py``):

``vllm_paths``           session: (the vLLM venv's python, the HF model folder), prepared
                         at the end of collection when tests under ``vllm/`` are selected

Set ``GATEWAY_SKIP_ENGINE_TESTS=1`` to skip these tests (loudly). Never skipped when ``CI``
is set: in CI a missing engine is a failure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .llamaserver import (
    CTX_SIZE,
    ENGINE_DIR,
    PARALLEL,
    LlamaServer,
    load_engines,
    spawn_llama_server,
    start_servers,
    wait_slots_idle,
)

engines = load_engines()
VLLM_DIR = ENGINE_DIR / "vllm"

SKIP_ENV = "GATEWAY_SKIP_ENGINE_TESTS"
SKIP_REASON = (
    f"real-engine tests SKIPPED because {SKIP_ENV}=1 -- llama-server was NOT exercised; "
    "unset it and run `python scripts/engines.py` to enable them"
)


def engine_tests_skipped() -> bool:
    """True when the engine tests are to be skipped (never when ``CI`` is set)."""
    return os.environ.get(SKIP_ENV, "") not in ("", "0") and not os.environ.get("CI")


# --------------------------------------------------------------------------- hooks


def _is_engine_item(item: pytest.Item) -> bool:
    return ENGINE_DIR in Path(str(item.path)).resolve().parents


def _is_vllm_item(item: pytest.Item) -> bool:
    return VLLM_DIR in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = engine_tests_skipped()
    for item in items:
        if _is_engine_item(item):
            item.add_marker(pytest.mark.engine)
            if skip:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


_prepare_error: str | None = None
_engine_paths: tuple[Path, Path] | None = None
_vllm_error: str | None = None
_vllm_paths: tuple[Path, Path] | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Prepare the engines the selected tests need before any runs (outside test timeouts)."""
    if engine_tests_skipped():
        return
    if any(_is_vllm_item(i) for i in session.items):
        _prepare_vllm(session)
    if any(_is_engine_item(i) and not _is_vllm_item(i) for i in session.items):
        _prepare_llama(session)


def _prepare_vllm(session: pytest.Session) -> None:
    global _vllm_error, _vllm_paths
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if not engines.vllm_is_ready() and tr is not None:
        tr.write_line(
            "[engine tests] vLLM is not prepared yet: installing it once now (minutes, "
            f"~3.5 GB; log: {engines.vllm_engine.prepare_log(engines.cache_root())}). "
            f"Set {SKIP_ENV}=1 to skip engine tests instead.",
            yellow=True,
            bold=True,
        )
    try:
        _vllm_paths = engines.ensure_vllm()
    except engines.EngineError as e:
        _vllm_error = str(e)


def _prepare_llama(session: pytest.Session) -> None:
    global _prepare_error, _engine_paths
    if os.environ.get(SKIP_ENV) and os.environ.get("CI"):
        sys.stderr.write(f"\n[engine tests] {SKIP_ENV} is ignored because CI is set\n")
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if not engines.is_built() and tr is not None:
        tr.write_line(
            "[engine tests] llama-server is not cached yet: building it once now "
            f"(several minutes; log: {engines.build_log_path()}). "
            f"Set {SKIP_ENV}=1 to skip engine tests instead.",
            yellow=True,
            bold=True,
        )
    try:
        _engine_paths = (engines.ensure_llama_server(), engines.ensure_model())
    except engines.EngineError as e:
        _prepare_error = str(e)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if engine_tests_skipped() and terminalreporter.stats.get("skipped"):
        for rep in terminalreporter.stats["skipped"]:
            if "real-engine tests SKIPPED" in str(rep.longrepr):
                terminalreporter.write_sep("!", SKIP_REASON, red=True, bold=True)
                break


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def _engine_ready() -> tuple[Path, Path]:
    if engine_tests_skipped():
        pytest.skip(SKIP_REASON)
    if _prepare_error is not None:
        pytest.fail(
            "real llama-server is not available -- run `python scripts/engines.py` and read "
            f"its error (or set {SKIP_ENV}=1 outside CI to skip):\n{_prepare_error}",
            pytrace=False,
        )
    if _engine_paths is not None:
        return _engine_paths
    return engines.ensure_llama_server(), engines.ensure_model()


@pytest.fixture(scope="session")
def llama_server_binary(_engine_ready: tuple[Path, Path]) -> Path:
    return _engine_ready[0]


@pytest.fixture(scope="session")
def llama_model(_engine_ready: tuple[Path, Path]) -> Path:
    return _engine_ready[1]


@pytest.fixture(scope="session")
def llama_server_procs(
    llama_server_binary: Path, llama_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[LlamaServer]]:
    base = tmp_path_factory.mktemp("llama-servers")
    save_dir = base / "slot-save"
    save_dir.mkdir()
    servers = start_servers(
        llama_server_binary, llama_model, base, 2, "--slot-save-path", str(save_dir) + "/"
    )
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="session")
def llama_servers(llama_server_procs: list[LlamaServer]) -> list[str]:
    return [s.url for s in llama_server_procs]


@pytest.fixture(scope="session")
def llama_server(llama_servers: list[str]) -> str:
    return llama_servers[0]


@pytest.fixture()
def llama_reset(llama_server_procs: list[LlamaServer]) -> Callable[..., None]:
    """Before the test: all slots idle (and the processes alive). Returns ``reset(erase=)``."""
    for server in llama_server_procs:
        if server.proc.poll() is not None:
            pytest.fail(
                f"shared llama-server pid {server.pid} died ({server.proc.returncode}):\n"
                f"{server.log_tail()}"
            )
    urls = [s.url for s in llama_server_procs]

    def reset(erase: bool = False, timeout: float = 60.0) -> None:
        wait_slots_idle(urls, timeout=timeout, erase=erase)

    reset()
    return reset


@pytest.fixture()
def start_llama_server(
    llama_server_binary: Path, llama_model: Path, tmp_path: Path
) -> Iterator[Callable[..., LlamaServer]]:
    """Factory for a private server: ``start(*extra_args, parallel=, ctx_size=, wait=True)``."""
    started: list[LlamaServer] = []

    def start(
        *extra: str, parallel: int = PARALLEL, ctx_size: int = CTX_SIZE, wait: bool = True
    ) -> LlamaServer:
        paths = (llama_server_binary, llama_model, tmp_path)
        if wait:
            server = start_servers(*paths, 1, *extra, parallel=parallel, ctx_size=ctx_size)[0]
        else:
            server = spawn_llama_server(*paths, *extra, parallel=parallel, ctx_size=ctx_size)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


# --------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="session")
def vllm_paths() -> tuple[Path, Path]:
    if engine_tests_skipped():
        pytest.skip(SKIP_REASON)
    if _vllm_error is not None:
        pytest.fail(
            "real vLLM is not available -- run `python scripts/engines.py` and read its "
            f"error (or set {SKIP_ENV}=1 outside CI to skip):\n{_vllm_error}",
            pytrace=False,
        )
    return _vllm_paths if _vllm_paths is not None else engines.ensure_vllm()
