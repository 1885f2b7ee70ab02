"""Nothing outside `gateway/engines/` branches on the engine kind.

Checked on the source (AST): no string constant naming an engine kind, and no
comparison of an object's `kind` against a string, in any module but the adapters', the
config's `EngineKind` Literal (`gateway/config/`), the simulator
(`gateway/sim/`, whose flavours are engine names) and the demo that wires the
simulator's flavours (`gateway/demo.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from gateway.config.discovery import EngineKind
from gateway.engines import GENERIC, adapter_for

ROOT = Path(__file__).resolve().parents[2] / "gateway"
ALLOWED = ("engines", "config", "sim", "demo.py")
KINDS = {k for k in get_args(EngineKind) if k != "auto"} | {GENERIC.kind}


def _checked_files() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).parts[0] not in ALLOWED]


def _is_kind(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "kind"


def _is_string(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_string(e) for e in node.elts)
    return False


def _branches(tree: ast.AST) -> list[int]:
    """Lines naming an engine kind, or comparing a `kind` to a string."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in KINDS:
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides) and any(_is_string(s) for s in sides):
                lines.append(node.lineno)
    return lines


def _found(files: list[Path]) -> list[str]:
    return [
        f"{p.relative_to(p.parent.parent)}:{line}"
        for p in files
        for line in _branches(ast.parse(p.read_text(), str(p)))
    ]


def test_no_engine_kind_branch_outside_the_adapters() -> None:
    assert _found(_checked_files()) == []


def test_the_check_sees_a_branch(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        'def f(replica):\n    if replica.kind == "vllm":\n        return 1\n'
        '    return replica.kind in ("a", "b")\n'
    )
    assert sorted(s.rsplit(":", 1)[1] for s in _found([probe])) == ["2", "2", "4"]


def test_every_config_kind_has_an_adapter() -> None:
    for kind in KINDS:
        assert adapter_for(kind).kind == kind
    assert adapter_for("auto") is GENERIC
