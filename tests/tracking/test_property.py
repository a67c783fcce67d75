"""Property test of the reproduction invariant on randomized multi-turn episodes.

Random episodes: one or two interleaved agents, random numbers of turns, tool calls (0-2 per reply) with tool
results, plain user turns, drifted generations (spelled as single characters), truncated generations
(finish_reason=length), discarded retries, forks of the history, edited last messages (retry with an edited
context), memory rewrites (system prompt replaced), tool-list changes, reasoning stripped by the client, and an
agent taking over the other agent's conversation.

Checked for every episode (``check_samples``): every sample reproduces, token for token, each call it covers:
``input_ids[:len(E(c))] == E(c)`` and the next ``len(out(c))`` ids are ``out(c)``, where ``E(c)`` is c's recorded
prompt with the ids generated earlier in the episode (same agent, same preceding messages, same text) put back
in place of their re-tokenization — computed by the test from ground truth, independently of the library — or
the recorded prompt itself with ``fix_drift=False``; the loss mask is 1 exactly on the covered outputs with
their recorded logprobs; every call is in exactly one sample. And nothing mergeable is left unmerged: the number
of samples is the minimum chain cover of the ground-truth prefix relation ``E(a) + out(a)`` prefix of ``E(b)``.
"""

from __future__ import annotations

import copy

import pytest
from episode_sim import EXTRA_TOOL, TOOLS, Sim, check_samples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentjet.tracking import TrackingConfig, episode_weights, track_episode

KINDS = ["turn", "turn", "turn", "turn", "retry", "fork", "edit", "rewrite", "tools", "share"]
OP = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 1),  # agent
    st.integers(0, 2),  # tool calls
    st.booleans(),  # drift
    st.sampled_from([None, None, None, 2, 5]),  # truncate
    st.booleans(),  # think (+ client strips it when drifting)
    st.integers(0, 1000),  # fork point
)


def run_ops(sim: Sim, ops, n_agents: int) -> None:
    states = [sim.new_agent(name) for name in "AB"[:n_agents]]
    for kind, ai, tc, drift, trunc, think, point in ops:
        s = states[ai % n_agents]
        if kind == "turn":
            sim.turn(s, tool_calls=0 if trunc else tc, drift=drift, truncate=trunc, think=think and not tc,
                     strip_think=think and drift)
        elif kind == "retry":  # a call whose output the agent discards
            sim.call(s, sim.reply(tool_calls=tc), drift=drift)
        elif kind == "fork":
            cuts = [k for k in range(2, len(s.messages) + 1) if s.messages[k - 1]["role"] != "assistant"]
            k = cuts[point % len(cuts)]
            s.messages, s.origins = s.messages[:k], s.origins[:k]
        elif kind == "edit":
            last = s.messages[-1]
            s.messages[-1] = {**last, "content": last["content"] + f" (edited {sim.unique()})"}
        elif kind == "rewrite":
            s.messages[0] = {"role": "system", "content": f"memory {sim.unique()}: be short"}
            s.origins = [None] * len(s.origins)
        elif kind == "tools":
            s.tools = copy.deepcopy(TOOLS) if len(s.tools or []) > 2 else (s.tools or []) + [EXTRA_TOOL]
        elif kind == "share" and n_agents == 2:
            other = states[1 - ai % 2]
            other.messages, other.origins = copy.deepcopy(s.messages), list(s.origins)  # origins keep their agent


def min_chain_cover(sim: Sim, fix_drift: bool) -> int:
    """n - maximum matching of the ground-truth prefix relation (Kuhn's algorithm)."""
    calls = sim.calls
    seqs = [sim.expected_prompt(c, fix_drift) for c in calls]
    succ = {
        a.call_index: [b.call_index for b in calls
                       if b.agent == a.agent and b.call_index > a.call_index and b.temperature == a.temperature
                       and seqs[b.call_index][:len(seqs[a.call_index]) + len(a.completion_ids)]
                       == seqs[a.call_index] + a.completion_ids]
        for a in calls
    }
    match: dict[int, int] = {}

    def augment(a: int, seen: set[int]) -> bool:
        for b in succ[a]:
            if b not in seen:
                seen.add(b)
                if b not in match or augment(match[b], seen):
                    match[b] = a
                    return True
        return False

    return len(calls) - sum(augment(c.call_index, set()) for c in calls)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=st.lists(OP, min_size=1, max_size=10), n_agents=st.integers(1, 2), fix=st.booleans(),
       template=st.sampled_from(["chatml", "llama3"]))
def test_reproduction_invariant(toks, ops, n_agents, fix, template):
    tok = toks[template]
    sim = Sim(tok, template)
    run_ops(sim, ops, n_agents)

    samples, report = track_episode(sim.calls, tok, TrackingConfig(fix_drift=fix))
    check_samples(sim, samples, fix_drift=fix)
    assert len(samples) == min_chain_cover(sim, fix)  # no merge missed, none made wrongly
    assert report.samples == len(samples) and report.merged_calls == len(sim.calls) - len(samples)
    assert report.trained_tokens == sum(len(c.completion_ids) for c in sim.calls)
    if samples:
        assert sum(s.weight * sum(s.loss_mask) for s in samples) == pytest.approx(1.0)
    assert [s.weight for s in samples] == episode_weights(samples)

    unmerged = track_episode(sim.calls, tok, TrackingConfig(fix_drift=fix, merge=False))[0]
    check_samples(sim, unmerged, fix_drift=fix)
    assert len(unmerged) == len(sim.calls)

    text, _ = track_episode(sim.calls, tok, TrackingConfig(fix_drift=fix, compare_level="text"))
    check_samples(sim, text, fix_drift=fix, exact_context=False)
    for s in text:  # at the text level a call's context may differ from its own prompt only by the tools
        for sp in s.stats["call_spans"]:
            c = sim.calls[sp["call_index"]]
            if not sp["exact_context"]:
                assert c.tools != sim.calls[s.call_indices[-1]].tools
