"""Which build of the gateway is running: pure Python, or with its request path
compiled by mypyc (`GATEWAY_COMPILE=1 pip install .`, see setup.py and
docs/performance.md). Shown at startup and as `gateway_build_info`."""

from __future__ import annotations

import importlib.machinery
import importlib.util

#: A module that every compiled build compiles (setup.py `COMPILED_MODULES`).
_PROBE = "gateway.pipeline.pipeline"


def compiled() -> bool:
    """True when the request path runs from compiled extension modules."""
    spec = importlib.util.find_spec(_PROBE)
    origin = spec.origin if spec is not None else None
    return bool(origin) and str(origin).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def describe() -> str:
    return "compiled request path (mypyc)" if compiled() else "pure Python"
