"""PEP 517 build backend: setuptools' own, plus, when the compiled build is
asked for, mypy (which ships mypyc), type stubs and the runtime dependencies in
the isolated build environment of a regular wheel build (setup.py):

    pip install .                       # pure Python (the default); no mypy needed
    GATEWAY_COMPILE=1 pip install .     # the compiled modules (mypyc), or fail
    pip install -e .                    # always pure Python
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every other hook is setuptools' own

#: The mypyc the compiled build is tested with (scripts/test's second pass).
MYPYC_REQUIREMENT = "mypy==2.4.1"


def _compiling() -> bool:
    return os.environ.get("GATEWAY_COMPILE", "").strip() == "1"


def _compile_requirements() -> list[str]:
    """mypyc type-checks the modules it compiles, so the build environment holds
    what `scripts/test` compiles with: the `compile` extra (mypy, stubs) and the
    runtime dependencies (their type information)."""
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    return [*project["optional-dependencies"]["compile"], *project["dependencies"]]


def get_requires_for_build_wheel(config_settings: dict[str, str] | None = None) -> list[str]:
    requires = list(_setuptools.get_requires_for_build_wheel(config_settings))
    return [*requires, *_compile_requirements()] if _compiling() else requires
