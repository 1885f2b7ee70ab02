"""The compiled build of the request path (mypyc).

`pyproject.toml` holds the project metadata; this file adds the extension
modules (see docs/performance.md, "The compiled build"). `GATEWAY_COMPILE`:
- `auto` (default): a regular install (`pip install .`) compiles the modules
  below when a C compiler and the Python headers are there, else (or if the
  compile fails) it installs pure Python and says so;
- `1`: compile or fail; `0`: pure Python.
An editable install (`pip install -e .`) is always pure Python: compiled
modules next to the sources would shadow every later edit.

Rules for the modules listed below (checked by tests/test_compiled_build.py),
from what broke in the compiled build:
- no `await` inside an `except` handler (one crashed the interpreter in the
  admission queue) nor, to be safe, inside a `finally` block;
- no local assigned in a `try` body and read in its handlers or `finally`
  (the compiled code types it by its narrowed type there);
- no exception subclass with class-level attribute overrides (keep those in
  gateway/errors.py, which stays interpreted), no subclass of a builtin
  exception other than Exception (gateway/http/disconnect.py);
- dataclass fields naming TYPE_CHECKING-only types are quoted.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The modules every request runs through. Not here: startup and off-path code
# (CLI, demo, simulator, config, admin, pollers: compiling buys nothing there);
# gateway/app.py (wiring; an async generator), httpserver.py (server lifecycle),
# queue.py (a generic slotted dataclass fails at import), errors.py (see above),
# state/memory.py (a compiled class cannot be subclassed by interpreted code, and
# state stores are subclassed).
COMPILED_MODULES = [
    "gateway/admission/controller.py",
    "gateway/admission/demand.py",
    "gateway/admission/ledger.py",
    "gateway/admission/livestate.py",
    "gateway/admission/metrics.py",
    "gateway/deadlines/deadline.py",
    "gateway/deadlines/timer.py",
    "gateway/engines/base.py",
    "gateway/engines/llamacpp.py",
    "gateway/engines/vllm.py",
    "gateway/forward/forwarder.py",
    "gateway/forward/rawbody.py",
    "gateway/forward/sse.py",
    "gateway/forward/upstream.py",
    "gateway/http/client.py",
    "gateway/http/client_conn.py",
    "gateway/http/connection.py",
    "gateway/http/exchange.py",
    "gateway/ingress/auth.py",
    "gateway/ingress/protocol.py",
    "gateway/ingress/stage.py",
    "gateway/observability/cells.py",
    "gateway/observability/metrics.py",
    "gateway/pipeline/context.py",
    "gateway/pipeline/endpoint.py",
    "gateway/pipeline/pipeline.py",
    "gateway/policy/budgets.py",
    "gateway/policy/estimate.py",
    "gateway/policy/stage.py",
    "gateway/policy/tokens.py",
    "gateway/replicas/registry.py",
    "gateway/scheduling/cycle.py",
    "gateway/scheduling/engine_view.py",
    "gateway/scheduling/filters.py",
    "gateway/scheduling/hashing.py",
    "gateway/scheduling/metrics.py",
    "gateway/scheduling/pickers.py",
    "gateway/scheduling/prefix.py",
    "gateway/scheduling/router.py",
    "gateway/scheduling/scorers/estimated_ttft.py",
    "gateway/scheduling/scorers/kv_headroom.py",
    "gateway/scheduling/scorers/least_load.py",
    "gateway/scheduling/scorers/prefix_affinity.py",
    "gateway/scheduling/scorers/queue_depth.py",
    "gateway/scheduling/scorers/session_affinity.py",
    "gateway/scheduling/slots.py",
    "gateway/scheduling/tracker.py",
]


MODES = ("auto", "1", "0")
_BUILD_COMMANDS = {"build", "build_ext", "bdist", "bdist_wheel", "install"}


def _mode() -> str:
    mode = os.environ.get("GATEWAY_COMPILE", "auto").strip() or "auto"
    if mode not in MODES:
        raise SystemExit(f"GATEWAY_COMPILE={mode!r}: expected auto (the default), 1 (compile or fail) "
                         "or 0 (pure Python)")
    return mode


def _warn(message: str) -> None:
    sys.stderr.write(f"\n*** gateway build: {message}\n\n")


def _cannot_compile() -> str | None:
    """Why this machine cannot build C extensions, or None."""
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers ({include}/Python.h; install python3-dev or the like)"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc!r} not found)"
    return None


def _ext_modules(mode: str) -> list[object]:
    editable = bool({"editable_wheel", "develop"} & set(sys.argv))
    if mode == "1" and editable:
        raise SystemExit(
            "GATEWAY_COMPILE=1 does not apply to an editable install: compiled modules next to the "
            "sources would shadow every later edit. Install with `pip install .`, or build a "
            "compiled copy of a working tree with `python scripts/build_compiled.py`."
        )
    if mode == "0" or editable or not _BUILD_COMMANDS & set(sys.argv):
        return []  # pure, or a metadata-only step (egg_info, dist_info, sdist) that builds nothing
    reason = _cannot_compile()
    if reason is not None:
        if mode == "1":
            raise SystemExit(f"GATEWAY_COMPILE=1: cannot compile: {reason}")
        _warn(f"{reason}: installing the pure-Python build (about 40 % more CPU per request)")
        return []
    root = Path(__file__).parent
    missing = [m for m in COMPILED_MODULES if not (root / m).is_file()]
    if missing:
        raise SystemExit(f"setup.py: COMPILED_MODULES names missing files: {missing}")
    try:
        from mypyc.build import mypycify

        return list(mypycify(COMPILED_MODULES, opt_level="3", debug_level="0"))
    except (SystemExit, Exception) as exc:  # mypyc reports type errors as SystemExit
        if mode == "1":
            raise
        _warn(f"mypyc could not compile the request path ({exc!r}): installing the pure-Python build")
        return []


class _BuildExt(build_ext):
    """`auto`: a failed C compile leaves the pure-Python build, with a warning
    (and none of the extensions built before the failure)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # compiler and linker failures come as several types
            if _mode() == "1":
                raise
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            _warn(f"compiling the request path failed ({exc}): installing the pure-Python build")


setup(ext_modules=_ext_modules(_mode()), cmdclass={"build_ext": _BuildExt})
