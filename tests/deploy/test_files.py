"""Every file under deploy/ parses, the Dockerfile passes a structural lint, and
no secret value is committed. The external checkers (hadolint, kubectl kustomize,
promtool, nginx -t) run in test_tools.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.deployfiles import (
    COMPOSE_DIR,
    DEPLOY,
    DOCKERFILE,
    ROOT,
    compose,
    config_flag,
    dashboard,
    dashboard_exprs,
    dockerfile_instructions,
    exec_form,
    files,
    final_stage,
    image_cmd,
    panels,
    yaml_docs,
)

_SECRET_NAME = re.compile(r"(?i)(key|token|secret|passw|credential)")
_KNOWN_SUFFIXES = {".yaml", ".yml", ".json", ".conf", ".md", ""}


def test_deploy_holds_only_known_file_kinds() -> None:
    unknown = [p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix not in _KNOWN_SUFFIXES]
    assert not unknown, f"add a parse check for {unknown}"


@pytest.mark.parametrize("path", files(".yaml", ".yml"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs, f"{path} holds no document"
    assert all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("path", files(".json"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_json_parses(path: Path) -> None:
    assert isinstance(json.loads(path.read_text()), dict)


def test_no_secret_objects_or_values_committed() -> None:
    for path in files(".yaml", ".yml"):
        for doc in yaml_docs(path):
            assert doc.get("kind") != "Secret", f"{path}: create Secrets out of band"
    for path in [*files(".yaml", ".yml", ".conf"), DOCKERFILE]:
        for line in path.read_text().splitlines():
            assert not re.search(
                r"(?i)(?<![a-z])(api_key|token|password)\s*:\s*['\"]?[A-Za-z0-9]", line
            ), f"{path}: {line.strip()!r} (use a ${{ENV}} reference)"


def test_dockerfile_structure() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    assert instructions[0].keyword == "FROM", "FROM comes first"
    assert instructions[0].args.startswith("python:3.11-slim")
    runtime = final_stage(instructions)
    assert runtime[0].args.startswith("python:3.11-slim")
    users = [i.args.split(":")[0] for i in runtime if i.keyword == "USER"]
    assert users and users[-1] not in ("root", "0"), "the runtime stage runs as a non-root user"
    checks = [i for i in runtime if i.keyword == "HEALTHCHECK"]
    assert len(checks) == 1 and "CMD" in checks[0].args
    for ins in instructions:
        if ins.keyword in ("ENV", "ARG"):
            for word in ins.args.split():
                name, _, value = word.partition("=")
                assert not (_SECRET_NAME.search(name) and value), f"{ins.keyword} {word}: a secret"


def test_dockerfile_compile_arg_and_build_tools_stay_in_the_build_stage() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    runtime = final_stage(instructions)
    build = instructions[: len(instructions) - len(runtime)]
    assert any(i.keyword == "ARG" and i.args.startswith("GATEWAY_COMPILE=0") for i in build)
    assert any(i.keyword == "RUN" and "gcc" in i.args for i in build)
    assert not any("gcc" in i.args or "apt-get" in i.args for i in runtime)


def test_dockerfile_copies_only_what_exists_and_is_not_ignored() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (".venv", ".build", ".git", "bench/results", ".pytest_cache", ".mypy_cache"):
        assert needed in ignored, f".dockerignore leaves out {needed}"
    for ins in dockerfile_instructions(DOCKERFILE.read_text()):
        if ins.keyword != "COPY" or ins.args.startswith("--from"):
            continue
        *sources, _dest = ins.args.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            top = src.split("/")[0]
            assert top not in ignored and src not in ignored, f"COPY {src}: in .dockerignore"


def test_image_cmd_uses_real_serve_flags() -> None:
    argv = image_cmd()
    assert config_flag(argv) == "/etc/gateway/gateway.yaml"
    helptext = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag in (a for a in argv if a.startswith("--")):
        assert flag in helptext, f"gateway serve has no {flag}"


def test_healthcheck_runs_python_not_curl() -> None:
    (check,) = [
        i for i in dockerfile_instructions(DOCKERFILE.read_text()) if i.keyword == "HEALTHCHECK"
    ]
    argv = exec_form(check.args.split(" CMD ", 1)[1])
    assert argv[0] == "python" and "curl" not in check.args


def test_compose_version_needed_is_stated() -> None:
    """Compose v1 (docker-compose 1.x) refuses a top-level `name:`; the docs say v2 is needed."""
    if "name" in compose():
        readme = (DEPLOY / "README.md").read_text()
        assert "Needs Docker Compose v2" in readme
        assert "Compose v2" in (COMPOSE_DIR / "compose.yaml").read_text().split("\n\n")[0]


def test_dashboard_queries_are_read_from_panels_inside_rows_too() -> None:
    row = {"type": "row", "collapsed": True, "panels": [{"targets": [{"expr": "inner_expr"}]}]}
    dash = {"panels": [{"targets": [{"expr": "top_expr"}]}, row]}
    assert dashboard_exprs(dash) == ["top_expr", "inner_expr"]
    real = dashboard()
    assert len(list(panels(real))) >= len(real["panels"])


def test_every_engine_panel_serves_both_engines_or_names_its_engine() -> None:
    for panel in panels(dashboard()):
        exprs = " ".join(t["expr"] for t in panel.get("targets", []))
        engines = {e for e in ("vllm", "llamacpp") if f"{e}:" in exprs}
        if len(engines) == 1:
            (engine,) = engines
            name = {"vllm": "vLLM", "llamacpp": "llama.cpp"}[engine]
            assert f"({name})" in panel["title"], f"{panel['title']!r} shows {name} only"


def _dashboard_layout() -> list[tuple[str, str]]:
    """(row title, panel title) of every panel, in the dashboard's order."""
    out: list[tuple[str, str]] = []
    row = ""
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            row = panel["title"]
        else:
            out.append((row, panel["title"]))
    return out


def test_deploy_readme_lists_exactly_the_dashboard_panels() -> None:
    text = (DEPLOY / "README.md").read_text()
    table = text[text.index("| row | panel | shows |") :].split("\n\n", 1)[0]
    documented = [
        (cells[0], cells[1])
        for line in table.splitlines()[2:]
        if (cells := [c.strip() for c in line.strip("|").split("|")])
    ]
    assert documented == _dashboard_layout()
