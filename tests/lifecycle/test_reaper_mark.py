"""The reaper's `mark` (a run across hosts marks every node stopped before any is signalled): the marker is
written only on a run whose pid is alive and carries the run's marker; nothing is signalled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.agentpyz import archive_path, spec_stdin

from dflashctl.remote.agentcall import parse_replies


def mark(run_dir: Path, run_id: str) -> dict:
    done = subprocess.run([sys.executable, archive_path(), "mark"], input=spec_stdin({"run_dir": str(run_dir),
                          "run_id": run_id}), capture_output=True, timeout=60, check=True)
    return parse_replies(done.stdout)[-1]


def sleeper(run_id: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "DFLASH_RUN_ID"}
    if run_id is not None:
        env["DFLASH_RUN_ID"] = run_id
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)


def test_a_live_run_of_ours_is_marked_stopped_and_keeps_running(tmp_path: Path) -> None:
    proc = sleeper("run-a")
    try:
        (tmp_path / "pid").write_text(f"{proc.pid}\n")
        assert mark(tmp_path, "run-a") == {"marked": True, "pid": proc.pid}
        doc = json.loads((tmp_path / "stopped").read_text())
        assert (doc["by"], doc["pid"]) == ("dflashctl stop", proc.pid)
        assert proc.poll() is None  # marked, not signalled
    finally:
        proc.kill()
        proc.wait()


def test_a_process_without_the_runs_marker_or_an_ended_run_is_not_marked(tmp_path: Path) -> None:
    other = sleeper("another-run")
    try:
        (tmp_path / "pid").write_text(f"{other.pid}\n")
        assert mark(tmp_path, "run-a")["marked"] is False
    finally:
        other.kill()
        other.wait()
    assert mark(tmp_path, "another-run")["marked"] is False  # its pid is gone now
    (tmp_path / "pid").unlink()
    assert mark(tmp_path, "run-a") == {"marked": False, "pid": None}
    assert not (tmp_path / "stopped").exists()
