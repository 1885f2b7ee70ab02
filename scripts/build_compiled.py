"""Build the compiled gateway (mypyc) in place, in a copy of this working tree.

    python scripts/build_compiled.py [DEST]      # default DEST: .build/compiled
    python scripts/build_compiled.py --tests     # the test files of the compiled modules

Copies the tree's files (tracked and untracked-but-not-ignored, as they are on
disk) into DEST and runs `GATEWAY_COMPILE=1 setup.py build_ext --inplace`
there, so DEST's compiled modules shadow DEST's sources and never this tree's.
Run Python from DEST (or with PYTHONPATH=DEST) to use it: `scripts/test` runs
the tests of the compiled modules there (`--tests`: the files setup.py maps
them to, and tests/test_compiled_build.py), `bench/overhead.py
--gateway-compiled DEST` measures it. Needs mypy (the `compile` extra) and a C
compiler.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compiled_modules() -> dict[str, list[str]]:
    """setup.py's COMPILED_MODULES: module path → the test files that exercise it."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            return {str(k): [str(t) for t in v] for k, v in value.items()}
    raise SystemExit("setup.py defines no COMPILED_MODULES")


def compiled_tests() -> list[str]:
    """The test files of the compiled pass, in a stable order."""
    files = {t for tests in compiled_modules().values() for t in tests}
    return sorted(files | {"tests/test_compiled_build.py"})


def _tree_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({f for f in out.decode().split("\0") if f and (ROOT / f).is_file()})


def build(dest: Path) -> float:
    if dest.exists():
        shutil.rmtree(dest)
    for rel in _tree_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    started = time.monotonic()
    env = {**os.environ, "GATEWAY_COMPILE": "1"}
    log = dest / "build.log"
    with log.open("wb") as fh:
        rc = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace"],
            cwd=dest,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    if rc != 0:
        sys.stdout.write(log.read_text(errors="replace")[-6000:])
        raise SystemExit(f"compiled build failed (exit {rc}); full log: {log}")
    return time.monotonic() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dest", nargs="?", default=str(ROOT / ".build" / "compiled"))
    p.add_argument(
        "--tests",
        action="store_true",
        help="print the test files of the compiled pass (one a line) and build nothing",
    )
    args = p.parse_args()
    if args.tests:
        print("\n".join(compiled_tests()))
        return 0
    dest = Path(args.dest)
    dest = dest if dest.is_absolute() else Path.cwd() / dest
    if dest.resolve() == ROOT:
        raise SystemExit(
            "DEST must not be this tree: its compiled modules would shadow the sources"
        )
    took = build(dest)
    modules = sorted(str(p.relative_to(dest)) for p in (dest / "gateway").rglob("*.so"))
    print(f"compiled build in {dest}: {len(modules)} modules in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
