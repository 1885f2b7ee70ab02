"""The optional compiled build (mypyc, setup.py): which modules it compiles,
the build backend's requirements, the build modes, and which build this test
run imports.

`scripts/test` runs the whole suite on the sources (GATEWAY_EXPECT_COMPILED=0),
then the tests of the compiled modules on a compiled copy of the tree
(GATEWAY_EXPECT_COMPILED=1, built by scripts/build_compiled.py); the checks at
the bottom make sure each pass really ran the build it claims.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from prometheus_client import generate_latest

from gateway import buildinfo
from gateway.observability.metrics import GatewayMetrics

ROOT = Path(__file__).resolve().parent.parent


def _compiled_modules() -> dict[str, list[str]]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, dict)
            return {str(k): [str(t) for t in v] for k, v in value.items()}
    raise AssertionError("setup.py defines no COMPILED_MODULES")


COMPILED = _compiled_modules()
MODULES = list(COMPILED)


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def test_the_compiled_list_names_existing_modules_and_their_tests() -> None:
    assert sorted(MODULES) == MODULES
    assert buildinfo.PROBE in {_module_name(m) for m in MODULES}
    for path, tests in COMPILED.items():
        assert (ROOT / path).is_file(), path
        assert tests, f"{path}: no test file runs it in the compiled pass"
        for test in tests:
            assert (
                (ROOT / test).is_file()
                and test.startswith("tests/")
                and Path(test).name.startswith("test_")
            ), (path, test)


def test_compiled_modules_are_pure_computation() -> None:
    """No coroutines: the async request path stays interpreted and idiomatic."""
    found = []
    for path in MODULES:
        tree = ast.parse((ROOT / path).read_text(), filename=path)
        found += [
            f"{path}:{n.lineno}"
            for n in ast.walk(tree)
            if isinstance(n, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith))
        ]
    assert not found, f"async code in a compiled module (keep those modules interpreted): {found}"


def _backend_requires(compile_flag: str | None) -> tuple[list[str], str]:
    """The build backend's wheel requirements, asked in a subprocess as pip would
    (the hook runs setup.py, whose side effects stay out of this process)."""
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_COMPILE"}
    if compile_flag is not None:
        env["GATEWAY_COMPILE"] = compile_flag
    code = (
        "import json, sys; sys.path.insert(0, 'tools'); import build_backend as b; "
        "print(json.dumps([b.get_requires_for_build_wheel(), b.MYPYC_REQUIREMENT]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    requires, pin = json.loads(proc.stdout.strip().splitlines()[-1])
    return requires, pin


def test_backend_adds_the_compile_toolchain_only_when_the_compiled_build_is_asked_for() -> None:
    pure, pin = _backend_requires(None)
    assert _backend_requires("0")[0] == pure
    assert not any(r.startswith("mypy") for r in pure)
    compiling = _backend_requires("1")[0]
    # What scripts/test compiles with (the `compile` extra, pinned mypyc) plus the
    # runtime dependencies, whose types mypyc checks against.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    compile_extra = project["optional-dependencies"]["compile"]
    assert pin in compile_extra
    assert compiling == [*pure, *compile_extra, *project["dependencies"]]


def _setup(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_COMPILE", "CC")} | env
    return subprocess.run(
        [sys.executable, "setup.py", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_an_editable_compiled_install_is_refused_and_a_bad_mode_named() -> None:
    proc = _setup(["develop"], ROOT, GATEWAY_COMPILE="1")
    assert proc.returncode != 0 and "editable install" in proc.stderr + proc.stdout
    for mode in ("yes", "auto"):
        proc = _setup(["--name"], ROOT, GATEWAY_COMPILE=mode)
        assert proc.returncode != 0 and f"GATEWAY_COMPILE={mode!r}" in proc.stderr + proc.stdout


def _source_copy(dest: Path) -> Path:
    for rel in [
        "setup.py",
        "pyproject.toml",
        "README.md",
        *[str(p.relative_to(ROOT)) for p in (ROOT / "gateway").rglob("*.py")],
    ]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes((ROOT / rel).read_bytes())
    return dest


def test_the_default_build_is_pure_python_and_1_without_a_compiler_fails(tmp_path: Path) -> None:
    tree = _source_copy(tmp_path)
    default = _setup(["build_ext", "--inplace"], tree, CC="/nonexistent/cc")
    assert default.returncode == 0, default.stderr
    assert not list(tree.rglob("*.so"))
    strict = _setup(["build_ext", "--inplace"], tree, CC="/nonexistent/cc", GATEWAY_COMPILE="1")
    assert (
        strict.returncode != 0 and "cannot compile: no C compiler" in strict.stderr + strict.stdout
    )


def _extension(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, name
    return spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_this_run_imports_the_build_it_claims() -> None:
    compiled = {path: _extension(_module_name(path)) for path in MODULES}
    expected = os.environ.get("GATEWAY_EXPECT_COMPILED")
    if expected is None:
        # Run by hand: either build, but never a mix of compiled and stale sources.
        assert len(set(compiled.values())) == 1, f"partly compiled tree: {compiled}"
    else:
        want = expected == "1"
        wrong = [path for path, is_ext in compiled.items() if is_ext != want]
        assert not wrong, (
            f"expected {'compiled' if want else 'pure-Python'} modules, got otherwise: {wrong}"
        )
    assert buildinfo.compiled() == all(compiled.values())


def test_build_info_metric_says_which_build_runs() -> None:
    text = generate_latest(GatewayMetrics().registry).decode()
    flag = "true" if buildinfo.compiled() else "false"
    assert f'gateway_build_info{{compiled="{flag}",version="' in text
