"""PolicyState: when the sentinel stops a run on its own (idle GPUs, no new step, a dead worker), from the same
views `status` judges; each rule at its limit and not before, and at most once."""

from __future__ import annotations

from dflashctl.analysis.watchspec import IdleLimit, Policy
from dflashctl.sentinel.policy import Decision, PolicyState, limit_spelling

from .test_events import BUSY, IDLE, Run, smi, steps, thread_oom

LOW = (88283, 3)  # memory held, 3 % utilisation: below a 5 % idle limit, above health's ≈0 %
SMALL = (400, 0)  # a GPU that holds no memory worth the name (below Thresholds.allocated_mib)


def idle_policy(for_s: float = 1800.0) -> PolicyState:
    return PolicyState(Policy(idle_limit=IdleLimit(5.0, for_s)))


def test_the_idle_limit_fires_when_the_episode_reaches_its_length_and_not_before() -> None:
    run, p = Run(), idle_policy()
    assert p.decide(run.look(1000.0, steps(1, 6), gpus=smi(LOW, LOW))) is None  # the episode starts
    assert p.decide(run.look(1600.0, gpus=smi(LOW, LOW))) is None
    assert p.decide(run.look(2799.0, gpus=smi(LOW, LOW))) is None
    d = p.decide(run.look(2800.0, gpus=smi(LOW, LOW)))
    assert d == Decision("stop", "idle", "GPUs 0-1 below 5 % utilisation with memory held for 30m 0s "
                                         "(idle limit 5%@30m)")
    assert p.decide(run.look(2900.0, gpus=smi(LOW, LOW))) is None  # it acts once


def test_a_busy_gpu_starts_the_idle_episode_over() -> None:
    run, p = Run(), idle_policy()
    assert p.decide(run.look(1000.0, steps(1, 6), gpus=smi(LOW, LOW))) is None
    assert p.decide(run.look(1600.0, gpus=smi(LOW, BUSY))) is None  # GPU 1 works: not idle
    assert p.decide(run.look(2000.0, gpus=smi(LOW, LOW))) is None  # a new episode from here
    assert p.decide(run.look(2800.0, gpus=smi(LOW, LOW))) is None
    assert p.decide(run.look(3799.0, gpus=smi(LOW, LOW))) is None
    d = p.decide(run.look(3800.0, gpus=smi(LOW, LOW)))
    assert d is not None and d.reason == "idle" and "for 30m 0s" in d.detail


def test_only_gpus_holding_memory_count_for_the_idle_limit() -> None:
    run, p = Run(), idle_policy(600.0)
    assert p.decide(run.look(1000.0, steps(1, 6), gpus=smi(IDLE, SMALL))) is None
    d = p.decide(run.look(1600.0, gpus=smi(IDLE, SMALL)))
    assert d is not None and d.detail == ("GPU 0 below 5 % utilisation with memory held for 10m 0s "
                                          "(idle limit 5%@10m)")
    run, p = Run(), idle_policy(600.0)  # no GPU holds memory: nothing of the run is idling on a GPU
    assert p.decide(run.look(1000.0, gpus=smi(SMALL, SMALL))) is None
    assert p.decide(run.look(5000.0, gpus=smi(SMALL, SMALL))) is None


def test_the_next_attempt_is_judged_afresh() -> None:
    p = idle_policy(600.0)
    first = Run("r1")
    assert p.decide(first.look(1000.0, steps(1, 6), gpus=smi(IDLE))) is None
    second = Run("r2")  # the restart: its own episode, and its own one decision
    assert p.decide(second.look(1300.0, steps(1, 2), gpus=smi(IDLE))) is None
    assert p.decide(second.look(1600.0, gpus=smi(IDLE))) is None  # 600 s after r1's episode began: not r2's
    assert p.decide(second.look(1900.0, gpus=smi(IDLE))) is not None


def test_the_idle_limit_applies_only_while_the_run_is_alive() -> None:
    run, p = Run(), idle_policy(600.0)
    assert p.decide(run.look(1000.0, steps(1, 6), gpus=smi(IDLE))) is None
    assert p.decide(run.look(1700.0, gpus=smi(IDLE), alive=False, exit_code=1)) is None


def test_the_stall_limit_fires_after_that_long_without_a_new_step() -> None:
    run, p = Run(), PolicyState(Policy(stall_limit_s=600.0))
    assert p.decide(run.look(1000.0, steps(1, 6))) is None
    assert p.decide(run.look(1400.0)) is None  # stalled by health's window (300 s), below the policy's limit
    assert p.decide(run.look(1599.0)) is None
    d = p.decide(run.look(1600.0))
    assert d == Decision("stop", "stalled", "no new step for 10m 0s after step 5 (stall limit 10m)")
    assert p.decide(run.look(2000.0)) is None


def test_the_stall_limit_waits_for_a_first_step_and_never_fires_for_a_job() -> None:
    run, p = Run(), PolicyState(Policy(stall_limit_s=600.0))
    assert p.decide(run.look(1000.0, b"loading\n")) is None
    assert p.decide(run.look(5000.0)) is None  # no step yet: the start is health's business (startup grace)
    job, p = Run(kind="eval"), PolicyState(Policy(stall_limit_s=600.0))
    assert p.decide(job.look(1000.0, b"evaluating 400 prompts\n")) is None
    assert p.decide(job.look(9000.0)) is None


def test_a_crashed_worker_stops_the_run_when_the_policy_says_stop() -> None:
    run, p = Run(), PolicyState(Policy(on_worker_failure="stop"))
    assert p.decide(run.look(10.0, steps(1, 6))) is None
    d = p.decide(run.look(11.0, thread_oom("drafter-1")))
    assert d is not None and d.action == "stop" and d.reason == "worker-failure"
    assert d.detail.startswith("drafter-1 crashed (drafter-1: torch.OutOfMemoryError: CUDA out of memory.")
    assert d.detail.endswith("(on-worker-failure stop)") and "\n" not in d.detail
    assert p.decide(run.look(12.0, thread_oom("drafter-2"))) is None
    run, p = Run(), PolicyState(Policy(on_worker_failure="keep"))
    p.decide(run.look(10.0, steps(1, 6)))
    assert p.decide(run.look(11.0, thread_oom("drafter-1"))) is None


def test_the_decision_is_a_policy_event() -> None:
    run, p = Run(), PolicyState(Policy(on_worker_failure="stop"))
    p.decide(run.look(10.0, steps(1, 6)))
    view = run.look(11.0, thread_oom("drafter-1"))
    d = p.decide(view)
    assert d is not None
    ev = d.to_event(view)
    assert (ev.kind, ev.t, ev.run, ev.verdict) == ("policy", 11.0, "r1", "degraded")
    assert ev.data == {"action": "stop", "reason": "worker-failure", "detail": d.detail}
    assert ev.message == f"stop the run: {d.detail}"


def test_the_default_policy_never_acts() -> None:
    run, p = Run(), PolicyState(Policy())
    views = [run.look(1000.0, steps(1, 6), gpus=smi(IDLE, IDLE)), run.look(9000.0, gpus=smi(IDLE, IDLE)),
             run.look(9001.0, thread_oom("drafter-1"), gpus=smi(IDLE, IDLE)), run.look(20000.0, gpus=smi(IDLE))]
    assert [p.decide(v) for v in views] == [None] * 4
    assert not Policy().acts


def test_limits_are_spelled_as_the_flags_spell_them() -> None:
    assert [limit_spelling(s) for s in (1800, 5400, 90, 45, 3600)] == ["30m", "1h30m", "1m30s", "45s", "1h"]
