"""The sentinel's two small rules of issue 28: when a hang's evidence is captured (a stall, a collective that timed
out — the latter first: its dumps are written then), and which GPUs an attempt may start on (analysis/gpuexclude.py
`decide`, the launch's rule too: fixed GPUs, none left, fewer than torchrun's ranks)."""

from __future__ import annotations

from dflashctl.analysis.events import Event
from dflashctl.analysis.gpuexclude import decide, gpus_needed
from dflashctl.model import GpuAction, HealthFinding, HealthSeverity
from dflashctl.sentinel.main import hang_reason
from dflashctl.sentinel.notify import compose

from .test_events import Run, steps

GLOO_TIMEOUT = (b"RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                b"1800000ms for recv operation to complete\n")


def test_a_stall_is_a_reason_to_capture_and_a_collective_timeout_outranks_it() -> None:
    run = Run()
    assert hang_reason(run.look(10.0, steps(1, 4))) is None
    assert hang_reason(run.look(400.0)) == "stalled"  # past the default 300 s window
    assert hang_reason(run.look(401.0, GLOO_TIMEOUT)) == "collective timeout"


def _finding(gpu: int, fid: str) -> HealthFinding:
    return HealthFinding(gpu=gpu, id=fid, severity=HealthSeverity.CRITICAL, meaning="m", evidence=f"{fid}=1",
                         action=GpuAction.RESET_GPU, remedy="r")


def test_the_gpu_rule_leaves_out_refuses_when_too_few_remain_and_never_swaps_fixed_gpus() -> None:
    bad = [_finding(1, "row-remap-pending"), _finding(3, "xid-79"), _finding(2, "thermal-slowdown")]
    ex = decide((0, 1, 2), bad, need=2)
    assert ex.keep == (0, 2) and ex.refused is None and ex.visible() == "0,2"
    ex = decide((0, 1, 2), bad, need=3)
    assert ex.refused == "2 healthy GPU(s) remain (0,2), the run needs 3: left out GPU 1 (row-remap-pending: " \
                         "row-remap-pending=1)"
    assert decide((1,), bad).refused == "no healthy GPU remains: GPU 1 (row-remap-pending: row-remap-pending=1)"
    assert decide((0, 1), bad, fixed=True).refused.startswith("unhealthy GPUs the trainer is configured to use: GPU 1")
    assert decide((0, 2), bad, need=4).refused is None  # nothing left out: the run's own GPU count is its business


def test_the_ranks_a_run_needs_are_torchruns_own_option() -> None:
    assert gpus_needed(["python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "x.py"]) == 2
    assert gpus_needed(["/opt/venv/bin/torchrun", "--nproc_per_node=4", "x.py", "--nproc-per-node", "9"]) == 4
    assert gpus_needed(["python3", "train.py", "--nproc-per-node", "3"]) == 1  # the script's, not torchrun's
    assert gpus_needed(["torchrun", "--nproc-per-node", "gpu", "x.py"]) == 1


def test_a_refused_restart_is_notified_as_not_started_with_the_gpus_why() -> None:
    refused = Event(50.0, "restart", "run-1", "crashed", "attempt 2 not started: no healthy GPU remains: GPU 1 (x)",
                    {"attempt": 2, "next_run": None, "error": "no healthy GPU remains: GPU 1 (xid-79: …)"})
    assert compose([refused], "pve1")["title"] == \
        "pve1 run run-1: attempt 2 not started: no healthy GPU remains: GPU 1 (xid-79: …)"
