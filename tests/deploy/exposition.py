"""The metric families of a Prometheus text exposition (the gateway's admin
/metrics), and the table of docs/metrics.md that documents them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})? \S+")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_DOC_ROW = re.compile(r"^\|\s*`(gateway_\w+)`\s*\|\s*(\w+)\s*\|([^|]*)\|")


@dataclass
class Family:
    name: str
    type: str
    labels: set[str] = field(default_factory=set)
    samples: int = 0
    #: label -> the values seen
    values: dict[str, set[str]] = field(default_factory=dict)


def families(text: str) -> dict[str, Family]:
    """Families by their exposed name (`gateway_requests_total`, `gateway_build_info`, a
    histogram by its base name)."""
    found: dict[str, Family] = {}
    for line in text.splitlines():
        m = _TYPE.match(line)
        if m:
            found[m.group(1)] = Family(m.group(1), m.group(2))
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        family = found.get(m.group(1)) or found.get(_strip_histogram(m.group(1)))
        if family is None:
            continue
        family.samples += 1
        for label, value in _LABEL.findall(m.group(2) or ""):
            if label != "le":
                family.labels.add(label)
                family.values.setdefault(label, set()).add(value)
    return found


def _strip_histogram(name: str) -> str:
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def exported(name: str, fams: dict[str, Family]) -> bool:
    """Whether a name a query uses is a series of an exposed family."""
    if name in fams:
        return True
    base = _strip_histogram(name)
    return base != name and base in fams and fams[base].type == "histogram"


@dataclass(frozen=True)
class DocRow:
    name: str
    type: str
    labels: frozenset[str]


def doc_rows(path: Path) -> dict[str, DocRow]:
    """The metric tables of docs/metrics.md: | `name` | type | `label`, ... | meaning |."""
    rows: dict[str, DocRow] = {}
    for line in path.read_text().splitlines():
        m = _DOC_ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is documented twice"
            labels = frozenset(re.findall(r"`(\w+)`", m.group(3)))
            rows[m.group(1)] = DocRow(m.group(1), m.group(2), labels)
    return rows


_VALUES_ROW = re.compile(r"^\|\s*`(\w+)`[^|]*\|([^|]*)\|")


def doc_label_values(path: Path) -> dict[str, set[str]]:
    """The `## Label values` table of docs/metrics.md: label -> the values it names."""
    text = path.read_text()
    section = text[text.index("## Label values") :]
    section = section[: section.index("\n## ", 1)]
    out: dict[str, set[str]] = {}
    for line in section.splitlines():
        m = _VALUES_ROW.match(line)
        if m:
            out.setdefault(m.group(1), set()).update(re.findall(r"`([^`]+)`", m.group(2)))
    return out
