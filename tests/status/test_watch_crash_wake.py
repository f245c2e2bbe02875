"""End to end over the loopback sshd + `pct` stand-in: with a redraw interval of 600 s, a thread's crash reaches
`status --watch` at all only through the probe's fine-grained log wait (agent/probe/logwait.py): the next timed
report is ten minutes away, the deadline here one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness.poll import wait_until

from status.runprog import start_in_container
from status.test_watch_e2e import Cli

DFLASHCTL = Path(sys.executable).parent / "dflashctl"
RUN_ID = "20261201-190000-wake"


@pytest.mark.slow
@pytest.mark.both_env_modes
def test_a_crash_reaches_the_watch_long_before_the_next_interval(pve) -> None:  # noqa: ANN001 - harness PveEnv
    pve.set_gpus([{"index": i, "memory.used": 47421 + i, "utilization.gpu": 0} for i in range(2)])
    run = start_in_container(pve, RUN_ID, step_s=0.05)
    wait_until(lambda: b"step=3" in (run / "train.log").read_bytes(), what="three steps in the container")
    cli = Cli("status", "--watch", "--json", "-i", "600", "--exit-on-failure")
    try:
        first = cli.next_json(timeout=60)  # the first look
        streaming = cli.next_json(timeout=60)  # the streaming probe's first report; its next timed one: 600 s on
        assert first["verdict"] == streaming["verdict"] == "training"
        (run / "crash").touch()
        crashed = cli.next_json(timeout=60)  # progress lines kept coming meanwhile: none of them woke the probe
        assert crashed["verdict"] == "degraded", crashed["verdict"]
        [t] = crashed["threads"]
        assert (t["name"], t["state"], t["exception"]) == ("drafter-0", "crashed", "RuntimeError")
        assert [s["id"] for s in crashed["signatures"]] == ["compile-thread-race"]
        assert cli.wait(timeout=60) == 105
    finally:
        cli.stop()
