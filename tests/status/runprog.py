"""A run directory (DESIGN §4) with a real, detached Python program as the "trainer".

The program (stdlib only, so it runs in the container too) prints the trainer's progress line every
`STEP_S`, and when the file `<run>/crash` appears, a worker thread raises a real exception (after
recording, in `<run>/crash.t`, the time just before the traceback is written). The process stays
alive afterwards, as in the seed: the run is degraded, not crashed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROGRAM = r'''
import os, sys, threading, time
run_dir = sys.argv[1]
step_s = float(sys.argv[2])
sys.stderr = sys.stdout

def drafter(name):
    while not os.path.exists(os.path.join(run_dir, "crash")):
        time.sleep(0.02)
    def compile_block():
        raise RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized function. "
                           "This is not supported at the moment.")
    with open(os.path.join(run_dir, "crash.t"), "w") as f:
        f.write(repr(time.time()))
    compile_block()

for i in range(2):
    threading.Thread(target=drafter, args=("drafter-%d" % i,), name="drafter-%d" % i, daemon=True).start()
    break  # one drafter crashes; the coordinator goes on (degraded)
step = 0
while True:
    step += 1
    print("step=%d loss=%.4f tok/s=1834.2 lr=3.00e-04 acc=0.123 acc_len=2.50" % (step, 4.0 / step), flush=True)
    time.sleep(step_s)
'''


def new_run_dir(workspace: Path, run_id: str) -> Path:
    run = workspace / "runs" / run_id
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"id": run_id, "name": "status-test", "host": "test",
                                               "started_at_epoch": time.time(), "gpus": []}))
    latest = workspace / "runs" / "latest"
    if latest.is_symlink():
        latest.unlink()
    latest.symlink_to(run_id)
    return run


def start_local(workspace: Path, run_id: str, step_s: float = 0.2) -> tuple[Path, subprocess.Popen]:
    """Start the program detached on this machine, as `launch` would: own session, log = train.log."""
    run = new_run_dir(workspace, run_id)
    (run / "prog.py").write_text(PROGRAM)
    with (run / "train.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, str(run / "prog.py"), str(run), str(step_s)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "DFLASH_RUN_ID": run_id, "DFLASH_RUN_DIR": str(run)})
    (run / "pid").write_text(f"{proc.pid}\n")
    return run, proc


def start_in_container(pve, run_id: str, step_s: float = 0.2) -> Path:  # noqa: ANN001 - harness PveEnv
    """Start the program detached inside the pve container (setsid, stdio to train.log, marker env)."""
    ws = pve.workspace_dir / "dflash"
    run = new_run_dir(ws, run_id)
    (run / "prog.py").write_text(PROGRAM)
    inside = f"/workspace/dflash/runs/{run_id}"
    script = (f"cd {inside} && DFLASH_RUN_ID={run_id} DFLASH_RUN_DIR={inside} setsid python3 prog.py {inside} {step_s} "
              f"</dev/null >train.log 2>&1 & echo $! > {inside}/pid")
    res = pve.exec(["sh", "-c", script])
    assert res.returncode == 0, res
    deadline = time.monotonic() + 10
    while not (run / "pid").exists() or not (run / "pid").read_text().strip():
        assert time.monotonic() < deadline, "pid file never appeared"
        time.sleep(0.05)
    return run


