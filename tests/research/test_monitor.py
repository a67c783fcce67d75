"""Watching a run: eval points become final only when the policy has moved on; health rules on a fake clock."""

from __future__ import annotations

import math

from agentjet.apps.research.monitor import (
    Health,
    Limits,
    TrialResult,
    Watch,
    eval_points,
    judge,
    parse_status,
    read_eval_record,
    result_points,
)
from agentjet.apps.research.spec import MetricSource
from agentjet.client.driver import EvalPoint
from agentjet.protocol import BufferCounts, ServerStatus

LIMITS = Limits(start_timeout_s=60, stall_s=120, run_timeout_s=1000)


def status(version: int = 0, steps: int = 0, evals: dict[str, float] | None = None, trained: int = 0,
           loss: float | None = None) -> ServerStatus:
    buffer = BufferCounts(open_episodes=0, pending_episodes=0, trained_episodes=trained, dropped_stale_episodes=0,
                          dropped_uniform_episodes=0, expired_episodes=0, aborted_episodes=0, eval_episodes=0)
    metrics = {"loss": loss, "reward_mean": 0.4} if loss is not None else {}
    return ServerStatus(model="m", engine="NullEngine", engine_state="ready", policy_version=version, train_steps=steps,
                        buffer=buffer, clients=[], throughput={}, eval_reward=evals or {}, last_train_metrics=metrics,
                        config={})


def test_an_eval_point_is_final_once_the_policy_moved_past_it() -> None:
    st = status(version=2, steps=2, evals={"0": 0.3, "2": 0.5})
    assert eval_points(st, MetricSource.EVAL_REWARD) == {0: 0.3}  # v2's eval may still be running
    assert eval_points(st, MetricSource.EVAL_REWARD, final=True) == {0: 0.3, 2: 0.5}
    assert eval_points(status(version=3, steps=3, loss=0.1), MetricSource.TRAIN_REWARD) == {3: 0.4}


def test_result_points_prefer_the_servers_final_status() -> None:
    final = status(version=4, steps=4, evals={"0": 0.2, "4": 0.7}).model_dump()
    assert result_points(TrialResult(stop_reason="x", final_status=final), MetricSource.EVAL_REWARD) == {0: 0.2, 4: 0.7}
    broken = TrialResult(stop_reason="x", final_status={"nonsense": 1},
                         evals=[{"policy_version": 3, "train_steps": 3, "reward": 0.6, "episodes": 4, "failed": 0,
                                 "seconds": 1.0}])
    assert result_points(broken, MetricSource.EVAL_REWARD) == {3: 0.6}


def test_an_eval_record_is_the_drivers_eval_point_and_reads_the_older_records() -> None:
    old = read_eval_record({"policy_version": 3, "train_steps": 3, "reward": 0.6, "episodes": 4, "failed": 1,
                                     "seconds": 2.5})  # before the driver: seconds was the eval's duration
    assert (old.episodes, old.failed, old.eval_seconds, old.seconds, old.train_seconds) == (3, 1, 2.5, 0.0, 0.0)
    point = EvalPoint(train_steps=4, policy_version=4, reward=float("nan"), episodes=0, failed=2, train_seconds=30.0,
                      seconds=45.0, eval_seconds=3.0)
    result = TrialResult(stop_reason="x", evals=[point])
    again = TrialResult.model_validate_json(result.model_dump_json())
    assert again.evals[0].model_dump(exclude={"reward"}) == point.model_dump(exclude={"reward"})
    assert math.isnan(again.evals[0].reward)  # an eval whose episodes all failed survives result.json


def test_start_timeout_then_running_then_stalled_on_a_fake_clock() -> None:
    w = Watch(started=1000.0)
    assert judge(w, True, None, 1030.0, LIMITS) is Health.STARTING
    assert judge(w, True, None, 1061.0, LIMITS) is Health.START_TIMEOUT
    w = Watch(started=1000.0)
    w.observe(status(trained=0), 1010.0)
    assert judge(w, True, None, 1100.0, LIMITS) is Health.RUNNING
    w.observe(status(trained=0), 1100.0)  # the same counters: no progress
    assert judge(w, True, None, 1129.0, LIMITS) is Health.RUNNING
    assert judge(w, True, None, 1131.0, LIMITS) is Health.STALLED
    w.observe(status(trained=8, steps=1, version=1, loss=0.1), 1131.0)  # progress resets the stall clock
    assert judge(w, True, None, 1200.0, LIMITS) is Health.RUNNING
    assert judge(w, True, None, 2001.0, LIMITS) is Health.TIMED_OUT


def test_finished_crashed_and_nan_loss() -> None:
    w = Watch(started=0.0)
    w.observe(status(), 1.0)
    assert judge(w, True, TrialResult(stop_reason="steps reached"), 2.0, LIMITS) is Health.FINISHED
    assert judge(w, False, TrialResult(ok=False, stop_reason="boom"), 2.0, LIMITS) is Health.CRASHED
    assert judge(w, False, None, 2.0, LIMITS) is Health.CRASHED
    w.observe(status(steps=1, version=1, trained=8, loss=float("nan")), 3.0)
    assert judge(w, True, None, 4.0, LIMITS) is Health.NAN_LOSS
    assert Health.STALLED.retryable and Health.CRASHED.retryable and not Health.NAN_LOSS.retryable



def test_a_nan_loss_sent_as_null_is_read_as_nan_and_wins_over_a_crash() -> None:
    data = status(version=1, steps=1, trained=8, loss=0.1).model_dump(mode="json")
    data["last_train_metrics"]["loss"] = None  # how the server writes NaN: JSON has no NaN
    st = parse_status(data)
    w = Watch(started=0.0)
    w.observe(st, 1.0)
    assert judge(w, False, None, 2.0, LIMITS) is Health.NAN_LOSS  # the client died of it; the cause is NaN
