"""The sentinel of an earlier run is a process of that run like any other: kill-zombies lists and ends it, a launch
refuses to start beside it (or ends it with --kill-zombies); the live run's sentinel is never touched.

How a sentinel outlives its run: run A's supervisor and program are SIGKILLed (a host OOM kill, a `kill -9` by
hand). A sentinel left running ends itself at the EOF on its stdin, so the test SIGSTOPs it first: it stays, as
one that hangs would, carrying A's marker. On the `local` host, a user's own program (`launch --exec`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from lifecycle.conftest import _no_run_outlives_its_test  # noqa: F401 - autouse: no run outlives its test

from .conftest import alive, gone, launch_prog, marker_of, run_dirs, sentinel_pid, wait_until, write_prog

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def lose_run_keeping_its_sentinel(cli, src: Path) -> tuple[dict, Path, int]:  # noqa: ANN001 - the cli fixture
    """Run A, lost: program and supervisor SIGKILLed, its sentinel stopped (alive, state T). (doc, dir, pid)."""
    a = launch_prog(cli, src, "--name", "a")
    rd = Path(a["run_dir"])
    sent = sentinel_pid(rd)
    supervisor = int((rd / "supervisor.pid").read_text())
    assert marker_of(supervisor) == a["run_id"] and supervisor != sent
    os.kill(sent, signal.SIGSTOP)
    wait_until(lambda: Path(f"/proc/{sent}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", timeout=30,
               what="the sentinel stopped")
    os.kill(supervisor, signal.SIGKILL)
    os.killpg(a["pid"], signal.SIGKILL)
    wait_until(lambda: gone(supervisor) and gone(a["pid"]), timeout=30, what="run A's supervisor and program gone")
    assert not (rd / "exit_code").exists()  # nothing recorded its end: lost
    wait_until(lambda: cli("runs", "--json").json()["runs"][0]["verdict"] == "lost", timeout=60,
               what="run A lost")
    assert alive(sent) and marker_of(sent) == a["run_id"]
    return a, rd, sent


def listed(cli, *flags: str) -> dict:  # noqa: ANN001
    res = cli("kill-zombies", "--json", *flags)
    assert res.code == 0, res.err
    doc = res.json()
    return {**doc, "rows": {z["pid"]: z for z in doc["zombies"]}}


def test_kill_zombies_ends_an_earlier_runs_sentinel_and_never_the_live_runs(local_host, cli, tmp_path):
    src = write_prog(tmp_path / "myproject")
    a, a_dir, a_sent = lose_run_keeping_its_sentinel(cli, src)
    ws = local_host.workspace_dir

    dry = listed(cli, "--dry-run")
    assert dry["current_run"] is None and dry["dry_run"] is True
    row = dry["rows"][a_sent]
    assert row["run_id"] == a["run_id"] and row["action"] == "kill" and "agent.pyz sentinel" in row["cmdline"]
    assert alive(a_sent)  # a dry run signals nothing

    before = run_dirs(ws)
    refused = cli("launch", "--source", str(src), "--exec", "--", "python3", "prog.py")
    assert refused.code == 2 and "process(es) of earlier runs are still alive" in refused.err
    assert "--kill-zombies" in refused.err and "Traceback" not in refused.err
    assert str(a_sent) in refused.err  # the table of what is in the way names it
    assert run_dirs(ws) == before and alive(a_sent)  # refused: nothing created, nothing signalled

    killed = listed(cli, "--yes", "--grace", "2")
    assert killed["ended"] >= 1 and killed["failed"] == 0 and killed["rows"][a_sent]["outcome"] in (
        "terminated", "killed", "defunct")
    wait_until(lambda: gone(a_sent), timeout=30, what="run A's sentinel gone")

    b = launch_prog(cli, src, "--name", "b")
    b_dir = Path(b["run_dir"])
    b_sent = sentinel_pid(b_dir)
    again = listed(cli, "--yes", "--grace", "2")
    assert again["current_run"] == b["run_id"]
    assert b_sent not in again["rows"] and b["pid"] not in again["rows"]  # the live run's processes: never listed
    assert not any(z["run_id"] == b["run_id"] for z in again["zombies"])
    assert alive(b_sent) and alive(b["pid"]) and marker_of(b_sent) == b["run_id"]
    n = len((b_dir / "events.jsonl").read_text().splitlines())
    (b_dir / "crash").touch()  # B's sentinel still watches: the crash of a worker is its next event
    wait_until(lambda: any('"worker-crashed"' in ln for ln in (b_dir / "events.jsonl").read_text().splitlines()[n:]),
               timeout=60, what="B's sentinel reporting B's crashed worker")
    assert cli("stop", b["run_id"]).code == 103
    wait_until(lambda: gone(b_sent), timeout=60, what="B's sentinel ending with its run")


def test_launch_with_kill_zombies_ends_the_earlier_runs_sentinel_and_starts_its_own(local_host, cli, tmp_path):
    src = write_prog(tmp_path / "myproject")
    a, _a_dir, a_sent = lose_run_keeping_its_sentinel(cli, src)
    res = cli("launch", "--source", str(src), "--json", "--name", "b", "--kill-zombies", "--exec", "--",
              "python3", "prog.py")
    assert res.code == 0, res.err
    b = res.json()
    assert any("ended 1 zombie process(es)" in n for n in b["notes"]), b["notes"]
    assert gone(a_sent)  # ended (and verified) before the new run started
    b_sent = sentinel_pid(Path(b["run_dir"]))
    assert alive(b_sent) and b_sent != a_sent and a["run_id"] != b["run_id"]
    assert cli("stop", b["run_id"]).code == 103
