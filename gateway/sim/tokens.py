"""A deterministic pseudo-tokenizer, the fixed chat template, and output text.

Tokenizer rule: every newline is a piece of its own; the rest of the text is
cut into words that keep the spaces or tabs before them (like BPE's
leading-space tokens), with trailing spaces a piece of their own (regex
`\\n|[^\\S\\n]*\\S+|[^\\S\\n]+`). Each piece is cut into chunks of 4
characters from its start and every chunk is one token, whose id is
`xxh32(chunk) % VOCAB_SIZE`. So "hello world" is `hell|o| wor|ld` = 4 tokens:
about one token per 3-4 characters of English, never more than one per
character. The rule is prefix-stable on word boundaries, which makes the
prefix cache behave as with a real tokenizer: a conversation re-sent with one
more turn shares every token of the earlier turns except possibly the last.

Chat template (fixed, not the model's): tools first as
`<|tools|>\\n{json}<|end|>\\n`, then each message as
`<|{role}|>\\n{content}<|end|>\\n`, then `<|assistant|>\\n` when a generation
prompt is added. Content given as a list of parts keeps only its text parts.

Generated text is a deterministic sequence of short words (at most 3 letters
after a space), each exactly one token under the rule above, so usage counts
match a re-tokenization of the output.
"""

from __future__ import annotations

import functools
import json
import random
import re
from array import array
from collections.abc import Sequence
from typing import Any

import xxhash

VOCAB_SIZE = 131072
_PIECE = re.compile(r"\n|[^\S\n]*\S+|[^\S\n]+")
_CHUNK = 4
_WORDS = (
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "on",
    "for",
    "as",
    "at",
    "by",
    "we",
    "be",
    "or",
    "an",
    "are",
    "was",
    "can",
    "all",
    "one",
    "has",
    "but",
    "not",
    "you",
    "its",
    "so",
    "if",
    "do",
    "up",
    "new",
    "use",
    "may",
    "out",
    "how",
    "now",
    "two",
    "way",
    "see",
)


@functools.lru_cache(maxsize=65536)
def _piece_ids(piece: str) -> tuple[int, ...]:
    return tuple(
        xxhash.xxh32_intdigest(piece[i : i + _CHUNK].encode()) % VOCAB_SIZE
        for i in range(0, len(piece), _CHUNK)
    )


@functools.lru_cache(maxsize=65536)
def _piece_strs(piece: str) -> tuple[str, ...]:
    return tuple(piece[i : i + _CHUNK] for i in range(0, len(piece), _CHUNK))


def tokenize(text: str) -> list[int]:
    """Token ids of `text` under the rule in the module docstring."""
    ids: list[int] = []
    for piece in _PIECE.findall(text):
        ids.extend(_piece_ids(piece))
    return ids


def token_pieces(text: str) -> list[str]:
    """The text of each token of `text` (same cut as `tokenize`)."""
    pieces: list[str] = []
    for piece in _PIECE.findall(text):
        pieces.extend(_piece_strs(piece))
    return pieces


def count_tokens(text: str) -> int:
    return sum(-(-len(piece) // _CHUNK) for piece in _PIECE.findall(text))


def content_text(content: object) -> str:
    """A message's content as text: a string, or the text parts of a list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part) for part in content)
    raise TypeError("message content must be a string or a list of content parts")


def _part_text(part: object) -> str:
    if isinstance(part, dict) and part.get("type") == "text":
        return str(part.get("text", ""))
    if isinstance(part, str):
        return part
    return ""


def render_chat(
    messages: Sequence[Any], tools: object = None, add_generation_prompt: bool = True
) -> str:
    """Render chat messages with the simulator's fixed template."""
    out: list[str] = []
    if tools:
        out.append("<|tools|>\n" + json.dumps(tools, sort_keys=True) + "<|end|>\n")
    for message in messages:
        if not isinstance(message, dict):
            raise TypeError("each message must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise TypeError("each message needs a string 'role'")
        out.append(f"<|{role}|>\n{content_text(message.get('content'))}<|end|>\n")
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)


def prompt_digest(tokens: Sequence[int]) -> int:
    """A 64-bit digest of a token sequence (seeds the output of a request)."""
    return xxhash.xxh3_64_intdigest(array("I", tokens).tobytes())


class OutputText:
    """The deterministic output of one request: natural length and token texts."""

    __slots__ = ("_rng", "natural_len")

    def __init__(self, seed: int, digest: int, len_min: int, len_max: int) -> None:
        self._rng = random.Random((seed << 64) ^ digest)
        self.natural_len = self._rng.randint(len_min, len_max)

    def next_piece(self) -> tuple[int, str]:
        """The next output token: (id, text)."""
        text = " " + self._rng.choice(_WORDS)
        return _piece_ids(text)[0], text
