"""Re-tokenization drift: find the assistant messages of a prompt that the model generated earlier in the
episode and put the exact generated token ids back in place of their re-tokenization (token-in, token-out).

An agent resends the model's reply as text. Rendering and re-tokenizing that text can give other ids than the
ones generated (the model may have produced a non-canonical tokenization, e.g. a word spelled as single
characters, that re-encoding merges). For every assistant message ``j`` of a call we look for the earlier call of
the same agent that produced it: same agent, the same preceding messages (``messages[:j]``) and a reply equal to
message ``j`` (content and tool calls, ids ignored). The message's *generated region* in the full render starts
after the generation prompt (``Segmentation.header``) and spans the generated text: ``decode(completion_ids)``,
end-of-turn token included when the model emitted it. The region is only accepted when the render contains exactly
that text there and both ends are token boundaries; a different text (the template or the client changed the
message: stripped reasoning, reformatted tool-call JSON, trimmed whitespace) is not drift: it is what the model
saw, it is kept, and it is counted as a ``render_mismatch``.

Drift = the recorded prompt holds the region's re-tokenization and that differs from the generated ids.
"""

from __future__ import annotations

import bisect
import enum
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agentjet.tracking.keys import message_key, prefix_digests, tools_key
from agentjet.tracking.segment import RenderCache, Segmentation, segment_messages
from agentjet.tracking.types import CallRecord

# region statuses
EXACT = "exact"  # the prompt holds the generated ids (no drift)
REPAIRED = "repaired"  # the prompt held a different re-tokenization; the generated ids were put back
KEPT = "kept"  # drift found, left as recorded (fix_drift=False)
RENDER_MISMATCH = "render_mismatch"  # the message renders to another text than the one generated: not drift
UNALIGNED = "unaligned"  # the generated text is there but a token crosses its boundary: cannot be spliced


class TitoOutcome(enum.Enum):
    """What token-in, token-out did to one request's prompt (``server/episodes/tito.py``)."""

    PLAIN = "plain"  # nothing to splice (or nothing changed): the plain prompt
    SPLICED = "spliced"  # generated ids put back where re-tokenization would have changed them
    FALLBACK = "fallback"  # splicing was attempted but failed a check: the plain prompt (see log at DEBUG)


def decode_exact(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass
class Generation:
    """One call's output, as needed to recognise it in a later prompt."""

    call_index: int
    agent: str
    ids: list[int]
    text: str  # decode_exact(ids)


class GenerationIndex:
    """Earlier generations by (agent, digest of the messages + reply they ended)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._by_key: dict[tuple[str, str], list[Generation]] = {}

    def add(self, call: CallRecord, keys: Sequence[str] | None = None) -> None:
        if not call.completion_ids:
            return
        keys = list(keys) if keys is not None else [message_key(m) for m in call.messages]
        digest = prefix_digests(keys + [message_key(call.response_message)])[-1]
        gen = Generation(call.call_index, call.agent, list(call.completion_ids),
                         decode_exact(self.tokenizer, call.completion_ids))
        self._by_key.setdefault((call.agent, digest), []).append(gen)

    def lookup(self, agent: str, digest: str, before: int | None) -> list[Generation]:
        """Generations of ``agent`` that ended with the message list identified by ``digest`` (latest first)."""
        gens = self._by_key.get((agent, digest), [])
        return [g for g in reversed(gens) if before is None or g.call_index < before]


@dataclass
class Region:
    """A generated region inside a (repaired) prompt."""

    message_index: int
    generator: int  # call_index of the call that generated it
    start: int  # token positions in the repaired prompt
    end: int
    status: str
    recorded_len: int = 0  # length of the region in the recorded prompt


@dataclass
class RepairedPrompt:
    ids: list[int]  # the prompt with generated regions as generated (when fix_drift), else as recorded
    recorded_ok: bool  # the recorded prompt is explained by the re-render (False: left untouched)
    regions: list[Region] = field(default_factory=list)  # accepted regions (exact / repaired / kept)
    drift_found: int = 0  # regions whose recorded tokens differ from the generated ids
    drift_repaired: int = 0
    render_mismatches: int = 0  # messages matched to a generation but rendered to another text
    unaligned: int = 0
    statuses: dict[int, str] = field(default_factory=dict)  # message index -> region status (matched messages)
    message_spans: list[tuple[int, int, str]] | None = None  # (start, end, role) per message, in ``ids``
    generation_span: tuple[int, int] | None = None  # the generation prompt, in ``ids``
    error: str | None = None
    segmentation: Segmentation | None = None

    @property
    def region_by_message(self) -> dict[int, Region]:
        return {r.message_index: r for r in self.regions}


class Located(NamedTuple):
    """A generated message found on the re-render: its token range there, the generation and the message."""

    t0: int
    t1: int
    generation: Generation
    message: int


def locate_generations(seg: Segmentation, messages: list[dict[str, Any]], keys: Sequence[str], agent: str,
                       index: GenerationIndex, before: int | None, result: RepairedPrompt) -> list[Located]:
    """Phase one: the assistant messages of ``messages`` that ``agent`` generated (found in ``index`` by the
    digest of the conversation up to them), located as token ranges on the re-render. Messages that cannot be
    located are counted in ``result`` (render mismatch, or a generation whose text does not start or end on a
    token boundary)."""
    digests = prefix_digests(list(keys))
    rendered, text, header = seg.ids, seg.text, seg.header
    found: list[Located] = []
    for j, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        gens = index.lookup(agent, digests[j + 1], before)
        if not gens:
            continue
        span = seg.messages[j]
        start_char = span.char_start + len(header)
        located = []
        if header and text.startswith(header, span.char_start):
            located = [g for g in gens if start_char + len(g.text) <= span.char_end
                       and text.startswith(g.text, start_char)]
        if not located:
            result.render_mismatches += 1
            result.statuses[j] = RENDER_MISMATCH
            continue
        t0 = seg.boundary(start_char)
        ends = {id(g): seg.boundary(start_char + len(g.text)) for g in located}
        # prefer the generation whose ids the render already holds, then the longest text, then the latest
        located.sort(key=lambda g: (not (t0 is not None and ends[id(g)] is not None
                                         and rendered[t0:ends[id(g)]] == g.ids), -len(g.text)))
        g = located[0]
        t1 = ends[id(g)]
        if t0 is None or t1 is None:
            result.unaligned += 1
            result.drift_found += 1
            result.statuses[j] = UNALIGNED
            continue
        found.append(Located(t0, t1, g, j))
    return found


def splice_generations(seg: Segmentation, found: list[Located], recorded: list[int] | None, fix_drift: bool,
                       result: RepairedPrompt) -> bool:
    """Phase two: walk the recorded prompt (``None``: a new prompt) against the re-render and put the generated
    ids in each located region. Outside the regions the recorded prompt must equal the re-render; in a region it
    may hold the generated ids (exact) or their re-tokenization (drift: replaced when ``fix_drift``). Fills
    ``result`` (ids, regions, statuses, spans) and returns False when the recorded prompt does not fit."""
    rendered = seg.ids
    out: list[int] = []
    cur = 0  # position in the recorded prompt
    pos = 0  # position in the re-render
    shifts: list[tuple[int, int]] = []  # (re-render position after a region, cumulative delta)
    delta = 0
    for t0, t1, g, j in found:
        plain = rendered[pos:t0]
        if recorded is not None and recorded[cur:cur + len(plain)] != plain:
            return False
        out += plain
        cur += len(plain)
        re_tok = rendered[t0:t1]
        start = len(out)
        if recorded is None:  # a new prompt: always splice (counted as drift prevented)
            status, took, rec_len = (EXACT if re_tok == g.ids else REPAIRED), g.ids, len(re_tok)
            if status == REPAIRED:
                result.drift_found += 1
                result.drift_repaired += 1
        elif recorded[cur:cur + len(g.ids)] == g.ids:
            status, took, rec_len = EXACT, g.ids, len(g.ids)
        elif recorded[cur:cur + len(re_tok)] == re_tok:
            rec_len = len(re_tok)
            result.drift_found += 1
            if fix_drift:
                status, took = REPAIRED, g.ids
                result.drift_repaired += 1
            else:
                status, took = KEPT, re_tok
        else:
            return False
        out += took
        cur += rec_len
        pos = t1
        delta += len(took) - len(re_tok)
        shifts.append((t1, delta))
        result.regions.append(Region(j, g.call_index, start, start + len(took), status, rec_len))
        result.statuses[j] = status
    tail = rendered[pos:]
    if recorded is not None and recorded[cur:] != tail:
        return False
    out += tail

    afters = [after for after, _ in shifts]  # increasing: the regions are in order

    def moved(t: int) -> int:
        i = bisect.bisect_right(afters, t)  # the shifts of the regions that end at or before t
        return t + (shifts[i - 1][1] if i else 0)

    result.ids = out
    result.message_spans = [(moved(s.token_start), moved(s.token_end), s.role) for s in seg.messages]
    if seg.generation is not None:
        result.generation_span = (moved(seg.generation.token_start), moved(seg.generation.token_end))
    return True


def repair_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    agent: str,
    index: GenerationIndex,
    recorded_ids: Sequence[int] | None = None,
    fix_drift: bool = True,
    before: int | None = None,
    keys: Sequence[str] | None = None,
    cache: RenderCache | None = None,
    resume: Segmentation | None = None,
) -> RepairedPrompt:
    """Locate the generated regions of ``messages`` (``locate_generations``) and splice the generated ids in
    (``splice_generations``).

    ``recorded_ids`` is the prompt the engine received (``None``: build a prompt for a new request, every
    located region spliced). Anything that does not fit leaves the recorded prompt untouched
    (``recorded_ok=False``). ``cache`` and ``resume`` save renders (``segment_messages``), nothing else.
    """
    try:
        seg = segment_messages(tokenizer, messages, tools, add_generation_prompt=True, cache=cache, resume=resume)
    except Exception as exc:  # a template that cannot render this request: nothing to repair
        ids = list(recorded_ids) if recorded_ids is not None else []
        return RepairedPrompt(ids=ids, recorded_ok=False, error=f"segmentation failed: {exc!r}")
    keys = list(keys) if keys is not None else [message_key(m) for m in messages]
    result = RepairedPrompt(ids=[], recorded_ok=True, segmentation=seg)
    found = locate_generations(seg, messages, keys, agent, index, before, result)
    recorded = list(recorded_ids) if recorded_ids is not None else None
    if splice_generations(seg, found, recorded, fix_drift, result):
        return result
    return RepairedPrompt(ids=list(recorded or []), recorded_ok=False, render_mismatches=result.render_mismatches,
                          statuses={k: v for k, v in result.statuses.items() if v == RENDER_MISMATCH},
                          error="the recorded prompt ids differ from the re-rendered prompt", segmentation=seg)


class TitoSession:
    """What token-in/token-out keeps between the requests of one episode, so that a request costs what its own
    prompt costs rather than re-reading the whole history: the index of the episode's generations, fed each
    call once, and the latest segmentation per agent, which that agent's next request resumes from
    (``segment_messages(resume=...)``). For a server's call list: append-only, ``call_index`` = the position.
    One request at a time per session (a lock; the server runs them in worker threads)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.lock = threading.Lock()
        self._index = GenerationIndex(tokenizer)
        self._count = 0  # calls indexed: previous_calls[:count]
        self._tail: CallRecord | None = None  # the last one indexed
        self._last: dict[str, Segmentation] = {}

    def index_of(self, previous_calls: Sequence[CallRecord]) -> GenerationIndex | None:
        """The index of exactly ``previous_calls`` (looked up with ``before=len(previous_calls)``), adding the
        calls not indexed yet; None when they do not extend the calls indexed so far as a server's list does."""
        n = self._count
        if len(previous_calls) < n or (n and previous_calls[n - 1] is not self._tail):
            return None
        for c in previous_calls[n:]:
            if c.call_index != self._count:
                return None
            self._index.add(c)
            self._count, self._tail = self._count + 1, c
        return self._index

    def last_segmentation(self, agent: str) -> Segmentation | None:
        return self._last.get(agent)

    def remember(self, agent: str, seg: Segmentation | None) -> None:
        if seg is not None:
            self._last[agent] = seg


def tito_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    agent: str,
    previous_calls: Sequence[CallRecord],
    session: TitoSession | None = None,
) -> tuple[list[int], RepairedPrompt]:
    """The prompt ids for a new request with every assistant message that the model generated earlier in the
    episode (same agent, same preceding messages) spliced in as the exact generated ids. A server can feed these
    ids to the engine so that the model sees its own tokens (token-in, token-out) and drift never happens.

    ``session``: the episode's ``TitoSession`` (the same result; the index and the segmentation are carried
    over from the earlier requests instead of rebuilt from the whole history)."""
    if session is None:
        return _tito_prompt_ids(tokenizer, messages, tools, agent, _fresh_index(tokenizer, previous_calls, agent),
                                None, None)
    with session.lock:
        index = session.index_of(previous_calls)
        if index is None:  # not a server's call list: as without a session
            return _tito_prompt_ids(tokenizer, messages, tools, agent,
                                    _fresh_index(tokenizer, previous_calls, agent), None, None)
        ids, rep = _tito_prompt_ids(tokenizer, messages, tools, agent, index, len(previous_calls),
                                    session.last_segmentation(agent))
        session.remember(agent, rep.segmentation)
        return ids, rep


def _fresh_index(tokenizer: Any, previous_calls: Sequence[CallRecord], agent: str) -> GenerationIndex:
    index = GenerationIndex(tokenizer)
    for c in previous_calls:
        if c.agent == agent:
            index.add(c)
    return index


def _tito_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, agent: str,
                     index: GenerationIndex, before: int | None, resume: Segmentation | None
                     ) -> tuple[list[int], RepairedPrompt]:
    rep = repair_prompt(tokenizer, messages, tools, agent, index, recorded_ids=None, fix_drift=True, before=before,
                        resume=resume)
    return rep.ids, rep


__all__ = [
    "EXACT",
    "KEPT",
    "RENDER_MISMATCH",
    "REPAIRED",
    "UNALIGNED",
    "Generation",
    "GenerationIndex",
    "Region",
    "RepairedPrompt",
    "TitoSession",
    "decode_exact",
    "message_key",
    "prefix_digests",
    "repair_prompt",
    "tito_prompt_ids",
    "tools_key",
]
