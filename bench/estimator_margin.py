"""How far the conservative estimator (`gateway.estimate`) is from real tokenizers.

Needs real tokenizers that ship inside a PyPI package (no download at run
time): `mistral-common` ships Tekken (tiktoken-style BPE, 131k vocabulary)
and SentencePiece models (32k vocabularies, Llama-2 style, one token per
digit). Run it in a separate environment so the gateway's own dependencies
stay untouched:

    python -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install mistral-common sentencepiece
    PYTHONPATH=. /tmp/tokvenv/bin/python bench/estimator_margin.py

Corpora (offline): English = docstrings of standard-library modules, code =
their Python source, Spanish = bench/data/es.txt. Each sample is ~1,500
characters. The ratio estimate / real is reported per tokenizer and corpus:
min < 1 would be an under-count. Writes bench/results/estimator_margin.{json,md}.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from gateway.policy.estimate import estimate_text

MODULES = (
    "json",
    "os",
    "re",
    "asyncio.tasks",
    "collections",
    "argparse",
    "email.message",
    "http.client",
    "logging",
    "subprocess",
    "typing",
    "dataclasses",
    "functools",
    "pathlib",
    "shutil",
    "socket",
    "threading",
    "unittest.case",
    "urllib.request",
    "zipfile",
    "tarfile",
    "datetime",
    "decimal",
    "fractions",
    "statistics",
    "random",
    "string",
    "textwrap",
    "difflib",
    "inspect",
    "pickle",
    "csv",
    "configparser",
    "heapq",
    "bisect",
    "contextlib",
    "enum",
    "ipaddress",
    "shlex",
    "uuid",
)
SAMPLE_CHARS = 1500
ROOT = Path(__file__).resolve().parent


def _chunks(text: str, size: int = SAMPLE_CHARS) -> Iterator[str]:
    buf = ""
    for line in text.splitlines(keepends=True):
        buf += line
        if len(buf) >= size:
            yield buf
            buf = ""
    if len(buf) >= size // 3:
        yield buf


def english() -> list[str]:
    docs: list[str] = []
    for name in MODULES:
        mod = importlib.import_module(name)
        docs.append(inspect.getdoc(mod) or "")
        for _, obj in inspect.getmembers(mod):
            is_def = inspect.isfunction(obj) or inspect.isclass(obj)
            if is_def and getattr(obj, "__module__", None) == mod.__name__:
                docs.append(inspect.getdoc(obj) or "")
    return list(_chunks("\n\n".join(d for d in docs if d)))


def code() -> list[str]:
    return list(_chunks("".join(inspect.getsource(importlib.import_module(n)) for n in MODULES)))


def spanish() -> list[str]:
    return list(_chunks((ROOT / "data" / "es.txt").read_text(), 300))


def tokenizers() -> dict[str, Callable[[str], int]]:
    import mistral_common
    import sentencepiece as spm
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    data = os.path.join(os.path.dirname(mistral_common.__file__), "data")
    tek = Tekkenizer.from_file(os.path.join(data, "tekken_240911.json"))
    out: dict[str, Callable[[str], int]] = {
        "tekken-131k": lambda t: len(tek.encode(t, bos=False, eos=False)),
    }
    for label, fname in (
        ("sentencepiece-v1-32k", "tokenizer.model.v1"),
        ("sentencepiece-v3-32k", "mistral_instruct_tokenizer_240323.model.v3"),
    ):
        sp = spm.SentencePieceProcessor(model_file=os.path.join(data, fname))
        out[label] = lambda t, sp=sp: len(sp.encode(t))
    return out


def measure() -> dict[str, dict[str, dict[str, float]]]:
    corpora = {"english": english(), "spanish": spanish(), "code": code()}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for tname, count in tokenizers().items():
        for cname, samples in corpora.items():
            ratios = [estimate_text(s) / max(1, count(s)) for s in samples]
            results.setdefault(tname, {})[cname] = {
                "samples": len(samples),
                "min_ratio": round(min(ratios), 3),
                "median_ratio": round(statistics.median(ratios), 3),
                "max_ratio": round(max(ratios), 3),
            }
    return results


def main() -> int:
    results = measure()
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    (out / "estimator_margin.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "| tokenizer | corpus | samples | min estimate/real | median | max |",
        "|---|---|---|---|---|---|",
    ]
    for tname, per in results.items():
        for cname, r in per.items():
            lines.append(
                f"| {tname} | {cname} | {r['samples']} | {r['min_ratio']} | {r['median_ratio']} "
                f"| {r['max_ratio']} |"
            )
    (out / "estimator_margin.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
