"""Committed bench results record paths relative to the repository, and an external
binary by its package and version, never the paths of the machine they ran on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.manifest import router_record
from bench.paths import repo_relative

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
_MACHINE_PATH = re.compile(r"(?<![\w.:/~-])/(?:tmp|work|home|root|opt|usr|var|mnt|srv)/[\w.+@~/-]*")


@pytest.mark.parametrize(
    "path",
    sorted(p for p in RESULTS.iterdir() if p.suffix in (".json", ".md")),
    ids=lambda p: p.name,
)
def test_committed_results_hold_no_machine_paths(path: Path) -> None:
    found = _MACHINE_PATH.findall(path.read_text())
    assert not found, f"{path.name} records machine paths: {sorted(set(found))[:5]}"


def test_paths_are_shown_relative_to_the_repository() -> None:
    root = Path("/srv/checkout/repo")
    command = (
        "python -m bench.routing --out /srv/checkout/repo/bench/results "
        "--trace /srv/checkout/data/traces/t.jsonl --vllm-router /tmp/venv/bin/vllm-router"
    )
    assert repo_relative(command, root) == (
        "python -m bench.routing --out bench/results --trace ../data/traces/t.jsonl "
        "--vllm-router vllm-router"
    )
    value = {
        "tree": "/srv/checkout/repo",
        "trees": ["before=/tmp/before", "/srv/checkout/repo/.build/compiled"],
        "logs": "/tmp/overhead-logs-x1",
        "url": "http://127.0.0.1:8000/v1/chat/completions",
        "note": "GET `/metrics`, /proc/<pid>/stat",
        "n": 3,
    }
    assert repo_relative(value, root) == {
        "tree": ".",
        "trees": ["before=<outside>/before", ".build/compiled"],
        "logs": "<outside>/overhead-logs-x1",
        "url": "http://127.0.0.1:8000/v1/chat/completions",
        "note": "GET `/metrics`, /proc/<pid>/stat",
        "n": 3,
    }


def test_the_router_is_recorded_by_package_not_by_path(tmp_path: Path) -> None:
    record = router_record(str(tmp_path / "venv" / "bin" / "vllm-router"))
    assert record["package"] == "vllm-router (PyPI)"
    assert str(tmp_path) not in str(record)
    assert router_record(None) == {"package": None, "version": None}
