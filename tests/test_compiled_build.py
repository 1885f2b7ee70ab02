"""The optional compiled build (mypyc, setup.py): the source rules it needs, the
build backend's requirements, and which build this test run imports.

`scripts/test` runs the whole suite twice: on the sources (GATEWAY_EXPECT_COMPILED=0)
and on a compiled copy of the tree (GATEWAY_EXPECT_COMPILED=1, built by
scripts/build_compiled.py); the checks at the bottom make sure each pass really
ran the build it claims.
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

import pytest
from prometheus_client import generate_latest

from gateway import buildinfo
from gateway.observability.metrics import GatewayMetrics

ROOT = Path(__file__).resolve().parent.parent


def _compiled_modules() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(v) for v in value]
    raise AssertionError("setup.py defines no COMPILED_MODULES")


MODULES = _compiled_modules()


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _trees() -> list[tuple[str, ast.Module]]:
    return [(path, ast.parse((ROOT / path).read_text(), filename=path)) for path in MODULES]


def test_the_compiled_list_names_existing_request_path_modules() -> None:
    assert MODULES == sorted(set(MODULES))
    assert "gateway/pipeline/pipeline.py" in MODULES  # buildinfo's probe
    for path in MODULES:
        assert (ROOT / path).is_file(), path


def _awaits_in(nodes: list[ast.stmt] | list[ast.ExceptHandler]) -> list[int]:
    return [n.lineno for part in nodes for n in ast.walk(part)
            if isinstance(n, (ast.Await, ast.AsyncWith, ast.AsyncFor))]


def test_no_await_in_exception_handlers_or_finally() -> None:
    found = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Try):
                found += [f"{path}:{line}" for line in _awaits_in(node.handlers) + _awaits_in(node.finalbody)]
    assert not found, f"`await` in an except handler or finally block of a compiled module: {found}"


def test_no_local_assigned_in_try_is_read_in_its_handlers() -> None:
    found = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            stored = {n.id for st in node.body for n in ast.walk(st)
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            read = {n.id for part in [*node.handlers, *node.finalbody] for n in ast.walk(part)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            found += [f"{path}:{node.lineno} {name}" for name in sorted(stored & read)]
    assert not found, f"locals assigned in `try` and read in its handlers / finally: {found}"


def test_no_exception_class_overrides_class_attributes() -> None:
    found = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            exceptionish = any(b.endswith(("Error", "Exception", "Exceeded", "Request", "Overloaded"))
                               for b in bases)
            assigns = [s for s in node.body if isinstance(s, (ast.Assign, ast.AnnAssign))]
            if exceptionish and assigns:
                found.append(f"{path}:{node.lineno} {node.name}")
            if bases & {"OSError", "ValueError", "RuntimeError", "TimeoutError", "ConnectionError"}:
                found.append(f"{path}:{node.lineno} {node.name} subclasses a builtin exception")
    assert not found, f"exception classes to keep out of compiled modules (gateway/errors.py): {found}"


def _backend_requires(compile_flag: str | None) -> tuple[list[str], str]:
    """The build backend's wheel requirements, asked in a subprocess as pip would
    (the hook runs setup.py, whose side effects stay out of this process)."""
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_COMPILE"}
    if compile_flag is not None:
        env["GATEWAY_COMPILE"] = compile_flag
    code = ("import json, sys; sys.path.insert(0, 'tools'); import build_backend as b; "
            "print(json.dumps([b.get_requires_for_build_wheel(), b.MYPYC_REQUIREMENT]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    requires, pin = json.loads(proc.stdout.strip().splitlines()[-1])
    return requires, pin


def test_backend_adds_the_compile_toolchain_unless_the_pure_build_is_asked_for() -> None:
    default, pin = _backend_requires(None)
    assert _backend_requires("auto")[0] == default and _backend_requires("1")[0] == default
    pure = _backend_requires("0")[0]
    assert not any(r.startswith("mypy") for r in pure)
    # What scripts/test compiles with (the `compile` extra, pinned mypyc) plus the
    # runtime dependencies, whose types mypyc checks against.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    compile_extra = project["optional-dependencies"]["compile"]
    assert pin in compile_extra
    assert default == [*pure, *compile_extra, *project["dependencies"]]


def _setup(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_COMPILE", "CC")} | env
    return subprocess.run([sys.executable, "setup.py", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=300, check=False)


def test_an_editable_compiled_install_is_refused_and_a_bad_mode_named() -> None:
    proc = _setup(["develop"], ROOT, GATEWAY_COMPILE="1")
    assert proc.returncode != 0 and "editable install" in proc.stderr + proc.stdout
    proc = _setup(["--name"], ROOT, GATEWAY_COMPILE="yes")
    assert proc.returncode != 0 and "GATEWAY_COMPILE='yes'" in proc.stderr + proc.stdout


def _source_copy(dest: Path) -> Path:
    for rel in ["setup.py", "pyproject.toml", "README.md", *[str(p.relative_to(ROOT)) for p in
                                                           (ROOT / "gateway").rglob("*.py")]]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes((ROOT / rel).read_bytes())
    return dest


def test_without_a_compiler_auto_builds_pure_python_and_1_fails(tmp_path: Path) -> None:
    tree = _source_copy(tmp_path)
    auto = _setup(["build_ext", "--inplace"], tree, CC="/nonexistent/cc")
    assert auto.returncode == 0, auto.stderr
    assert "no C compiler" in auto.stderr and "pure-Python build" in auto.stderr
    assert not list(tree.rglob("*.so"))
    strict = _setup(["build_ext", "--inplace"], tree, CC="/nonexistent/cc", GATEWAY_COMPILE="1")
    assert strict.returncode != 0 and "cannot compile: no C compiler" in strict.stderr + strict.stdout


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
        assert not wrong, f"expected {'compiled' if want else 'pure-Python'} modules, got otherwise: {wrong}"
    assert buildinfo.compiled() == all(compiled.values())


def test_build_info_metric_says_which_build_runs() -> None:
    text = generate_latest(GatewayMetrics().registry).decode()
    flag = "true" if buildinfo.compiled() else "false"
    assert f'gateway_build_info{{compiled="{flag}",version="' in text


@pytest.mark.slow
def test_a_failed_compile_in_auto_mode_leaves_a_pure_build(tmp_path: Path) -> None:
    """A compiler that is there but fails (here `false`): mypyc generates the C,
    the compile fails, and `auto` installs pure Python with no extension left over."""
    tree = _source_copy(tmp_path)
    auto = _setup(["build_ext", "--inplace"], tree, CC="false")
    assert auto.returncode == 0, auto.stderr[-3000:]
    assert "compiling the request path failed" in auto.stderr and "pure-Python build" in auto.stderr
    assert not list(tree.rglob("*.so"))
