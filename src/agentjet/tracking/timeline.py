"""Timelines and timeline merging.

Every call is a timeline: its input (messages, tools, prompt ids) and its output (generated ids + logprobs). At
episode end, per agent, a timeline ``a`` is *absorbable* into a later timeline ``b`` (``a ≺ b``) when

- same agent, ``a`` came first, same temperature (one sample has one temperature),
- ``ignore_tools`` or the same tools list,
- TOKEN level: ``prompt'(a) + output(a)`` is a prefix of ``prompt'(b)`` (``prompt'`` = the prompt after drift
  repair, i.e. the recorded prompt when there was nothing to repair or ``fix_drift`` is off);
  TEXT level: ``messages(a) + [reply(a)]`` is a prefix of ``messages(b)`` and ``b``'s prompt holds ``a``'s output
  ids as the generated region of that reply.

At the token level ``≺`` is transitive and the outputs of a chain ``a1 ≺ a2 ≺ ... ≺ ak`` occupy disjoint,
ordered regions of ``prompt'(ak) + output(ak)``: the chain becomes ONE sample whose loss mask is 1 on every
output of the chain. Choosing the chains is a minimum chain cover of the DAG ``≺``: a maximum bipartite matching
``a -> b`` (Kuhn's augmenting paths, nearest successor first), so a linear conversation of ``T`` calls gives one
sample and a history forked ``f`` times gives ``f + 1`` samples. Anything else stays separate: calls are never
merged unless the prefix relation holds, so forks, retries with an edited context, memory rewrites or templates
that re-render earlier turns (stripped reasoning) are detected (and counted per reason in the report).
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentjet.tracking.config import CompareLevel, TrackingConfig
from agentjet.tracking.drift import (
    EXACT,
    KEPT,
    RENDER_MISMATCH,
    UNALIGNED,
    GenerationIndex,
    RepairedPrompt,
    repair_prompt,
)
from agentjet.tracking.keys import message_key, tools_key
from agentjet.tracking.segment import RenderCache, Segmentation
from agentjet.tracking.types import NO_VERSION, CallRecord, EpisodeSample
from agentjet.tracking.weights import episode_weights


@dataclass
class Timeline:
    call: CallRecord
    keys: list[str]  # message keys of the input
    reply_key: str
    tools_key: str
    prompt: list[int]  # the prompt after drift repair (== call.prompt_ids when nothing was repaired)
    repair: RepairedPrompt | None = None

    @property
    def index(self) -> int:
        return self.call.call_index

    @property
    def sequence_len(self) -> int:
        return len(self.prompt) + len(self.call.completion_ids)


@dataclass
class TrackingReport:
    """Episode-level statistics of context tracking."""

    calls: int = 0
    samples: int = 0
    merged_calls: int = 0  # calls absorbed into a longer call's sample
    merge_rate: float = 0.0  # merged_calls / calls
    drift_mismatches: int = 0  # re-tokenized generated regions that differed from the generated ids (all prompts)
    drift_repaired: int = 0
    drifted_generations: int = 0  # distinct generations re-tokenized differently at least once
    render_mismatches: int = 0  # replies resent with another text than generated (not drift; kept)
    unaligned_regions: int = 0  # generated text found but cut by a re-render token: not repairable
    retokenize_failures: int = 0  # recorded prompts that are not the re-render of their messages (left as is)
    blocked: dict[str, int] = field(default_factory=dict)  # why a call with a later call was not absorbed
    agents: dict[str, dict[str, int]] = field(default_factory=dict)  # agent -> {"calls", "samples"}
    tokens_unmerged: int = 0  # sum over calls of len(prompt') + len(output): one sample per call
    tokens_merged: int = 0  # sum of the sample lengths
    trained_tokens: int = 0  # sum of the loss masks
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _validate(calls: Sequence[CallRecord]) -> None:
    for c in calls:
        if len(c.completion_ids) != len(c.completion_logprobs):
            raise ValueError(f"call {c.call_index}: {len(c.completion_ids)} completion ids but "
                             f"{len(c.completion_logprobs)} logprobs")
        if c.completion_versions is not None and len(c.completion_versions) != len(c.completion_ids):
            raise ValueError(f"call {c.call_index}: {len(c.completion_ids)} completion ids but "
                             f"{len(c.completion_versions)} versions")
    seen = Counter(c.call_index for c in calls)
    dup = [i for i, n in seen.items() if n > 1]
    if dup:
        raise ValueError(f"duplicate call_index values: {dup}")


class _Merger:
    def __init__(self, timelines: list[Timeline], config: TrackingConfig) -> None:
        self.tls = timelines
        self.cfg = config
        self.token = config.compare_level == CompareLevel.TOKEN

    # ------------------------------------------------------------------ the relation
    def relation(self, a: Timeline, b: Timeline) -> str | None:
        """None when ``a`` is absorbable into ``b``, else why not."""
        if a.call.agent != b.call.agent:
            return "agent"
        if a.index >= b.index:
            return "order"
        if a.call.temperature != b.call.temperature:
            return "temperature"
        if not self.cfg.ignore_tools and a.tools_key != b.tools_key:
            return "tools_changed"
        out = a.call.completion_ids
        if self.token:
            n = len(a.prompt)
            if n + len(out) <= len(b.prompt) and b.prompt[:n] == a.prompt and b.prompt[n:n + len(out)] == out:
                return None
            return "token_mismatch"
        n = len(a.keys)
        if len(b.keys) <= n or b.keys[:n] != a.keys or b.keys[n] != a.reply_key:
            return "messages"
        region = b.repair.region_by_message.get(n) if b.repair is not None and b.repair.recorded_ok else None
        if region is None or b.prompt[region.start:region.end] != out:
            return "token_mismatch"
        return None

    def region_start(self, a: Timeline, leaf: Timeline) -> int:
        if a is leaf:
            return len(leaf.prompt)
        if self.token:
            return len(a.prompt)
        assert leaf.repair is not None
        return leaf.repair.region_by_message[len(a.keys)].start

    # ------------------------------------------------------------------ chain cover
    def chains(self) -> list[list[Timeline]]:
        by_agent: dict[str, list[Timeline]] = defaultdict(list)
        for t in self.tls:
            by_agent[t.call.agent].append(t)
        result: list[list[Timeline]] = []
        for tls in by_agent.values():
            result.extend(self._agent_chains(tls))
        result.sort(key=lambda ch: ch[-1].index)
        return result

    def successors(self, tls: list[Timeline]) -> dict[int, list[Timeline]]:
        """For each timeline the later ones it is absorbable into (the edges of ``≺``), nearest first.

        At the TOKEN level ``≺`` is transitive: when ``a ≺ x`` and ``x ≺ b``, then ``a ≺ b`` without comparing
        ``a``'s tokens with ``b``'s. Going from the last timeline back, each ``a`` compares its tokens with its
        first successor ``x`` and takes every successor of ``x`` from there; only the timelines that ``x`` does
        not lead to are compared directly. In a linear conversation each call is compared once, not once per
        later call (which cost O(turns x tokens) per call)."""
        succ: dict[int, list[Timeline]] = {}
        reach: dict[int, set[int]] = {}  # index -> indices of all its successors
        for i in range(len(tls) - 1, -1, -1):
            a = tls[i]
            cands: list[Timeline] = []
            via: set[int] = set()  # successors implied by transitivity
            for b in tls[i + 1:]:
                if b.index in via or self.relation(a, b) is None:
                    cands.append(b)
                    if self.token and not via:
                        via = reach[b.index]
            reach[a.index] = {b.index for b in cands}
            cands.sort(key=lambda b: (b.sequence_len, b.index))  # nearest successor first
            succ[a.index] = cands
        return succ

    def _agent_chains(self, tls: list[Timeline]) -> list[list[Timeline]]:
        succ = self.successors(tls)
        match_of: dict[int, Timeline] = {}  # successor index -> predecessor

        def augment(a: Timeline, seen: set[int]) -> bool:
            for b in succ[a.index]:
                if b.index in seen:
                    continue
                seen.add(b.index)
                if b.index not in match_of or augment(match_of[b.index], seen):
                    match_of[b.index] = a
                    return True
            return False

        limit = sys.getrecursionlimit()
        if len(tls) + 50 > limit:
            sys.setrecursionlimit(len(tls) + 200)
        try:
            for a in tls:
                augment(a, set())
        finally:
            sys.setrecursionlimit(limit)

        pred = {b: a for b, a in match_of.items()}
        has_succ = {a.index for a in match_of.values()}
        chains: list[list[Timeline]] = []
        for leaf in tls:
            if leaf.index in has_succ:
                continue
            members = [leaf]
            x = leaf
            while x.index in pred:
                x = pred[x.index]
                members.append(x)
            # members: leaf first. Check every member against the chain's last call directly (needed at the
            # TEXT level, where the relation is not transitive; it always holds at the TOKEN level).
            cur_leaf, cur = leaf, [leaf]
            for m in members[1:]:
                if self.token or self.relation(m, cur_leaf) is None:
                    cur.append(m)
                else:
                    chains.append(list(reversed(cur)))
                    cur_leaf, cur = m, [m]
            chains.append(list(reversed(cur)))
        return chains

    # ------------------------------------------------------------------ blocked reasons
    def blocked_reason(self, a: Timeline) -> str | None:
        later = [b for b in self.tls if b.call.agent == a.call.agent and b.index > a.index]
        if not later:
            return None
        target = a.keys + [a.reply_key]

        def common(b: Timeline) -> int:
            n = 0
            for x, y in zip(target, b.keys, strict=False):
                if x != y:
                    break
                n += 1
            return n

        best = max(later, key=lambda b: (common(b), -b.index))
        m, n = common(best), len(a.keys)
        if m == 0 and not set(target) & set(best.keys):
            return "independent"  # an unrelated conversation of the same agent
        if m < n:
            if m == len(best.keys):
                return "rewind"  # the history was cut back to before this call (a fork of the conversation)
            return "edited"  # an earlier message was changed (retry with edited context, memory rewrite, ...)
        if len(best.keys) == n:
            return "retry"  # the same context was sent again: this call's output was discarded
        if m == n:
            return "output_edited"  # the reply was resent with another content (e.g. reasoning stripped)
        reason = self.relation(a, best)
        if reason is None:
            return "duplicate"  # another call with the same output was absorbed instead
        if reason in ("temperature", "tools_changed"):
            return reason
        status = best.repair.statuses.get(n) if best.repair is not None else None
        if status == RENDER_MISMATCH:
            return "render_mismatch"  # the template renders the reply differently from what was generated
        if status == KEPT:
            return "drift_unrepaired"
        if status == UNALIGNED:
            return "drift_unrepairable"
        if best.repair is not None and not best.repair.recorded_ok or a.repair is not None and not a.repair.recorded_ok:
            return "retokenize_mismatch"
        if a.tools_key != best.tools_key:
            return "tools_changed"
        return "token_mismatch"  # the template re-rendered the shared context differently


def _naive_samples(calls: Sequence[CallRecord]) -> list[EpisodeSample]:
    samples = []
    for c in calls:
        n = len(c.prompt_ids)
        mask = [0] * n + [1] * len(c.completion_ids)
        if mask and mask[0]:
            mask[0] = 0
        samples.append(EpisodeSample(
            input_ids=list(c.prompt_ids) + list(c.completion_ids),
            loss_mask=mask,
            behaviour_logprobs=[0.0] * n + list(c.completion_logprobs),
            token_versions=[NO_VERSION] * n + c.versions,
            agent=c.agent,
            temperature=c.temperature,
            call_indices=[c.call_index],
            min_policy_version=c.policy_version,
            stats={"num_calls": 1, "merged_calls": 0, "tokens": n + len(c.completion_ids),
                   "trained_tokens": sum(mask), "drift": False, "drift_found": 0, "drift_repaired": 0,
                   "call_spans": [{"call_index": c.call_index, "gen_start": n, "gen_end": n + len(c.completion_ids),
                                   "exact_context": True, "policy_version": c.policy_version,
                                   "finish_reason": c.finish_reason, "api": c.api}]},
        ))
    return samples


def track_episode(
    calls: Sequence[CallRecord],
    tokenizer: Any = None,
    config: TrackingConfig | None = None,
) -> tuple[list[EpisodeSample], TrackingReport]:
    """Turn an episode's calls into training samples (drift repair + timeline merging) and report on it.

    Without a tokenizer: one sample per call from the recorded ids (no drift analysis, no merging)."""
    cfg = config or TrackingConfig()
    ordered = sorted(calls, key=lambda c: c.call_index)
    _validate(ordered)
    report = TrackingReport(calls=len(ordered), config={**asdict(cfg), "compare_level": cfg.compare_level.value})

    if tokenizer is None:
        samples = _naive_samples(ordered)
        for s, w in zip(samples, episode_weights(samples, cfg.weighting), strict=True):
            s.weight = w
        _finish_report(report, samples, [len(c.prompt_ids) + len(c.completion_ids) for c in ordered])
        return samples, report

    index = GenerationIndex(tokenizer)
    cache = RenderCache()
    timelines: list[Timeline] = []
    drifted: set[int] = set()
    last: dict[str, Segmentation] = {}  # per agent: its latest call's segmentation, the next one resumes from it
    for c in ordered:
        keys = [message_key(m) for m in c.messages]
        rep = repair_prompt(tokenizer, c.messages, c.tools, c.agent, index, recorded_ids=c.prompt_ids,
                            fix_drift=cfg.fix_drift, before=c.call_index, keys=keys, cache=cache,
                            resume=last.get(c.agent))
        if rep.segmentation is not None:
            last[c.agent] = rep.segmentation
        prompt = rep.ids if rep.recorded_ok else list(c.prompt_ids)
        timelines.append(Timeline(c, keys, message_key(c.response_message), tools_key(c.tools), prompt, rep))
        index.add(c, keys)
        report.drift_mismatches += rep.drift_found
        report.drift_repaired += rep.drift_repaired
        report.render_mismatches += rep.render_mismatches
        report.unaligned_regions += rep.unaligned
        report.retokenize_failures += 0 if rep.recorded_ok else 1
        drifted.update(r.generator for r in rep.regions if r.status != "exact")
    report.drifted_generations = len(drifted)

    merger = _Merger(timelines, cfg)
    chains = merger.chains() if cfg.merge else [[t] for t in timelines]
    episode_drift = report.drift_mismatches
    samples = [_chain_sample(chain, merger, cfg, episode_drift) for chain in chains]
    for s, w in zip(samples, episode_weights(samples, cfg.weighting), strict=True):
        s.weight = w

    if cfg.merge:
        reasons: Counter[str] = Counter()
        for chain in chains:
            r = merger.blocked_reason(chain[-1])
            if r is not None:
                reasons[r] += 1
        report.blocked = dict(sorted(reasons.items()))
    _finish_report(report, samples, [t.sequence_len for t in timelines])
    return samples, report


def _chain_sample(chain: list[Timeline], merger: _Merger, cfg: TrackingConfig, episode_drift: int) -> EpisodeSample:
    leaf = chain[-1]
    ids = leaf.prompt + list(leaf.call.completion_ids)
    mask = [0] * len(ids)
    lps = [0.0] * len(ids)
    versions = [NO_VERSION] * len(ids)  # each call's generated span carries its own tokens' versions
    spans = []
    for t in chain:
        out = list(t.call.completion_ids)
        start = merger.region_start(t, leaf)
        if ids[start:start + len(out)] != out:  # the relation guarantees it; never train a wrong token
            raise AssertionError(f"call {t.index}: output ids not found in the merged sequence")
        versions[start:start + len(out)] = t.call.versions
        for i, lp in enumerate(t.call.completion_logprobs):
            if start + i > 0:
                mask[start + i] = 1
                lps[start + i] = float(lp)
        spans.append({
            "call_index": t.index,
            "gen_start": start,
            "gen_end": start + len(out),
            "exact_context": ids[:start] == t.prompt,
            "prompt_repaired": t.prompt != list(t.call.prompt_ids),
            "policy_version": t.call.policy_version,
            "finish_reason": t.call.finish_reason,
            "api": t.call.api,
        })
    rep = leaf.repair
    stats: dict[str, Any] = {
        "num_calls": len(chain),
        "merged_calls": len(chain) - 1,
        "call_spans": spans,
        "tokens": len(ids),
        "trained_tokens": sum(mask),
        "drift_found": rep.drift_found if rep else 0,  # drifted regions in this sample's context
        "drift_repaired": rep.drift_repaired if rep else 0,
        "render_mismatches": rep.render_mismatches if rep else 0,
        "drift": episode_drift > 0,  # per-episode flag: some prompt of the episode had drift
        "episode_drift_found": episode_drift,
        "retokenize_mismatch": bool(rep is not None and not rep.recorded_ok),
        "compare_level": cfg.compare_level.value,
        "fix_drift": cfg.fix_drift,
    }
    if rep is not None and rep.recorded_ok:  # where earlier generations sit in the prompt, when not as generated
        stats["drift_regions"] = [{"start": r.start, "end": r.end, "status": r.status, "call_index": r.generator}
                                  for r in rep.regions if r.status != EXACT]
    if rep is not None and rep.recorded_ok and rep.message_spans is not None:
        stats["messages"] = [{"index": i, "role": role, "start": s, "end": e}
                             for i, (s, e, role) in enumerate(rep.message_spans)]
        if rep.generation_span is not None:
            stats["generation_prompt"] = list(rep.generation_span)
    return EpisodeSample(
        input_ids=ids,
        loss_mask=mask,
        behaviour_logprobs=lps,
        token_versions=versions,
        agent=leaf.call.agent,
        temperature=leaf.call.temperature,
        call_indices=[t.index for t in chain],
        min_policy_version=min(t.call.policy_version for t in chain),
        stats=stats,
    )


def _finish_report(report: TrackingReport, samples: list[EpisodeSample], per_call_lengths: list[int]) -> None:
    report.samples = len(samples)
    report.merged_calls = sum(len(s.call_indices) - 1 for s in samples)
    report.merge_rate = report.merged_calls / report.calls if report.calls else 0.0
    report.tokens_unmerged = sum(per_call_lengths)
    report.tokens_merged = sum(len(s.input_ids) for s in samples)
    report.trained_tokens = sum(sum(s.loss_mask) for s in samples)
    agents: dict[str, dict[str, int]] = {}
    for s in samples:
        a = agents.setdefault(s.agent, {"calls": 0, "samples": 0})
        a["calls"] += len(s.call_indices)
        a["samples"] += 1
    report.agents = agents


def build_samples(
    calls: list[CallRecord],
    tokenizer: Any = None,
    config: TrackingConfig | None = None,
) -> list[EpisodeSample]:
    """The episode's training samples. Without a tokenizer (or with ``merge=False``): one sample per call."""
    return track_episode(calls, tokenizer, config)[0]


__all__ = ["Timeline", "TrackingReport", "build_samples", "track_episode"]
