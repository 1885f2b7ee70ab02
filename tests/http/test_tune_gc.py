"""`gateway serve` freezes its startup objects and collects the young generation less often."""

from __future__ import annotations

import subprocess
import sys


def test_tune_gc_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    code = (
        "import gc; from gateway.http.serving import tune_gc; assert gc.get_freeze_count() == 0; "
        "tune_gc(); print(gc.get_freeze_count() > 1000, gc.get_threshold()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "10000"]
