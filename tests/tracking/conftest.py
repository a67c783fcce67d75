from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from templates import TEMPLATES, with_template  # noqa: E402


@pytest.fixture(scope="session")
def tiny_base():
    from agentjet.models import build_tiny_tokenizer

    return build_tiny_tokenizer()


def make_tokenizer(base, name: str):
    """The tiny tokenizer with the special tokens and the chat template of fixture template ``name``."""
    template, special, bos, _eot = TEMPLATES[name]
    return with_template(base, template, special, bos)


@pytest.fixture(scope="session")
def toks(tiny_base):
    return {name: make_tokenizer(tiny_base, name) for name in TEMPLATES}
