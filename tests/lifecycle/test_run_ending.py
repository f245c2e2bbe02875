"""A run that is ending is alive, not lost: between the trainer's exit and the `exit_code` its supervisor
writes (after it has reaped the rest of the trainer's process group, up to its grace period) every one-shot
reader (`status`, `runs`, `kill-zombies`, a new `launch`) must see a live run.

The window is held open deterministically: the supervisor is SIGSTOPped before the trainer is told to
finish, so the trainer exits (defunct, unreaped) and its child, which ignores SIGTERM, lingers until the
supervisor is continued. Nothing here waits a fixed time; everything polls files or /proc.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflashctl.agent.lib.runstate import list_runs, run_state
from dflashctl.agent.lib.runstate import live_latest as _live_latest
from dflashctl.analysis.health import Evidence, ProcessState, judge
from dflashctl.analysis.logscan import scan
from dflashctl.commands import stop as stop_command
from dflashctl.model import Verdict
from dflashctl.remote.probe import probe_doc

from .conftest import FAKE_TRAINER, alive, kill_quietly, marker_of, proc_state, wait_until, write_config

pytestmark = pytest.mark.timeout(60)


def group_members(pgid: int) -> list[int]:
    """Live (not defunct) pids whose process group is pgid."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            rest = text[text.rfind(")") + 2:].split()
            if int(rest[2]) == pgid and rest[0] not in ("Z", "X"):
                out.append(int(name))
    return out


def unique(prefix: str) -> str:
    """A run id no concurrent test session uses (their safety nets end processes by run id)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def ppid_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process frozen (SIGSTOP) for the block; continued whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: proc_state(pid) == "T", what=f"pid {pid} stopped")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)


def launch_lingering(cli, tmp_path: Path, name: str) -> tuple[str, int, int, Path, Path]:
    """A run whose trainer ends (exit 0) once `release` exists and whose child ignores SIGTERM, so its
    supervisor has a group to reap. Returns (run id, trainer pid, supervisor pid, release file, config)."""
    release = tmp_path / "finish-now"
    cfg = write_config(tmp_path / "linger.toml", mode="ignore-term", children=1, step_s=0.05,
                       stop_file=str(release))
    launched = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", unique(name),
                   "--wait-for", "step", "--json")
    assert launched.code == 0, launched.err
    run_id, pid = launched.json()["run_id"], launched.json()["pid"]
    return run_id, pid, ppid_of(pid), release, cfg


def test_one_shot_readers_see_an_ending_run_alive_until_its_exit_code_is_written(local_host, cli, tmp_path):
    run_id, pid, supervisor, release, cfg = launch_lingering(cli, tmp_path, "linger")
    rd = local_host.workspace_dir / "runs" / run_id
    assert marker_of(supervisor) == run_id
    wait_until(lambda: len(group_members(pid)) == 2, what="the trainer and its child in one group")
    (child,) = [p for p in group_members(pid) if p != pid]

    with stopped(supervisor):
        release.touch()
        wait_until(lambda: proc_state(pid) == "Z", what="the trainer exited (unreaped: its supervisor is frozen)")
        assert alive(child) and not (rd / "exit_code").exists()  # the window: trainer gone, group not yet reaped

        status = cli("status", "--json")
        doc = status.json()
        assert status.code != 100 and doc["verdict"] != "lost", doc["reasons"]
        assert doc["run"]["alive"] is True and doc["run"]["exit_code"] is None and doc["run"]["ending"] is True
        assert any("supervisor is ending the rest of its process group" in r for r in doc["reasons"])
        (listed,) = cli("runs", "--json").json()["runs"]
        assert listed["alive"] is True and listed["verdict"] != "lost" and listed["ending"] is True
        zombies = cli("kill-zombies", "--dry-run", "--json").json()
        assert zombies["current_run"] == run_id  # the supervisor reaping its group is protected, not a zombie
        assert [z for z in zombies["zombies"] if z["action"] == "kill"] == []
        again = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "too-soon")
        assert again.code == 2 and f"run {run_id} is still running" in again.err
        assert _live_latest(str(local_host.workspace_dir / "runs")) == run_id  # and so does the launcher's check
        with local_host.connect() as t:
            run = probe_doc(t, str(local_host.workspace_dir), run_id, gpus=False)["run"]
        assert run["alive"] is True and run["ending"] is True and run["supervisor_pid"] == supervisor

    wait_until(lambda: (rd / "exit_code").exists(), what="exit_code written by the supervisor")
    assert not alive(child) and group_members(pid) == []  # exit_code present => nothing of the run is alive
    final = cli("status", "--json")
    assert final.code == 0 and final.json()["verdict"] == "finished" and final.json()["run"]["alive"] is False
    assert cli("runs", "--json").json()["runs"][0]["verdict"] == "finished"


def _leader_with_child(run_id: str, tmp_path: Path) -> tuple[int, int]:
    """A process-group leader carrying run_id's marker that starts a child (same group, same marker)
    and exits: the shape an older launcher leaves while it reaps. Returns (leader pid, child pid)."""
    pidfile = tmp_path / f"{run_id}.child"
    code = ("import os, subprocess, sys\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pidfile)!r} + '.tmp', 'w').write(str(c.pid)); os.replace({str(pidfile)!r} + '.tmp', "
            f"{str(pidfile)!r})\n")
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                              env={"PATH": os.environ["PATH"], "DFLASH_RUN_ID": run_id})
    leader.wait()  # reaped by us: the recorded pid is gone, as after the supervisor's wait()
    return leader.pid, int(pidfile.read_text())


def _run_dir(ws: Path, run_id: str, pid: int) -> Path:
    rd = ws / "runs" / run_id
    rd.mkdir(parents=True)
    (rd / "train.log").write_bytes(b"step=1 loss=2\n")
    (rd / "pid").write_text(f"{pid}\n")
    return rd


def test_a_run_without_supervisor_pid_is_alive_while_a_marked_process_of_its_group_lives(local_host, cli,
                                                                                          tmp_path):
    ws = local_host.workspace_dir
    old1 = unique("old1")
    leader, child = _leader_with_child(old1, tmp_path)
    rd = _run_dir(ws, old1, leader)  # launched by an older launcher: no supervisor.pid
    (ws / "runs" / "latest").symlink_to(old1)
    try:
        state = run_state(old1, str(rd))
        assert state["alive"] is True and state["ending"] is True and state["supervisor_pid"] is None
        with local_host.connect() as t:  # the assembled probe says the same as the piece
            doc = probe_doc(t, str(ws), old1, gpus=False, runs=True)
        assert doc["run"]["alive"] is True and doc["run"]["ending"] is True
        assert [r["alive"] for r in doc["runs"]] == [True]
        refused = cli("launch", "--source", str(FAKE_TRAINER), "--name", "next")
        assert refused.code == 2 and f"run {old1} is still running" in refused.err
        assert _live_latest(str(ws / "runs")) == old1  # the launcher's own check (under its lock) agrees
    finally:
        kill_quietly(child)
    wait_until(lambda: not alive(child), what="child gone")
    state = run_state(old1, str(rd))
    assert state["alive"] is False and state["ending"] is False  # nothing left and no exit code: lost, as before
    assert _live_latest(str(ws / "runs")) is None


def test_a_group_member_without_this_runs_marker_does_not_keep_it_alive(tmp_path):
    mine = unique("mine")
    leader, child = _leader_with_child(unique("other"), tmp_path)  # same group, the marker names another run
    rd = _run_dir(tmp_path, mine, leader)
    try:
        assert run_state(mine, str(rd))["alive"] is False
    finally:
        kill_quietly(child)


def test_a_live_supervisor_keeps_the_run_alive_only_while_it_is_ours_and_no_exit_code_exists(tmp_path):
    r1, r2 = unique("r1"), unique("r2")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sup = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                           env={"PATH": os.environ["PATH"], "DFLASH_RUN_ID": r1})
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={"PATH": os.environ["PATH"]})
    try:
        # a forked child shows its parent's environment until it has exec'd: wait for the marker it will carry
        wait_until(lambda: marker_of(sup.pid) == r1, what="the supervisor stand-in's marker")
        rd = _run_dir(tmp_path, r1, gone.pid)
        (rd / "supervisor.pid").write_text(f"{sup.pid}\n")
        state = run_state(r1, str(rd))
        assert state["alive"] is True and state["ending"] is True and state["supervisor_pid"] == sup.pid
        (rd / "supervisor.pid").write_text(f"{stranger.pid}\n")  # a reused pid: someone else's process
        assert run_state(r1, str(rd))["alive"] is False
        (rd / "supervisor.pid").write_text(f"{sup.pid}\n")
        (rd / "exit_code").write_text("0\n")  # recorded: the supervisor's last moments do not count
        state = run_state(r1, str(rd))
        assert state["alive"] is False and state["ending"] is False and state["exit_code"] == 0
        (rd / "exit_code").unlink()
        sup.kill()
        sup.wait()
        assert run_state(r1, str(rd))["alive"] is False  # supervisor and trainer gone, no exit code: lost
        starting = _run_dir(tmp_path, r2, gone.pid)
        (starting / "pid").unlink()  # the supervisor has not started the trainer yet
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={"PATH": os.environ["PATH"], "DFLASH_RUN_ID": r2})
        try:
            wait_until(lambda: marker_of(live.pid) == r2, what="the starting supervisor's marker")
            (starting / "supervisor.pid").write_text(f"{live.pid}\n")
            state = run_state(r2, str(starting))
            assert state["alive"] is True and state["ending"] is False  # starting, not ending
            assert [r["alive"] for r in list_runs(str(tmp_path / "runs"))] == [True, False]
        finally:
            live.kill()
            live.wait()
    finally:
        for p in (sup, stranger):
            p.kill()
            p.wait()


def test_health_says_an_ending_run_is_reaping_its_group_not_lost():
    log = scan(b"step=7 loss=1.5\n")
    ending = judge(Evidence(now=100.0, process=ProcessState(alive=True, ending=True), log=log, last_progress_time=99.0))
    assert ending.verdict == Verdict.TRAINING and "supervisor is ending the rest" in ending.reasons[0]
    running = judge(Evidence(now=100.0, process=ProcessState(alive=True), log=log, last_progress_time=99.0))
    assert not any("supervisor" in r for r in running.reasons)


def test_stop_of_an_ending_run_waits_for_its_exit_code_and_says_how_it_ended(local_host, cli, tmp_path,
                                                                              monkeypatch):
    run_id, pid, supervisor, release, _ = launch_lingering(cli, tmp_path, "ending")
    seen_ending = threading.Event()
    real_get_run = stop_command.get_run

    def observed_get_run(*args, **kwargs):  # the real probe; the test only learns what stop saw
        info, doc = real_get_run(*args, **kwargs)
        if info.ending:
            seen_ending.set()
        return info, doc

    monkeypatch.setattr(stop_command, "get_run", observed_get_run)
    outcome: dict[str, BaseException | object] = {}

    def call_stop() -> None:
        with local_host.connect() as t:
            try:
                outcome["result"] = stop_command.stop(t, None, grace_s=5)
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = e

    with stopped(supervisor):
        release.touch()
        wait_until(lambda: proc_state(pid) == "Z", what="the trainer exited (unreaped: its supervisor is frozen)")
        worker = threading.Thread(target=call_stop)
        worker.start()
        assert seen_ending.wait(20), "stop never saw the run ending"
    worker.join(30)
    assert not worker.is_alive()
    err = outcome.get("error")
    assert isinstance(err, stop_command.NotRunning), outcome
    assert f"run {run_id} has already ended with exit code 0" in err.message
