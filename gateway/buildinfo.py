"""Which build of the gateway is running: pure Python, or with its
pure-computation modules compiled by mypyc (`GATEWAY_COMPILE=1 pip install .`,
see setup.py). Shown at startup and as `gateway_build_info`."""

from __future__ import annotations

import importlib.machinery
import importlib.util

#: A module that the compiled build compiles (setup.py `COMPILED_MODULES`).
PROBE = "gateway.scheduling.prefix"


def compiled() -> bool:
    """True when the compiled modules run from extension modules."""
    spec = importlib.util.find_spec(PROBE)
    origin = spec.origin if spec is not None else None
    return bool(origin) and str(origin).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def describe() -> str:
    return "compiled modules (mypyc)" if compiled() else "pure Python"
