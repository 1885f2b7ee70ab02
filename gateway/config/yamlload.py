"""YAML loading that refuses duplicate keys (YAML 1.2 forbids them; PyYAML
silently keeps the last one), naming the key path and both lines."""

from __future__ import annotations

from typing import Any

import yaml

from gateway.config.decode import ConfigError

#: A duplicate key is reported at most this many times per document.
_MAX_REPORTED = 50


def load_yaml(text: str, label: str) -> Any:
    """The single YAML document of `text`; ConfigError for invalid YAML or duplicate keys."""
    docs = load_yaml_all(text, label)
    if len(docs) > 1:
        raise ConfigError([f"{label}: expected one YAML document, found {len(docs)}"])
    return docs[0] if docs else None


def load_yaml_all(text: str, label: str) -> list[Any]:
    """Every YAML document of `text` (`---` separated), each checked for duplicate keys."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        problems: list[str] = []
        for i, node in enumerate(nodes):
            where = label if len(nodes) == 1 else f"{label}[{i}]"
            _duplicates(node, "", where, problems)
        if problems:
            raise ConfigError(problems[:_MAX_REPORTED])
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError([f"{label}: invalid YAML: {exc}"]) from None


def _duplicates(node: yaml.Node, path: str, label: str, problems: list[str]) -> None:
    stack: list[tuple[yaml.Node, str]] = [(node, path)]
    seen_nodes: set[int] = set()
    while stack and len(problems) < _MAX_REPORTED:
        current, where = stack.pop()
        if id(current) in seen_nodes:  # an alias: already walked
            continue
        seen_nodes.add(id(current))
        if isinstance(current, yaml.MappingNode):
            stack += _mapping(current, where, label, problems)
        elif isinstance(current, yaml.SequenceNode):
            stack += [(item, f"{where}[{i}]") for i, item in enumerate(current.value)]


def _mapping(
    node: yaml.MappingNode, where: str, label: str, problems: list[str]
) -> list[tuple[yaml.Node, str]]:
    first_line: dict[str, int] = {}
    children: list[tuple[yaml.Node, str]] = []
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
            continue
        key = str(key_node.value)
        path = f"{where}.{key}" if where else key
        line = key_node.start_mark.line + 1
        if key in first_line:
            problems.append(
                f"{path}: duplicate key in {label} (lines {first_line[key]} and {line}; "
                "YAML keys must be unique)"
            )
        else:
            first_line[key] = line
        children.append((value_node, path))
    return children
