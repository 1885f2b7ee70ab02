"""The pseudo-tokenizer and chat template (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sim.tokens import OutputText, count_tokens, render_chat, token_pieces, tokenize

TEXT = st.text(alphabet=st.sampled_from(list("abc XY\n\t.,")), max_size=200)


def test_rule_examples() -> None:
    assert token_pieces("hello world") == ["hell", "o", " wor", "ld"]
    assert token_pieces("a\n\nb  ") == ["a", "\n", "\n", "b", "  "]
    assert tokenize("hello") == tokenize("hello")
    assert tokenize("hello") != tokenize("hellp")


@given(TEXT)
def test_count_matches_tokenize_and_pieces_rebuild_text(text: str) -> None:
    assert count_tokens(text) == len(tokenize(text)) == len(token_pieces(text))
    assert "".join(token_pieces(text)) == text
    assert len(tokenize(text)) <= len(text)


@given(TEXT, TEXT)
def test_prefix_stable_at_newlines(a: str, b: str) -> None:
    assert tokenize(a + "\n" + b)[: len(tokenize(a + "\n"))] == tokenize(a + "\n")


def test_generated_words_are_one_token_each() -> None:
    out = OutputText(seed=1, digest=2, len_min=3, len_max=3)
    assert out.natural_len == 3
    pieces = [out.next_piece() for _ in range(50)]
    for token_id, text in pieces:
        assert tokenize(text) == [token_id]
    assert len(tokenize("".join(t for _, t in pieces))) == 50


def test_render_chat() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}],
        },
    ]
    assert render_chat(msgs) == "<|system|>\ns<|end|>\n<|user|>\na<|end|>\n<|assistant|>\n"
    assert render_chat(msgs, add_generation_prompt=False).endswith("<|end|>\n")
    assert render_chat(msgs, tools=[{"type": "function"}]).startswith("<|tools|>\n")
    with pytest.raises(TypeError):
        render_chat([{"content": "no role"}])
    with pytest.raises(TypeError):
        render_chat(["not an object"])
