"""A trainer group of gloo ranks on CPU against the single-process trainer (tiny model).

Tolerances (conftest): weights within 5e-5 absolute after the steps (one AdamW step moves them by ~1e-3),
losses within 1e-4 relative. Each test also checks that the tolerance separates "the same steps" from "one
step more or less", so it can fail.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from tests.distributed.conftest import LOSS, LOSS_RTOL, WEIGHT_ATOL, max_weight_diff, train_config

from agentjet.distributed import (
    GroupState,
    LearnerGroupSettings,
    RankFailure,
    TrainerGroup,
    TrainerGroupError,
)
from agentjet.runtime.blocking import run_blocking

pytestmark = pytest.mark.timeout(300)


def settings(procs: int, work_dir: Path, **kw) -> LearnerGroupSettings:
    return LearnerGroupSettings(procs=procs, work_dir=work_dir, export_dir=work_dir / "export",
                                startup_timeout_s=120, step_timeout_s=60, push_timeout_s=60,
                                collective_timeout_s=10, shutdown_timeout_s=20, **kw)


@pytest.fixture(scope="module")
def group2(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two ranks, shared by the tests of this module; each test starts from the saved initial state."""
    work = tmp_path_factory.mktemp("group2")
    group = TrainerGroup(tiny_model_path, settings(2, work), train_config())
    group.start()
    init = group.save(work / "init")
    group.initial_checkpoint = init  # type: ignore[attr-defined]
    yield group
    group.close()
    assert group.exit_codes[-1] == 0, f"the last generation exited with {group.exit_codes}"


def fresh(group: TrainerGroup) -> TrainerGroup:
    group.load(group.initial_checkpoint)  # type: ignore[attr-defined]
    assert group.policy_version == 0
    return group


def test_two_ranks_match_the_single_process_trainer(group2, batches, reference) -> None:
    group = fresh(group2)
    steps = batches[:3]
    ref_metrics, ref_state = reference(steps)
    for i, batch in enumerate(steps):
        m = group.train_step(batch)
        r = ref_metrics[i]
        assert m["micro_batches"] >= 2 and m["ranks"] == 2
        assert m["trained_tokens"] == r["trained_tokens"] and m["samples"] == r["samples"]
        assert m["kl"] > 0 or i == 0
        for key in ("loss", "pg_loss", "kl", "grad_norm", "mean_abs_logprob_diff"):
            assert m[key] == pytest.approx(r[key], rel=LOSS_RTOL), key
        assert m["clip_frac"] == pytest.approx(r["clip_frac"], abs=1e-9)
        # every sample's trainer logprobs come back from the rank that trained it, in the batch's order
        assert len(m.trainer_logprobs) == len(batch)
        for got, want, s in zip(m.trainer_logprobs, r.trainer_logprobs, batch, strict=True):
            assert len(got) == s.num_trained_tokens
            assert max(abs(x - y) for x, y in zip(got, want, strict=True)) < 1e-4
    assert group.policy_version == 3
    scored = group.score(batches[4][:3])  # a probe's scoring, split across the ranks, no update
    assert [len(x) for x in scored] == [s.num_trained_tokens for s in batches[4][:3]]
    assert group.policy_version == 3
    diff = max_weight_diff(group.latest_weights, ref_state)
    assert diff < WEIGHT_ATOL
    _, two_steps = reference(steps[:2])  # the tolerance tells 3 steps from 2
    assert max_weight_diff(group.latest_weights, two_steps) > 10 * WEIGHT_ATOL


def test_two_ranks_match_the_single_process_trainer_under_every_sequence_level_choice(group2, batches,
                                                                                     reference) -> None:
    """GSPO's sequence ratio, CISPO, GRPO's sequence mean and masked IS per sequence need a sequence's tokens
    together and a normaliser over the whole batch: split across 2 ranks and several micro-batches, the step is
    still the single-process one."""
    from agentjet.settings import LossSettings

    loss = LossSettings(kl_coef=0.05, objective="cispo", ratio_level="sequence", aggregation="seq_mean",
                        correction="mask_sequence", correction_low=0.98, correction_high=1.02,
                        clip_eps_low=0.01, clip_eps_high=0.01)
    group = fresh(group2)
    group.set_loss(loss)
    try:
        ref_metrics, ref_state = reference(batches[:2], loss)
        for batch, r in zip(batches[:2], ref_metrics, strict=True):
            m = group.train_step(batch)
            assert m["micro_batches"] >= 2
            for key in ("loss", "pg_loss", "kl", "grad_norm", "is_masked_frac"):
                assert m[key] == pytest.approx(r[key], rel=LOSS_RTOL, abs=1e-9), key
        assert 0 < r["is_masked_frac"] < 1  # some sequences dropped, some kept: the mask took part
        assert max_weight_diff(group.latest_weights, ref_state) < WEIGHT_ATOL
    finally:
        group.set_loss(LOSS)


def test_resume_reshards_two_ranks_to_one_and_back(group2, batches, reference, tiny_model_path, tmp_path) -> None:
    group = fresh(group2)
    group.train_step(batches[0])
    group.train_step(batches[1])
    ckpt2 = group.save(tmp_path / "from-2-ranks")

    one_rank = settings(1, tmp_path / "one", gradient_checkpointing=True)  # recomputation changes nothing
    with TrainerGroup(tiny_model_path, one_rank, train_config()) as one:
        one.load(ckpt2)  # before start: the ranks restore it while starting
        one.start()
        assert one.policy_version == 2
        m = one.train_step(batches[2])
        ref_metrics, ref_state = reference(batches[:3])
        assert m["loss"] == pytest.approx(ref_metrics[2]["loss"], rel=LOSS_RTOL)
        assert max_weight_diff(one.latest_weights, ref_state) < WEIGHT_ATOL
        ckpt1 = one.save(tmp_path / "from-1-rank")
    assert one.exit_codes == [0]  # a clean exit of every rank

    group.load(ckpt1)  # a running group loads (and reshards) in place
    assert group.policy_version == 3
    assert not any(group.recovery_dir.iterdir())  # the checkpoint is the recovery point now
    m = group.train_step(batches[3])
    assert len(list(group.recovery_dir.iterdir())) == 1
    ref_metrics, ref_state = reference(batches[:4])
    assert m["loss"] == pytest.approx(ref_metrics[3]["loss"], rel=LOSS_RTOL)
    assert group.policy_version == 4
    assert max_weight_diff(group.latest_weights, ref_state) < WEIGHT_ATOL


def _step_in_thread(group: TrainerGroup, batch) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["metrics"] = group.train_step(batch)
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_rank_killed_mid_step_restarts_the_group_and_no_batch_counts_twice(group2, batches, reference) -> None:
    group = fresh(group2)
    faults = group.counters["faults"]
    group.train_step(batches[0])
    _, _, pid = group.rank_processes[1]
    os.kill(pid, signal.SIGSTOP)  # rank 1 freezes; the step below reaches rank 0, which waits in a collective
    thread, out = _step_in_thread(group, batches[1])
    thread.join(timeout=1.0)
    os.kill(pid, signal.SIGKILL)  # ... and rank 1 dies in the middle of it
    thread.join(timeout=200)
    assert not thread.is_alive()
    err = out.get("error")
    assert isinstance(err, RankFailure), out
    assert "rank 1" in str(err) and err.restarted
    assert group.exit_codes[-1] != 0  # the killed generation
    assert group.state is GroupState.READY and group.counters["faults"] == faults + 1
    assert group.policy_version == 1  # the failed step was not applied

    # the caller kept batch 1 pending and trains it again: each batch is applied exactly once
    group.train_step(batches[1])
    group.train_step(batches[2])
    _, ref_state = reference(batches[:3])
    assert max_weight_diff(group.latest_weights, ref_state) < WEIGHT_ATOL
    _, twice = reference([batches[0], batches[1], batches[1], batches[2]])
    assert max_weight_diff(group.latest_weights, twice) > 10 * WEIGHT_ATOL


def test_a_hung_rank_fails_the_step_by_the_collective_timeout(group2, batches, reference) -> None:
    group = fresh(group2)
    group.train_step(batches[0])
    _, _, pid = group.rank_processes[1]
    os.kill(pid, signal.SIGSTOP)  # hangs without dying: rank 0 waits until its collective timeout (10 s)
    try:
        thread, out = _step_in_thread(group, batches[1])
        thread.join(timeout=200)
    finally:
        if any(p == pid for _, _, p in group.rank_processes):
            os.kill(pid, signal.SIGKILL)
    err = out.get("error")
    assert isinstance(err, TrainerGroupError), out
    assert err.restarted and group.policy_version == 1
    group.train_step(batches[1])
    _, ref_state = reference(batches[:2])
    assert max_weight_diff(group.latest_weights, ref_state) < WEIGHT_ATOL


def test_bad_batches_are_refused_before_reaching_the_ranks(group2, batches) -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        group2.train_step([])
    empty = [type(s)(s.input_ids, [0] * len(s.input_ids), s.behaviour_logprobs, s.advantages) for s in batches[0]]
    with pytest.raises(ValueError, match="no trained tokens"):
        group2.train_step(empty)
    assert group2.state is GroupState.READY


def test_a_single_process_checkpoint_starts_a_group_with_fresh_optimizer(tiny_model_path, batches, tmp_path) -> None:
    from tests.distributed.conftest import plain_engine


    plain = plain_engine(tiny_model_path)
    run_blocking(plain.train_step(batches[0]))
    plain.save(tmp_path / "plain")  # Hugging Face weights + optimizer.pt + policy version
    with TrainerGroup(tiny_model_path, settings(1, tmp_path / "one"), train_config()) as group:
        group.load_hf_weights(tmp_path / "plain", policy_version=1)
        m = group.train_step(batches[1])
        assert group.policy_version == 2
        # the reference: the saved weights, a fresh optimizer, and the KL reference taken from those weights
        again = plain_engine(tmp_path / "plain")
        r = run_blocking(again.train_step(batches[1]))
        assert m["loss"] == pytest.approx(r["loss"], rel=LOSS_RTOL)
        state = {k: v.detach() for k, v in again.generator.model.state_dict().items()}
        assert max_weight_diff(group.latest_weights, state) < WEIGHT_ATOL
