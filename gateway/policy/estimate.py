"""The conservative token estimator (pure, stdlib only).

The text is cut like a BPE pre-tokenizer would (letter runs split at case
changes, digits, symbols, whitespace) and each piece is charged at least
what common BPE vocabularies spend on it. The chat template is charged
separately (`MESSAGE_OVERHEAD` per message, `BASE_OVERHEAD` per request,
`TOOLS_OVERHEAD` when tools are sent). Measured margins against real
tokenizers: docs/policies.md (bench/estimator_margin.py).
"""

from __future__ import annotations

import re

MESSAGE_OVERHEAD = 8
BASE_OVERHEAD = 32
TOOLS_OVERHEAD = 128
#: The estimate is at most this many times a real tokenizer's count (the
#: largest ratio measured, docs/policies.md, is 2.96 on a whole chat request):
#: a prompt whose estimate is over a limit by less than this factor may fit,
#: and is counted exactly before it is refused.
MAX_OVERCOUNT = 3.0

_PIECE = re.compile(
    r" ?[A-Z]?[a-z]+| ?[A-Z]+(?![a-z])"  # ASCII words split at case changes, with one leading space
    r"| ?[^\W\d_]+"  # letters of any script (accents, Cyrillic, CJK, ...) and other word characters
    r"| ?\d"  # each digit (one leading space rides along)
    r"| ?[^\w\s]| ?_"  # each symbol (idem)
    r"|\n"  # each newline
    r"|[^\S\n]+",  # other whitespace runs
)


def _ceil4(n: int) -> int:
    return -(-n // 4)


def _letters_cost(piece: str) -> int:
    if piece.isascii():
        return _ceil4(len(piece))
    latin = sum(1 for ch in piece if ch < "\u0250")
    if latin == len(piece):
        return _ceil4(len(piece)) + sum(1 for ch in piece if ch > "\x7f")
    return len(piece) + latin


def _piece_cost(piece: str) -> int:
    body = piece[1:] if piece[0] == " " and len(piece) > 1 else piece
    if body[0].isspace():
        return 1 if piece == "\n" else _ceil4(len(piece))
    if body.isalpha():
        return _letters_cost(piece)
    return len(body)


def estimate_text(text: str) -> int:
    """A conservative token count of plain text (no template overhead).

    Every piece costs at least ceil(len / 4), so the estimate is never below
    a tokenizer that spends one token per 4 characters of a word (the
    simulator's); real BPE vocabularies: see the module docstring."""
    return sum(_piece_cost(p) for p in _PIECE.findall(text))


#: No piece spans a whitespace character that follows a non-whitespace one.
_SAFE_CUT = re.compile(r"\S\s")


def estimate_text_in_slices(text: str, slice_chars: int = 16384) -> int:
    """`estimate_text(text)`, computed over slices of about `slice_chars`
    characters: one `findall` over a long text is one C call that holds the
    GIL, so a worker thread estimating a long prompt would stall the event
    loop for its whole length. A slice ends just before a whitespace
    character that follows a non-whitespace one; no piece spans that point
    (pieces carry whitespace only in front of them) and the pattern looks
    only ahead, so the sum over the slices is exactly the estimate of the
    whole text. A text with no such point stays one slice."""
    total, start, end = 0, 0, len(text)
    while start < end:
        cut = _SAFE_CUT.search(text, start + slice_chars) if start + slice_chars < end else None
        stop = cut.start() + 1 if cut is not None else end
        total += estimate_text(text[start:stop])
        start = stop
    return total
