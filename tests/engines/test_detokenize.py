"""Incremental detokenization releases exactly the text of a whole decode, token by token."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjet.engines.detokenize import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizers(tiny_model_path: Path) -> dict:
    from transformers import AutoTokenizer

    from agentjet.models import resolve_model

    return {"tiny": AutoTokenizer.from_pretrained(tiny_model_path),
            "smollm2": AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))}


def pieces(tok, ids: list[int]) -> tuple[list[str], str]:
    d = IncrementalDetokenizer(tok)
    out = [d.push(t) for t in ids]
    out.append(d.flush())
    return out, d.text


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_text_round_trips_token_by_token(tokenizers: dict, name: str) -> None:
    tok = tokenizers[name]
    text = "Héllo, wörld! 3 + 4 = 7. 日本語のテキスト 🙂🚀 <tool_call>{\"x\": 1}</tool_call>\n  indented\tend"
    ids = tok.encode(text, add_special_tokens=False)
    out, joined = pieces(tok, ids)
    assert "".join(out) == joined == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in out)  # a character split across tokens is released whole


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_token_sequence_round_trips(tokenizers: dict, name: str, data) -> None:
    tok = tokenizers[name]
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=40))
    out, joined = pieces(tok, ids)
    assert "".join(out) == joined == tok.decode(ids, skip_special_tokens=True)
