"""Every module of the gateway stays under `MAX_LINES`: a module that grows
past it is split by concept (see docs/architecture.md) before it lands.

`OVERSIZE` names the modules still over the limit, each with the most lines
it may have. An entry only shrinks: the test fails when such a module grows
past its allowance, and when it is back under the limit (drop the entry)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400

#: Modules over the limit, and the lines each may have until it is split.
OVERSIZE: dict[str, int] = {}


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _oversize(root: Path, limit: int, allowed: dict[str, int]) -> list[str]:
    out = []
    for path in sorted((root / "gateway").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        n = _lines(path)
        cap = allowed.get(name, limit)
        if n > cap:
            out.append(f"{name}: {n} lines (at most {cap})")
        elif name in allowed and n <= limit:
            out.append(f"{name}: {n} lines, under {limit}: drop it from OVERSIZE")
    return out


def test_no_module_exceeds_the_limit() -> None:
    assert _oversize(ROOT, MAX_LINES, OVERSIZE) == []


def test_every_allowance_names_a_module() -> None:
    assert [name for name in OVERSIZE if not (ROOT / name).is_file()] == []


@pytest.mark.parametrize(
    ("lines", "allowed", "found"),
    [
        (401, {}, ["gateway/big.py: 401 lines (at most 400)"]),
        (400, {}, []),
        (420, {"gateway/big.py": 430}, []),
        (431, {"gateway/big.py": 430}, ["gateway/big.py: 431 lines (at most 430)"]),
        (
            390,
            {"gateway/big.py": 430},
            ["gateway/big.py: 390 lines, under 400: drop it from OVERSIZE"],
        ),
    ],
)
def test_the_check_catches_what_it_claims(
    tmp_path: Path, lines: int, allowed: dict[str, int], found: list[str]
) -> None:
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "big.py").write_text("x = 1\n" * lines)
    (tmp_path / "gateway" / "small.py").write_text("x = 1\n")
    assert _oversize(tmp_path, 400, allowed) == found
