"""The optional compiled build (mypyc) of the gateway's pure-computation modules.

`pyproject.toml` holds the project metadata; this file adds the extension
modules. `GATEWAY_COMPILE`:
- unset or `0` (default): pure Python;
- `1`: compile the modules below with mypyc, or fail.
An editable install (`pip install -e .`) is always pure Python: compiled
modules next to the sources would shadow every later edit.

Only modules that mypyc compiles as they are written belong here: pure
computation with no async code (tests/test_compiled_build.py checks that).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

# Each compiled module, with the test files that exercise it: scripts/test runs
# these (and tests/test_compiled_build.py) a second time on a compiled copy.
COMPILED_MODULES = {
    "gateway/forward/rawbody.py": ["tests/forward/test_rawbody.py"],
    "gateway/forward/reassemble.py": ["tests/forward/test_reassemble.py"],
    "gateway/forward/sse.py": ["tests/forward/test_sse.py"],
    "gateway/ingress/fields.py": ["tests/ingress/test_fields.py"],
    "gateway/ingress/jsonbody.py": ["tests/ingress/test_hostile_json.py"],
    "gateway/ingress/protocol.py": [
        "tests/ingress/test_protocol.py",
        "tests/ingress/test_hostile_json.py",
    ],
    "gateway/observability/cells.py": ["tests/observability/test_fastmetrics.py"],
    "gateway/policy/estimate.py": ["tests/policy/test_tokens.py"],
    "gateway/scheduling/hashing.py": ["tests/scheduling/test_scheduling.py"],
    "gateway/scheduling/prefix.py": ["tests/scheduling/test_prefix.py"],
    "gateway/scheduling/scorers/estimated_ttft.py": ["tests/scheduling/test_scheduling.py"],
    "gateway/scheduling/scorers/kv_headroom.py": ["tests/scheduling/test_scheduling.py"],
    "gateway/scheduling/scorers/least_load.py": ["tests/scheduling/test_scheduling.py"],
    "gateway/scheduling/scorers/prefix_affinity.py": ["tests/scheduling/test_scheduling.py"],
    "gateway/scheduling/scorers/queue_depth.py": ["tests/scheduling/test_scheduling.py"],
    "gateway/scheduling/scorers/session_affinity.py": ["tests/scheduling/test_scheduling.py"],
}

_BUILD_COMMANDS = {"build", "build_ext", "bdist", "bdist_wheel", "install"}


def _compile() -> bool:
    mode = os.environ.get("GATEWAY_COMPILE", "0").strip() or "0"
    if mode not in ("0", "1"):
        raise SystemExit(
            f"GATEWAY_COMPILE={mode!r}: expected 1 (compile or fail) or 0 (pure Python, "
            "the default)"
        )
    return mode == "1"


def _cannot_compile() -> str | None:
    """Why this machine cannot build C extensions, or None."""
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers ({include}/Python.h; install python3-dev or the like)"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc!r} not found)"
    return None


def _ext_modules() -> list[object]:
    if not _compile():
        return []
    if {"editable_wheel", "develop"} & set(sys.argv):
        raise SystemExit(
            "GATEWAY_COMPILE=1 does not apply to an editable install: compiled modules next to the "
            "sources would shadow every later edit. Install with `pip install .`, or build a "
            "compiled copy of a working tree with `python scripts/build_compiled.py`."
        )
    if not _BUILD_COMMANDS & set(sys.argv):
        return []  # a metadata-only step (egg_info, dist_info, sdist) that builds nothing
    reason = _cannot_compile()
    if reason is not None:
        raise SystemExit(f"GATEWAY_COMPILE=1: cannot compile: {reason}")
    root = Path(__file__).parent
    missing = [m for m in COMPILED_MODULES if not (root / m).is_file()]
    if missing:
        raise SystemExit(f"setup.py: COMPILED_MODULES names missing files: {missing}")
    from mypyc.build import mypycify

    return list(mypycify(list(COMPILED_MODULES), opt_level="3", debug_level="0"))


setup(ext_modules=_ext_modules())
