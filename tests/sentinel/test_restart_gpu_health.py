"""A restart re-checks the GPUs (`launch --exclude-unhealthy-gpus`, issue 28 part 3), on the local host with the
nvidia-smi and dmesg stand-ins (the only stand-ins: the launch, supervisor, sentinel and program are real processes).

A GPU that turns unhealthy while an attempt runs (a pending row remap, then an Xid 79 in the kernel log) is left out
of the next attempt, which gets the healthy ones as CUDA_VISIBLE_DEVICES, and the restart event says which and why;
when fewer healthy GPUs remain than torchrun's ranks need, no attempt starts and an event says which GPUs and why.
Each attempt is steered by a file in its run directory (`crash`), never by a timer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lifecycle.conftest import _no_run_outlives_its_test  # noqa: F401 - autouse: no run outlives its test

from .conftest import cue, launch_rechecking, log_text, of_kind, run_dirs, wait_exit_code, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

VISIBLE = r'''
import os, sys, time
ctl = os.environ["DFLASH_RUN_DIR"]
if os.environ.get("RANK", "0") == "0":
    print("visible=" + os.environ.get("CUDA_VISIBLE_DEVICES", "-"), flush=True)
    print("step 1 loss 1.0", flush=True)
while not os.path.exists(os.path.join(ctl, "crash")):
    time.sleep(0.05)
sys.exit(1)
'''
REMAP = {"remapped_rows.pending": "Yes"}
ECC = {"ecc.errors.uncorrected.volatile.total": 2}
# GPU 2's PCI address in the nvidia-smi stand-in (00000000:1A:00.0), as the driver writes it in the kernel log
XID_79_GPU2 = "2026-12-03T10:00:00,000000+00:00 NVRM: Xid (PCI:0000:1a:00): 79, pid=4242, name=python3, " \
              "GPU has fallen off the bus."


def _deploy(cli, tmp_path: Path) -> Path:  # noqa: ANN001
    src = tmp_path / "src"
    src.mkdir()
    (src / "visible.py").write_text(VISIBLE)
    return src


def _attempts(workspace: Path) -> list[Path]:
    return [workspace / "runs" / n for n in run_dirs(workspace)]


def test_a_gpu_that_turns_unhealthy_between_attempts_is_left_out_of_the_next(local_host, cli, tmp_path,
                                                                             monkeypatch) -> None:  # noqa: ANN001
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    monkeypatch.setenv("DFLASH_FAKE_KMSG", str(kmsg))
    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3}, {"memory.used": 3}])
    src = _deploy(cli, tmp_path)
    first = launch_rechecking(cli, src, "gpus", "python3", "visible.py", opts=("--max-restarts", "2"))
    ws = local_host.workspace_dir
    wait_until(lambda: "visible=" in log_text(first), what="attempt 1's first line")
    assert "visible=-" in log_text(first)  # every GPU healthy: nothing left out, nothing set

    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3, **REMAP}, {"memory.used": 3}])
    cue(first, "crash")
    second = wait_until(lambda: len(_attempts(ws)) >= 2 and _attempts(ws)[1], timeout=120, what="attempt 2")
    wait_until(lambda: "visible=" in log_text(second), timeout=120, what="attempt 2's first line")
    assert "visible=0,2" in log_text(second)
    assert "[dflashctl] restart: left out GPU 1 (row-remap-pending" in log_text(second)
    gpus = json.loads((first / "restart.json").read_text())["gpus"]
    assert gpus["keep"] == [0, 2] and list(gpus["left_out"]) == ["1"] and gpus["visible"] == "0,2"
    (restart,) = of_kind(first, "restart")
    assert restart["next_run"] == second.name
    assert "left out GPU 1 (row-remap-pending: remapped_rows.pending=yes" in restart["message"]
    assert restart["message"].endswith("the attempt gets CUDA_VISIBLE_DEVICES=0,2")
    sentence = restart["message"][restart["message"].index("left out "):]
    assert f"[dflashctl] restart: {sentence}\n" in log_text(second)  # the log line and the event say the same
    assert json.loads((second / "meta.json").read_text())["gpus_left_out"] == {"1": gpus["left_out"]["1"]}
    launched = json.loads((second / "launch.json").read_text())["env"]
    assert launched["CUDA_VISIBLE_DEVICES"] == "0,2" and launched["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"

    kmsg.write_text(XID_79_GPU2 + "\n")  # GPU 2 falls off the bus while attempt 2 runs
    cue(second, "crash")
    third = wait_until(lambda: len(_attempts(ws)) >= 3 and _attempts(ws)[2], timeout=120, what="attempt 3")
    wait_until(lambda: "visible=" in log_text(third), timeout=120, what="attempt 3's first line")
    assert "visible=0" in log_text(third) and "visible=0," not in log_text(third)
    (restart,) = of_kind(second, "restart")
    assert "GPU 1 (row-remap-pending" in restart["message"] and "GPU 2 (xid-79" in restart["message"]
    cue(third, "crash")
    wait_exit_code(third)


def test_no_attempt_starts_when_fewer_healthy_gpus_remain_than_the_ranks_need(local_host, cli, tmp_path) -> None:  # noqa: ANN001
    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3}, {"memory.used": 3}])
    src = _deploy(cli, tmp_path)
    first = launch_rechecking(cli, src, "ranks", "python3", "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", "2", "visible.py", opts=("--env", "OMP_NUM_THREADS=1"))
    wait_until(lambda: "visible=" in log_text(first), timeout=120, what="rank 0's first line")

    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3, **REMAP}, {"memory.used": 3, **ECC}])
    cue(first, "crash")
    wait_exit_code(first, timeout=120)
    refused = wait_until(lambda: of_kind(first, "restart"), timeout=60, what="the refused restart's event")[0]
    assert refused["next_run"] is None and refused["attempt"] == 2
    assert refused["message"].startswith("attempt 2 not started: 1 healthy GPU(s) remain (0), the run needs 2: "
                                         "left out GPU 1 (row-remap-pending"), refused["message"]
    assert "GPU 2 (ecc-uncorrected: ecc.errors.uncorrected.volatile.total=2)" in refused["message"]
    assert not (first / "restart.json").exists()
    assert [p.name for p in _attempts(local_host.workspace_dir)] == [first.name]
    status = cli("status", first.name, "--json", "--events")
    assert status.code == 100, status.err  # crashed, no restart pending
    assert any(e.get("kind") == "restart" and "not started" in e.get("message", "")
               for e in status.json()["events"]), status.out[-2000:]


def test_in_a_container_the_sentinel_rechecks_the_gpus_it_sees_there(pve, cli, tmp_path) -> None:  # noqa: ANN001
    """The same over ssh + `pct exec` in a real LXC container: the sentinel, from its agent archive, reads the
    container's nvidia-smi and leaves out the GPU with an uncorrectable ECC error."""
    pve.set_gpus([{"memory.used": 3}, {"memory.used": 3}, {"memory.used": 3}])
    src = _deploy(cli, tmp_path)
    launch_rechecking(cli, src, "ctgpus", "python3", "visible.py")
    ws = pve.workspace_dir / "dflash"
    first = _attempts(ws)[0]
    wait_until(lambda: "visible=" in log_text(first), timeout=120, what="attempt 1's first line")
    pve.set_gpus([{"memory.used": 3}, {"memory.used": 3}, {"memory.used": 3, **ECC}])
    cue(first, "crash")
    second = wait_until(lambda: len(_attempts(ws)) >= 2 and _attempts(ws)[1], timeout=120, what="attempt 2")
    wait_until(lambda: "visible=" in log_text(second), timeout=120, what="attempt 2's first line")
    assert "visible=0,1" in log_text(second)
    gpus = json.loads((first / "restart.json").read_text())["gpus"]
    assert gpus["keep"] == [0, 1] and list(gpus["left_out"]) == ["2"], gpus
    cue(second, "crash")
    wait_exit_code(second)
