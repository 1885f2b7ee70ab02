"""Build the compiled gateway (mypyc) in place, in a copy of this working tree.

    python scripts/build_compiled.py [DEST]      # default DEST: .build/compiled

Copies the tree's files (tracked and untracked-but-not-ignored, as they are on
disk) into DEST and runs `GATEWAY_COMPILE=1 setup.py build_ext --inplace`
there, so DEST's compiled modules shadow DEST's sources and never this tree's.
Run Python from DEST (or with PYTHONPATH=DEST) to use it: `scripts/test` runs
the suite there a second time, `bench/overhead.py --gateway-compiled DEST`
measures it. Needs mypy (the `compile` extra) and a C compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tree_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
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
        rc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=dest, env=env,
                            stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        sys.stdout.write(log.read_text(errors="replace")[-6000:])
        raise SystemExit(f"compiled build failed (exit {rc}); full log: {log}")
    return time.monotonic() - started


def main() -> int:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".build" / "compiled"
    dest = dest if dest.is_absolute() else Path.cwd() / dest
    if dest.resolve() == ROOT:
        raise SystemExit("DEST must not be this tree: its compiled modules would shadow the sources")
    took = build(dest)
    modules = sorted(str(p.relative_to(dest)) for p in (dest / "gateway").rglob("*.so"))
    print(f"compiled build in {dest}: {len(modules)} modules in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
