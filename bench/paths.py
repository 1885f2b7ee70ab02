"""Paths as committed results record them: relative to the repository (`.`,
`bench/results`, `.build/compiled`), `../name` beside it, and anything else as
`<outside>/name` (a temporary tree or log folder: it is gone after the run).
An external binary is named by its package (the manifest records the package's
version), never by where it was installed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: binaries named by their package (bench/manifest.py records the version)
PACKAGE_BINARIES = frozenset({"vllm-router"})
_FS_ROOTS = ("tmp", "work", "home", "root", "opt", "usr", "var", "mnt", "srv", "builds")
_COMPONENT = r"[\w.+@~-]+"


def _absolute(root: Path) -> re.Pattern[str]:
    starts = [re.escape(str(root.parent)), *(f"/{d}" for d in _FS_ROOTS)]
    return re.compile(rf"(?<![\w.:/~-])(?:{'|'.join(starts)})(?:/{_COMPONENT})*(?![\w/])")


def shown_path(path: str, root: Path = ROOT) -> str:
    p = Path(path)
    if p.name in PACKAGE_BINARIES:
        return p.name
    if p == root:
        return "."
    if p.is_relative_to(root):
        return str(p.relative_to(root))
    if p.is_relative_to(root.parent) and p != root.parent:
        return "../" + str(p.relative_to(root.parent))
    return f"<outside>/{p.name}"


def repo_relative(value: Any, root: Path = ROOT) -> Any:
    """`value` (JSON-like) with every absolute path in its strings shown as `shown_path`."""
    if isinstance(value, str):
        return _absolute(root).sub(lambda m: shown_path(m.group(0), root), value)
    if isinstance(value, dict):
        return {k: repo_relative(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [repo_relative(v, root) for v in value]
    return value
