"""scripts/vllm_engine.py's step bookkeeping (markers, resume, failure) with stand-in steps.

The real steps (pip, conversion) run in `scripts/engines.py` before the engine tests.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "vllm_engine.py"


@pytest.fixture()
def ve(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("vllm_engine_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("vllm_engine_under_test", None)


def fake_steps(
    ve: ModuleType, calls: list[str], fail: str | None = None
) -> dict[str, Callable[[Path, Path], None]]:
    def make(step: str) -> Callable[[Path, Path], None]:
        def run(root: Path, gguf: Path) -> None:
            calls.append(step)
            if step == fail:
                ve._run(["false"], root, step)  # a real failing command, logged
            if step == "venv":
                py = ve.vllm_python(root)
                py.parent.mkdir(parents=True, exist_ok=True)
                py.write_text("")

        return run

    return {step: make(step) for step in ve.STEPS}


def test_steps_run_once_and_resume_after_a_failure(ve: ModuleType, tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    calls: list[str] = []
    ve._ACTIONS = fake_steps(ve, calls, fail="prune")
    with pytest.raises(RuntimeError) as info:
        ve.prepare(tmp_path, gguf, lambda _msg: None)
    message = str(info.value)
    assert "step 'prune' failed (exit 1): false" in message
    assert "prepare.log" in message and "finished steps are kept" in message
    assert calls == ["venv", "install", "prune"]
    times = ve.step_times(tmp_path)
    assert times["venv"] is not None and times["install"] is not None
    assert times["prune"] is None and times["convert"] is None
    assert not ve.is_ready(tmp_path)

    calls.clear()
    ve._ACTIONS = fake_steps(ve, calls)
    result = ve.prepare(tmp_path, gguf, lambda _msg: None)
    assert calls == ["prune", "convert"]  # resumed at the failed step
    assert ve.is_ready(tmp_path) and result["model"] == str(ve.hf_model_dir(tmp_path))

    calls.clear()
    ve.prepare(tmp_path, gguf, lambda _msg: None)
    assert calls == []  # idempotent


def test_a_new_install_invalidates_the_later_steps(ve: ModuleType, tmp_path: Path) -> None:
    calls: list[str] = []
    ve._ACTIONS = fake_steps(ve, calls)
    ve.prepare(tmp_path, tmp_path / "m.gguf", lambda _msg: None)
    (ve.vllm_dir(tmp_path) / "steps" / "install.done").unlink()
    calls.clear()
    ve.prepare(tmp_path, tmp_path / "m.gguf", lambda _msg: None)
    assert calls == ["install", "prune", "convert"]
    marker = json.loads((ve.vllm_dir(tmp_path) / "steps" / "convert.done").read_text())
    assert marker["seconds"] >= 0
