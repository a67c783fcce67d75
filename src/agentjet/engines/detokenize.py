"""Incremental detokenization: the text a stream of token ids adds, token by token, at a cost that does not
grow with the length of the output.

Decoding a token alone is wrong in general: a character may span several byte-level tokens, and SentencePiece
tokenizers drop or keep a leading space depending on what comes before. So each step decodes a short window:
the ids from ``prefix`` (a few tokens already shown) to the end, and subtracts the text of ``prefix..read``
(what those already-shown tokens decode to in the same context). New text is released only when it does not end
in an incomplete UTF-8 sequence (U+FFFD). This is the scheme of Hugging Face's text-generation-inference and
vLLM. The concatenated pieces equal ``tokenizer.decode(ids, skip_special_tokens=True)`` (tested).
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"
# A UTF-8 character is at most 4 bytes and a byte-level token holds at least one: text still incomplete after
# this many tokens is invalid for good (it decodes to U+FFFD in the whole text too) and is released as it is.
_MAX_PENDING = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # everything released so far
        self._prefix = 0  # start of the context window
        self._read = 0  # ids before this are in ``text``

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token: int) -> str:
        """Add one token id; return the text it releases (possibly empty)."""
        self.ids.append(token)
        return self._release(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end)."""
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        shown = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        complete = not full.endswith(_REPLACEMENT) or final or len(self.ids) - self._read > _MAX_PENDING
        if len(full) > len(shown) and complete:
            piece = full[len(shown):]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += piece
            return piece
        return ""
