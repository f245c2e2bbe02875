"""A GPU re-check that never answers does not cost the restart, and leaves no nvidia-smi behind (issue 28 part 3).

After an Xid 79 nvidia-smi can hang for good. The sentinel's re-check before a restart is bounded (RECHECK_S); here
the nvidia-smi stand-in hangs until killed (its `hang` knob), so the next attempt can only start through the
re-check's timeout: no timer decides what the test sees. Every hung nvidia-smi records its pid, and none may
outlive the attempt it was read for (an orphaned one would hang on past the run). Real launch, supervisor, sentinel
and program on the local host; nvidia-smi is the only stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lifecycle.conftest import _no_run_outlives_its_test  # noqa: F401 - autouse: no run outlives its test

from .conftest import (
    cue,
    kill_tree_quietly,
    launch_rechecking,
    log_text,
    run_dirs,
    sentinel_pid,
    wait_exit_code,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROG = r'''
import os, sys, time
ctl = os.environ["DFLASH_RUN_DIR"]
print("started", flush=True)
while not os.path.exists(os.path.join(ctl, "crash")):
    time.sleep(0.05)
sys.exit(1)
'''


def _hung(folder: Path) -> dict[int, int]:
    """The stand-in's hung calls: pid -> its caller's pid."""
    return {int(p.name): int(p.read_text()) for p in folder.iterdir() if p.name.isdigit()}


def _living(pid: int) -> bool:
    """Alive and not a zombie (a killed child its parent has not reaped yet holds nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_hung_gpu_recheck_times_out_the_restart_goes_ahead_and_no_nvidia_smi_is_left(local_host, cli,
                                                                                      tmp_path) -> None:  # noqa: ANN001
    hung = tmp_path / "hung"
    hung.mkdir()
    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3}])
    src = tmp_path / "src"
    src.mkdir()
    (src / "prog.py").write_text(PROG)
    first = launch_rechecking(cli, src, "hung", "python3", "prog.py", opts=("--max-restarts", "1"))
    ws = local_host.workspace_dir
    wait_until(lambda: "started" in log_text(first), timeout=120, what="attempt 1's first line")
    sentinel = sentinel_pid(first)
    try:
        local_host.gpus.extra(hang=str(hung))  # from here every nvidia-smi call hangs until killed
        cue(first, "crash")
        second = wait_until(lambda: len(run_dirs(ws)) >= 2 and ws / "runs" / run_dirs(ws)[1], timeout=120,
                            what="attempt 2")
        wait_exit_code(first)  # attempt 1's supervisor is done: its sentinel has ended

        log = log_text(first, "sentinel.log")
        assert "GPU re-check before attempt 2 failed: no answer within 4 s" in log, log[-2000:]
        restart = json.loads((first / "restart.json").read_text())
        assert restart["attempt"] == 2 and "gpus" not in restart  # no reading: the GPUs as they were
        ours = [pid for pid, caller in _hung(hung).items() if caller == sentinel]
        assert ours, "no nvidia-smi of the sentinel hung: the re-check never met the hang"
        assert [p for p in ours if _living(p)] == [], "a hung nvidia-smi outlived the sentinel that started it"

        local_host.gpus.extra(hang=None)  # the driver answers again; attempt 2's own wait may have met the hang:
        kill_tree_quietly(*(p for p in _hung(hung) if _living(p)))  # its reading fails, the next answers
        wait_until(lambda: "started" in log_text(second), timeout=120, what="attempt 2's first line")
        cue(second, "crash")
        wait_exit_code(second)
    finally:
        kill_tree_quietly(*(p for p in _hung(hung) if _living(p)))
