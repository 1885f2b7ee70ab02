"""Each part of a `Replica` is written by one module (`gateway/replicas/parts.py`).

Checked on the source: an assignment to `<x>.<part>.<field>` (directly, through
a name bound to `<x>.<part>`, or by `setattr(<x>.<part>, ...)`) outside the
part's owner fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {
    "health": "gateway/replicas/registry.py",
    "found": "gateway/replicas/registry.py",
    "status": "gateway/replicas/registry.py",
    "ledger": "gateway/admission/controller.py",
    "ejection": "gateway/replicas/outliers.py",
}


def _part(node: ast.expr) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) and node.attr in OWNERS else None


def _writes(tree: ast.AST) -> set[str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, part = node.targets[0], _part(node.value)
            if isinstance(target, ast.Name) and part is not None:
                aliases[target.id] = part
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [
                t for t in node.targets for t in (t.elts if isinstance(t, ast.Tuple) else [t])
            ]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and _part(node.args[0]) is not None
        ):
            found.add(_part(node.args[0]) or "")
        for t in targets:
            if not isinstance(t, ast.Attribute):
                continue
            part = _part(t.value)
            if part is None and isinstance(t.value, ast.Name):
                part = aliases.get(t.value.id)
            if part is not None:
                found.add(part)
    return found


def _violations(files: list[Path], root: Path = ROOT) -> list[str]:
    out = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        for part in sorted(_writes(ast.parse(path.read_text(), rel))):
            if OWNERS[part] != rel:
                out.append(f"{rel} writes Replica.{part}")
    return out


def test_each_part_has_one_writer() -> None:
    files = [
        p
        for p in sorted((ROOT / "gateway").rglob("*.py"))
        if p.relative_to(ROOT).parts[1] not in ("sim", "http")
    ]
    assert _violations(files) == []


def test_the_check_sees_every_kind_of_write(tmp_path: Path) -> None:
    probe = tmp_path / "gateway" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "def f(r):\n    r.health.healthy = True\n    e = r.ejection\n    e.until += 1\n"
        "    setattr(r.status, 'draining', True)\n"
    )
    assert _violations([probe], tmp_path) == [
        "gateway/probe.py writes Replica.ejection",
        "gateway/probe.py writes Replica.health",
        "gateway/probe.py writes Replica.status",
    ]
