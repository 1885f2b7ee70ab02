"""The code stays within its rules: ruff (the rule set in pyproject.toml, and
its formatting) and strict mypy over the gateway package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ["gateway", "tests", "bench", "scripts", "tools", "setup.py"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_ruff_rules_and_format() -> None:
    check = _run("ruff", "check", *TREES)
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run("ruff", "format", "--check", *TREES)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_strict_mypy() -> None:
    result = _run("mypy", "gateway")
    assert result.returncode == 0, result.stdout + result.stderr
