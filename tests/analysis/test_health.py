"""Verdicts and GPU findings (DESIGN §5), starting with the seed's own evidence."""

from __future__ import annotations

from pathlib import Path

from dflashctl.analysis.gpus import parse_nvidia_smi
from dflashctl.analysis.health import Evidence, GpuSweep, ProcessState, Thresholds, judge, judge_gpus
from dflashctl.analysis.logscan import scan
from dflashctl.model import GpuFinding, GpuProcess, GpuSample, Verdict

DATA = Path(__file__).parent / "data"


def seed_sweep() -> GpuSweep:
    return GpuSweep(None, parse_nvidia_smi((DATA / "seed_nvidia_smi.csv").read_text()).samples)


def test_seed_grep_output_and_gpu_rows_are_degraded_with_eight_idle_allocated_gpus() -> None:
    h = judge(Evidence(now=None, log=scan((DATA / "seed_grep.txt").read_bytes()), sweeps=[seed_sweep()]))
    assert h.verdict == Verdict.DEGRADED and h.exit_code == 105  # the same run as the full log: the same verdict
    assert [(t.name, t.state) for t in h.threads] == [("drafter-0", "crashed"), ("drafter-1", "crashed"),
                                                      ("drafter-2", "crashed")]
    assert [g.finding for g in h.gpus] == [GpuFinding.IDLE_ALLOCATED] * 8
    assert h.hits == []  # the grep threw the tracebacks away: nothing to name


def test_seed_with_its_real_tracebacks_names_compile_thread_race_and_the_remedy() -> None:
    h = judge(Evidence(now=None, log=scan((DATA / "seed_train.log").read_bytes()), sweeps=[seed_sweep()]))
    assert h.verdict == Verdict.DEGRADED and h.exit_code == 105
    assert {t.name: t.exception for t in h.threads} == {f"drafter-{i}": "RuntimeError" for i in range(3)}
    assert [x.signature.id for x in h.hits] == ["compile-thread-race"]
    assert 'compile_strategy = "warmup"' in h.hits[0].signature.remedy
    assert "Detected that you are using FX" in h.hits[0].text
    assert h.final_exception == "RuntimeError"
    assert h.progress["step"] == 3


def _gpu(i: int, mem: float, util: float | None, power: float | None = None) -> GpuSample:
    return GpuSample(index=i, memory_used_mib=mem, memory_total_mib=81559, utilization_pct=util, power_w=power)


def test_idle_allocated_needs_the_whole_window_at_zero() -> None:
    sweeps = [GpuSweep(100.0, (_gpu(0, 80000, 0), _gpu(1, 80000, 0))),
              GpuSweep(130.0, (_gpu(0, 80000, 95), _gpu(1, 80000, 0))),
              GpuSweep(150.0, (_gpu(0, 80000, 0), _gpu(1, 80000, 0)))]
    g = judge_gpus(sweeps, 150.0, run_alive=True)
    assert [x.finding for x in g] == [GpuFinding.BUSY, GpuFinding.IDLE_ALLOCATED]
    assert g[0].history == [0, 95, 0]
    # old samples fall out of the window
    g = judge_gpus(sweeps, 150.0 + 55, run_alive=True)
    assert [x.finding for x in g] == [GpuFinding.IDLE_ALLOCATED, GpuFinding.IDLE_ALLOCATED]


def test_idle_without_memory_and_unknown_utilisation() -> None:
    g = judge_gpus([GpuSweep(None, (_gpu(0, 3, 0), _gpu(1, 80000, None)))], None, run_alive=True)
    assert [x.finding for x in g] == [GpuFinding.IDLE, None]


def test_memory_held_after_the_run_died_is_orphaned() -> None:
    g = judge_gpus([GpuSweep(None, (_gpu(0, 80000, 0), _gpu(1, 10, 0)))], None, run_alive=False)
    assert [x.finding for x in g] == [GpuFinding.ORPHANED, GpuFinding.IDLE]


def test_memory_held_by_a_process_of_no_live_run_is_orphaned_while_the_run_lives() -> None:
    s0 = GpuSample(index=0, uuid="GPU-a", memory_used_mib=90000, utilization_pct=0)
    s1 = GpuSample(index=1, uuid="GPU-b", memory_used_mib=40000, utilization_pct=90)
    g = judge_gpus([GpuSweep(None, (s0, s1))], None, run_alive=True,
                   gpu_processes=[GpuProcess(91451, 90000, "GPU-a"), GpuProcess(7, 40000, "GPU-b")],
                   live_pids=frozenset({7}))
    assert [x.finding for x in g] == [GpuFinding.ORPHANED, GpuFinding.BUSY]


LOG = b"step=1 loss=3.0 tok/s=10\nstep=2 loss=2.9 tok/s=11\n"


def test_training_then_stalled_after_the_stall_window() -> None:
    busy = [GpuSweep(1000.0, (_gpu(0, 80000, 97),))]
    ev = Evidence(now=1000.0, process=ProcessState(alive=True), log=scan(LOG), sweeps=busy, last_progress_time=990.0)
    assert judge(ev).verdict == Verdict.TRAINING
    ev.last_progress_time = 1000.0 - 301
    h = judge(ev)
    assert h.verdict == Verdict.STALLED and h.exit_code == 104 and "no new step" in h.reasons[0]


def test_nccl_hang_shape_busy_at_low_power_without_progress_is_stalled() -> None:
    hang = [GpuSweep(t, (_gpu(0, 80000, 100, 95.0), _gpu(1, 80000, 100, 101.0))) for t in (950.0, 980.0, 1000.0)]
    ev = Evidence(now=1000.0, process=ProcessState(alive=True), log=scan(LOG), sweeps=hang, last_progress_time=600.0)
    h = judge(ev)
    assert h.verdict == Verdict.STALLED
    ev.sweeps = [GpuSweep(t, (_gpu(0, 80000, 100, 650.0), _gpu(1, 80000, 100, 640.0))) for t in (950.0, 1000.0)]
    ev.last_progress_time = 999.0  # busy at full power and stepping: training
    assert judge(ev).verdict == Verdict.TRAINING


def test_idle_allocated_before_the_first_step_is_starting_until_the_grace_runs_out() -> None:
    idle = [GpuSweep(1000.0, (_gpu(0, 80000, 0),))]
    ev = Evidence(now=1000.0, process=ProcessState(alive=True, started_at=900.0), log=scan(b"compiling\n"),
                  sweeps=idle)
    assert judge(ev).verdict == Verdict.STARTING
    ev.process = ProcessState(alive=True, started_at=1000.0 - Thresholds().startup_grace_s - 1)
    assert judge(ev).verdict == Verdict.STALLED


def test_an_evaluation_run_is_running_not_starting_or_stalled_however_long_it_takes() -> None:
    late = 1000.0 - Thresholds().startup_grace_s - 1
    log = scan(b"prompt tokens   new steps    tau   fwd  lossless\n")
    ev = Evidence(now=1000.0, process=ProcessState(alive=True, started_at=late, job="evaluating run 20261129-1-tiny"),
                  log=log)
    h = judge(ev)
    assert h.verdict == Verdict.TRAINING and h.reasons == [
        "evaluating run 20261129-1-tiny (not a training run: no steps to wait for)"]
    ev.process = ProcessState(alive=True, started_at=late)  # the same, as a training run: no first step, stalled
    assert judge(ev).verdict == Verdict.STALLED
    ended = ProcessState(alive=False, exit_code=1, job="evaluating run 20261129-1-tiny")  # failed: a crash
    assert judge(Evidence(now=1000.0, process=ended, log=log)).verdict == Verdict.CRASHED


def test_process_outcomes() -> None:
    log = scan(LOG)
    assert judge(Evidence(now=1.0, process=ProcessState(alive=False, exit_code=0), log=log)).verdict == Verdict.FINISHED
    assert judge(Evidence(now=1.0, process=ProcessState(alive=False, exit_code=1), log=log)).verdict == Verdict.CRASHED
    assert judge(Evidence(now=1.0, process=ProcessState(alive=False), log=log)).verdict == Verdict.LOST
    stopped = judge(Evidence(now=1.0, process=ProcessState(alive=False, exit_code=143, stopped=True), log=log))
    assert stopped.verdict == Verdict.STOPPED and stopped.exit_code == 103


def test_log_ending_in_an_uncaught_main_thread_exception_is_crashed_offline() -> None:
    log = scan(LOG + b"Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
               b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    h = judge(Evidence(now=None, log=log))
    assert h.verdict == Verdict.CRASHED and h.final_exception == "torch.OutOfMemoryError"
    assert [x.signature.id for x in h.hits] == ["cuda-oom"]


def test_error_files_are_a_second_source_of_thread_crashes() -> None:
    tb = ('Traceback (most recent call last):\n  File "/ws/code/trainer/pipeline.py", line 210, in drafter_loop\n'
          '    loss = self.step(batch)\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n')
    errors = {"drafter-1": {"thread": "drafter-1", "type": "torch.OutOfMemoryError",
                            "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "traceback": tb, "time": 5.0}}
    hb = {"time": 9.0, "step": 40, "tok_s": 1500.0, "loss": 2.5,
          "threads": [{"name": "coordinator", "state": "running", "step": 40},
                      {"name": "drafter-0", "state": "running", "step": 40},
                      {"name": "drafter-1", "state": "crashed", "step": 12}]}
    h = judge(Evidence(now=10.0, process=ProcessState(alive=True), log=scan(LOG), errors=errors, heartbeat=hb))
    assert h.verdict == Verdict.DEGRADED
    states = {t.name: (t.state, t.exception) for t in h.threads}
    assert states == {"coordinator": ("running", None), "drafter-0": ("running", None),
                      "drafter-1": ("crashed", "torch.OutOfMemoryError")}
    assert [x.signature.id for x in h.hits] == ["cuda-oom"]
    assert h.final_exception == "torch.OutOfMemoryError"


# -- the two stall shapes, told apart -------------------------------------------------------------------------------


def _alive(sweeps: list[GpuSweep], last_step: float | None, *, started_at: float | None = None) -> Evidence:
    return Evidence(now=1000.0, process=ProcessState(alive=True, started_at=started_at), log=scan(LOG), sweeps=sweeps,
                    last_progress_time=last_step)


def _sweeps(*gpus: tuple[float, float | None], times: tuple[float, ...] = (950.0, 980.0, 1000.0)) -> list[GpuSweep]:
    """The same readings at each time: one (utilisation %, power W) per GPU, every one holding 80 GB."""
    return [GpuSweep(t, tuple(_gpu(i, 80000, u, p) for i, (u, p) in enumerate(gpus))) for t in times]


def test_idle_with_memory_held_is_its_own_shape_with_its_own_remedy() -> None:
    h = judge(_alive(_sweeps((0, 70.0), (1, 72.0)), last_step=1000.0 - 61))
    assert h.verdict == Verdict.STALLED and h.stall_shape == "idle-held"
    assert [g.finding for g in h.gpus] == [GpuFinding.IDLE_ALLOCATED] * 2
    assert h.reasons == ["idle with memory held: every GPU holding memory is at ≈0 % (0-1), no new step for 61 s"]
    assert "dflashctl stacks" in h.stall_remedy and "data loader" in h.stall_remedy
    assert "NCCL" not in h.stall_remedy


def test_spinning_at_low_power_is_its_own_shape_with_its_own_remedy() -> None:
    h = judge(_alive(_sweeps((100, 95.0), (99, 101.0)), last_step=1000.0 - 301))
    assert h.verdict == Verdict.STALLED and h.exit_code == 104 and h.stall_shape == "spinning"
    assert [g.finding for g in h.gpus] == [GpuFinding.SPINNING] * 2
    assert h.reasons[0] == "no new step for 301 s (stall window 300 s)"
    assert h.reasons[1].startswith("spinning: GPU(s) 0-1 at ≈100 % utilisation at near-idle power (≤ 150 W)")
    for needle in ("every rank", "NCCL_DEBUG=INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "timeout"):
        assert needle in h.stall_remedy
    assert "data loader" not in h.stall_remedy


def test_a_step_of_unknown_age_with_spinning_gpus_is_stalled_at_once_as_before() -> None:
    h = judge(Evidence(now=None, log=scan(LOG), sweeps=[GpuSweep(None, (_gpu(0, 80000, 100, 95.0),))]))
    assert h.verdict == Verdict.STALLED and h.stall_shape == "spinning"
    assert h.reasons == ["spinning: GPU(s) 0 at ≈100 % utilisation at near-idle power (≤ 150 W): the shape of a dead "
                         "collective or a spin-wait kernel"]


def test_spinning_ranks_beside_an_idle_one_are_the_spinning_shape_and_name_both() -> None:
    h = judge(_alive(_sweeps((0, 70.0), (100, 95.0), (100, 96.0)), last_step=1000.0 - 301))
    assert [g.finding for g in h.gpus] == [GpuFinding.IDLE_ALLOCATED, GpuFinding.SPINNING, GpuFinding.SPINNING]
    assert h.verdict == Verdict.STALLED and h.stall_shape == "spinning"
    assert "GPU(s) 1-2 at ≈100 %" in h.reasons[1] and "while GPU(s) 0 sit at ≈0 % with memory held" in h.reasons[1]


def test_spinning_before_the_stall_window_is_a_finding_and_a_reason_not_yet_a_verdict() -> None:
    h = judge(_alive(_sweeps((100, 95.0)), last_step=1000.0 - 120))
    assert h.verdict == Verdict.TRAINING and h.stall_shape is None
    assert [g.finding for g in h.gpus] == [GpuFinding.SPINNING]
    assert h.reasons == ["last new step 120 s ago",
                         "GPU(s) 0 spinning: ≈100 % utilisation at near-idle power, no new step (waiting in a "
                         "collective?)"]


def test_busy_at_low_power_while_stepping_is_a_light_workload_not_a_spin() -> None:
    h = judge(_alive(_sweeps((100, 95.0)), last_step=1000.0 - 5))
    assert h.verdict == Verdict.TRAINING and h.stall_shape is None
    assert [g.finding for g in h.gpus] == [GpuFinding.BUSY] and h.reasons == ["last new step 5 s ago"]


def test_a_stall_at_full_power_has_no_shape() -> None:
    h = judge(_alive(_sweeps((100, 650.0), (98, 640.0)), last_step=1000.0 - 301))
    assert h.verdict == Verdict.STALLED and h.stall_shape is None and h.stall_remedy is None
    assert h.reasons == ["no new step for 301 s (stall window 300 s)"]


def test_spinning_before_the_first_step_is_starting_until_the_grace_runs_out() -> None:
    spin = _sweeps((100, 95.0))
    ev = Evidence(now=1000.0, process=ProcessState(alive=True, started_at=900.0), log=scan(b"init\n"), sweeps=spin)
    h = judge(ev)
    assert h.verdict == Verdict.STARTING and h.stall_shape is None and [g.finding for g in h.gpus] == [
        GpuFinding.SPINNING]
    ev.process = ProcessState(alive=True, started_at=1000.0 - Thresholds().startup_grace_s - 1)
    h = judge(ev)
    assert h.verdict == Verdict.STALLED and h.stall_shape == "spinning"
    assert h.reasons[0].startswith("no first step") and h.reasons[1].startswith("spinning: ")


def test_the_seed_scenario_stays_degraded_and_names_no_stall_shape() -> None:
    h = judge(Evidence(now=None, log=scan((DATA / "seed_train.log").read_bytes()), sweeps=[seed_sweep()]))
    assert h.verdict == Verdict.DEGRADED and h.stall_shape is None
    assert "GPU(s) 0-7 hold memory at ≈0 % utilisation" in h.reasons


def test_the_gpus_alone_of_the_seed_are_the_idle_held_shape() -> None:
    h = judge(Evidence(now=None, sweeps=[seed_sweep()]))
    assert h.verdict == Verdict.STALLED and h.stall_shape == "idle-held"
