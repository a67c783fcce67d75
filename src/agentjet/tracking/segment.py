"""Message segmentation for any chat template.

Given a tokenizer with a chat template, the messages and the tools of a request, find the span of every message
in the *full* rendered prompt (characters and tokens), plus the span of the generation prompt. Nothing about the
template is hard-coded: the spans are derived from the template itself by rendering the conversation's prefixes
(``messages[:k]``, without generation prompt) and measuring how far each prefix agrees with the full render.

Boundary ``b_k`` (where message ``k`` starts) is the length of the longest common prefix of the full render and the
render of ``messages[:k]``. Message ``k`` spans ``[b_k, b_{k+1})`` and the generation prompt spans ``[b_n, len)``
where ``b_n`` is where the render without generation prompt stops agreeing with the full one. The spans therefore
partition the full render and include everything the template adds around a message (role headers, end-of-turn
tokens, separators, a default system prompt goes to the first message, tools go wherever the template puts them).

Templates that fold a message into another one (Gemma folds the system prompt into the first user turn) give the
folded message an empty or short span; ``content_span`` then points at the message's text where it really is.
Templates that re-render earlier messages depending on later ones (e.g. stripping the reasoning of earlier turns)
are detected: the affected boundary is clamped and ``exact`` is False.

Token spans come from the offsets of the one tokenization of the full render (the ids the engine receives); a
token that straddles a character boundary belongs to the span where it starts (``straddles`` lists them).

Rendering every prefix costs O(n) renders of up to n messages: quadratic in the conversation. A conversation
grows by appending, so ``segment_messages(resume=...)`` takes the segmentation of an earlier request whose
messages it extends and reuses its boundaries instead of re-rendering those prefixes (``Segmentation.agreement``:
where each prefix's render stops agreeing with the full render). A request then renders only its new messages'
prefixes: its cost grows like its own prompt.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool) -> str:
    """The chat template's text for ``messages`` (the same call the server tokenizes)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False
    )


def prompt_token_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The prompt ids exactly as the server builds them."""
    return list(tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
    ))


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (C-speed comparisons, O(n log n) worst case)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class MessageSpan:
    """Where one message (or the generation prompt, ``index == -1``) lies in the full render."""

    index: int
    role: str
    char_start: int
    char_end: int
    token_start: int
    token_end: int
    content_span: tuple[int, int] | None = None  # chars of the message's own text (may lie in another span)

    @property
    def char_len(self) -> int:
        return self.char_end - self.char_start

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start


@dataclass
class Segmentation:
    text: str  # the full render (generation prompt included when requested)
    ids: list[int]  # its tokenization (== the server's prompt ids)
    offsets: list[tuple[int, int]]
    messages: list[MessageSpan]  # one per input message, contiguous, in order
    generation: MessageSpan | None  # the generation prompt (role "assistant", index -1)
    header: str  # the text the template adds for add_generation_prompt=True ("" when none)
    exact: bool = True  # False when a prefix render disagreed with the full render inside an earlier message
    straddles: list[int] = field(default_factory=list)  # tokens that cross a span boundary
    _starts: list[int] = field(default_factory=list, repr=False)
    # what a segmentation of a longer conversation resumes from (``segment_messages(resume=...)``):
    # ``digests[k]`` identifies ``messages[:k]`` exactly, ``agreement[k]`` is where the render of ``messages[:k]``
    # (no generation prompt) stops agreeing with ``text`` (None: that prefix does not render), ``render_key``
    # the tokenizer, template and tools that rendered them
    digests: list[str] = field(default_factory=list, repr=False)
    agreement: list[int | None] = field(default_factory=list, repr=False)
    render_key: tuple[Any, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self._starts:
            self._starts = [s for s, _ in self.offsets]

    @property
    def spans(self) -> list[MessageSpan]:
        """Message spans followed by the generation prompt span (when present)."""
        return self.messages + ([self.generation] if self.generation is not None else [])

    def token_at(self, char: int) -> int:
        """Index of the first token that starts at or after ``char`` (tokens starting before belong left)."""
        return bisect.bisect_left(self._starts, char)

    def boundary(self, char: int) -> int | None:
        """The token index whose tokens split the text exactly at ``char``, or None when a token crosses it."""
        if char <= 0:
            return 0
        if char >= len(self.text):
            return len(self.ids)
        t = self.token_at(char)
        if t < len(self.ids) and self._starts[t] != char:
            return None
        if t > 0 and self.offsets[t - 1][1] > char:
            return None
        return t

    def piece(self, span: MessageSpan) -> str:
        return self.text[span.char_start:span.char_end]


class RenderCache:
    """Renders keyed by the exact content of the message prefix, the tools and the generation-prompt flag.

    The calls of an episode share most of their prefixes: one cache per episode makes segmenting all of them
    cost about as much as rendering each distinct prefix once."""

    def __init__(self) -> None:
        self._renders: dict[tuple[Any, ...], str | None] = {}

    def get(self, key: tuple[Any, ...]) -> tuple[bool, str | None]:
        if key in self._renders:
            return True, self._renders[key]
        return False, None

    def put(self, key: tuple[Any, ...], value: str | None) -> None:
        self._renders[key] = value


def _exact_digests(messages: list[dict[str, Any]]) -> list[str]:
    """``d[k]`` identifies ``messages[:k]`` exactly, as the template sees them (rolling SHA-1)."""
    h = hashlib.sha1(b"agentjet-render")
    out = [h.hexdigest()]
    for m in messages:
        h.update(b"\x00" + json.dumps(m, sort_keys=True, ensure_ascii=False, default=str).encode())
        out.append(h.copy().hexdigest())
    return out


def _render_key(tokenizer: Any, tools: list[dict[str, Any]] | None) -> tuple[Any, ...]:
    """What a render depends on besides the messages: the tokenizer, its template and the tools."""
    return (id(tokenizer), getattr(tokenizer, "chat_template", None),
            json.dumps(tools or [], sort_keys=True, default=str))


def _shared_prefix(a: list[str], b: list[str]) -> int:
    """The largest k with ``a[k] == b[k]`` for prefix digests: how many leading messages two conversations share."""
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k - 1


class Resumed:
    """Prefix agreements known from an earlier segmentation (``resume``) of a conversation this one extends.

    ``resume`` rendered the same prefixes ``messages[:k]`` (same digests, same render key) and measured where each
    stops agreeing with its own full render; its full render agrees with this one up to ``p``. An agreement
    below ``p`` holds for this render as well (the two renders are equal there, and the prefix ends or differs
    at that point); one at or past ``p`` must be measured again."""

    def __init__(self, resume: Segmentation | None, render_key: tuple[Any, ...], digests: list[str],
                 full: str) -> None:
        ok = resume is not None and resume.render_key == render_key and bool(resume.agreement)
        self._agreement = resume.agreement if resume is not None and ok else []
        self._shared = _shared_prefix(resume.digests, digests) if resume is not None and ok else 0
        self._agree_to = common_prefix_len(resume.text, full) if resume is not None and ok else 0

    def known(self, k: int) -> tuple[bool, int | None]:
        """(True, agreement of prefix k) when ``resume`` settles it, else (False, None)."""
        if k > self._shared or k >= len(self._agreement):
            return False, None
        a = self._agreement[k]
        if a is None or a < self._agree_to:
            return True, a
        return False, None


def _try_render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, gen: bool) -> str | None:
    try:
        return render_chat(tokenizer, messages, tools, gen)
    except Exception:  # templates may reject a prefix (e.g. an empty conversation)
        return None


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def encode_with_offsets(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def segment_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    cache: RenderCache | None = None,
    resume: Segmentation | None = None,
) -> Segmentation:
    """Segment the full render of ``messages`` (and ``tools``) into one span per message (+ generation prompt).

    ``cache``: share one ``RenderCache`` between the calls of an episode to render each prefix once.
    ``resume``: an earlier segmentation (any: it is used only where it provably applies) of a conversation that
    this one extends; its boundaries are reused instead of re-rendering the shared prefixes. The result is the
    same with or without it."""
    n = len(messages)
    digests = _exact_digests(messages)
    render_key = _render_key(tokenizer, tools)

    def render(k: int, gen: bool) -> str | None:
        if cache is None:
            return _try_render(tokenizer, messages[:k], tools, gen)
        key = (id(tokenizer), digests[k], render_key[2], gen)
        hit, value = cache.get(key)
        if not hit:
            value = _try_render(tokenizer, messages[:k], tools, gen)
            cache.put(key, value)
        return value

    full_or_none = render(n, add_generation_prompt)
    full = full_or_none if full_or_none is not None else render_chat(tokenizer, messages, tools,
                                                                     add_generation_prompt)  # raises
    exact = True
    agreement: list[int | None] = [0] * (n + 1)

    # where the generation prompt starts: the render without it agrees with the full render up to there
    if add_generation_prompt:
        bare = render(n, False)
        gen_start = common_prefix_len(bare, full) if bare is not None else len(full)
        agreement[n] = gen_start if bare is not None else None
        if bare is not None and len(bare) != gen_start:
            exact = False  # the template renders the last message differently when a reply is requested
        header = full[gen_start:]
    else:
        gen_start, header = len(full), ""
        agreement[n] = len(full)

    resumed = Resumed(resume, render_key, digests, full)
    bounds = [0] * (n + 1)
    bounds[n] = gen_start
    for k in range(1, n):
        known, agree = resumed.known(k)
        if not known:
            prefix = render(k, False)
            agree = common_prefix_len(prefix, full) if prefix is not None else None
        agreement[k] = agree
        # (a prefix may end differently from the full render, e.g. a group of tool results is closed only after
        # its last one: the boundary is then where they stop agreeing)
        b = agree if agree is not None else bounds[k - 1]
        if b < bounds[k - 1]:
            b, exact = bounds[k - 1], False
        bounds[k] = min(b, gen_start)
    for k in range(1, n + 1):  # keep monotone
        if bounds[k] < bounds[k - 1]:
            bounds[k], exact = bounds[k - 1], False

    ids, offsets = encode_with_offsets(tokenizer, full)
    seg = Segmentation(text=full, ids=ids, offsets=offsets, messages=[], generation=None, header=header, exact=exact,
                       digests=digests, agreement=agreement, render_key=render_key)
    token_bounds = [seg.token_at(b) for b in bounds] + [len(ids)]
    for b in bounds:
        if seg.boundary(b) is None:
            seg.straddles.append(seg.token_at(b) - 1)

    search_from = 0
    for k, m in enumerate(messages):
        cs, ce = bounds[k], bounds[k + 1]
        content = _content_text(m)
        content_span = None
        for cand in (content, content.strip()):
            if not cand:
                continue
            pos = full.find(cand, cs, ce)
            if pos < 0:  # folded elsewhere (e.g. into the next turn)
                pos = full.find(cand, max(search_from, cs))
            if pos >= 0:
                content_span = (pos, pos + len(cand))
                search_from = max(search_from, pos + len(cand))
                break
        seg.messages.append(MessageSpan(k, str(m.get("role", "")), cs, ce, token_bounds[k], token_bounds[k + 1],
                                        content_span))
    if add_generation_prompt:
        seg.generation = MessageSpan(-1, "assistant", gen_start, len(full), token_bounds[n], len(ids))
    return seg


__all__ = [
    "MessageSpan",
    "RenderCache",
    "Segmentation",
    "common_prefix_len",
    "encode_with_offsets",
    "prompt_token_ids",
    "render_chat",
    "segment_messages",
]
