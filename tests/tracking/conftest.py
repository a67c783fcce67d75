from __future__ import annotations

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from templates import TEMPLATES  # noqa: E402


@pytest.fixture(scope="session")
def tiny_base():
    from agentjet.models import build_tiny_tokenizer

    return build_tiny_tokenizer()


def make_tokenizer(base, name: str):
    """The tiny tokenizer with the special tokens and the chat template of fixture template ``name``."""
    template, special, bos, _eot = TEMPLATES[name]
    tok = copy.deepcopy(base)
    tok.add_special_tokens({"additional_special_tokens": special})
    if bos:
        tok.bos_token = bos
    tok.chat_template = template
    return tok


@pytest.fixture(scope="session")
def toks(tiny_base):
    return {name: make_tokenizer(tiny_base, name) for name in TEMPLATES}
