"""End to end over the loopback sshd + `pct` stand-in: `status --watch` sees a thread die, survives a
dropped connection, and `--exit-on-failure` exits 105 naming the thread and its exception."""

from __future__ import annotations

import json
import os
import pty
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from harness.poll import wait_until

from status.runprog import start_in_container

DFLASHCTL = Path(sys.executable).parent / "dflashctl"
RUN_ID = "20261129-101500-watch"


class Cli:
    """The installed console script as a real process; stdout lines arrive on a queue as written."""

    def __init__(self, *args: str, tty: bool = False):
        """tty: stdout is a pseudo-terminal, as for a person watching: every redraw of the live view arrives (on a
        pipe, rich prints only the final view)."""
        master = None
        if tty:
            master, slave = pty.openpty()
        self.proc = subprocess.Popen([str(DFLASHCTL), *args], stdout=slave if tty else subprocess.PIPE,
                                     stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200", "LINES": "60"})
        if tty:
            os.close(slave)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._pump, args=(master,), daemon=True).start()

    def _pump(self, master: int | None) -> None:
        if master is not None:
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the program closed the terminal
                    break
                if not chunk:
                    break
                self.out.append(chunk.decode("utf-8", "replace"))
            os.close(master)
            return
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self.out.append(line)
            self.lines.put(line)

    def next_json(self, timeout: float = 30) -> dict:
        while True:
            line = self.lines.get(timeout=timeout)
            if line.startswith("{"):
                return json.loads(line)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def run_dir(pve) -> Path:  # noqa: ANN001 - harness PveEnv
    pve.set_gpus([{"index": i, "memory.used": 47421 + i, "utilization.gpu": 0} for i in range(3)])
    run = start_in_container(pve, RUN_ID, step_s=0.2)
    wait_until(lambda: b"step=3" in (run / "train.log").read_bytes(), what="three steps in the container")
    return run


@pytest.mark.slow
def test_watch_survives_a_dropped_connection_then_exits_105_on_the_crash(run_dir: Path, sshd_server) -> None:  # noqa: ANN001
    cli = Cli("status", "--watch", "--json", "-i", "0.5", "--exit-on-failure")
    try:
        first = cli.next_json()
        assert first["verdict"] == "training" and first["run"]["id"] == RUN_ID
        cli.next_json()  # the streaming probe is up
        sshd_server.drop_connections()
        recs = [cli.next_json()]
        while recs[-1]["reconnecting"] is None:
            recs.append(cli.next_json())
            assert len(recs) < 20, "no reconnecting record after the drop"
        assert "connection" in recs[-1]["reconnecting"] or "ended" in recs[-1]["reconnecting"]
        while recs[-1]["reconnecting"] is not None:
            recs.append(cli.next_json())
        resumed = recs[-1]
        assert resumed["verdict"] == "training" and resumed["progress"]["step"] > first["progress"]["step"]
        (run_dir / "crash").touch()
        last = resumed
        while cli.proc.poll() is None or not cli.lines.empty():
            try:
                last = cli.next_json(timeout=30)
            except queue.Empty:
                break
            if last["verdict"] != "training":
                break
        assert cli.wait() == 105
        assert last["verdict"] == "degraded" and last["exit_code"] == 105
        [t] = last["threads"]
        assert (t["name"], t["state"], t["exception"]) == ("drafter-0", "crashed", "RuntimeError")
        assert [s["id"] for s in last["signatures"]] == ["compile-thread-race"]
        # after the reconnect the log was resumed from its offset, not re-read: every byte scanned once
        assert last["log"]["bytes_scanned"] == last["log"]["offset"] > resumed["log"]["offset"] > first["log"]["offset"]
        assert [g["finding"] for g in last["gpus"]] == ["idle-allocated"] * 3
    finally:
        cli.stop()


@pytest.mark.slow
def test_watch_table_exits_105_naming_thread_and_exception(run_dir: Path) -> None:
    cli = Cli("status", "--watch", "-i", "0.5", "--exit-on-failure", tty=True)
    try:
        # the crash comes only once the watch has drawn the run as training: what follows is live detection
        wait_until(lambda: "TRAINING" in "".join(cli.out), 60, what="a frame showing the run training")
        drawn = len(cli.out)
        (run_dir / "crash").touch()
        code = cli.wait(timeout=60)
        out = "".join(cli.out)
        assert "DEGRADED" in "".join(cli.out[drawn:]), "the crash must be seen by the running watch"
        assert code == 105, (out, cli.proc.stderr.read().decode() if cli.proc.stderr else "")
        for needle in ("DEGRADED", "drafter-0", "crashed", "RuntimeError", "Detected that you are using FX",
                       "compile-thread-race", 'compile_strategy = "warmup"'):
            assert needle in out, needle
    finally:
        cli.stop()
