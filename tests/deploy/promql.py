"""What the dashboard's and the alert rules' PromQL asks of the metrics: the
series selectors with their label matchers, and the labels they group by. The
expressions here are plain selectors inside functions and aggregations, which
these patterns read exactly; `promtool check rules` (test_tools.py) parses
them for real."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Grafana's variables, replaced by values PromQL accepts.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$task": ".*"}
#: Labels Prometheus adds to every scraped series, and the bucket label.
TARGET_LABELS = frozenset({"instance", "job", "le"})

_SELECTOR = re.compile(
    r"(?<![\w:$])((?:gateway_|vllm:|llamacpp:)[A-Za-z0-9_:]*|up(?![\w:]))\s*(?:\{([^}]*)\})?"
)
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"^label_values\(\s*([^,\s]+)\s*,\s*(\w+)\s*\)$")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[Matcher, ...]


def promql(expr: str) -> str:
    """A dashboard expression as PromQL (Grafana's variables filled in; a
    `label_values(metric, label)` variable query as its selector)."""
    m = _LABEL_VALUES.match(expr.strip())
    if m:
        return m.group(1)
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return expr


def label_values_label(expr: str) -> str | None:
    m = _LABEL_VALUES.match(expr.strip())
    return m.group(2) if m else None


def selectors(expr: str) -> list[Selector]:
    found = []
    for m in _SELECTOR.finditer(expr):
        body = m.group(2) or ""
        matchers = tuple(Matcher(*x) for x in _MATCHER.findall(body))
        leftover = _MATCHER.sub("", body).replace(",", "").strip()
        assert not leftover, f"unread label matcher {leftover!r} in {expr!r}"
        found.append(Selector(m.group(1), matchers))
    return found


def grouping_labels(expr: str) -> set[str]:
    """Labels named in by / without / on / ignoring clauses."""
    return {
        label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label
    }
