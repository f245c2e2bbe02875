"""`logs -f` ends with the run's real outcome: it waits for the exit code the supervisor writes after
the trainer is gone (the window in which a follow used to call a finished run lost)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from dflashctl.commands.logs import follow

pytestmark = pytest.mark.timeout(60)


def test_follow_waits_for_the_exit_code_written_after_the_trainer_is_gone(local_host):  # noqa: ANN001
    rd = local_host.workspace_dir / "runs" / "r1"
    rd.mkdir(parents=True)
    (local_host.workspace_dir / "runs" / "latest").symlink_to("r1")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a real pid, now gone: the trainer has exited; its supervisor is still reaping the group
    (rd / "pid").write_text(f"{dead.pid}\n")
    (rd / "train.log").write_bytes(b"step=4 loss=1.0\n")

    def supervisor_finishes() -> None:
        with open(rd / "train.log", "ab") as f:
            f.write(b"[dflashctl] trainer exited with code 0\n")
        (rd / "exit_code").write_text("0\n")

    timer = threading.Timer(1.5, supervisor_finishes)
    timer.start()
    try:
        with local_host.connect() as t:
            events = list(follow(t, None, interval=0.1))
    finally:
        timer.cancel()
    assert events[-1].run.exit_code == 0 and events[-1].run.verdict() == "finished"
    assert b"".join(e.data for e in events).endswith(b"[dflashctl] trainer exited with code 0\n")
